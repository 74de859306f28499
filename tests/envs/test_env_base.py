"""Action parsing and the episode bookkeeping every env shares."""

import pytest

from evolver import envs
from evolver.envs import base


@pytest.mark.parametrize("turn, action", [
    ("Thought: go.\nAction: move up", "move up"),
    ("Thought: go.\nAction:\nmove up\n", "move up"),  # AgentGym's template puts it on the next line
    ("Action: first\nThought: no, wait.\nAction: second", "second"),  # the last Action: wins
    ("move left", "move left"),  # no Action: -> the whole text
    ("Action: `get 1 oak log`.", "get 1 oak log"),
    ("Thought: nothing", "Thought: nothing"),
    ("Action:", ""),
])
def test_parse_action(turn, action):
  assert base.parse_action(turn) == action


def test_parse_tool_call_with_multiline_json():
  turn = 'Thought: t\nAction: get_weather\nAction Input: {\n  "city": "Oslo",\n  "day": "Monday"\n}\ntrailing'
  assert base.parse_tool_call(turn) == ("get_weather", {"city": "Oslo", "day": "Monday"}, None)


def test_parse_tool_call_without_input_and_with_bad_json():
  assert base.parse_tool_call("Action: list_todos") == ("list_todos", None, None)
  name, args, error = base.parse_tool_call("Action: add_todo\nAction Input: {oops")
  assert (name, args) == ("add_todo", None) and "not valid JSON" in error


def test_names_and_make():
  assert envs.names() == ["babyai", "maze", "sql", "textcraft", "tools", "wordle"]
  for name in envs.names():
    env = envs.make(name)
    assert isinstance(env, envs.Env) and env.name == name and env.version
  with pytest.raises(envs.EnvError, match="unknown env"):
    envs.make("chess")


def test_step_before_reset_raises_and_bad_tasks_are_refused():
  env = envs.make("maze")
  with pytest.raises(envs.EpisodeNotStartedError, match="reset"):
    env.step("Action: move up")
  with pytest.raises(envs.EpisodeNotStartedError):
    env.expert_action()
  for index, split in [(-1, "train"), (env.num_tasks("train"), "train"), (0, "test"), ("3", "train"),
                       (True, "train")]:
    with pytest.raises(envs.EnvError):
      env.reset(index, split)
  with pytest.raises(envs.EnvError):
    env.num_tasks("val")


def test_episode_ends_at_max_rounds_and_stays_over():
  env = envs.make("maze")
  env.reset(0)
  done = False
  for round_ in range(env.max_rounds):
    observation, reward, done, info = env.step("Action: jump")
    assert "Unknown action" in observation and reward == 0.0 and info == {"success": False}
    assert done == (round_ == env.max_rounds - 1)
  assert "Out of rounds" in observation
  observation, reward, done, info = env.step(env.expert_action())
  assert done and "episode is over" in observation and info == {"success": False}


def test_reward_is_score_so_far_after_success():
  env = envs.make("wordle")
  env.reset(0)
  while True:
    observation, reward, done, info = env.step(env.expert_action())
    if done:
      break
  assert reward == 1.0 and info["success"]
  again = env.step("Action: c r a t e")
  assert again[1:] == (1.0, True, {"success": True}) and "over" in again[0]
