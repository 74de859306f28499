"""The env benchmark suite runs end to end and reports every field (speed goals are judged from
`python -m launch.benchmark --suite env`, never asserted in tests)."""

import pytest

from launch.benchmarks import env as env_benchmark


@pytest.mark.slow
def test_env_benchmark_reports_every_field(capsys):
  result = env_benchmark.run(["--seconds", "1"])
  table = capsys.readouterr().out
  assert "load generator: asyncio" in table and "http" in table
  assert result["suite"] == "env" and result["unit"] == "steps/s"
  assert result["peer"] is None and result["speedup"] is None
  assert result["ours"] == result["http_16"]
  assert result["in_process"] > result["http_1"] > 0
  assert result["http_16"] > 0
