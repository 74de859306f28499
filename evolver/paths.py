"""One path layer for everything a run writes: local directories and object stores (`gs://`, `s3://`) alike.

Run directories, checkpoints, metrics, configs, eval results and explorations are `etils.epath.Path`s (what orbax
uses), so `MODEL_DIR='gs://bucket/runs/bc'` works wherever a local directory does:

  model_dir = paths.as_path("gs://bucket/runs/bc")      # URIs as given; local paths made absolute
  paths.write_json(model_dir / "eval_results.json", results)

Writes are atomic (a temporary name in the same folder, then a rename: a reader sees the old file or the new one,
never part of one), and happen on the primary process only (`evolver.distributed.is_primary`): every process of
a multi-host run runs the same program and computes the same content, and process 0 alone writes it; on the
others the write functions return without touching storage, so nothing may read back what it has just written.
`evolver.train.metrics.MetricsWriter` follows the same rule; orbax coordinates the checkpoints itself.

A component that needs a real local file (an SQLite database, a ScaNN index) asks for `local_dir`, which refuses a
URI with a message naming the component.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

from etils import epath

from evolver import distributed

PathLike = str | os.PathLike
KNOWN_SCHEMES = ("gs://", "s3://", "az://", "hf://")  # what etils.epath registers (fsspec or tf.io.gfile backends)


def _text(path: PathLike) -> str:
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"a path must be a str or os.PathLike, got {type(path).__name__}: {path!r}")
  text = os.fspath(path)
  if not isinstance(text, str) or not text:
    raise ValueError(f"a path must be a non-empty string, got {path!r}")
  return text


def is_local(path: PathLike) -> bool:
  """Whether `path` names the local filesystem (no `scheme://` prefix)."""
  return "://" not in _text(path)


def as_path(path: PathLike) -> epath.Path:
  """`path` as an `epath.Path`: a URI (`gs://bucket/x`) as it is, a local path made absolute.

  Raises:
    ValueError: a URI whose scheme etils.epath does not handle, or an empty path.
  """
  text = _text(path)
  if is_local(text):
    return epath.Path(os.path.abspath(text))
  try:
    return epath.Path(text)
  except KeyError:
    scheme = text.split("://", 1)[0]
    raise ValueError(f"{text!r}: the path layer (etils.epath) handles local paths and {', '.join(KNOWN_SCHEMES)} "
                     f"URIs, not {scheme}://") from None


def local_dir(path: PathLike, what: str) -> str:
  """The absolute local directory for a component that needs real local files (`what` names it in the error).

  Raises:
    ValueError: `path` is a URI.
  """
  text = _text(path)
  if not is_local(text):
    raise ValueError(f"{what} needs a local directory, got {text!r}: give it a local path")
  return os.path.abspath(text)


def write_bytes(path: PathLike, data: bytes) -> epath.Path:
  """Writes `data` to `path` atomically, creating its folder; on the primary process only (module docstring).

  Returns:
    The path written (as `as_path` gives it).
  """
  path = as_path(path)
  if not distributed.is_primary():
    return path
  path.parent.mkdir(parents=True, exist_ok=True)
  temporary = path.parent / f".{path.name}.tmp-{uuid.uuid4().hex}"
  try:
    temporary.write_bytes(bytes(data))
    temporary.replace(path)
  except BaseException:
    if temporary.exists():
      temporary.unlink()
    raise
  return path


def write_text(path: PathLike, text: str) -> epath.Path:
  """Writes `text` (UTF-8) to `path` atomically; on the primary process only. Returns the path."""
  return write_bytes(path, text.encode("utf-8"))


def write_json(path: PathLike, data: Any, *, indent: int | None = 2, sort_keys: bool = False) -> epath.Path:
  """Writes `data` as JSON (UTF-8, a final newline) to `path` atomically; on the primary process only."""
  return write_text(path, json.dumps(data, indent=indent, sort_keys=sort_keys) + "\n")
