"""`python -m launch.train` end to end: gin, BC on expert data, checkpoints, resume, crash recovery."""

import json
import os
import subprocess
import sys

import pytest

from evolver.train import checkpoints as ckpt_lib
from evolver.train import metrics as metrics_lib
from evolver.train.trainer import KILL_DURING_SAVE_ENV
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# A small model and dataset so that every run here takes seconds; the rest is runs/bc.gin as it ships.
SMALL = [
    "ModelConfig.hidden_size = 64", "ModelConfig.num_layers = 2", "ModelConfig.intermediate_size = 128",
    "train_bc.envs = ['sql', 'wordle']", "TaskSlices.expert_count = 16", "TaskSlices.val_count = 0",
    "train_bc.batch_size = 4", "train_bc.buckets = (512,)", "TrainerConfig.checkpoint_every = 4",
    "make_optimizer.learning_rate = 1e-2", "make_optimizer.warmup_steps = 2",
    "train_bc.curriculum_steps = 6", "train_bc.window_batch_size = 4",
    "train_bc.window_buckets = (256,)",
]


def train(model_dir, steps, *extra_bindings, env=None, check=True):
  bindings = [f"MODEL_DIR = '{model_dir}'", f"TRAIN_STEPS = {steps}", *SMALL, *extra_bindings]
  cmd = [sys.executable, "-m", "launch.train", "--gin_file=gin_configs/runs/bc.gin"]
  cmd += [f"--gin_bindings={b}" for b in bindings]
  run_env = one_device_env()  # one CPU device, as users run it
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(run_env, **(env or {})),
                        timeout=600)
  if check and proc.returncode != 0:
    raise AssertionError(f"launch.train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return proc


def losses(model_dir):
  rows = metrics_lib.read_metrics(str(model_dir))
  steps = [r["step"] for r in rows if "loss" in r]
  assert len(steps) == len(set(steps)), f"a step was logged twice: {steps}"
  return {r["step"]: r["loss"] for r in rows if "loss" in r}


@pytest.fixture(scope="module")
def bc_runs(tmp_path_factory):
  """The 12-step run, uninterrupted; and, after it, the same run killed while saving step 8 (for
  test_sigkill_mid_save_resumes_from_last_complete_checkpoint): (run, killed, its proc). One after the other: the
  first compiles the run's programs into the persistent compilation cache (tests/conftest.py), the second loads them."""
  root = tmp_path_factory.mktemp("bc")
  model_dir, killed_dir = root / "run", root / "killed"
  train(model_dir, 12)
  killed_proc = train(killed_dir, 12, env={KILL_DURING_SAVE_ENV: "8"}, check=False)
  return model_dir, killed_dir, killed_proc


@pytest.fixture(scope="module")
def uninterrupted(bc_runs):
  return bc_runs[0]


@pytest.mark.slow
def test_bc_trains_checkpoints_and_writes_configs(uninterrupted):
  loss = losses(uninterrupted)
  assert sorted(loss) == list(range(1, 13))
  assert sum(loss[s] for s in (10, 11, 12)) < 0.8 * sum(loss[s] for s in (1, 2, 3))
  steps = ckpt_lib.Checkpointer(str(uninterrupted), async_save=False).all_steps()
  assert steps == [4, 8, 12]
  operative = (uninterrupted / "operative_config.gin").read_text()
  assert "TRAIN_STEPS = 12" in operative and "ModelConfig.hidden_size = 64" in operative
  assert (uninterrupted / "config.gin").exists()
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(uninterrupted / "tensorboard"))
  model, step = ckpt_lib.restore_model(str(uninterrupted))
  assert step == 12 and model.config.hidden_size == 64


def test_rerun_with_more_steps_resumes_without_repeating(uninterrupted, tmp_path):
  model_dir = tmp_path / "more"
  subprocess.run(["cp", "-r", str(uninterrupted), str(model_dir)], check=True)
  proc = train(model_dir, 16)
  assert "resuming at step 12" in proc.stdout
  assert sorted(losses(model_dir)) == list(range(1, 17))


def test_sigkill_mid_save_resumes_from_last_complete_checkpoint(uninterrupted, bc_runs):
  _, model_dir, proc = bc_runs  # run 12 steps with a SIGKILL while saving step 8 (beside the uninterrupted run)
  assert proc.returncode == -9, proc.stderr[-2000:]
  complete = ckpt_lib.Checkpointer(str(model_dir), async_save=False).all_steps()
  assert complete and max(complete) in (4, 8)
  logged_before = sorted(losses(model_dir))
  assert logged_before[-1] == 8  # steps past the last complete checkpoint were logged, then lost
  proc = train(model_dir, 12)
  assert f"resuming at step {max(complete)}" in proc.stdout
  resumed, reference = losses(model_dir), losses(uninterrupted)
  assert sorted(resumed) == list(range(1, 13))
  for step in range(1, 13):
    assert resumed[step] == pytest.approx(reference[step], rel=1e-5, abs=1e-6), step


def test_bad_binding_fails_fast_with_its_name(tmp_path):
  proc = train(tmp_path / "bad", 4, "train_bc.no_such_option = 3", check=False)
  assert proc.returncode != 0
  assert "no_such_option" in proc.stderr and "Traceback" not in proc.stderr


def test_every_run_config_parses_as_it_ships(tmp_path):
  # Parsed as launch.train parses them, in a fresh process (in pytest's, `tests/models` shadows gin's includes),
  # with an empty cache: parsing exports no model (gin_configs/smollm2 name SmolLM2's export, made when a run reads it).
  script = ("import sys, gin\n"
            "from evolver.train import gin_config\n"
            "for path in sys.argv[1:]:\n"
            "  gin.clear_config()\n"
            "  gin_config.parse([path], [\"MODEL_DIR = 'x'\"])\n"
            "  print(path, gin.query_parameter('run.loop').selector)\n")
  runs = sorted(os.path.join("gin_configs", folder, f) for folder in ("runs", "benchmarks", "rl_signal", "smollm2")
                for f in os.listdir(os.path.join(ROOT, "gin_configs", folder)) if f.endswith(".gin"))
  proc = subprocess.run([sys.executable, "-c", script, *runs], cwd=ROOT, capture_output=True, text=True,
                        env={**os.environ, "EVOLVER_CACHE_DIR": str(tmp_path)})
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert not os.listdir(tmp_path)
  loops = dict(line.split() for line in proc.stdout.strip().splitlines())
  expected = {os.path.join("gin_configs", "runs", f"{name}.gin"): f"train_{name}"
              for name in ("agentevol", "bc", "dpo", "grpo")}
  expected[os.path.join("gin_configs", "runs", "agentevolver.gin")] = "train_grpo"  # GRPO with all three mechanisms
  expected.update({os.path.join("gin_configs", "benchmarks", f"bc_{name}.gin"): "train_bc"
                   for name in ("bfcl", "sciworld")})
  expected.update({os.path.join("gin_configs", "rl_signal", f"{name}.gin"): "train_grpo"
                   for name in ("probe", "grpo_before", "grpo")})
  expected[os.path.join("gin_configs", "rl_signal", "agentevol.gin")] = "train_agentevol"
  expected.update({os.path.join("gin_configs", "smollm2", f"{name}.gin"): loop
                   for name, loop in (("warmup", "train_bc"), ("grpo", "train_grpo"), ("experience", "train_grpo"),
                                      ("agentevolver", "train_grpo"), ("selfq", "generate_tasks"))})
  assert loops == expected


def test_export_writes_a_checkpoint_that_loads_with_the_run_s_weights(uninterrupted, tmp_path):
  import numpy as np
  from evolver.models import load_hf
  from launch import export
  out = tmp_path / "exported"
  record = export.main(["--model_dir", str(uninterrupted), "--out", str(out), "--dtype", "bfloat16"])
  assert record["step"] == 12 and record["dtype"] == "bfloat16"
  assert {"config.json", "model.safetensors", "tokenizer.json", export.EXPORT_FILE} <= set(os.listdir(out))
  model, _ = ckpt_lib.restore_model(str(uninterrupted))
  loaded = load_hf(str(out))  # float32 compute from the bf16 weights
  ids = np.arange(40, dtype=np.int32)[None] % model.config.vocab_size
  want, got = np.asarray(model(ids)), np.asarray(loaded(ids))
  assert np.abs(got - want).max() < 0.05 * np.abs(want).max()  # bf16 rounding of the weights only
