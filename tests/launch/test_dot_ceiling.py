"""launch.benchmarks.dot_ceiling at a tiny shape: both sides run in their own processes and the ratio is the peer's
seconds over ours (the figures themselves are measured by `launch.benchmark --suite smollm2`, never asserted).

  python -m pytest tests/launch/test_dot_ceiling.py -q
"""

import math

import pytest

from launch import benchmark
from launch.benchmarks import dot_ceiling


def test_the_ceiling_times_both_sides_on_the_same_chain(capsys):
  result = dot_ceiling.compare([4], hidden=8, intermediate=16, layers=2, repeats=1, torch_threads=(1,), title="tiny")
  assert set(result) == {"dot_ratio_4", "dot_gflops_ours_4", "dot_gflops_peer_4"}
  assert all(v > 0 and math.isfinite(v) for v in result.values())
  # GFLOP/s are the same work over each side's seconds, so their ratio is the seconds' ratio.
  assert math.isclose(result["dot_ratio_4"], result["dot_gflops_ours_4"] / result["dot_gflops_peer_4"])
  out = capsys.readouterr().out
  assert "Matmul ceiling (tiny MLP chain: 2 x [rows, 8] @ [8, 16] @ [16, 8], float32)" in out
  assert "rows 4: the kernels' speedup" in out


def test_a_chain_is_the_flops_of_its_two_matmuls_per_layer():
  assert dot_ceiling._flops(rows=32, hidden=576, intermediate=1536, layers=30) == 2 * 2 * 32 * 576 * 1536 * 30
  assert dot_ceiling._steps_for(32) == 200 and dot_ceiling._steps_for(2048) == 3


def test_it_is_a_suite_and_the_helpers_are_not():
  suites = benchmark.available_suites()
  assert "dot_ceiling" in suites and "smollm2" in suites and "common" not in suites
  with pytest.raises(SystemExit):
    benchmark.main(["--suite", "common"])


def test_results_name_the_machine_they_ran_on():
  m = benchmark.machine()
  assert m["cpu"] and m["cores"] >= 1 and m["vector_isa"] in ("avx512f", "avx2", "avx", "neon", "asimd", "unknown")
