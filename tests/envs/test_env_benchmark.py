"""The env benchmark suite runs end to end and meets its goal: >= 2,000 steps/s with 16 HTTP clients."""

import pytest

from launch.benchmarks import env as env_benchmark


@pytest.mark.slow
def test_env_benchmark_reports_and_meets_the_goal(capsys):
  result = env_benchmark.run(["--seconds", "1"])
  table = capsys.readouterr().out
  assert "load generator: asyncio" in table and "http" in table
  assert result["suite"] == "env" and result["unit"] == "steps/s"
  assert result["peer"] is None and result["speedup"] is None
  assert result["ours"] == result["http_16"]
  assert result["in_process"] > result["http_1"] > 0
  assert result["http_16"] >= 2000
