"""Test-wide set-up: 8 fake CPU devices and JAX's persistent compilation cache.

Both must be set before JAX is imported anywhere, so they live here. Single-device tests pin themselves to
`jax.devices()[0]`; sharding tests build meshes over all 8.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(_ROOT, ".cache", "jax"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def pytest_configure(config):
  config.addinivalue_line("markers", "slow: slower tests; still run in CI")
