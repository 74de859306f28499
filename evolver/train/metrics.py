"""Metrics: one JSON object per logged step in `MODEL_DIR/metrics.jsonl`, plus TensorBoard event files.

On resume the writer drops rows past the restored step (they came from a run that died before its next
checkpoint and will be recomputed), so no step is logged twice; TensorBoard is told the same with
`purge_step`.
"""

import json
import math
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

METRICS_FILE = "metrics.jsonl"


def _to_python(value: Any) -> Any:
  if isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "item"):
    value = np.asarray(value)
    return value.item() if value.size == 1 else value.tolist()
  return value


def read_metrics(model_dir: str) -> list[dict[str, Any]]:
  path = os.path.join(model_dir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if line:
        try:
          rows.append(json.loads(line))
        except json.JSONDecodeError:
          break  # A torn last line from a killed process.
  return rows


class MetricsWriter:

  def __init__(self, model_dir: str, *, resume_step: int | None = None, tensorboard: bool = True):
    os.makedirs(model_dir, exist_ok=True)
    self.path = os.path.join(model_dir, METRICS_FILE)
    keep_until = resume_step if resume_step is not None else -1
    rows = [r for r in read_metrics(model_dir) if r.get("step", -1) <= keep_until]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      for row in rows:
        f.write(json.dumps(row) + "\n")
    os.replace(tmp, self.path)
    self._file = open(self.path, "a")
    self._tb = None
    if tensorboard:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(model_dir, "tensorboard"), purge_step=keep_until + 1)

  def write(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
    row = {"step": int(step)}
    for key, value in metrics.items():
      value = _to_python(value)
      if isinstance(value, float) and not math.isfinite(value):
        value = str(value)
      row[key] = value
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    if self._tb is not None:
      for key, value in row.items():
        if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
          self._tb.add_scalar(key, value, int(step))
    return row

  def close(self) -> None:
    self._file.close()
    if self._tb is not None:
      self._tb.close()
