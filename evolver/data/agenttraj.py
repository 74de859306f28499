"""AgentGym's AgentTraj JSON: read and write, losslessly for everything but token arrays.

The format (AgentGym's AgentTraj / AgentTraj-L files) is a JSON list of items:

  [{"item_id": "maze_12",
    "conversations": [{"from": "human", "loss": null, "value": "<instruction>"},
                      {"from": "gpt", "loss": false, "value": "Ok."},
                      {"from": "human", "loss": null, "value": "<first observation>"},
                      {"from": "gpt", "loss": true, "value": "Thought: ...\\nAction: ..."}, ...]}]

`from` is "human" (our role "user"), "gpt" ("assistant") or "system"; `loss` is true, false, null or absent
(null and absent both mean the default, see `Message.loss`). evolver writes its trajectory fields as extra keys
of each item (`env`, `task_index`, `split`, `env_version`, `reward`, `success`, `experience`, and `failed` /
`error` for failed rollouts); AgentGym ignores unknown keys, and `read_agenttraj` reads them back. Token
arrays (`token_ids`, `loss_mask`, `logprobs`) are not written: they belong to one tokenizer and one rollout.

Items without the extra keys (AgentGym's own files) get `env` and `task_index` from an item id of the form
`<env>_<index>` (e.g. "webshop_5238"), `reward` 0 and `success` False.

An item whose `conversations` is null or empty is an error (`AgentTrajError`, naming the file and the item),
or, with `skip_empty=True`, left out with a warning that names every item left out.

  python -c "from evolver.data import agenttraj; print(len(agenttraj.read_agenttraj('AgentTraj-L/maze.json')))"
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Sequence
from typing import Any

from evolver.data.trajectory import Message, Trajectory

FROM_TO_ROLE = {"human": "user", "gpt": "assistant", "system": "system"}
ROLE_TO_FROM = {role: source for source, role in FROM_TO_ROLE.items()}


class AgentTrajError(ValueError):
  """A malformed AgentTraj file; the message names the file and the item (index and item_id).

  Its parts, for callers that word the message their own way: `path`, `item` ("item 3 (item_id 'maze_3')", or
  None when the file as a whole is wrong), `problem`, and `skippable` (whether `skip_empty=True` would leave
  the item out instead).
  """

  path: str | None = None
  item: str | None = None
  problem: str | None = None
  skippable = False


class EmptyConversationError(ValueError):
  """An item whose `conversations` is null or empty (`skip_empty=True` leaves such items out)."""

  def __init__(self, problem: str):
    super().__init__(f"{problem}; pass skip_empty=True to drop such items")
    self.problem = problem


def _file_error(path: str, problem: str, item: str | None = None, skippable: bool = False) -> AgentTrajError:
  hint = "; pass skip_empty=True to drop such items" if skippable else ""
  error = AgentTrajError(f"{path}: {item}: {problem}{hint}" if item else f"{path}: {problem}")
  error.path, error.item, error.problem, error.skippable = path, item, problem, skippable
  return error


# ----------------------------------------------------------------------------------------------------------
# Trajectory <-> item (one element of the JSON list).
# ----------------------------------------------------------------------------------------------------------


def conversation_of(messages: Sequence[Message]) -> list[dict[str, Any]]:
  """Messages as AgentTraj `conversations` turns (`from`, `loss`, `value`)."""
  return [{"from": ROLE_TO_FROM[m.role], "loss": m.loss, "value": m.content} for m in messages]


def trajectory_to_item(trajectory: Trajectory) -> dict[str, Any]:
  """One AgentTraj item: `item_id`, `conversations`, then evolver's extra keys."""
  item: dict[str, Any] = {
      "item_id": trajectory.item_id,
      "conversations": conversation_of(trajectory.messages),
      "env": trajectory.env,
      "task_index": int(trajectory.task_index),
      "split": trajectory.split,
      "env_version": trajectory.env_version,
      "reward": float(trajectory.reward),
      "success": bool(trajectory.success),
      "experience": trajectory.experience,
  }
  if trajectory.failed or trajectory.error is not None:
    item["failed"] = bool(trajectory.failed)
    item["error"] = trajectory.error
  return item


def messages_from_conversation(conversation: Any) -> list[Message]:
  """AgentTraj `conversations` turns as Messages; raises ValueError naming the bad turn."""
  if not isinstance(conversation, list):
    raise ValueError(f"'conversations' must be a list, got {type(conversation).__name__}")
  messages = []
  for turn_index, turn in enumerate(conversation):
    where = f"turn {turn_index}"
    if not isinstance(turn, dict):
      raise ValueError(f"{where} must be an object, got {type(turn).__name__}")
    source = turn.get("from")
    if source not in FROM_TO_ROLE:
      raise ValueError(f"{where} has unknown 'from' {source!r}; expected one of {sorted(FROM_TO_ROLE)}")
    value = turn.get("value")
    if not isinstance(value, str):
      raise ValueError(f"{where} 'value' must be a string, got {type(value).__name__}")
    loss = turn.get("loss")
    if loss is not None and not isinstance(loss, bool):
      raise ValueError(f"{where} 'loss' must be true, false or null, got {loss!r}")
    messages.append(Message(FROM_TO_ROLE[source], value, loss))
  return messages


def _env_and_index(item_id: str) -> tuple[str, int]:
  """("maze", 12) from "maze_12"; ("", -1) when the id has no numeric suffix."""
  env, _, suffix = item_id.rpartition("_")
  if env and suffix.isdigit():
    return env, int(suffix)
  return "", -1


def _typed(item: dict[str, Any], key: str, types: tuple[type, ...], default: Any) -> Any:
  """item[key] checked against `types`; `default` when the key is absent or null."""
  value = item.get(key)
  if value is None:
    return default
  # bool is an int subclass, but a `true` task_index or reward is a mistake, not a number.
  if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
    names = " or ".join(t.__name__ for t in types)
    raise ValueError(f"{key!r} must be {names}, got {value!r}")
  return value


def item_to_trajectory(item: Any, *, skip_empty: bool = False) -> Trajectory | None:
  """A Trajectory from one AgentTraj item; raises ValueError (without the file/item prefix) when malformed.

  Returns None for a null or empty conversation when `skip_empty`, else such a conversation is an error
  (EmptyConversationError): an AgentTraj item always starts with its instruction, and one without is a broken
  export, not a task.
  """
  if not isinstance(item, dict):
    raise ValueError(f"item must be an object, got {type(item).__name__}")
  item_id = item.get("item_id")
  if not isinstance(item_id, str):
    raise ValueError(f"'item_id' must be a string, got {item_id!r}")
  if "conversations" not in item:
    raise ValueError("item has no 'conversations'")
  conversation = item["conversations"]
  if conversation is None or conversation == []:
    if skip_empty:
      return None
    state = "null" if conversation is None else "empty"
    raise EmptyConversationError(f"'conversations' is {state} (an item needs at least its instruction)")
  messages = messages_from_conversation(conversation)
  inferred_env, inferred_index = _env_and_index(item_id)
  reward = _typed(item, "reward", (int, float), 0.0)
  if not math.isfinite(reward):
    raise ValueError(f"'reward' must be finite, got {reward!r}")
  error = item.get("error")
  if error is not None and not isinstance(error, str):
    raise ValueError(f"'error' must be a string or null, got {error!r}")
  return Trajectory(
      item_id=item_id,
      messages=messages,
      env=_typed(item, "env", (str,), inferred_env),
      task_index=_typed(item, "task_index", (int,), inferred_index),
      split=_typed(item, "split", (str,), ""),
      env_version=_typed(item, "env_version", (str,), ""),
      reward=float(reward),
      success=_typed(item, "success", (bool,), False),
      failed=_typed(item, "failed", (bool,), False),
      error=error,
      experience=dict(_typed(item, "experience", (dict,), {})),
  )


# ----------------------------------------------------------------------------------------------------------
# Files.
# ----------------------------------------------------------------------------------------------------------


def _item_label(index: int, item: Any) -> str:
  item_id = item.get("item_id") if isinstance(item, dict) else None
  return f"item {index} (item_id {item_id!r})"


def parse_agenttraj(data: Any, source: str = "<data>", *, skip_empty: bool = False) -> list[Trajectory]:
  """Trajectories from already-parsed AgentTraj JSON; `source` names the file in errors and warnings.

  With `skip_empty`, items whose `conversations` is null or empty are left out, and one warning names them all.
  """
  if not isinstance(data, list):
    raise _file_error(source, f"an AgentTraj file is a JSON list of items, got {type(data).__name__}")
  trajectories, skipped = [], []
  for index, item in enumerate(data):
    try:
      trajectory = item_to_trajectory(item, skip_empty=skip_empty)
    except EmptyConversationError as error:
      raise _file_error(source, error.problem, _item_label(index, item), skippable=True) from None
    except (ValueError, TypeError) as error:
      raise _file_error(source, str(error), _item_label(index, item)) from error
    if trajectory is None:
      skipped.append(_item_label(index, item))
    else:
      trajectories.append(trajectory)
  if skipped:
    warnings.warn(f"{source}: skipped {len(skipped)} of {len(data)} items whose 'conversations' is null or empty "
                  f"(skip_empty): {', '.join(skipped)}", stacklevel=2)
  return trajectories


def loads_agenttraj(data: bytes | str, source: str = "<data>", *, skip_empty: bool = False) -> list[Trajectory]:
  """All trajectories of an AgentTraj file's contents (UTF-8 bytes or text); `source` names it in errors."""
  try:
    items = json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
  except json.JSONDecodeError as error:
    raise _file_error(source, f"not valid JSON: {error}") from error
  except UnicodeDecodeError as error:
    raise _file_error(source, f"not UTF-8 text: {error}") from error
  return parse_agenttraj(items, source, skip_empty=skip_empty)


def dumps_agenttraj(trajectories: Iterable[Trajectory]) -> str:
  """An AgentTraj file's text (unicode unescaped, one space of indent, a final newline)."""
  return json.dumps([trajectory_to_item(t) for t in trajectories], ensure_ascii=False, indent=1) + "\n"


def read_agenttraj(path: str | os.PathLike, *, skip_empty: bool = False) -> list[Trajectory]:
  """All trajectories of an AgentTraj JSON file (UTF-8)."""
  path = os.fspath(path)
  with open(path, "rb") as f:
    return loads_agenttraj(f.read(), path, skip_empty=skip_empty)


def write_agenttraj(path: str | os.PathLike, trajectories: Iterable[Trajectory]) -> None:
  """Writes an AgentTraj JSON file (UTF-8, unicode unescaped) atomically: a reader never sees half a file."""
  path = os.fspath(path)
  text = dumps_agenttraj(trajectories)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  temporary = f"{path}.tmp{os.getpid()}"
  try:
    with open(temporary, "w", encoding="utf-8") as f:
      f.write(text)
    os.replace(temporary, path)
  finally:
    if os.path.exists(temporary):
      os.unlink(temporary)
