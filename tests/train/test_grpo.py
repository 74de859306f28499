"""GRPO: the HET-PPO train step across meshes, and `launch.train` with runs/grpo.gin end to end."""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evolver.data import batching
from evolver.models import ModelConfig, make_model, sharding
from evolver.train import advantages
from evolver.train import checkpoints as ckpt_lib
from evolver.train import metrics as metrics_lib
from evolver.train import rl
from evolver.train import step as step_lib
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=64)


def rl_batch(seed=0, rows=8, length=16):
  rng = np.random.default_rng(seed)
  ids = rng.integers(0, CONFIG.vocab_size, size=(rows, length)).astype(np.int32)
  mask = (rng.random((rows, length)) < 0.6).astype(np.float32)
  mask[:, 0] = 0
  graphdef, params = nnx.split(make_model(CONFIG, seed=1))
  logp = np.asarray(rl._logprobs(graphdef, params, ids))
  return {"input_ids": ids, "loss_mask": mask,
          "exp_mask": (rng.random((rows, length)) < 0.5).astype(np.float32),
          "advantages": np.repeat(rng.normal(size=(rows, 1)), length, axis=1).astype(np.float32) * mask,
          "old_logp": (logp + rng.normal(0, 0.3, logp.shape)).astype(np.float32),
          "ref_logp": (logp + rng.normal(0, 0.3, logp.shape)).astype(np.float32)}


def test_one_grpo_step_on_8_devices_equals_1_device():
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 fake devices")
  graphdef, params = nnx.split(make_model(CONFIG, seed=1))
  batch = rl_batch()
  loss_fn = lambda p, b: rl.het_ppo_loss_fn(nnx.merge(graphdef, p), b, step_lib.batch_normalizers(b),  # noqa: E731
                                            kl_coef=0.01, entropy_coeff=0.01)

  def run(mesh):
    placed = jax.device_put(jax.tree.map(jnp.copy, params), sharding.state_shardings(params, mesh))

    @jax.jit
    def f(p, b):
      with sharding.activate(mesh):
        return jax.value_and_grad(loss_fn, has_aux=True)(p, b)
    return f(placed, batch)

  (loss_1, metrics_1), grads_1 = run(sharding.make_mesh(devices=jax.devices()[:1]))
  (loss_8, metrics_8), grads_8 = run(sharding.make_mesh(data=2, fsdp=2, tensor=2))
  np.testing.assert_allclose(float(loss_8), float(loss_1), atol=1e-5)
  assert 0 < float(metrics_1["clipfrac"]) < 1 and float(metrics_1["off_policy_fraction"]) > 0
  for key in ("pg_loss_on", "pg_loss_off", "kl_ref", "entropy"):
    np.testing.assert_allclose(float(metrics_8[key]), float(metrics_1[key]), atol=1e-5)
  leaves_1, leaves_8 = jax.tree.leaves(grads_1), jax.tree.leaves(grads_8)
  assert len(leaves_1) == len(leaves_8) > 0
  for a, b in zip(leaves_1, leaves_8):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)


def test_a_minibatch_cut_to_its_rows_bucket_gives_the_same_loss_and_gradients():
  # The GRPO loop runs each minibatch at its own rows' longest bucket: the cut columns are right padding.
  graphdef, params = nnx.split(make_model(CONFIG, seed=1))
  batch = rl_batch(length=24)
  lengths = np.array([5, 9, 12, 7, 3, 11, 8, 10], np.int32)
  pad = np.arange(24)[None, :] >= lengths[:, None]
  batch["input_ids"][pad] = 0
  for key in ("loss_mask", "exp_mask", "advantages", "old_logp", "ref_logp"):
    batch[key][pad] = 0
  batch["lengths"] = lengths
  rows = np.array([0, 3, 4, 6])
  cut = batching.take_rows(batch, rows, (8, 16, 24), keys=rl.RL_KEYS)
  full = {k: batch[k][rows] for k in rl.RL_KEYS}
  assert cut["input_ids"].shape == (4, 8) and full["input_ids"].shape == (4, 24)
  grad_fn = jax.jit(jax.value_and_grad(
      lambda p, b: rl.het_ppo_loss_fn(nnx.merge(graphdef, p), b, step_lib.batch_normalizers(b), kl_coef=0.01,
                                      entropy_coeff=0.01), has_aux=True))
  (loss_cut, metrics_cut), grads_cut = grad_fn(params, cut)
  (loss_full, metrics_full), grads_full = grad_fn(params, full)
  assert float(metrics_full["num_tokens"]) > 0
  np.testing.assert_allclose(float(loss_cut), float(loss_full), rtol=1e-6, atol=1e-7)
  for key in ("pg_loss", "kl_ref", "entropy", "clipfrac"):
    np.testing.assert_allclose(float(metrics_cut[key]), float(metrics_full[key]), rtol=1e-6, atol=1e-7)
  for a, b in zip(jax.tree.leaves(grads_cut), jax.tree.leaves(grads_full)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)


def test_group_advantages():
  adv = advantages.group_advantages([1.0, 0.0, 0.3, 0.3], [7, 7, 9, 9])
  np.testing.assert_allclose(adv[:2], [1 / (np.std([1, 0], ddof=1) + 1e-6) * 0.5, -0.5 / (np.std([1, 0], ddof=1) + 1e-6)],
                             rtol=1e-5)
  np.testing.assert_allclose(adv[2:], [0.0, 0.0])


SMALL = ["ModelConfig.hidden_size = 64", "ModelConfig.num_layers = 2", "ModelConfig.intermediate_size = 128"]


def launch(run_file, model_dir, steps, *bindings, check=True):
  cmd = [sys.executable, "-m", "launch.train", f"--gin_file=gin_configs/runs/{run_file}",
         f"--gin_bindings=MODEL_DIR = '{model_dir}'", f"--gin_bindings=TRAIN_STEPS = {steps}"]
  cmd += [f"--gin_bindings={b}" for b in [*SMALL, *bindings]]
  env = one_device_env()
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
  if check and proc.returncode != 0:
    raise AssertionError(f"launch.train {run_file} failed:\n{proc.stderr[-3000:]}")
  return proc


def test_grpo_without_init_checkpoint_fails_clearly(tmp_path):
  proc = launch("grpo.gin", tmp_path / "g", 1, check=False)
  assert proc.returncode != 0
  assert "set INIT_CHECKPOINT" in proc.stderr


def test_served_envs_that_are_not_server_urls_stop_the_run_with_what_is_wrong(tmp_path):
  proc = launch("grpo.gin", tmp_path / "g", 1, "served_envs.urls = {'maze': 'ftp://host:1'}", check=False)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert "bad gin config: served_envs.urls: env 'maze': expected a server URL" in proc.stderr
  assert not (tmp_path / "g").exists()  # before the run made anything


@pytest.mark.slow
def test_grpo_runs_from_a_bc_checkpoint_and_resumes(bc_checkpoint, tmp_path):
  bc_dir = bc_checkpoint  # a tiny BC run's checkpoint, trained once per session (tests/train/conftest.py)
  grpo = ["train_grpo.envs = ['sql', 'maze']", "train_grpo.tasks_per_step = 2", "train_grpo.group_size = 2",
          "TaskSlices.val_count = 0",
          "train_grpo.max_new_tokens = 16", "train_grpo.max_rounds = 2", "train_grpo.num_minibatches = 2",
          f"INIT_CHECKPOINT = '{bc_dir}'", "TrainerConfig.checkpoint_every = 1",
          # Prompts are ~250-290 tokens: a two-turn episode outgrows 320 and is cut to it, not dropped.
          "train_grpo.buckets = (320,)",
          # The scoring pass the shipped recipe skips (it takes the sampler's log-probabilities): run here, it shows
          # on real envs' templates that the two are the same numbers, which is what lets the recipe skip it.
          "train_grpo.old_logp = 'recompute'"]
  run_dir = tmp_path / "grpo"
  launch("grpo.gin", run_dir, 2, *grpo)
  rows = metrics_lib.read_metrics(str(run_dir))
  assert [r["step"] for r in rows] == [1, 2]
  assert all("rollout/success" in r and "rollout/reward" in r for r in rows)
  trained = [r for r in rows if "pg_loss_on" in r]
  assert trained and all(np.isfinite(r["loss"]) and "kl_ref" in r and "clipfrac" in r for r in trained)
  # Each step records the train tasks its groups trained on (2 tasks a step, one group each): what
  # `launch.eval --indices RUN_DIR` evaluates.
  assert all(len(r[rl.TRAINED_TASKS_KEY]) == 2 for r in trained)
  assert all(re.fullmatch(r"(sql|maze)/\d+", name) for r in trained for name in r[rl.TRAINED_TASKS_KEY])
  assert sum(map(len, rl.trained_tasks(rows).values())) == len({n for r in rows for n in r[rl.TRAINED_TASKS_KEY]})
  # Where a step's time goes: its episodes, then the update.
  assert all(r["time/rollout_s"] > 0 and r["rollout/sampled_tokens"] > 0 for r in rows)
  assert all(r["time/update_s"] > 0 for r in trained)
  # The breakdown: the sampler's pieces without compilation, the log-prob passes and updates, what XLA compiled
  # (the first step compiles the sampler's and the update's programs), memory, and the floor below the rollout.
  for r in rows:
    parts = r["time/prefill_s"] + r["time/decode_s"] + r["time/select_s"] + r["time/rollout_compile_s"]
    assert 0 < parts <= r["time/rollout_s"] and r["time/env_s"] > 0
    # (floor_s is decode_s x packed steps / decode steps: exactly decode_s when no row idles, never above it)
    assert 0 < r["time/rollout_floor_s"] <= r["time/decode_s"] and 0 <= r["rollout/idle_row_fraction"] < 1
    assert r["memory/peak_rss_gb"] >= r["memory/rss_gb"] > 0
  # The first step compiles every program (the sampler's before its episodes run, so the rollout itself compiles
  # nothing); the second compiles none.
  assert rows[0]["compile/compiles"] > 0 and rows[0]["time/rollout_compile_s"] == 0
  assert rows[1]["compile/compiles"] == 0, rows[1]
  assert all(r["time/old_logp_s"] > 0 and r["time/ref_logp_s"] > 0 and r["time/ppo_s"] > 0 for r in trained)
  # The recomputed behaviour log-probs match the sampler's (same weights, same tokens).
  assert all(abs(r["behaviour_logp_gap"]) < 1e-3 and r["old_logp/from_sampler"] == 0 for r in trained)
  assert sum(r["rollout/truncated"] for r in rows) > 0
  # As if the run died after logging step 2 but before step 2's checkpoint (update 4: two minibatches a step) was
  # complete: the resumed run starts from step 1's and logs step 2 once, anew (a writer told the update count, 2,
  # kept the dead run's row: [1, 2, 2, 3]).
  checkpoints = ckpt_lib.checkpoint_dir(str(run_dir))
  shutil.rmtree(os.path.join(checkpoints, "4"))
  assert ckpt_lib.Checkpointer(str(run_dir), async_save=False).latest_step() == 2
  proc = launch("grpo.gin", run_dir, 3, *grpo)
  assert "resuming at step 1" in proc.stdout
  assert [r["step"] for r in metrics_lib.read_metrics(str(run_dir))] == [1, 2, 3]


@pytest.mark.slow
def test_dynamic_sampling_and_the_curriculum_count_their_episodes_and_resume_exactly(bc_checkpoint, tmp_path):
  grpo = ["train_grpo.envs = ['maze']", "train_grpo.tasks_per_step = 2", "train_grpo.group_size = 2",
          "TaskSlices.val_count = 0", "train_grpo.max_new_tokens = 16", "train_grpo.max_rounds = 2",
          f"INIT_CHECKPOINT = '{bc_checkpoint}'", "TrainerConfig.checkpoint_every = 1", "train_grpo.buckets = (320,)",
          "train_grpo.dynamic_sampling_rounds = 2", "train_grpo.task_source = @PassRateCurriculum()",
          "TaskSlices.explore_count = 4"]
  run_dir = tmp_path / "dapo"
  launch("grpo.gin", run_dir, 2, *grpo)
  rows = metrics_lib.read_metrics(str(run_dir))
  for r in rows:
    # Each round draws a whole step's tasks; groups with signal fill the step, the rest are spent.
    assert r["rollout/episodes"] == r["rollout/rounds"] * 2 * 2
    assert r["rollout/signal_groups"] <= 2 and (r["rollout/rounds"] == 3 or r["rollout/signal_groups"] == 2)
    assert r["curriculum/mixed"] + r["curriculum/settled"] + r["curriculum/unseen"] == 4
  assert rows[1]["curriculum/unseen"] < 4  # what step 1 saw is kept, and drawn from
  checkpoints = ckpt_lib.Checkpointer(str(run_dir), async_save=False)
  saved = json.loads(checkpoints.restore_state_files(2)["curriculum"]["pass_rates.json"])  # (update 2: step 1)
  assert saved and all(k.startswith("maze/") and 0 < len(v) <= 16 for k, v in saved.items())
  # Resumed from step 1's checkpoint, step 2 draws and rolls out exactly what it did.
  shutil.rmtree(os.path.join(ckpt_lib.checkpoint_dir(str(run_dir)), "4"))
  launch("grpo.gin", run_dir, 2, *grpo)
  again = metrics_lib.read_metrics(str(run_dir))[1]
  for key in ("rollout/episodes", "rollout/success", "rollout/sampled_tokens", "curriculum/mixed",
              "curriculum/unseen"):
    assert again[key] == rows[1][key], key
