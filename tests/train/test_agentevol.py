"""AgentEvol: reward weights and merge strategies on hand-made trajectories; and `launch.train` with
runs/agentevol.gin end to end (global steps, every phase from the base model, kill + restart inside a phase with
the exploration reused).

  python -m pytest tests/train/test_agentevol.py -q
"""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import optax
import pytest
from flax import nnx

from evolver.models.decoder import make_model
from evolver.train import agentevol
from evolver.train import checkpoints as ckpt_lib
from evolver.train import explorations
from evolver.train import metrics as metrics_lib
from evolver.train.trainer import KILL_DURING_SAVE_ENV
from tests.train.helpers import traj
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TRAIN_STEPS = 4
ITERATIONS = 2
CURRICULUM = 1  # BC's first step trains on windows; learning phases restart from its end, at local step 2
SMALL_MODEL = ["ModelConfig.hidden_size = 64", "ModelConfig.num_layers = 2", "ModelConfig.intermediate_size = 128"]
# A small model, two envs, tiny slices and short episodes: every run here takes seconds.
SMALL = SMALL_MODEL + [
    "train_agentevol.envs = ['sql', 'wordle']", "TaskSlices.expert_count = 16",
    "TaskSlices.val_start = 100", "TaskSlices.val_count = 1", "TaskSlices.explore_start = 110",
    "TaskSlices.explore_count = 2", "train_agentevol.samples_per_task = 2",
    f"train_agentevol.num_iterations = {ITERATIONS}", "train_agentevol.batch_size = 4",
    "train_agentevol.buckets = (512,)", "train_agentevol.max_new_tokens = 16", "train_agentevol.max_rounds = 2",
    "LoopConfig.eval_tasks = 1", "LoopConfig.eval_max_new_tokens = 16", "LoopConfig.eval_max_rounds = 2",
    "TrainerConfig.checkpoint_every = 2", "make_optimizer.learning_rate = 1e-2",
    "make_optimizer.warmup_steps = 2", f"train_agentevol.curriculum_steps = {CURRICULUM}",
    "train_agentevol.window_batch_size = 4", "train_agentevol.window_buckets = (512,)",
]


def logged_steps(phase):
  """The global steps phase `phase` trains: BC all of its own, learning phases those after the curriculum."""
  first = 1 if phase == 0 else CURRICULUM + 1
  return [phase * TRAIN_STEPS + s for s in range(first, TRAIN_STEPS + 1)]


# ----------------------------------------------------------------------------------------------------------
# Pure functions on hand-made trajectories.
# ----------------------------------------------------------------------------------------------------------


EXPERT = [traj(0, ["a"], True), traj(1, ["b"], True), traj(2, ["c"], True)]
ITER_1 = [traj(5, ["x", "y"], True), traj(5, ["x", "y"], True),      # a success sampled twice
          traj(5, ["z"], True, reward=0.8),                           # another success (babyai-like reward)
          traj(5, ["w"], False, reward=0.5),                          # a partial failure
          traj(6, ["q"], False), traj(6, ["x", "y"], True, failed=True)]  # an env error never trains
ITER_2 = [traj(6, ["r"], True), traj(5, ["x", "y"], True)]            # new; a repeat of iteration 1's


def test_reward_weights_binary_and_graded():
  binary = agentevol.reward_weighted(ITER_1)
  assert [(t.task_index, t.weight) for t in binary] == [(5, 1.0), (5, 1.0), (5, 1.0)]
  graded = agentevol.reward_weighted(ITER_1, binary_reward=False)
  assert [t.weight for t in graded] == [1.0, 1.0, 0.8, 0.5]
  assert all(isinstance(t, agentevol.WeightedTrajectory) and not t.failed for t in graded)


@pytest.mark.parametrize("merge, explored, expected_new, expected_dups", [
    ("expert+current", [ITER_1], 2, 1),           # 3 successes, one a duplicate
    ("expert+current", [ITER_1, ITER_2], 2, 0),   # iteration 2's own two successes
    ("accumulate", [ITER_1, ITER_2], 3, 2),       # 5 successes across iterations, 2 duplicates
    ("current", [ITER_1, ITER_2], 2, 0),
])
def test_merge_strategies_sizes(merge, explored, expected_new, expected_dups):
  sources, counts = agentevol.learning_sources(EXPERT, explored, merge)
  assert counts == {"explored_examples": expected_new, "explored_duplicates": expected_dups}
  has_expert = merge != "current"
  assert len(sources) == (2 if has_expert else 1)
  if has_expert:
    assert sources[0] is EXPERT
  assert len(sources[-1]) == expected_new


def test_bc_phase_is_the_expert_set_and_current_needs_data():
  for merge in agentevol.MERGE_STRATEGIES:
    assert agentevol.learning_sources(EXPERT, [], merge)[0] == [EXPERT]
  with pytest.raises(ValueError, match="nothing to learn"):
    agentevol.learning_sources(EXPERT, [[traj(5, ["x"], False)]], "current")
  with pytest.raises(ValueError, match="merge must be one of"):
    agentevol.learning_sources(EXPERT, [ITER_1], "everything")


def test_merged_batches_carry_the_weights():
  from evolver.data import batching
  from evolver.models.tokenizer import load_tokenizer
  tokenizer = load_tokenizer()
  sources, _ = agentevol.learning_sources(EXPERT + [traj(3, ["d"], False)], [ITER_1], "expert+current",
                                          binary_reward=False)
  it = batching.BatchIterator(batching.ConcatSource(*sources),
                              lambda t: agentevol.tokenize_weighted(t, tokenizer), batch_size=16,
                              pad_id=batching.pad_id_of(tokenizer), buckets=(512,), shuffle=False,
                              keep_fn=agentevol.keep_for_training)
  assert (it.num_examples, it.num_filtered) == (3 + 3, 1)  # the expert's failure is left out, as in BC
  weights = next(it)["weights"]
  np.testing.assert_allclose(sorted(weights[weights > 0]), [0.5, 0.8, 1.0, 1.0, 1.0, 1.0])


def test_resume_position():
  assert agentevol.resume_position(0, {}, 4) == (0, 0)
  assert agentevol.resume_position(6, {"phase": 1, "train_steps": 4}, 4) == (1, 2)
  assert agentevol.resume_position(8, {"phase": 1, "train_steps": 4}, 4) == (2, 0)  # phase 1 finished
  with pytest.raises(ValueError, match="TRAIN_STEPS"):
    agentevol.resume_position(8, {"phase": 1, "train_steps": 5}, 4)
  with pytest.raises(ValueError, match="not come from an AgentEvol run"):
    agentevol.resume_position(8, {"data": {}}, 4)


def train(model_dir, *extra_bindings, env=None, check=True):
  bindings = [f"MODEL_DIR = '{model_dir}'", f"TRAIN_STEPS = {TRAIN_STEPS}", *SMALL, *extra_bindings]
  cmd = [sys.executable, "-m", "launch.train", "--gin_file=gin_configs/runs/agentevol.gin"]
  cmd += [f"--gin_bindings={b}" for b in bindings]
  run_env = one_device_env()  # one CPU device, as users run it
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(run_env, **(env or {})),
                        timeout=600)
  if check and proc.returncode != 0:
    raise AssertionError(f"launch.train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return proc


def train_rows(model_dir):
  rows = [r for r in metrics_lib.read_metrics(str(model_dir)) if "loss" in r]
  steps = [r["step"] for r in rows]
  assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
  return {r["step"]: r for r in rows}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp("agentevol") / "run"
  proc = train(model_dir, "LoopConfig.eval_last = True")
  return model_dir, proc


def test_agentevol_runs_all_phases_with_global_steps(uninterrupted):
  model_dir, proc = uninterrupted
  rows = train_rows(model_dir)
  total = (ITERATIONS + 1) * TRAIN_STEPS
  assert sorted(rows) == [s for p in range(ITERATIONS + 1) for s in logged_steps(p)]
  for step, row in rows.items():
    assert row["phase"] == (step - 1) // TRAIN_STEPS and row["phase_step"] == (step - 1) % TRAIN_STEPS + 1
    assert row["curriculum"] == float(step <= CURRICULUM), step
  phase_ends = [TRAIN_STEPS * (p + 1) for p in range(ITERATIONS + 1)]
  assert [s for s, r in rows.items() if "val/overall/success" in r] == phase_ends
  for m in range(1, ITERATIONS + 1):
    first = rows[logged_steps(m)[0]]
    assert first["explore/episodes"] == 2 * 2 * 2  # envs x tasks x K
    assert "explore/success" in first and "explore/kept" in first
    json_path, npz_path = explorations.exploration_paths(str(model_dir), m)
    assert os.path.exists(json_path) and os.path.exists(npz_path)
  assert ckpt_lib.Checkpointer(str(model_dir), async_save=False).latest_step() == total
  assert os.path.isdir(ckpt_lib.checkpoint_dir(str(model_dir), ckpt_lib.BEST_SUBDIR))
  results = json.loads((model_dir / "eval_results.json").read_text())
  assert [h["step"] for h in results["phases"]] == phase_ends
  # Held out: every phase's end (BC = before self-evolution), and the val-selected policy among them.
  kept = ckpt_lib.Checkpointer(str(model_dir), async_save=False, subdir=agentevol.PHASES_SUBDIR).all_steps()
  assert sorted(kept) == phase_ends
  by_phase = results["by_phase"]
  assert list(by_phase) == ["bc", "iteration 1", "iteration 2"]
  assert [r["policy_step"] for r in by_phase.values()] == phase_ends
  assert all(r["envs"]["sql"]["num_tasks"] == 1 for r in by_phase.values())
  # Every phase keeps its episodes, the same tasks in the same order: paired across phases.
  keys = [[(e["env"], e["index"], e["sample"]) for e in r["episodes"]] for r in by_phase.values()]
  assert keys[0] and all(k == keys[0] for k in keys)
  selected = [r for r in by_phase.values() if r["policy_step"] == results["policy_step"]]
  assert len(selected) == 1 and selected[0]["envs"] == results["envs"]
  # The last policy (LoopConfig.eval_last): the last phase's own held-out figures, reused, not evaluated again.
  last = json.loads((model_dir / "eval_results_last.json").read_text())
  assert last["policy_step"] == total and last["envs"] == by_phase["iteration 2"]["envs"]
  assert last["episodes"] == by_phase["iteration 2"]["episodes"]
  assert "held-out success" in proc.stdout and "iteration 2" in proc.stdout and "selected" in proc.stdout


def test_every_learning_phase_restarts_from_the_curriculum_end(uninterrupted):
  model_dir, _ = uninterrupted
  rows = train_rows(model_dir)
  base_steps = ckpt_lib.Checkpointer(str(model_dir), async_save=False, subdir=agentevol.BASE_SUBDIR).all_steps()
  assert base_steps == [CURRICULUM]
  curriculum_end = rows[CURRICULUM]["param_norm"]  # `param_norm`: after the step's update
  for p in range(1, ITERATIONS + 1):
    assert rows[logged_steps(p)[0]]["start_param_norm"] == pytest.approx(curriculum_end, rel=1e-6), p
  for p in range(ITERATIONS):
    # Training moved the weights, so continuing from the previous phase would start elsewhere.
    assert abs(rows[(p + 1) * TRAIN_STEPS]["param_norm"] - curriculum_end) > 1e-3 * curriculum_end


@pytest.mark.slow
def test_without_curriculum_every_phase_starts_from_the_base_model(tmp_path):
  model_dir = tmp_path / "run"
  train(model_dir, "train_agentevol.curriculum_steps = 0", "train_agentevol.num_iterations = 1",
        "LoopConfig.eval_tasks = 0", "train_agentevol.context_loss_weight = 0.0")
  rows = train_rows(model_dir)
  assert sorted(rows) == list(range(1, 2 * TRAIN_STEPS + 1))
  config = ckpt_lib.restore_model(str(model_dir))[0].config  # the run's architecture, as its checkpoints say
  assert config.hidden_size == 64
  base_norm = float(optax.tree.norm(nnx.split(make_model(config, seed=0))[1]))  # a fresh init by SEED
  for p in range(2):
    assert rows[p * TRAIN_STEPS + 1]["start_param_norm"] == pytest.approx(base_norm, rel=1e-6), p
  assert abs(rows[TRAIN_STEPS]["param_norm"] - base_norm) > 1e-3 * base_norm
  assert not os.path.exists(os.path.join(model_dir, agentevol.BASE_SUBDIR))


def test_whole_episodes_train_their_observations_at_the_gin_context_weight(uninterrupted, tmp_path):
  # agentevol.gin's context_loss_weight (0.25, as bc.gin's): the first whole-episode batch after the curriculum
  # is BC data's first batch, the same one a run without curriculum and without context loss starts with, so
  # their loss-token counts differ by a quarter of that batch's observation tokens.
  model_dir = tmp_path / "actions_only"
  with ThreadPoolExecutor(2) as pool:  # two independent runs, side by side
    bad = pool.submit(train, tmp_path / "bad", "train_agentevol.context_loss_weight = 1.5", check=False)
    pool.submit(train, model_dir, "train_agentevol.curriculum_steps = 0", "train_agentevol.num_iterations = 0",
                "LoopConfig.eval_tasks = 0", "train_agentevol.context_loss_weight = 0.0").result()
    actions = train_rows(model_dir)[1]["num_tokens"]
    with_context = train_rows(uninterrupted[0])[CURRICULUM + 1]["num_tokens"]
    context_tokens = (with_context - actions) / 0.25
    assert context_tokens >= 1 and context_tokens == pytest.approx(round(context_tokens), abs=1e-3)
    proc = bad.result()
    assert proc.returncode != 0 and "context_loss_weight must be in [0, 1], got 1.5" in proc.stderr


def test_curriculum_must_leave_steps_and_match_on_resume(uninterrupted, tmp_path):
  model_dir = tmp_path / "b"
  shutil.copytree(uninterrupted[0], model_dir)
  with ThreadPoolExecutor(2) as pool:  # two independent runs that must fail, side by side
    leaves_none = pool.submit(train, tmp_path / "a", f"train_agentevol.curriculum_steps = {TRAIN_STEPS}", check=False)
    mismatch = pool.submit(train, model_dir, "train_agentevol.curriculum_steps = 2", check=False)
    proc = leaves_none.result()
    assert proc.returncode != 0 and "curriculum_steps (4) must be in [0, TRAIN_STEPS=4)" in proc.stderr
    proc = mismatch.result()
    assert proc.returncode != 0 and "made with curriculum_steps=1" in proc.stderr


@pytest.mark.slow
def test_kill_and_restart_resumes_inside_the_phase(uninterrupted, tmp_path):
  reference_dir, _ = uninterrupted
  model_dir = tmp_path / "killed"
  every_step = "TrainerConfig.checkpoint_every = 1"

  def killed_at(step):
    proc = train(model_dir, every_step, env={KILL_DURING_SAVE_ENV: str(step)}, check=False)
    assert proc.returncode == -9, proc.stderr[-2000:]
    complete = max(ckpt_lib.Checkpointer(str(model_dir), async_save=False).all_steps())
    assert complete in (step - 1, step)
    return proc, complete

  # Killed while saving BC's last step, after that step's best-on-val policy was saved: the restart redoes
  # the step and must not trip over the best checkpoint that already exists.
  _, first = killed_at(TRAIN_STEPS)
  # Killed again inside iteration 1 (local step 3), after its exploration.
  proc, complete = killed_at(TRAIN_STEPS + 3)
  where = "bc, local step 3" if first == TRAIN_STEPS - 1 else "iteration 1, local step 0"
  assert f"resuming at step {first}" in proc.stdout and f"step {first} is {where}" in proc.stdout
  explored = explorations.exploration_paths(str(model_dir), 1)[0]
  mtime = os.stat(explored).st_mtime_ns
  proc = train(model_dir, every_step)
  assert f"step {complete} is iteration 1, local step {complete - TRAIN_STEPS}" in proc.stdout
  assert "iteration 1: reusing the saved exploration" in proc.stdout
  assert os.stat(explored).st_mtime_ns == mtime
  resumed, reference = train_rows(model_dir), train_rows(reference_dir)
  assert sorted(resumed) == sorted(reference)
  for step in sorted(reference):
    assert resumed[step]["loss"] == pytest.approx(reference[step]["loss"], rel=1e-5, abs=1e-6), step
