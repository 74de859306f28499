"""Metrics: one JSON object per logged step in `MODEL_DIR/metrics.jsonl`, plus TensorBoard event files.

On resume the writer drops rows past the restored step (they came from a run that died before its next
checkpoint and will be recomputed), so no step is logged twice; TensorBoard is told the same with
`purge_step`.

`MODEL_DIR` goes through the path layer (`evolver.paths`). On a local directory every row is appended and flushed
as it is written. An object store (`gs://`) has no append: the rows are kept in memory and the whole file is
rewritten (atomically) at `flush()` (the loop calls it before every checkpoint, so a resumed run finds every row
up to its checkpoint), at most `flush_every_s` after a row, and at `close()`; event files likewise, through
`PathRecordFile`. In a multi-host run process 0 alone writes (`evolver.distributed.is_primary`); the others build
the same rows and write nothing.
"""

import io
import json
import math
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from evolver import distributed
from evolver import paths

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_SUBDIR = "tensorboard"
FLUSH_EVERY_S = 60.0


def _to_python(value: Any) -> Any:
  if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "item"):
    value = np.asarray(value)
    return value.item() if value.size == 1 else value.tolist()
  return value


def parse_metrics(text: str) -> list[dict[str, Any]]:
  """The rows of a metrics.jsonl text, up to a torn last line (a killed process's) if any."""
  rows = []
  for line in text.splitlines():
    line = line.strip()
    if line:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        break
  return rows


def read_metrics(model_dir: paths.PathLike) -> list[dict[str, Any]]:
  """The rows of `MODEL_DIR/metrics.jsonl` (local or a URI); [] when there is none."""
  path = paths.as_path(model_dir) / METRICS_FILE
  return parse_metrics(path.read_text()) if path.exists() else []


class PathRecordFile:
  """An event file tensorboardX writes through the path layer, for stores without append: the bytes are kept in
  memory and the whole file is rewritten at each flush (tensorboardX flushes every `flush_secs` and at close)."""

  def __init__(self, path: str):
    self.path = paths.as_path(path)
    self._buffer = io.BytesIO()

  def write(self, data: bytes) -> None:
    self._buffer.write(data)

  def flush(self) -> None:
    paths.write_bytes(self.path, self._buffer.getvalue())

  def close(self) -> None:
    self.flush()


class PathRecordFactory:
  """tensorboardX's writer factory for a URI scheme (`record_writer.register_writer_factory`): `PathRecordFile`s."""

  def open(self, path: str) -> PathRecordFile:
    return PathRecordFile(path)

  def directory_check(self, path: str) -> None:
    del path  # object stores have no directories to make


def _tensorboard_writer(logdir: str, purge_step: int):
  from tensorboardX import SummaryWriter
  from tensorboardX import record_writer
  if not paths.is_local(logdir):
    record_writer.register_writer_factory(logdir.split("://", 1)[0], PathRecordFactory())
  return SummaryWriter(logdir, purge_step=purge_step)


class MetricsWriter:
  """Writes metrics rows of one run (module docstring)."""

  def __init__(self, model_dir: paths.PathLike, *, resume_step: int | None = None, tensorboard: bool = True,
               flush_every_s: float = FLUSH_EVERY_S):
    """
    Args:
      model_dir: the run directory (local or a URI).
      resume_step: the step the run resumes at: rows past it are dropped (None: a fresh run, every row dropped).
      tensorboard: also write TensorBoard event files under `MODEL_DIR/tensorboard`.
      flush_every_s: on a store without append, the longest a row waits in memory before the file is rewritten
        (seconds).
    """
    directory = paths.as_path(model_dir)
    self.path = directory / METRICS_FILE
    self.writes = distributed.is_primary()
    self.flush_every_s = flush_every_s
    self._file = None
    self._lines: list[str] = []  # every row, on a store without append
    self._dirty = False
    self._flushed_at = time.monotonic()
    self._tb = None
    if not self.writes:
      return
    keep_until = resume_step if resume_step is not None else -1
    lines = [json.dumps(r) for r in read_metrics(directory) if r.get("step", -1) <= keep_until]
    paths.write_text(self.path, "".join(line + "\n" for line in lines))
    if paths.is_local(self.path):
      self._file = open(self.path, "a")
    else:
      self._lines = lines
    if tensorboard:
      self._tb = _tensorboard_writer(str(directory / TENSORBOARD_SUBDIR), purge_step=keep_until + 1)

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Logs `metrics` as the row of `step` (non-finite floats as strings); returns the row."""
    row = {"step": int(step)}
    for key, value in metrics.items():
      value = _to_python(value)
      if isinstance(value, float) and not math.isfinite(value):
        value = str(value)
      row[key] = value
    if not self.writes:
      return row
    if self._file is not None:
      self._file.write(json.dumps(row) + "\n")
      self._file.flush()
    else:
      self._lines.append(json.dumps(row))
      self._dirty = True
      if time.monotonic() - self._flushed_at >= self.flush_every_s:
        self.flush()
    if self._tb is not None:
      for key, value in row.items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
          self._tb.add_scalar(key, value, int(step))
    return row

  def flush(self) -> None:
    """Makes every row written so far durable: rewrites the file on a store without append (module docstring)."""
    if self._dirty:
      paths.write_text(self.path, "".join(line + "\n" for line in self._lines))
      self._dirty = False
    self._flushed_at = time.monotonic()
    if self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    self.flush()
    if self._file is not None:
      self._file.close()
      self._file = None
    if self._tb is not None:
      self._tb.close()
      self._tb = None
