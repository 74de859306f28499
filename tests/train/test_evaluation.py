"""Evaluation: summaries from trajectories, `evaluate` with the tiny policy, and `launch.eval` end to end.

  python -m pytest tests/train/test_evaluation.py -q
"""

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from evolver import envs
from evolver.models import load_hf, save_hf
from evolver.models.tokenizer import load_tokenizer
from evolver.rollout import Rollout, RolloutEngine
from evolver.train.evaluation import (evaluate, flatten_metrics, params_digest, summarize, summarize_env,
                                      write_eval_results)
from tests.rollout.tiny_policy import tiny_model, tiny_sampler
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rollout(env, group, sample, success=False, reward=0.0, turns=1, failed=False):
  return Rollout(item_id=f"{env}_{group}", messages=[], env=env, task_index=group, group=group, sample=sample,
                 success=success, reward=reward, turns=turns, failed=failed, error="boom" if failed else None,
                 finish_reason="error" if failed else "done")


def test_summaries_avg_and_best_at_k():
  # Three tasks x 2 samples: task 0 solved once, task 1 never, task 2's samples both failed (env error).
  trajs = [_rollout("maze", 0, 0, True, 1.0, 3), _rollout("maze", 0, 1, False, 0.2, 5),
           _rollout("maze", 1, 0, False, 0.0, 4), _rollout("maze", 1, 1, False, 0.4, 4),
           _rollout("maze", 2, 0, failed=True), _rollout("maze", 2, 1, failed=True)]
  s = summarize_env(trajs)
  assert (s["num_tasks"], s["num_episodes"], s["num_failed"]) == (3, 6, 2)
  assert s["success"] == pytest.approx(1 / 4)          # avg@2 over the 4 completed episodes
  assert s["best_success"] == pytest.approx(1 / 2)     # best@2 over the 2 tasks with a completed episode
  assert s["reward"] == pytest.approx(1.6 / 4)
  assert s["best_reward"] == pytest.approx((1.0 + 0.4) / 2)
  assert s["turns"] == pytest.approx(4.0)
  assert s["errors"] == ["boom"]
  both = summarize(trajs + [_rollout("sql", 0, 0, True, 1.0, 2)], ["maze", "sql"], {"maze": "m1", "sql": "s1"})
  assert both["envs"]["sql"]["success"] == 1.0 and both["envs"]["maze"]["version"] == "m1"
  assert both["overall"]["success"] == pytest.approx((0.25 + 1.0) / 2)  # each env counts the same
  assert both["overall"]["num_failed"] == 2 and both["overall"]["num_episodes"] == 7


class SolvesEvenTasks:
  """A real wordle env that reports success at the first step of even-indexed tasks: success counts that
  are not all zero, whatever the random policy types."""

  def __init__(self):
    self._env = envs.make("wordle")
    self.name, self.version, self.max_rounds = "wordle", self._env.version, 2
    self._index = -1

  def instruction(self):
    return self._env.instruction()

  def num_tasks(self, split):
    return self._env.num_tasks(split)

  def reset(self, index, split="train"):
    self._index = index
    return self._env.reset(index, split)

  def step(self, text):
    observation, reward, done, info = self._env.step(text)
    if self._index % 2 == 0:
      return "Solved.", 1.0, True, {"success": True}
    return observation, reward, done, info

  def expert_action(self):
    return self._env.expert_action()


@pytest.fixture(scope="module")
def tok():
  return load_tokenizer()


@pytest.fixture(scope="module")
def sampler(tok):
  return tiny_sampler(tiny_model(tok))


def test_evaluate_counts_match_trajectories(sampler, tok, tmp_path):
  factory = lambda name: SolvesEvenTasks() if name == "wordle" else envs.make(name)
  results = evaluate(sampler, tok, ["wordle", "maze"], split="eval", num_tasks=3, max_new_tokens=24,
                     max_rounds=2, env_factory=factory)
  assert results["split"] == "eval" and results["num_samples"] == 1 and results["temperature"] == 0.0
  wordle, maze = results["envs"]["wordle"], results["envs"]["maze"]
  assert wordle["num_tasks"] == maze["num_tasks"] == 3 and wordle["num_failed"] == 0
  assert wordle["success"] == pytest.approx(2 / 3) and wordle["best_success"] == pytest.approx(2 / 3)
  assert wordle["version"] == envs.make("wordle").version
  episodes = results["episodes"]
  assert [(e["env"], e["index"]) for e in episodes] == [("wordle", i) for i in range(3)] + [("maze", i) for i in range(3)]
  for name in ("wordle", "maze"):
    mine = [e for e in episodes if e["env"] == name]
    assert results["envs"][name]["success"] == pytest.approx(sum(e["success"] for e in mine) / 3)
    assert results["envs"][name]["turns"] == pytest.approx(sum(e["turns"] for e in mine) / 3)
  assert [e["turns"] for e in episodes[:3]] == [1, 2, 1]  # solved tasks end after their first turn
  assert results["overall"]["success"] == pytest.approx((wordle["success"] + maze["success"]) / 2)
  flat = flatten_metrics(results, "val")
  assert flat["val/wordle/success"] == pytest.approx(2 / 3)
  assert {"val/maze/reward", "val/maze/turns", "val/maze/num_failed", "val/overall/success"} <= set(flat)
  assert all(isinstance(v, float) for v in flat.values())
  path = write_eval_results(str(tmp_path), results)
  assert path == os.path.join(str(tmp_path), "eval_results.json")
  with open(path) as f:
    assert json.load(f)["envs"]["wordle"]["success"] == pytest.approx(2 / 3)


def test_evaluate_k_samples_and_explicit_indices(sampler, tok):
  with RolloutEngine(sampler, tok) as engine:  # a kept engine, as a training loop would hold one
    results = evaluate(engine, None, ["maze"], split="train", indices={"maze": [5, 7]}, num_samples=2,
                       max_new_tokens=24, max_rounds=2, keep_episodes=True)
  assert results["temperature"] == 1.0 and results["envs"]["maze"]["num_episodes"] == 4
  assert sorted({(e["index"], e["sample"]) for e in results["episodes"]}) == [(5, 0), (5, 1), (7, 0), (7, 1)]
  with pytest.raises(ValueError, match="out of range"):
    evaluate(sampler, tok, ["maze"], split="eval", indices=[10**6])
  with pytest.raises(ValueError, match="set a temperature"):
    evaluate(sampler, tok, ["maze"], num_samples=3, temperature=0.0)


def test_launch_eval_writes_next_to_the_run_unless_told():
  from launch import eval as eval_cli
  assert eval_cli.results_path(None, os.path.join("runs", "bc")) == os.path.join("runs", "bc", "eval_results.json")
  assert eval_cli.results_path("elsewhere.json", os.path.join("runs", "bc")) == "elsewhere.json"
  assert eval_cli.results_path(None, None) == "eval_results.json"  # --hf_checkpoint without --out


def test_launch_eval_end_to_end(tok, tmp_path):
  checkpoint = str(tmp_path / "ckpt")
  save_hf(tiny_model(tok), checkpoint)
  tok.save_pretrained(checkpoint)
  out = str(tmp_path / "out" / "eval_results.json")
  env = one_device_env(base={**os.environ, "JAX_PLATFORMS": "cpu"})  # one CPU device is all it needs
  proc = subprocess.run(
      [sys.executable, "-m", "launch.eval", "--hf_checkpoint", checkpoint, "--envs", "maze,wordle",
       "--split", "eval", "--num_tasks", "3", "--max_new_tokens", "16", "--max_rounds", "2", "--out", out],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "overall" in proc.stdout and "wrote" in proc.stdout
  with open(out) as f:
    results = json.load(f)
  assert set(results["envs"]) == {"maze", "wordle"}
  for name, r in results["envs"].items():
    assert r["num_tasks"] == 3 and r["num_episodes"] == 3 and r["num_failed"] == 0
    assert r["version"] == envs.make(name).version
    assert 1 <= r["turns"] <= 2
  assert results["policy"] == {"hf_checkpoint": checkpoint,
                               "params_digest": params_digest(nnx.state(load_hf(checkpoint), nnx.Param))}
  assert len(results["episodes"]) == 6


@pytest.mark.slow  # two launch.eval processes: ~45 s on 2 CPU cores
def test_launch_eval_with_greedy_then_baseline(tmp_path):
  """The shipped checkpoint evaluated twice alike (2 maze tasks, avg@2 and greedy): the same episodes, so a paired
  difference of 0 with the interval [0, 0]; the first run's files are the ones the sweep report reads."""
  from launch import sweep_report
  checkpoint = os.path.join(ROOT, "evolver", "assets", "checkpoints", "bc_tiny")
  env = one_device_env(base={**os.environ, "JAX_PLATFORMS": "cpu"})
  common = [sys.executable, "-m", "launch.eval", "--hf_checkpoint", checkpoint, "--envs", "maze", "--num_tasks", "2",
            "--num_samples", "2", "--with_greedy", "--max_new_tokens", "16", "--max_rounds", "2"]
  first, second = str(tmp_path / "first"), str(tmp_path / "second")
  for command in (common + ["--out", first], common + ["--out", second, "--baseline", first]):
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
  assert "avg@2:" in proc.stdout and "greedy:" in proc.stdout and "this minus the baseline" in proc.stdout
  assert sorted(os.listdir(first)) == [sweep_report.EVAL_FILE, sweep_report.SAMPLES_FILE]

  def read(*parts):
    with open(os.path.join(*parts)) as f:
      return json.load(f)

  greedy, sampled = read(first, sweep_report.EVAL_FILE), read(first, sweep_report.SAMPLES_FILE)
  assert (greedy["num_samples"], greedy["temperature"]) == (1, 0.0)
  assert (sampled["num_samples"], sampled["temperature"], sampled["seed"]) == (2, 1.0, 0)
  for name in (sweep_report.EVAL_FILE, sweep_report.SAMPLES_FILE):  # the same episodes: paired by (env, index, sample)
    assert read(first, name)["episodes"] == read(second, name)["episodes"]
  paired = read(second, "paired.json")
  assert paired["baseline"] == first and set(paired) >= {"greedy", "sampled"}
  for kind, pairs in (("greedy", 2), ("sampled", 4)):
    for e in (paired[kind]["envs"]["maze"], paired[kind]["overall"]):
      assert (e["diff"], e["lo"], e["hi"], e["pairs"], e["tasks"]) == (0.0, 0.0, 0.0, pairs, 2)


def test_params_digest_is_the_weights_identity(tokenizer):
  params = nnx.state(tiny_model(tokenizer), nnx.Param)
  digest = params_digest(params)
  assert len(digest) == 16 and params_digest(nnx.state(tiny_model(tokenizer), nnx.Param)) == digest
  leaves, treedef = jax.tree_util.tree_flatten(params)
  changed = jax.tree_util.tree_unflatten(treedef, [leaves[0].at[(0,) * leaves[0].ndim].add(1e-3), *leaves[1:]])
  as_bf16 = jax.tree_util.tree_map(lambda x: x.astype(jnp.bfloat16), params)
  assert len({digest, params_digest(changed), params_digest(as_bf16)}) == 3
