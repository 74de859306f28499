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
