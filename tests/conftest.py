"""Test-wide set-up: 8 fake CPU devices, XLA flags for fast compiles and JAX's persistent compilation cache; the
files with slow tests first.

Both must be set before JAX is imported anywhere, so they live here. Single-device tests pin themselves to
`jax.devices()[0]`; sharding tests build meshes over all 8.

launch/test.sh runs the suite on 2 pytest-xdist workers, a file at a time per worker (`--dist loadfile`: a file's
module fixtures are built once). Workers take files in collection order, so the files holding `slow` tests are
collected first: the longest work starts first and the short files fill in at the end, instead of one worker
starting a long file while the other has nothing left.
"""

import os

# XLA:CPU at LLVM's optimisation level 0: the suite's tiny programs spend far more time compiling than running
# (tests/subprocess_env.py; the processes tests start keep it): the same programs, less optimised.
os.environ.setdefault("EVOLVER_TEST_XLA_FLAGS", "--xla_backend_optimization_level=0")
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 " + os.environ["EVOLVER_TEST_XLA_FLAGS"])
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_ROOT, ".cache", "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: slower tests; still run in CI")


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
  slow_files = {item.path for item in items if item.get_closest_marker("slow")}
  slow_count = {path: sum(1 for item in items if item.path == path and item.get_closest_marker("slow"))
                for path in slow_files}
  # Sorted by count, then name: every xdist worker must collect the same order (set order varies by process).
  order = {path: rank for rank, path in enumerate(sorted(slow_files, key=lambda p: (-slow_count[p], str(p))))}
  items.sort(key=lambda item: order.get(item.path, len(order)))  # stable: the rest keep their order


# Seconds per test file (set-up, call and tear-down of its tests, module fixtures included), summed from the
# reports the controller receives (xdist workers' too): `--durations` names tests, this names the files, the unit a
# worker takes (`--dist loadfile`). Printed at the end with -v or --durations.
_FILE_SECONDS: dict[str, float] = {}


def pytest_runtest_logreport(report):
  path = report.nodeid.split("::", 1)[0]
  _FILE_SECONDS[path] = _FILE_SECONDS.get(path, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter, exitstatus, config):  # pylint: disable=unused-argument
  if not _FILE_SECONDS or not (config.getoption("durations") or config.getoption("verbose") > 0):
    return
  total = sum(_FILE_SECONDS.values())
  terminalreporter.write_sep("=", f"slowest test files ({total:.0f} s of tests in all)")
  for path, seconds in sorted(_FILE_SECONDS.items(), key=lambda kv: -kv[1])[:20]:
    terminalreporter.write_line(f"{seconds:8.1f}s  {path}")
