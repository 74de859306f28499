"""Every built-in env: splits, the expert, the random baseline, the instruction."""

import random
import re

import pytest

from evolver import envs
from evolver.envs import report

NAMES = envs.names()


@pytest.mark.parametrize("name", NAMES)
def test_splits_have_the_promised_sizes_and_never_overlap(name):
  env = envs.make(name)
  assert env.num_tasks("train") >= 500 and env.num_tasks("eval") >= 100
  keys = {split: [env.task_key(i, split) for i in range(env.num_tasks(split))] for split in ("train", "eval")}
  for split, split_keys in keys.items():
    assert len(set(split_keys)) == len(split_keys), f"duplicate tasks within {split}"
  assert not set(keys["train"]) & set(keys["eval"])


@pytest.mark.parametrize("name", NAMES)
def test_tasks_are_deterministic_by_index(name):
  first, second = envs.make(name), envs.make(name)
  for index in (0, 7, 99):
    assert first.reset(index, "eval") == second.reset(index, "eval")
    assert first.expert_action() == second.expert_action()
  assert first.task_key(3, "train") != first.task_key(3, "eval")


@pytest.mark.parametrize("name", NAMES)
def test_expert_solves_50_random_eval_and_50_random_train_tasks(name):
  env = envs.make(name)
  rng = random.Random(1234)
  for split in ("eval", "train"):
    for index in rng.sample(range(env.num_tasks(split)), 50):
      env.reset(index, split)
      done, turns = False, 0
      while not done:
        turn = env.expert_action()
        assert re.fullmatch(r"Thought: [^\n]+\nAction: .+", turn, re.DOTALL), turn
        observation, reward, done, info = env.step(turn)
        assert isinstance(observation, str) and 0.0 <= reward <= 1.0 and "success" in info
        turns += 1
      assert info["success"], f"{name} {split}[{index}]: expert failed: {observation}"
      assert reward > 0.0 and turns <= env.max_rounds


@pytest.mark.parametrize("name", NAMES)
def test_random_agent_rarely_succeeds(name):
  env = envs.make(name)
  rate = report.random_success_rate(env, episodes=100, seed=0)
  print(f"\nrandom agent success on {name}: {rate:.2f}")
  assert rate <= 0.25


@pytest.mark.parametrize("name", NAMES)
def test_instruction_is_a_short_react_conversation_start(name):
  text = envs.make(name).instruction()
  assert "Thought:" in text and "Action:" in text
  assert len(text.split()) < 350


@pytest.mark.parametrize("name", NAMES)
def test_malformed_action_explains_how_to_act(name):
  env = envs.make(name)
  env.reset(0)
  observation, reward, done, info = env.step("Thought: hmm\nAction: %%%")
  assert isinstance(observation, str) and observation and not done and reward == 0.0
  assert info == {"success": False}


def test_babyai_seed_lists_are_solved_by_the_bot():
  """The stored seed list agrees with a recomputation for a few seeds of every level."""
  from evolver.envs import babyai
  import gymnasium as gym
  for level in babyai.LEVELS:
    world = gym.make(level)
    for seed in babyai.seed_lists()[level]["eval"][:3]:
      assert babyai.bot_solution_length(world, seed, 16) is not None


def test_babyai_reward_is_babyai_s_own():
  env = envs.make("babyai")
  env.reset(0, "eval")
  done = False
  while not done:
    _, reward, done, info = env.step(env.expert_action())
  assert info["success"] and 0.1 < reward < 1.0  # 1 - 0.9 * steps / max_steps


def test_tools_reward_is_the_fraction_of_subgoals_met():
  env = envs.make("tools")
  for index in range(40):
    env.reset(index)
    if len(env._task.goals) == 3:
      break
  rewards = []
  while True:
    _, reward, done, info = env.step(env.expert_action())
    rewards.append(reward)
    if done:
      break
  assert rewards[-1] == 1.0 and set(rewards) <= {0.0, 1 / 3, 2 / 3, 1.0}
  env.reset(index)
  observation, reward, done, info = env.step('Action: finish\nAction Input: {"answer": "no idea"}')
  assert done and not info["success"] and reward < 1.0


def test_textcraft_expert_splits_large_gets():
  # Tasks needing more than 64 of a raw material: one `get` takes at most 64.
  env = envs.make("textcraft")
  for index in (166, 246):
    env.reset(index, "train")
    done, info, turns = False, {}, 0
    while not done and turns < env.max_rounds:
      _, _, done, info = env.step(env.expert_action())
      turns += 1
    assert info["success"], index


def test_babyai_resets_in_threads_leave_stdout_alone(capsys, monkeypatch):
  """The rollout engine resets envs in threads: the level generator's rejection messages are dropped without
  touching the process-wide sys.stdout (a redirect per reset raced and lost the process's later prints)."""
  import concurrent.futures
  import sys

  from minigrid.envs.babyai.core import roomgrid_level

  seen = []
  generate = roomgrid_level.RoomGridLevel._gen_grid

  def recording(self, *args, **kwargs):
    seen.append(sys.stdout)
    roomgrid_level.print("Sampling rejected: (a message the generator prints)")
    return generate(self, *args, **kwargs)

  monkeypatch.setattr(roomgrid_level.RoomGridLevel, "_gen_grid", recording)
  stdout = sys.stdout
  worlds = [envs.make("babyai") for _ in range(4)]
  with concurrent.futures.ThreadPoolExecutor(4) as pool:
    list(pool.map(lambda i: worlds[i].reset(i, "train"), range(4)))
  assert seen and all(s is stdout for s in seen)
  assert sys.stdout is stdout
  print("still here")
  assert capsys.readouterr().out == "still here\n"
