"""DPO: pairs from hand-made trajectories, the masked pair loss against `rl.losses.dpo_loss` and under
microbatching, pair batches, and `launch.train` with runs/dpo.gin from a tiny BC run.

  python -m pytest tests/train/test_dpo.py -q
"""

import dataclasses
import functools
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evolver.data import expert as expert_lib
from evolver.data.tokenize import TokenizedExample
from evolver.data.trajectory import Message, Trajectory
from evolver.models.config import ModelConfig
from evolver.models.decoder import make_model
from evolver.rl import losses
from evolver.train import checkpoints as ckpt_lib
from evolver.train import dpo
from evolver.train import explorations
from evolver.train import metrics as metrics_lib
from evolver.train import optimizer as optimizer_lib
from evolver.train import state as state_lib
from evolver.train import step as step_lib
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL_MODEL = ["ModelConfig.hidden_size = 64", "ModelConfig.num_layers = 2", "ModelConfig.intermediate_size = 128"]
EXPLORE = (110, 2)  # start, count of the exploration slice of train
SMALL_DPO = SMALL_MODEL + [
    "train_dpo.envs = ['sql', 'wordle']", f"TaskSlices.explore_start = {EXPLORE[0]}",
    f"TaskSlices.explore_count = {EXPLORE[1]}", "TaskSlices.val_start = 100", "TaskSlices.val_count = 1",
    "train_dpo.samples_per_task = 2", "train_dpo.pairs_per_batch = 2", "train_dpo.buckets = (1024,)",
    "train_dpo.max_new_tokens = 16", "train_dpo.max_rounds = 2", "LoopConfig.eval_tasks = 1",
    "LoopConfig.eval_max_new_tokens = 16", "LoopConfig.eval_max_rounds = 2",
    "TrainerConfig.checkpoint_every = 2", "make_optimizer.learning_rate = 1e-3", "make_optimizer.warmup_steps = 0",
]


# ----------------------------------------------------------------------------------------------------------
# Pairs.
# ----------------------------------------------------------------------------------------------------------


def traj(task, action, success, reward, env="maze", failed=False):
  messages = [Message("user", "instruction"), Message("assistant", "Ok."), Message("user", "observation"),
              Message("assistant", f"Thought: go.\nAction: {action}")]
  return Trajectory(item_id=f"{env}_{task}", messages=messages, env=env, task_index=task, split="train",
                    reward=reward, success=success, failed=failed)


def test_pairs_success_failure_per_instruction():
  trajectories = [
      traj(0, "a", True, 1.0), traj(0, "b", False, 0.0), traj(0, "a", True, 1.0),  # 0: a duplicate winner
      traj(0, "c", False, 0.3), traj(0, "d", False, 0.0, failed=True),          # an env error never pairs
      traj(1, "a", True, 0.69), traj(1, "b", False, 0.0),                        # 1: winner below 0.7
      traj(2, "a", True, 0.7), traj(2, "b", False, 0.69), traj(2, "c", False, 0.695),  # 2: gap 0.01 / 0.005
      traj(3, "a", True, 1.0), traj(3, "b", True, 1.0),                          # 3: no failure
      traj(0, "e", False, 0.0, env="sql"),                                       # another env's task 0
      traj(4, "a", False, 0.9), traj(4, "b", True, 0.8),                         # 4: the failure scores higher
  ]
  pairs = dpo.build_pairs(trajectories)
  assert pairs == [(0, 1), (0, 3), (7, 8)]
  assert dpo.build_pairs(trajectories, min_winner_reward=0.6) == [(0, 1), (0, 3), (5, 6), (7, 8)]
  assert dpo.build_pairs(trajectories, min_reward_gap=0.0) == [(0, 1), (0, 3), (7, 8), (7, 9)]


def test_pair_cap_prefers_distinct_trajectories():
  trajectories = [traj(0, "w0", True, 1.0), traj(0, "w1", True, 1.0), traj(0, "l0", False, 0.0),
                  traj(0, "l1", False, 0.0)]
  assert dpo.build_pairs(trajectories) == [(0, 2), (1, 3), (0, 3), (1, 2)]
  assert dpo.build_pairs(trajectories, max_pairs_per_task=2) == [(0, 2), (1, 3)]


# ----------------------------------------------------------------------------------------------------------
# Loss and batches.
# ----------------------------------------------------------------------------------------------------------


def test_pair_loss_is_rl_dpo_loss_on_interleaved_rows_and_ignores_padding():
  model = make_model(ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                 intermediate_size=64), seed=0)
  rng = np.random.default_rng(0)
  ids = rng.integers(3, 64, size=[8, 10]).astype(np.int32)
  mask = np.zeros([8, 10], np.float32)
  mask[:, 5:] = 1.0
  ref = rng.normal(size=[8]).astype(np.float32) - 30
  pair_mask = np.asarray([1, 0, 1, 0, 1, 0, 0, 0], np.float32)  # the last pair is padding
  batch = {"input_ids": ids, "loss_mask": mask, "ref_logp": ref, "pair_mask": pair_mask}
  loss, metrics = dpo.dpo_loss_fn(model, batch, {"pairs": jnp.float32(3.0)}, beta=0.5)
  seq = np.asarray(losses.sequence_logprobs(step_lib.policy_logprobs(model, ids), mask))
  expected, expected_metrics = losses.dpo_loss(seq[0:6:2], seq[1:6:2], ref[0:6:2], ref[1:6:2], beta=0.5)
  assert float(loss) == pytest.approx(float(expected), rel=1e-5)
  for key in ("reward_margin", "reward_accuracy", "chosen_logp", "rejected_logp"):
    assert float(metrics[key]) == pytest.approx(float(expected_metrics[key]), rel=1e-5)
  assert float(metrics["num_pairs"]) == 3.0


def test_dpo_loss_masks_padding_pairs_and_is_log_2_at_the_reference():
  rng = np.random.default_rng(0)
  c, r, rc, rr = (rng.normal(size=[3]).astype(np.float32) for _ in range(4))
  loss, _ = losses.dpo_loss(c, r, rc, rr, beta=0.5)
  padded, metrics = losses.dpo_loss(np.append(c, 5.0), np.append(r, -5.0), np.append(rc, 0.0), np.append(rr, 0.0),
                                    beta=0.5, pair_mask=np.asarray([1, 1, 1, 0], np.float32))
  assert float(padded) == pytest.approx(float(loss), rel=1e-6) and float(metrics["num_pairs"]) == 3.0
  assert float(losses.dpo_loss(c, r, c, r, beta=0.5)[0]) == pytest.approx(math.log(2))


def _example(rng, length, vocab):
  mask = np.zeros([length], np.float32)
  mask[length // 2:] = 1.0
  zeros = np.zeros([length], np.float32)
  return TokenizedExample(input_ids=rng.integers(3, vocab, size=[length]).astype(np.int32), loss_mask=mask,
                          exp_mask=zeros, advantages=zeros, logprobs=zeros)


def test_pair_batches_interleave_and_resume():
  rng = np.random.default_rng(0)
  examples = [_example(rng, n, 50) for n in (10, 12, 30, 8, 9, 40)]
  pairs = [(0, 1), (2, 3), (4, 5), (1, 0), (3, 2)]
  ref = np.arange(6, dtype=np.float32) * -10.0
  it = dpo.PairBatchIterator(examples, pairs, ref, pairs_per_batch=2, pad_id=0, buckets=(16, 32), seed=3)
  assert (it.num_pairs, it.num_dropped) == (4, 1)  # (4, 5) does not fit 32 tokens
  batches = [next(it) for _ in range(2)]  # one epoch: 2 pairs in bucket 16, 2 in bucket 32
  served = []
  for batch in batches:
    assert batch["input_ids"].shape[0] == 4 and batch["pair_mask"].tolist()[1::2] == [0, 0]
    for row in range(0, 4, 2):
      if batch["pair_mask"][row]:
        chosen, rejected = (int(np.argmin(np.abs(ref - batch["ref_logp"][row + k]))) for k in (0, 1))
        assert batch["lengths"][row] == len(examples[chosen])
        assert batch["lengths"][row + 1] == len(examples[rejected])
        served.append((chosen, rejected))
  assert sorted(served) == sorted([(0, 1), (2, 3), (1, 0), (3, 2)])
  state = it.get_state()
  following = next(it)
  again = dpo.PairBatchIterator(examples, pairs, ref, pairs_per_batch=2, pad_id=0, buckets=(16, 32), seed=3)
  again.set_state(state)
  np.testing.assert_array_equal(next(again)["input_ids"], following["input_ids"])


def test_dpo_step_keeps_pairs_whole_under_microbatching():
  model = make_model(ModelConfig(vocab_size=64, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                 intermediate_size=64), seed=0)
  graphdef, params = nnx.split(model)
  rng = np.random.default_rng(1)
  examples = [_example(rng, 12, 64) for _ in range(8)]
  ref = rng.normal(size=[8]).astype(np.float32) * 3 - 40
  it = dpo.PairBatchIterator(examples, [(0, 1), (2, 3), (4, 5), (6, 7)], ref, pairs_per_batch=4, pad_id=0,
                             buckets=(16,), seed=0)
  batch = {k: jnp.asarray(v) for k, v in next(it).items() if k in dpo.STEP_KEYS}
  optimizer = optimizer_lib.make_optimizer(10)
  loss_fn = functools.partial(dpo.dpo_loss_fn, beta=0.5)
  out = {}
  for micro in (1, 2):
    state = state_lib.create_train_state(params, optimizer, 0)
    step = jax.jit(functools.partial(step_lib.train_step, graphdef=graphdef, loss_fn=loss_fn, optimizer=optimizer,
                                     num_microbatches=micro))
    new_state, metrics = step(state, batch)
    out[micro] = (float(metrics["loss"]), new_state.params)
  assert out[2][0] == pytest.approx(out[1][0], rel=1e-5)
  for a, b in zip(jax.tree.leaves(out[1][1]), jax.tree.leaves(out[2][1])):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------
# launch.train end to end.
# ----------------------------------------------------------------------------------------------------------


def launch(gin_file, bindings, check=True):
  cmd = [sys.executable, "-m", "launch.train", f"--gin_file={gin_file}"] + [f"--gin_bindings={b}" for b in bindings]
  env = one_device_env()  # one CPU device, as users run it
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
  if check and proc.returncode != 0:
    raise AssertionError(f"launch.train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return proc


def test_dpo_without_init_checkpoint_fails_clearly(tmp_path):
  proc = launch("gin_configs/runs/dpo.gin", [f"MODEL_DIR = '{tmp_path / 'dpo'}'", "TRAIN_STEPS = 2"], check=False)
  assert proc.returncode != 0
  assert "set INIT_CHECKPOINT" in proc.stderr
  assert not (tmp_path / "dpo" / "checkpoints").exists()


@pytest.mark.slow
def test_dpo_from_a_bc_run(bc_checkpoint, tmp_path):
  bc_dir, dpo_dir = bc_checkpoint, tmp_path / "dpo"  # a tiny BC run, trained once per session (conftest.py)
  bindings = [f"MODEL_DIR = '{dpo_dir}'", f"INIT_CHECKPOINT = '{bc_dir}'", "TRAIN_STEPS = 4", *SMALL_DPO]
  # A 2-step BC policy solves nothing: the exploration finds no pair, and the run says so.
  proc = launch("gin_configs/runs/dpo.gin", bindings, check=False)
  assert proc.returncode != 0 and "no success/failure pairs" in proc.stderr, proc.stderr[-2000:]
  explored, meta = explorations.load_exploration(str(dpo_dir), 1)
  assert len(explored) == 2 * EXPLORE[1] * 2 and meta["policy_step"] == 0
  assert all(t.token_ids is not None for t in explored)
  # Add, per explored task, the expert's success and a failed copy of it, as if the policy had sampled them;
  # the rerun reuses the saved exploration and pairs each success with the task's 3 distinct failures.
  added = []
  for env in ("sql", "wordle"):
    for index in range(EXPLORE[0], sum(EXPLORE)):
      good = expert_lib.expert_trajectory(env, index)
      assert good.success and good.reward >= 0.7
      bad = dataclasses.replace(good, messages=good.messages[:-1] + [Message("assistant", "Action: give up")],
                                success=False, reward=0.0)
      added += [good, bad]
  explorations.save_exploration(str(dpo_dir), 1, explored + added, meta)
  proc = launch("gin_configs/runs/dpo.gin", bindings)
  assert "reusing the saved exploration" in proc.stdout
  assert "12 pairs from 4 tasks" in proc.stdout, proc.stdout
  rows = [r for r in metrics_lib.read_metrics(str(dpo_dir)) if "loss" in r]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  # The policy starts as the reference (the BC model): every margin is 0 and the loss is log 2.
  assert rows[0]["loss"] == pytest.approx(math.log(2), abs=1e-4)
  assert rows[0]["pairs"] == 12 and rows[0]["num_pairs"] == 2
  assert rows[-1]["reward_margin"] > 0 and "val/overall/success" in rows[-1]
  assert ckpt_lib.Checkpointer(str(dpo_dir), async_save=False).all_steps() == [2, 4]
  assert (dpo_dir / "eval_results.json").exists() and (dpo_dir / "operative_config.gin").exists()
