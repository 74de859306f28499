"""Expert trajectories: AgentGym's conversation layout, outcome from the last step, nothing after `done`."""

import pytest

import evolver.envs as envs
from evolver.data import expert
from evolver.data.trajectory import OPENING_REPLY


@pytest.mark.parametrize("name", envs.names())
def test_expert_trajectory_layout_and_outcome(name):
  env = envs.make(name)
  trajectory = expert.expert_trajectory(name, 1)
  messages = trajectory.messages
  assert (trajectory.item_id, trajectory.env, trajectory.task_index, trajectory.split) == (f"{name}_1", name, 1,
                                                                                          "train")
  assert trajectory.env_version == type(env).version
  assert messages[0].role == "user" and messages[0].content == env.instruction()
  assert messages[1].role == "assistant" and messages[1].content == OPENING_REPLY
  assert messages[2].role == "user" and messages[2].content == env.reset(1, "train")
  assert [m.role for m in messages[1:]] == (["assistant", "user"] * len(messages))[:len(messages) - 1]
  assert messages[-1].role == "assistant"  # the observation after the last step is not a message
  assert all(m.loss is None for m in messages)
  # Replaying the expert turns reproduces every observation, and the last turn ends the episode.
  turns = [m.content for m in messages[3::2]]
  assert 1 <= len(turns) <= env.max_rounds
  for i, turn in enumerate(turns):
    observation, reward, done, info = env.step(turn)
    if i + 1 < len(turns):
      assert not done and messages[4 + 2 * i].content == observation
  assert done and (trajectory.reward, trajectory.success) == (reward, info["success"])
  assert trajectory.success


def test_eval_split_item_ids_differ_from_train():
  trajectory = expert.expert_trajectory("maze", 0, "eval")
  assert (trajectory.item_id, trajectory.split) == ("maze_eval_0", "eval")
