"""The rollout benchmark suite at a very small size: both sides run, the JSON dict is complete and sane.

  python -m pytest tests/rollout/test_rollout_benchmark.py -q
"""

import math

import pytest

from launch.benchmarks import rollout


def test_tiny_default_config_is_tiny_gin():
  config = rollout.tiny_default_config()
  assert (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads,
          config.intermediate_size, config.tie_embeddings, config.qkv_bias) == (2432, 192, 4, 4, 2, 512, True, True)


def test_workload_covers_every_env():
  from evolver import envs
  workload = rollout.make_workload(episodes_per_env=2, max_rounds=3, max_new_tokens=16)
  assert workload.tasks == tuple((name, i) for name in envs.names() for i in (0, 1))
  assert rollout.Workload.from_json(workload.to_json()) == workload


@pytest.mark.slow
def test_suite_runs_small_and_reports_every_field(capsys):
  result = rollout.run(["--envs", "maze,wordle", "--episodes_per_env", "1", "--max_rounds", "2",
                        "--max_new_tokens", "8", "--repeats", "1", "--torch_threads", "1",
                        "--jax_settings", "all cores", "--inline"])
  for key in ("suite", "ours", "peer", "unit", "speedup", "speedup_self", "ours_reprefill"):
    assert key in result, key
  assert result["suite"] == "rollout" and result["unit"] == "episodes/s"
  for key in ("ours", "peer", "speedup", "speedup_self", "ours_reprefill"):
    assert result[key] > 0 and math.isfinite(result[key]), (key, result[key])
  assert math.isclose(result["speedup"], result["ours"] / result["peer"])
  assert math.isclose(result["speedup_self"], result["ours"] / result["ours_reprefill"])
  assert result["episodes"] == 2 and result["failed_ours"] == 0
  # Random text never solves a task in 2 rounds: both sides take every turn, each cut at max_new_tokens
  # unless it stops on the end-of-turn token.
  assert result["turns_ours"] == result["turns_peer"] == 4
  assert 0 < result["tokens_ours"] <= 4 * 8 and 0 < result["tokens_peer"] <= 4 * 8
  # The engine's two modes sample the same greedy turns (tests/rollout/test_rollout_engine.py asserts it).
  assert result["agreement_self"]["episodes_identical"] == 1.0
  for key in ("prefill_s", "decode_s", "env_s", "template_s"):
    assert result["profile_ours"][key] >= 0 and result["profile_peer"][key] >= 0
  out = capsys.readouterr().out
  assert "episodes/s" in out and "Where the time goes" in out
