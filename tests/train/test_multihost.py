"""Multi-host: one GRPO step run by 2 processes (2 CPU devices each, gloo collectives: a global mesh of 4) equals
the same steps run by 1 process on 4 devices, and resumes from its checkpoint.

Both runs start from one tiny BC checkpoint and take the same gin bindings; the 2-process run is two
`launch.train` processes on loopback (`--coordinator_address`, `--num_processes`, `--process_id`) sharing one
MODEL_DIR, as a pod's hosts share a bucket. Each process rolls out its half of the task groups and the trajectories
are gathered, so both runs train on the same rollouts: the logged rollout figures are equal, and the losses and the
trained parameters agree to float32 reduction-order tolerance (the mesh differs: the 4 devices span 2 processes).
"""

import os
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import jax
import numpy as np
import pytest

from evolver.train import checkpoints as ckpt_lib
from evolver.train import metrics as metrics_lib
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["ModelConfig.hidden_size = 64", "ModelConfig.num_layers = 2", "ModelConfig.intermediate_size = 128"]
# 2 tasks x 2 episodes a step (one group on each host), 2 steps: the second step's episodes are sampled with the
# weights the first trained (each host's local copy). An entropy bonus and a large learning rate make the
# parameters move even when every episode fails (a tiny BC policy's usual outcome: no advantage). Programs compile
# as the steps meet them (test_grpo.py tests the precompiled first step).
GRPO = ["train_grpo.envs = ['sql', 'maze']", "train_grpo.tasks_per_step = 2", "train_grpo.group_size = 2",
        "TaskSlices.val_count = 0", "LoopConfig.eval_tasks = 0", "train_grpo.max_new_tokens = 8",
        "train_grpo.max_rounds = 2", "train_grpo.num_minibatches = 1", "train_grpo.buckets = (320,)",
        "TrainerConfig.checkpoint_every = 1", "het_ppo_loss_fn.entropy_coeff = 0.01",
        "make_optimizer.learning_rate = 1e-3", "train_grpo.precompile = False"]
STEPS = 2
# Rollout figures are computed on the same gathered trajectories: equal. Losses and parameters: the same math
# over a mesh whose devices sit in two processes (reductions in another order).
# The behaviour log-probabilities are the gathered episodes' own (the shipped recipe's `old_logp = 'sampler'`; the
# reference's still come from the scoring pass over the mesh).
EQUAL_KEYS = ("rollout/success", "rollout/reward", "rollout/turns", "rollout/sampled_tokens", "exp_tokens",
              "old_logp/from_sampler")
CLOSE_KEYS = ("loss", "pg_loss_on", "kl_ref", "entropy")
ATOL = 1e-5


def _command(run_file: str, model_dir, steps: int, *bindings: str) -> list[str]:
  return [sys.executable, "-m", "launch.train", f"--gin_file=gin_configs/runs/{run_file}",
          f"--gin_bindings=MODEL_DIR = '{model_dir}'", f"--gin_bindings=TRAIN_STEPS = {steps}",
          *[f"--gin_bindings={b}" for b in [*SMALL, *bindings]]]


def _env(devices: int) -> dict[str, str]:
  return one_device_env(devices)


def _run(cmd: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=900)
  if proc.returncode != 0:
    raise AssertionError(f"{' '.join(cmd[:4])} failed:\n{proc.stderr[-4000:]}")
  return proc


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _run_two_processes(cmd: list[str]) -> list[str]:
  """Runs `cmd` as processes 0 and 1 of one run on loopback; returns their stdouts."""
  address = f"127.0.0.1:{_free_port()}"
  procs = [subprocess.Popen([*cmd, f"--coordinator_address={address}", "--num_processes=2", f"--process_id={i}"],
                            cwd=ROOT, env=_env(2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = [p.communicate(timeout=900) for p in procs]
  for i, (p, (_, err)) in enumerate(zip(procs, outs)):
    assert p.returncode == 0, f"process {i} failed:\n{err[-4000:]}"
  return [out for out, _ in outs]


def _params(model_dir) -> list[np.ndarray]:
  model, _ = ckpt_lib.restore_model(str(model_dir))
  from flax import nnx
  return [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.slow
def test_a_grpo_step_on_2_processes_equals_1_process(bc_checkpoint, tmp_path):
  bc_dir = bc_checkpoint  # a tiny BC run's checkpoint, trained once per session (tests/train/conftest.py)
  grpo = [*GRPO, f"INIT_CHECKPOINT = '{bc_dir}'"]

  single_dir = tmp_path / "single"
  # The 1-process run is independent of the 2-process one: it runs alongside.
  with ThreadPoolExecutor(1) as pool:
    single_run = pool.submit(_run, _command("grpo.gin", single_dir, STEPS, *grpo), _env(4))

    # The 2-process run stops after step 1 and is started again: step 2 runs from the checkpoint both processes
    # restored.
    multi_dir = tmp_path / "multi"
    for steps in (1, STEPS):
      outs = _run_two_processes(_command("grpo.gin", multi_dir, steps, *grpo))
    single_run.result()
  assert "resuming at step 1" in outs[0] and "resuming at step 1" in outs[1]

  single, multi = metrics_lib.read_metrics(str(single_dir)), metrics_lib.read_metrics(str(multi_dir))
  assert [r["step"] for r in single] == [r["step"] for r in multi] == [1, 2]  # process 0 alone wrote metrics
  for row_single, row_multi in zip(single, multi):
    for key in EQUAL_KEYS:
      assert row_multi[key] == row_single[key], key
    assert row_single["rollout/sampled_tokens"] > 0 and row_single["old_logp/from_sampler"] == 1
    for key in CLOSE_KEYS:
      np.testing.assert_allclose(row_multi[key], row_single[key], atol=ATOL, err_msg=key)
  assert single[1]["kl_ref"] > 0  # the second step's policy is not the reference
  trained_single, trained_multi = _params(single_dir), _params(multi_dir)
  start = _params(bc_dir)
  assert len(trained_single) == len(trained_multi) == len(start) > 0
  assert max(np.abs(a - b).max() for a, b in zip(trained_single, start)) > 1e-4  # the step trained
  for a, b in zip(trained_single, trained_multi):
    np.testing.assert_allclose(b, a, atol=ATOL)


def test_a_multi_process_run_needs_an_experience_service(tmp_path, monkeypatch):
  from evolver import distributed
  from evolver.train.experience import ExperienceManager
  monkeypatch.setattr(distributed, "process_count", lambda: 2)  # (what jax.process_count() says in such a run)
  manager = ExperienceManager(store_dir=str(tmp_path / "store"))
  with pytest.raises(ValueError, match="service_url"):
    manager.start(model_dir=tmp_path / "run", envs=["maze"], seed=0)
  manager.close()


def test_groups_split_evenly_over_processes_and_never_span_two():
  from evolver import distributed
  shares = [distributed.own_groups(7, index=i, count=3) for i in range(3)]
  assert shares == [[0, 3, 6], [1, 4], [2, 5]]
  assert sorted(g for share in shares for g in share) == list(range(7))
  assert distributed.own_groups(5) == [0, 1, 2, 3, 4]  # one process: all of them
