"""Self-questioned tasks in the RL loop (evolver/train/synthetic_tasks.py): the step's tasks drawn from the
mixture, the synthetic set kept in checkpoints (a resumed run mixes the same tasks), rollouts grown into new tasks,
and a synthetic task's ground truth as a trajectory (what can seed the experience pool)."""

import json
import random

import pytest

from evolver import envs
from evolver.data.trajectory import Message
from evolver.rollout import Rollout, Task
from evolver.tasks.taskset import SyntheticTask, ground_truth_trajectory, save_taskset
from evolver.train.synthetic_tasks import SyntheticTasks, rollout_actions


def explored_records(name, worlds, steps=15, seed=0):
  """Hindsight tasks of random explorations of train worlds [80, 80 + worlds)."""
  env, rng, records = envs.make(name), random.Random(seed), []
  for world in range(80, 80 + worlds):
    env.reset_world(world, "train")
    for _ in range(steps):
      if env.done:
        break
      env.step(env.sample_action(rng))
    records += [SyntheticTask(spec=t.spec, actions=tuple(t.actions), description=t.description,
                              source={"proposer": "hindsight", "world": world, "episode": 0})
                for t in env.hindsight_tasks()]
  return records


@pytest.fixture()
def small_slices():
  import gin
  with gin.unlock_config():
    gin.bind_parameter("TaskSlices.explore_count", 4)
  yield
  gin.clear_config()


def test_the_step_draws_from_the_mixture_and_a_resumed_run_mixes_the_same_tasks(tmp_path, small_slices):
  records = explored_records("maze", 2)
  assert len(records) >= 4
  path = tmp_path / "tasks.jsonl"
  save_taskset(str(path), records)
  ext = SyntheticTasks(taskset=str(path), synthetic_data_ratio=1.0)
  ext.start(model_dir=str(tmp_path), envs=["maze"], seed=5)
  assert ext.mixture.stats()["pool"] == 8 and ext.mixture.synthetic_used == 4  # 4 originals + 4 x 1.0
  drawn = ext.choose_tasks(3, [Task("maze", 0)] * 6)
  assert len(drawn) == 6 and drawn == ext.choose_tasks(3, [Task("maze", 1)] * 6)  # (seed, step) alone
  assert any(t.spec is not None for t in ext.mixture.pool) and any(t.spec is None for t in ext.mixture.pool)
  files = ext.state_files()
  save_taskset(str(path), records[::-1][:2])  # the file changes after the checkpoint
  resumed = SyntheticTasks(taskset=str(path), synthetic_data_ratio=1.0)
  with pytest.warns(UserWarning, match="the task set has 2: using all of them"):
    resumed.start(model_dir=str(tmp_path), envs=["maze"], seed=5)
  resumed.load_state_files(files)
  assert resumed.mixture.pool == ext.mixture.pool
  assert resumed.choose_tasks(3, [Task("maze", 0)] * 6) == drawn
  ext.close()
  resumed.close()


def test_rollouts_grow_the_synthetic_set(tmp_path, small_slices):
  ext = SyntheticTasks(taskset=None, synthetic_data_ratio=1.0, regenerate_every=1)
  with pytest.warns(UserWarning, match="using all of them"):
    ext.start(model_dir=str(tmp_path), envs=["maze"], seed=0)
  env = envs.make("maze")
  opening = [Message("user", env.instruction()), Message("assistant", "Ok."), Message("user", env.reset(81))]
  turns = []
  for _ in range(4):  # the expert's own moves: they reach cells, which become tasks
    turn = env.expert_action()
    turns += [Message("assistant", turn), Message("user", env.step(turn)[0])]
  rollout = Rollout(item_id="maze_81", messages=opening + turns, env="maze", task_index=81, split="train",
                    turns=4, group=0, opening_len=3)
  assert len(rollout_actions(rollout)) == 4 and rollout_actions(rollout)[0].startswith("move ")
  row = ext.after_step(0, [rollout])
  assert row["added"] >= 4 and row["synthetic_available"] == row["added"]  # the expert's path: 4 new cells
  assert ext.mixture.synthetic_used == 4
  for record in ext.mixture.records:  # every added task replays to success in a fresh env
    trajectory = ground_truth_trajectory(record, envs.make("maze"))
    assert trajectory.success and trajectory.task_spec == record.spec.to_json()
    assert trajectory.messages[1].content == "Ok." and trajectory.messages[3].content.startswith("Thought:")
  assert ext.after_step(1, [rollout])["added"] == 0  # the same outcomes again: nothing new
  ext.close()


def test_an_llm_proposes_the_tasks_from_the_replayed_rollouts(tmp_path, small_slices):
  with pytest.raises(ValueError, match="needs `llm`"):
    SyntheticTasks(proposer="llm")
  prompts_seen = []

  def generate(prompts):  # an LLM that names the rollout's first two moves as a task
    prompts_seen.extend(prompts)
    return ['[{"query": "walk two squares", "confidence": 0.9, "action_sequence": '
            f'{json.dumps(moves[:2])}}}]', "no JSON here"][:len(prompts)]

  ext = SyntheticTasks(taskset=None, regenerate_every=1, proposer="llm", llm=generate)
  with pytest.warns(UserWarning, match="using all of them"):
    ext.start(model_dir=str(tmp_path), envs=["maze"], seed=0)
  env = envs.make("maze")
  opening = [Message("user", env.instruction()), Message("assistant", "Ok."), Message("user", env.reset(81))]
  turns = []
  for _ in range(3):
    turn = env.expert_action()
    turns += [Message("assistant", turn), Message("user", env.step(turn)[0])]
  rollout = Rollout(item_id="maze_81", messages=opening + turns, env="maze", task_index=81, split="train",
                    turns=3, group=0, opening_len=3)
  moves = rollout_actions(rollout)
  with pytest.warns(UserWarning, match="the task set has 1: using all of them"):
    row = ext.after_step(0, [rollout])
  assert len(prompts_seen) == 1 and "Action: " + moves[0] in prompts_seen[0]
  assert row["llm_prompts"] == 1 and row["llm_proposals"] == 1 and row["added"] == 1
  (record,) = ext.mixture.records
  assert record.spec.goal == "walk two squares" and record.source["proposer"] == "rollout_llm"
  assert ground_truth_trajectory(record, envs.make("maze")).success
  ext.close()
