"""Benchmark suites for `python -m launch.benchmark --suite NAME`.

Each suite is a module here with `run(args: list[str]) -> dict`: it prints a readable table and returns the
result dict (at least `suite`, `ours`, `peer`, `unit`, `speedup`), which `launch.benchmark` prints as the
last line, as JSON.
"""
