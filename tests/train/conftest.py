"""Fixtures shared by the training tests: the shipped tokenizer, a small batch of expert sql episodes, and one tiny
BC checkpoint for the RL and DPO runs that only need some BC checkpoint to start from."""

import fcntl
import os
import subprocess
import sys

import pytest

from evolver.data import batching, expert
from evolver.models.tokenizer import load_tokenizer
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The small model every launch.train test uses; a run that starts from `bc_checkpoint` takes its shapes from it.
SMALL_MODEL = ["ModelConfig.hidden_size = 64", "ModelConfig.num_layers = 2", "ModelConfig.intermediate_size = 128"]


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer()


@pytest.fixture(scope="module")
def batch(tokenizer):
  """Two expert sql episodes as a train batch of 8 rows (`input_ids`, `loss_mask`)."""
  trajectories = [expert.expert_trajectory("sql", i) for i in range(2)]
  out = batching.batch_trajectories(trajectories, tokenizer, buckets=(512, 1024, 1536), batch_size=8)
  return {k: out[k] for k in ("input_ids", "loss_mask")}


@pytest.fixture(scope="session")
def bc_checkpoint(tmp_path_factory):
  """MODEL_DIR of a tiny BC run (the small model, 2 steps on 8 expert sql episodes), trained once per test run by
  `launch.train` for the tests whose GRPO/DPO runs only need some BC checkpoint to start from (INIT_CHECKPOINT).
  Those runs only read it; tests about the BC run itself train their own. Under pytest-xdist the workers share it:
  the first to get here trains it while the others wait on the lock (the parent of a worker's base temporary
  directory is the run's)."""
  shared = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    shared = shared.parent
  model_dir, done = shared / "shared_bc" / "bc", shared / "shared_bc" / "done"
  model_dir.parent.mkdir(exist_ok=True)
  with open(shared / "shared_bc.lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    if not done.exists():
      _train_bc(model_dir)
      done.touch()
  return model_dir


def _train_bc(model_dir):
  bindings = [*SMALL_MODEL, f"MODEL_DIR = '{model_dir}'", "TRAIN_STEPS = 2", "train_bc.envs = ['sql']",
              "TaskSlices.expert_count = 8", "train_bc.batch_size = 4", "train_bc.buckets = (512,)",
              "TaskSlices.val_count = 0", "LoopConfig.eval_tasks = 0", "train_bc.curriculum_steps = 0"]
  env = one_device_env()  # one CPU device, as users run it
  proc = subprocess.run([sys.executable, "-m", "launch.train", "--gin_file=gin_configs/runs/bc.gin",
                         *[f"--gin_bindings={b}" for b in bindings]],
                        cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
  assert proc.returncode == 0, f"the shared BC run failed:\n{proc.stderr[-3000:]}"
