"""Gin plumbing for `python -m launch.train`: parse files and bindings with clear errors, then run the loop
the run config names (`run.loop = @train_bc`, `@train_agentevol`, ...).

Where files are found, the same from any working directory:
- a gin file given to `parse` (`--gin_file`) as it is given (relative to the working directory), else under the
  first search path that has it;
- an `include` (in a file or a binding) under the first search path that has it, never the working directory.
The search paths are the given ones (`--gin_search_paths`), then gin_configs/, then the repository root.

A run stopped by SIGTERM (a preemption: `evolver.train.loop.Preempted`, its checkpoint complete) exits with status
143 (`PREEMPTED_EXIT_STATUS`, what a shell reports for a process SIGTERM ended) after one line on stderr; running
the same command again resumes from that checkpoint.
"""

import contextlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence

import gin
from gin import resource_reader

import evolver.envs as envs_lib
# Importing these registers their configurables with gin.
from evolver.models import config as _model_config  # noqa: F401
from evolver.train import optimizer as _optimizer  # noqa: F401
from evolver.train import trainer as _trainer  # noqa: F401
from evolver.train.loop import Preempted

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_SEARCH_PATHS = (os.path.join(REPO_ROOT, "gin_configs"), REPO_ROOT)
PREEMPTED_EXIT_STATUS = 143  # 128 + SIGTERM


class ConfigError(ValueError):
  """A gin file or binding that cannot be applied; the message names it."""


def register_loops() -> None:
  """Imports every module with a training loop so run configs can name them."""
  import importlib
  for module in ("evolver.train.bc", "evolver.train.agentevol", "evolver.train.rl", "evolver.train.dpo",
                 "evolver.train.experience", "evolver.train.synthetic_tasks", "evolver.train.credit"):
    try:
      importlib.import_module(module)
    except ModuleNotFoundError as e:
      if e.name != module:
        raise


def lookup_paths(extra: Sequence[str] = ()) -> list[str]:
  """Where gin files and includes are looked up, in order: `extra`, gin_configs/, the repository root (absolute)."""
  return [os.path.abspath(p) for p in extra] + list(DEFAULT_SEARCH_PATHS)


def resolve(file: str, paths: Sequence[str]) -> str:
  """The absolute path of a gin file given on the command line: as given (relative to the working directory),
  else under the first of `paths` that has it. Raises ConfigError when none has it."""
  if os.path.isfile(file):
    return os.path.abspath(file)
  if not os.path.isabs(file):
    for path in paths:
      candidate = os.path.join(path, file)
      if os.path.isfile(candidate):
        return candidate
  raise ConfigError(f"gin file {file!r} not found (in the working directory {os.getcwd()!r} or the search paths "
                    f"{list(paths)}; add one with --gin_search_paths)")


@contextlib.contextmanager
def _look_up_only_in(paths: Sequence[str]) -> Iterator[None]:
  """While gin parses, it looks up relative files (includes) only under `paths`, and not as Python packages.

  Left alone, gin tries a relative name first in the working directory, then under its search paths, with every
  registered reader at each; `gin.resource_reader`'s reader takes the name's folder for a Python package
  ('models/tiny.gin' -> package `models`). It logs "Path not found: models/tiny.gin" at ERROR level for every
  miss (the first lines every run printed), and crashes with a TypeError when a directory of that name is
  importable as a namespace package (a `models/` or `runs/` directory in the working directory or on sys.path).
  gin has no public way to set or reset either list, hence its private names, checked so that a gin release
  that renames them fails here, loudly."""
  prefixes = getattr(gin.config, "_LOCATION_PREFIXES", None)
  readers = getattr(gin.config, "_FILE_READERS", None)
  if not isinstance(prefixes, list) or not isinstance(readers, list):
    raise RuntimeError("gin.config._LOCATION_PREFIXES and gin.config._FILE_READERS are no longer lists in this "
                       "gin-config release; evolver.train.gin_config._look_up_only_in must be updated for it")
  saved_prefixes, saved_readers = list(prefixes), list(readers)
  prefixes[:] = list(paths)
  readers[:] = [entry for entry in readers if entry[0] is not resource_reader.system_path_reader]
  try:
    yield
  finally:
    prefixes[:], readers[:] = saved_prefixes, saved_readers


def parse(gin_files: Sequence[str], bindings: Sequence[str], search_paths: Sequence[str] = ()) -> None:
  """Parses `gin_files` (relative to the working directory, else to the search paths), then `bindings`;
  includes are looked up in the search paths only (module docstring). Raises ConfigError, naming what failed."""
  register_loops()
  paths = lookup_paths(search_paths)
  files = [resolve(file, paths) for file in gin_files]
  try:
    with _look_up_only_in(paths):
      gin.parse_config_files_and_bindings(files, list(bindings), finalize_config=False)
  except (ValueError, KeyError, SyntaxError, IOError) as e:
    raise ConfigError(f"bad gin config: {e}") from e


@gin.configurable
def served_envs(urls: dict[str, str | list[str]] | None = None, server: str = "evolver") -> dict:
  """The envs this run plays on servers instead of in process: {env name: URL or [URLs]} (`launch.serve_env`,
  or AgentGym's servers with `server = 'agentgym'`); every env the run makes by that name (rollouts, val and
  held-out evaluation, task slices, self-questioning's checks) is then a `RemoteEnv` (`evolver.envs.serving`).
    served_envs.urls = {'maze': ['http://10.0.0.5:36001', 'http://10.0.0.6:36001'], 'sql': 'http://10.0.0.7:36002'}
  Returns `serving`'s arguments."""
  return {"urls": urls or {}, "server": server}


@gin.configurable
def run(loop: Callable[[], object] = gin.REQUIRED) -> object:
  """Runs the configured training loop (it takes everything else from gin) with the envs `served_envs` names
  on their servers. A preempted run (module docstring) prints why on stderr and exits with
  `PREEMPTED_EXIT_STATUS`."""
  stack = contextlib.ExitStack()
  try:
    served = stack.enter_context(envs_lib.serving(**served_envs()))
  except envs_lib.EnvError as e:
    raise ConfigError(f"bad gin config: served_envs.urls: {e}") from None
  with stack:
    if served:
      print(f"envs on servers: {served}", flush=True)
    try:
      return loop()
    except Preempted as e:
      print(e, file=sys.stderr, flush=True)
      raise SystemExit(PREEMPTED_EXIT_STATUS) from None
