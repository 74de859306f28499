"""The retrieval benchmark suite runs end to end at tiny size and reports every field (its goals are judged from
`python -m launch.benchmark --suite retrieval`, never asserted in tests), and its recall floor can fail it."""

import json

import pytest

from launch import benchmark
from launch.benchmarks import retrieval

FIELDS = ("suite", "ours", "peer", "unit", "speedup", "recall_at_10", "qps_speedup", "upsert_1k_s", "build_s",
          "index_mb", "resident_mb_at_1m", "resident_at_1m_measured", "recall_floor", "floor_failures", "n", "dim",
          "params", "goals", "sizes")
SIZE_FIELDS = ("n", "build_s", "index_mb", "build_peak_mb", "bytes_per_vector", "exact_qps", "scann_qps",
               "qps_speedup", "recall_at_10", "upsert_1k_s", "leaves", "leaves_to_search")


def test_retrieval_benchmark_reports_every_field(capsys):
  assert "retrieval" in benchmark.available_suites()
  result = benchmark.main(["--suite", "retrieval", "--small"])
  out = capsys.readouterr().out
  assert "retrieval benchmark" in out and "recall@10" in out
  assert json.loads(out.strip().splitlines()[-1]) == result
  missing = [k for k in FIELDS if k not in result]
  assert not missing
  assert result["suite"] == "retrieval" and result["unit"] == "queries/s" and result["small"] is True
  assert result["speedup"] == result["qps_speedup"] == round(result["ours"] / result["peer"], 1)
  assert 0.0 <= result["recall_at_10"] <= 1.0 and result["upsert_1k_s"] > 0
  assert [row["n"] for row in result["sizes"]] == [2000, 4000]
  assert result["recall_floor"] == 0.95 and result["floor_failures"] == [] and "recall floor 0.95: met" in out
  assert result["resident_mb_at_1m"] is None and "resident size at 1,000,000 x 384: not stated" in out
  for row in result["sizes"]:
    assert not [k for k in SIZE_FIELDS if k not in row]
    assert row["exact_qps"] > 0 and row["scann_qps"] > 0


def test_a_recall_under_the_floor_exits_non_zero(capsys):
  with pytest.raises(SystemExit) as exit_:
    benchmark.main(["--suite", "retrieval", "--small", "--recall_floor", "1.01"])
  assert exit_.value.code not in (0, None) and "recall floor 1.01 not met" in str(exit_.value.code)
  out = capsys.readouterr().out
  result = json.loads(out.strip().splitlines()[-1])  # the figures are still printed
  assert result["recall_floor"] == 1.01 and len(result["floor_failures"]) == 2
  assert "recall floor 1.01: recall@10" in out


def test_the_resident_size_at_1m_is_measured_there_or_extrapolated():
  row = {"n": 100_000, "index_mb": 180.0, "bytes_per_vector": 1887}
  stated = retrieval.resident_at_stated_size([row], 384)
  assert (stated["mb"], stated["measured"]) == (round(1887 * 1e6 / 2**20, 1), False)
  assert "extrapolated from n=100,000" in stated["line"]
  stated = retrieval.resident_at_stated_size([row, {"n": 1_000_000, "index_mb": 1709.0, "bytes_per_vector": 1792}],
                                             384)
  assert (stated["mb"], stated["measured"]) == (1709.0, True) and "1,709 MiB measured" in stated["line"]
