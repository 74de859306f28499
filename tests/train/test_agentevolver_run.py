"""The full AgentEvolver config (gin_configs/runs/agentevolver.gin) run end to end as it ships, from the shared BC
checkpoint of the tiny default (evolver/assets/checkpoints/bc_tiny) with fewer, shorter episodes: every mechanism acts
within 2 RL steps (the experience pool, self-questioned tasks, ADCA step credit), and a run killed while saving step 2
resumes from step 1 to exactly the pool (ids, contents, freq, utility, committed steps) and metrics that the same
run logged for step 2 before it was killed, in another process.

One tiny run serves every test here (the run, killed while saving step 2, then resumed).

  python -m pytest tests/train/test_agentevolver_run.py -q
"""

import json
import math
import os
import subprocess
import sys

import pytest

from evolver.tasks.taskset import save_taskset
from evolver.train import metrics as metrics_lib
from evolver.train.trainer import KILL_DURING_SAVE_ENV
from tests.subprocess_env import one_device_env
from tests.train.test_selfq_rl import explored_records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Its one fixture (three runs, the longest file of the suite) runs first on its worker (tests/conftest.py's order),
# not last, where it held the whole suite's end.
pytestmark = pytest.mark.slow

# Per RL step the tiny GRPO takes ppo_epochs x num_minibatches = 2 updates: the save of RL step 2 is update 4.
KILL_AT_UPDATE = "4"
UNTIMED = ("time/", "memory/", "compile/")  # prefixes of what a run's timing, not its seed, decides


def launch(gin_files, bindings, env=None, check=True):
  cmd = [sys.executable, "-m", "launch.train", *[f"--gin_file={f}" for f in gin_files],
         *[f"--gin_bindings={b}" for b in bindings]]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(one_device_env(), **(env or {})),
                        timeout=900)  # one CPU device, as users run it
  if check and proc.returncode != 0:
    raise AssertionError(f"launch.train failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return proc


def metric_rows(model_dir):
  """(the rows of the first process to log each step, the last row logged for each step)."""
  first, last = {}, {}
  for row in metrics_lib.read_metrics(str(model_dir)):
    first.setdefault(row["step"], row)
    last[row["step"]] = row
  return first, last


def seeded(row):
  """The row's metrics that the seed decides (NaNs made comparable)."""
  return {k: ("nan" if isinstance(v, float) and math.isnan(v) else v) for k, v in row.items()
          if not k.startswith(UNTIMED) and k not in ("wall_s", "timestamp")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("agentevolver")
  save_taskset(str(tmp / "tasks.jsonl"), explored_records("maze", 2))  # a small self-questioned task set
  common = ["TaskSlices.val_count = 0", "TRAIN_STEPS = 2", f"TASKSET = '{tmp / 'tasks.jsonl'}'",
            "train_grpo.envs = ['maze', 'sql']", "train_grpo.tasks_per_step = 2", "train_grpo.group_size = 4",
            "train_grpo.max_new_tokens = 48", "train_grpo.max_rounds = 2",  # 48: room for a whole maze action
            "TaskSlices.expert_count = 8",
            "TaskSlices.explore_count = 2",  # 4 originals beside the task set: the mixture draws both kinds
            "SyntheticTasks.regenerate_every = 1", "ExperienceManager.log_pool_digest = True",
            "AdcaAdvantages.skip_type = None",  # (AgentEvolver's yaml): judge every group, even at 0 success
            "TrainerConfig.checkpoint_every = 1", "LoopConfig.eval_tasks = 0",
            "train_grpo.precompile = False"]  # 2 short steps: compile only the programs they meet
  files = ["gin_configs/runs/agentevolver.gin"]
  killed = tmp / "killed"
  # Unbuffered: the killed process's stdout up to the kill is kept.
  killed_proc = launch(files, [*common, f"MODEL_DIR = '{killed}'"],
                       env={KILL_DURING_SAVE_ENV: KILL_AT_UPDATE, "PYTHONUNBUFFERED": "1"}, check=False)
  assert killed_proc.returncode == -9, killed_proc.stderr[-2000:]
  before_kill, _ = metric_rows(killed)
  resumed_proc = launch(files, [*common, f"MODEL_DIR = '{killed}'"])
  _, after_resume = metric_rows(killed)
  return {"before_kill": before_kill, "resumed": after_resume, "killed_stdout": killed_proc.stdout,
          "resumed_stdout": resumed_proc.stdout, "killed_dir": killed}


def test_every_mechanism_acts_within_two_steps(runs):
  # The run logged both steps before it was killed (while saving step 2).
  rows = runs["before_kill"]
  assert sorted(rows) == [1, 2]
  assert "initialised 'default' from 16 expert trajectories" in runs["killed_stdout"]
  for step in (1, 2):
    row = rows[step]
    assert row["experience/episodes_with"] > 0  # episodes ran with retrieved experience
    assert row["experience/trained_with"] > 0  # hybrid: the keeping task's samples trained with it
    assert row["exp_tokens"] > 0  # and the stripped ones trained off-policy
    # Step credit judged every step, some steps GOOD and some BAD (the shipped policy moves toward the maze's goal
    # on some turns), and ADCA moved the advantages of the steps it judged away from GRPO's outcome advantage.
    assert row["credit/adca_active"] == 1.0 and row["credit/judged_steps"] > 0
    assert 0 < row["credit/good_fraction"] < 1
    assert row["credit/changed_steps"] > 0
    assert row["experience/summary/committed"] > 0  # the step's rollouts went into the pool
  assert sum(rows[s]["synthetic_tasks/synthetic_in_step"] for s in rows) > 0  # self-questioned tasks were drawn
  # Regeneration ran after each step (regenerate_every 1); the tiny policy's rollouts reach no new state, so it
  # proposes nothing from them here.
  assert all("synthetic_tasks/proposed" in rows[s] for s in rows)
  assert rows[1]["experience/retrieved_from_run"] == 0 and rows[2]["experience/pool_size"] > \
      rows[1]["experience/pool_size"] - rows[1]["experience/summary/committed"]


def test_a_run_killed_between_steps_resumes_to_the_same_pool_and_metrics(runs):
  # Step 2 again in a new process, from step 1's checkpoint (its pool, task state, sampling keys and optimizer).
  assert "resuming at step 1" in runs["resumed_stdout"] and "initialised" not in runs["resumed_stdout"]
  unbroken, resumed = runs["before_kill"][2], runs["resumed"][2]
  assert resumed["experience/pool_digest"] == unbroken["experience/pool_digest"]
  assert seeded(resumed) == seeded(unbroken)
  assert json.loads((runs["killed_dir"] / "experience_run.json").read_text())["base"] == 0
