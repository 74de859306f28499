"""Expert trajectories: each built-in env's scripted expert, played out as AgentGym-style ReAct conversations.

A trajectory's messages are

  [user: instruction, assistant: "Ok.", user: first observation,
   assistant: expert turn, user: observation, ..., assistant: last expert turn]

The observation after the last step is not a message (nothing trains on it); the last step's reward and
`info["success"]` are the trajectory's. Episodes stop at `env.max_rounds` expert turns.

  python -c "from evolver.data import expert; print(expert.expert_trajectory('maze', 0).messages[-1])"
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import evolver.envs as envs_lib
from evolver.data.trajectory import OPENING_REPLY, Message, Trajectory


def item_id(env_name: str, index: int, split: str = "train") -> str:
  """AgentGym's item id (`maze_12`) for train tasks; `maze_eval_12` for the held-out split."""
  return f"{env_name}_{index}" if split == "train" else f"{env_name}_{split}_{index}"


def expert_trajectory(env_name: str, index: int, split: str = "train",
                      env: envs_lib.Env | None = None) -> Trajectory:
  """Plays task `index` of `split` with the env's scripted expert.

  Args:
    env_name: a built-in env (`evolver.envs.names()`).
    index: task index within `split`.
    split: "train" or "eval".
    env: an instance of `env_name` to reuse (making one per task is slow for some envs); it is reset here.
  """
  env = env if env is not None else envs_lib.make(env_name)
  messages = [Message("user", env.instruction()), Message("assistant", OPENING_REPLY),
              Message("user", env.reset(index, split))]
  reward, success = 0.0, False
  for round_index in range(env.max_rounds):
    turn = env.expert_action()
    messages.append(Message("assistant", turn))
    observation, reward, done, info = env.step(turn)
    success = bool(info["success"])
    if done:
      break
    if round_index + 1 < env.max_rounds:
      messages.append(Message("user", observation))
  return Trajectory(item_id=item_id(env_name, index, split), messages=messages, env=env_name,
                    task_index=index, split=split, env_version=env.version, reward=float(reward),
                    success=success)


def expert_trajectories(env_name: str, indices: Iterable[int], split: str = "train") -> Iterator[Trajectory]:
  """`expert_trajectory` over `indices`, reusing one env instance."""
  env = envs_lib.make(env_name)
  for index in indices:
    yield expert_trajectory(env_name, index, split, env=env)
