"""evolver.runtime: compiled programs are released before the process runs out of mapped regions."""

import jax
import jax.numpy as jnp
import pytest

from evolver import runtime


def test_counts_are_read_on_linux():
  regions, limit = runtime.mapped_regions(), runtime.map_limit()
  assert regions is not None and limit is not None and 0 < regions < limit


def test_releases_compiled_programs_only_over_the_fraction():
  add_one = jax.jit(lambda x: x + 1)
  assert int(add_one(jnp.int32(1))) == 2
  assert add_one._cache_size() == 1
  assert not runtime.release_compiled_programs(0.5, regions=50, limit=100)
  assert add_one._cache_size() == 1
  assert runtime.release_compiled_programs(0.5, regions=51, limit=100)
  assert add_one._cache_size() == 0
  assert int(add_one(jnp.int32(2))) == 3  # compiled again on next use
  assert not runtime.release_compiled_programs(0.5)  # this test process maps far fewer regions than the limit


def test_counts_at_most_once_per_interval(monkeypatch):
  counts = []
  monkeypatch.setattr(runtime, "mapped_regions", lambda: counts.append(1) or 99)
  monkeypatch.setattr(runtime, "_last_count_s", float("-inf"))
  add_one = jax.jit(lambda x: x + 1)
  add_one(jnp.int32(1))
  assert runtime.release_compiled_programs(0.5, min_interval_s=3600.0, limit=100)  # counted: 99 > 50
  assert add_one._cache_size() == 0
  add_one(jnp.int32(1))
  assert not runtime.release_compiled_programs(0.5, min_interval_s=3600.0, limit=100)  # within the hour: no count
  assert len(counts) == 1 and add_one._cache_size() == 1
  assert runtime.release_compiled_programs(0.5, limit=100)  # no interval: counted again
  assert len(counts) == 2


def test_bad_fraction_is_refused():
  with pytest.raises(ValueError, match="fraction must be in"):
    runtime.release_compiled_programs(1.0)


def test_compile_log_counts_each_new_program_once_under_its_tag():
  log = runtime.compile_log()
  assert runtime.compile_log() is log  # one log per process
  mark = log.mark()
  log.tag = "phase a"
  double = jax.jit(lambda x: x * 2.0 + 1.0)
  x3, x5 = jnp.ones(3), jnp.ones(5)
  double(x3)
  double(x3)  # the same shape: no new program
  log.tag = "phase b"
  double(x5)
  events = [e for e in log.since(mark) if e.fun_name == "jit(<lambda>)"]
  assert [e.tag for e in events] == ["phase a", "phase b"]
  assert all(e.seconds > 0 and not e.cache_hit for e in events)
  summary = runtime.CompileLog.summary(events)
  assert summary["compiles"] == 2 and summary["cache_hits"] == 0 and summary["compile_s"] > 0
  assert runtime.CompileLog.by_function(events)["jit(<lambda>)"]["compiles"] == 2
  assert log.since(log.mark()) == []
  log.tag = ""


_CACHE_PROBE = """
import json, sys
import jax, jax.numpy as jnp
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
from evolver import runtime
log = runtime.compile_log()
jax.jit(lambda x: jnp.sin(x) * 3.0 + 0.5)(jnp.ones(7))
events = [e for e in log.events if e.fun_name == "jit(<lambda>)"]
print(json.dumps(runtime.CompileLog.summary(events)))
"""


def test_compile_log_counts_persistent_cache_hits_apart(tmp_path):
  """The second process reads the program the first one compiled: a cache hit, not a compilation."""
  import json
  import os
  import subprocess
  import sys
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(tmp_path / "cache"), JAX_PLATFORMS="cpu")
  runs = [json.loads(subprocess.run([sys.executable, "-c", _CACHE_PROBE], env=env, check=True, capture_output=True,
                                    text=True).stdout.strip().splitlines()[-1]) for _ in range(2)]
  assert runs[0]["compiles"] == 1 and runs[0]["cache_hits"] == 0
  assert runs[1]["compiles"] == 0 and runs[1]["cache_hits"] == 1


def test_memory_figures_are_read():
  rss, peak = runtime.resident_gb(), runtime.peak_resident_gb()
  assert rss is not None and 0 < rss <= peak + 1e-3 < 1000
