"""Process-level guards for long runs.

XLA:CPU maps about 30 memory regions per compiled program (its code and data sections), and JAX keeps every
program it has compiled. A long run that compiles a program per shape (the sampler's row and cache sizes, GRPO's
buckets) reaches the kernel's per-process limit, `vm.max_map_count` (65,530 by default): measured, a CPU GRPO run
passed 20,000 regions within three minutes, and at the limit compilation fails ("LLVM compilation error: Cannot
allocate memory") and the process aborts. `release_compiled_programs` drops JAX's caches of compiled programs
before that; they are compiled again on next use (read back from the persistent compilation cache when on).

The programs hold memory too, about 0.1 MB a region (two CPU runs side by side, AgentEvol at 14 GB and GRPO at
6-12 GB, were OOM-killed on a 24 GB machine), but releasing sooner costs more than it saves: measured, at 5% of
the limit a 120-episode evaluation peaked at 2.62 GB resident instead of 4.81 GB, while the rollout benchmark
ran 4.8x slower (11.0 vs 2.29 s): its working set of programs is above 5%, so every generate call released them
and traced them again. Hence half the limit.

`enable_compilation_cache` turns on JAX's persistent compilation cache, so a run reads back the programs an earlier
run compiled. Every `python -m launch.X` calls it (`launch/__init__.py`). The cache lives in
`$JAX_COMPILATION_CACHE_DIR` when that is set, else in `$EVOLVER_CACHE_DIR/jax`, else in `~/.cache/evolver/jax`:
beside the datasets (`evolver.data.tfds_builders`). launch/quickstart.sh and launch/test.sh set EVOLVER_CACHE_DIR
to .cache in the repository. `JAX_ENABLE_COMPILATION_CACHE=false` turns the cache off.

This module imports JAX only where it uses it, so commands without JAX (the env server) start without it.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

CACHE_DIR_ENV = "EVOLVER_CACHE_DIR"
JAX_CACHE_DIR_ENV = "JAX_COMPILATION_CACHE_DIR"

_MAPS = "/proc/self/maps"
_MAX_MAP_COUNT = "/proc/sys/vm/max_map_count"


def mapped_regions() -> int | None:
  """Memory regions this process has mapped (Linux), or None where the count cannot be read."""
  try:
    with open(_MAPS, "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return None


def map_limit() -> int | None:
  """The kernel's per-process limit on mapped regions (Linux), or None where it cannot be read."""
  try:
    with open(_MAX_MAP_COUNT) as f:
      return int(f.read().strip())
  except (OSError, ValueError):
    return None


def resident_gb() -> float | None:
  """This process's resident memory now, in GB (Linux /proc/self/statm), or None where it cannot be read."""
  try:
    with open("/proc/self/statm") as f:
      return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
  except (OSError, ValueError, IndexError):
    return None


def peak_resident_gb() -> float:
  """The most resident memory this process has held, in GB (getrusage's ru_maxrss: KiB on Linux; it counts pages
  a little differently from /proc/self/statm, so the current figure bounds it from below)."""
  import resource  # pylint: disable=import-outside-toplevel
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024) / 1e9
  return max(peak, resident_gb() or 0.0)


_last_count_s = float("-inf")


def release_compiled_programs(fraction: float = 0.5, *, min_interval_s: float = 0.0, regions: int | None = None,
                              limit: int | None = None) -> bool:
  """Clears JAX's compiled-program caches when the process maps more than `fraction` of the kernel's limit of
  regions; returns True when it did. Counting reads /proc/self/maps (~12 ms at 30,000 regions), so callers on a
  hot path pass `min_interval_s`: within that many seconds of the last count it returns False without counting.
  `regions` and `limit` default to this process's and the kernel's (given: for tests; given regions are always
  checked). Where neither can be read (not Linux) it does nothing."""
  global _last_count_s
  if not 0.0 < fraction < 1.0:
    raise ValueError(f"fraction must be in (0, 1), got {fraction}")
  if regions is None:
    now = time.monotonic()
    if now - _last_count_s < min_interval_s:
      return False
    _last_count_s = now
    regions = mapped_regions()
  limit = map_limit() if limit is None else limit
  if regions is None or limit is None or regions <= fraction * limit:
    return False
  import jax  # pylint: disable=import-outside-toplevel
  jax.clear_caches()
  return True


def return_free_memory() -> bool:
  """Hands the C heap's free memory back to the kernel (glibc's `malloc_trim(0)`); returns False where there is no
  glibc. XLA's compilations allocate and free a lot on the C heap, and glibc keeps what was freed: after the RL
  step's programs were compiled (75 sampler programs, tiny default) the process held 1.29 GB, 0.65 GB after a
  trim, with every program still compiled."""
  global _libc
  if _libc is None:
    try:
      import ctypes  # pylint: disable=import-outside-toplevel
      _libc = ctypes.CDLL("libc.so.6")
      _libc.malloc_trim  # pylint: disable=pointless-statement
    except (OSError, AttributeError):
      _libc = False
  if not _libc:
    return False
  _libc.malloc_trim(0)
  return True


_libc = None


def cache_dir() -> str:
  """The root of what evolver caches (compiled programs, datasets, exported models): `$EVOLVER_CACHE_DIR`, else
  `~/.cache/evolver` (an empty variable counts as unset)."""
  return os.environ.get(CACHE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "evolver")


def compilation_cache_dir() -> str:
  """Where JAX's persistent compilation cache lives: `$JAX_COMPILATION_CACHE_DIR`, else `$EVOLVER_CACHE_DIR/jax`,
  else `~/.cache/evolver/jax` (an empty variable counts as unset)."""
  explicit = os.environ.get(JAX_CACHE_DIR_ENV)
  if explicit:
    return explicit
  return os.path.join(cache_dir(), "jax")


def enable_compilation_cache() -> str:
  """Turns on JAX's persistent compilation cache in `compilation_cache_dir()` for this process and the processes it
  starts, and returns the directory (JAX creates it on the first write).

  It sets `JAX_COMPILATION_CACHE_DIR`, which JAX reads when it is imported (and child processes inherit), so
  calling it before JAX is imported keeps JAX out of processes that never use it; where JAX is already imported
  the setting is updated too. Either way it must run before the first compilation."""
  path = compilation_cache_dir()
  os.environ[JAX_CACHE_DIR_ENV] = path
  jax = sys.modules.get("jax")
  if jax is not None:
    jax.config.update("jax_compilation_cache_dir", path)
  return path


# -- what XLA compiles ---------------------------------------------------------------------------------------------

_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"  # jax._src.dispatch.BACKEND_COMPILE_EVENT
_TRACE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration")
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"


class CompileEvent(NamedTuple):
  """One program JAX handed to XLA: the jitted function's name, the seconds XLA took, whether the persistent
  compilation cache served it (then the seconds are the read), the seconds of tracing and lowering to MLIR before
  it, and the log's tag at the time (e.g. "step 3")."""

  fun_name: str
  seconds: float
  cache_hit: bool
  tag: str
  trace_s: float = 0.0


class CompileLog:
  """Every XLA compilation of this process, in order, from JAX's monitoring events (`compile_log()` gives the one
  log; it listens from its first call on). `tag` labels the events that follow (the RL loop sets it to the step
  being run), so a run can say which step compiled what. Keeps the last `max_events` events."""

  def __init__(self, max_events: int = 100_000):
    self.events: collections.deque[CompileEvent] = collections.deque(maxlen=max_events)
    self.tag = ""
    self._hits = 0
    self._hits_seen = 0
    self._count = 0  # events ever logged
    self._trace_s = 0.0  # tracing and lowering not yet followed by a compile
    self._lock = threading.Lock()

  def _on_event(self, event: str, **kwargs: Any) -> None:
    if event == _CACHE_HIT_EVENT:
      with self._lock:
        self._hits += 1

  def _on_duration(self, event: str, seconds: float, **kwargs: Any) -> None:
    if event in _TRACE_EVENTS:
      with self._lock:
        self._trace_s += float(seconds)
      return
    if event != _BACKEND_COMPILE_EVENT:
      return
    with self._lock:  # a persistent-cache hit is reported inside the compile it served
      hit, self._hits_seen = self._hits > self._hits_seen, self._hits
      trace_s, self._trace_s = self._trace_s, 0.0
      self.events.append(CompileEvent(str(kwargs.get("fun_name", "?")), float(seconds), hit, self.tag, trace_s))
      self._count += 1

  def mark(self) -> int:
    """A position in the log: `since(mark)` gives the events after it."""
    return self._count

  def since(self, mark: int) -> list[CompileEvent]:
    """The events logged after `mark` (those still kept)."""
    events = list(self.events)
    new = self._count - mark
    return events[len(events) - min(new, len(events)):] if new > 0 else []

  @staticmethod
  def summary(events: Sequence[CompileEvent]) -> dict[str, float]:
    """Counts and seconds of `events`: `compiles` and `compile_s` (XLA compilations), `cache_hits` and
    `cache_read_s` (programs the persistent cache served), `trace_s` (tracing and lowering before either)."""
    compiled = [e for e in events if not e.cache_hit]
    hits = [e for e in events if e.cache_hit]
    return {"compiles": len(compiled), "compile_s": sum(e.seconds for e in compiled), "cache_hits": len(hits),
            "cache_read_s": sum(e.seconds for e in hits), "trace_s": sum(e.trace_s for e in events)}

  @staticmethod
  def by_function(events: Sequence[CompileEvent]) -> dict[str, dict[str, float]]:
    """`summary` per jitted function name, most compile seconds first."""
    names = collections.defaultdict(list)
    for e in events:
      names[e.fun_name].append(e)
    out = {name: CompileLog.summary(evs) for name, evs in names.items()}
    return dict(sorted(out.items(), key=lambda kv: -(kv[1]["compile_s"] + kv[1]["cache_read_s"])))


_compile_log: CompileLog | None = None


def compile_log() -> CompileLog:
  """The process's `CompileLog`, listening to JAX's monitoring events from the first call on."""
  global _compile_log
  if _compile_log is None:
    from jax import monitoring  # pylint: disable=import-outside-toplevel
    log = CompileLog()
    monitoring.register_event_listener(log._on_event)  # pylint: disable=protected-access
    monitoring.register_event_duration_secs_listener(log._on_duration)  # pylint: disable=protected-access
    _compile_log = log
  return _compile_log
