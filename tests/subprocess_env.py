"""The environment of the processes tests start (`launch.train`, `launch.eval`, ...): one CPU device, as users run
them, with the tests' XLA flags kept.

tests/conftest.py sets `EVOLVER_TEST_XLA_FLAGS` (LLVM's optimisation level 0 for XLA:CPU: the suite's tiny
programs spend far more time compiling than running; measured on tests/models/test_sampler.py, 126 -> 81 CPU
seconds) and puts it in `XLA_FLAGS` beside the 8 fake devices of the pytest process. A process a test starts
gets those flags without the fake devices, or with the device count it asks for.
"""

import os

TEST_XLA_FLAGS_ENV = "EVOLVER_TEST_XLA_FLAGS"


def subprocess_xla_flags(devices: int | None = None) -> str:
  """XLA_FLAGS for a test's process: the tests' flags, and `devices` fake CPU devices when given."""
  flags = os.environ.get(TEST_XLA_FLAGS_ENV, "").split()
  if devices is not None:
    flags.insert(0, f"--xla_force_host_platform_device_count={devices}")
  return " ".join(flags)


def one_device_env(devices: int | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
  """`base` (default: this process's environment) with XLA_FLAGS set to `subprocess_xla_flags(devices)`."""
  env = dict(os.environ if base is None else base)
  env["XLA_FLAGS"] = subprocess_xla_flags(devices)
  return env
