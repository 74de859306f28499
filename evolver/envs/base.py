"""The Env protocol, the shared episode bookkeeping, action parsing and task splits.

Every built-in environment subclasses `TextEnv`, which owns what is common to all of them: split and index
checks, the round counter and `max_rounds`, the "episode is over" answer after `done`, the error before any
`reset`, parsing the raw assistant turn into an action, and `info["success"]`. A subclass writes four things:
`_reset_task`, `_act`, `_expert_turn` and `_sample_action`.

Rewards follow AgentGym: the reward of a step is the episode's score so far, in [0, 1], so a trajectory's
reward is the reward of its last step.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
import threading
import zlib
from typing import Any, Callable, Generic, Protocol, TypeVar, runtime_checkable

SPLITS = ("train", "eval")


class EnvError(ValueError):
  """A caller error: unknown split, index out of range, bad argument (HTTP 400)."""


class EpisodeNotStartedError(RuntimeError):
  """`step` or `expert_action` before any `reset` (HTTP 409)."""


@runtime_checkable
class Env(Protocol):
  """What rollouts, data builders and the HTTP server rely on; local and remote envs both satisfy it."""

  name: str
  version: str
  max_rounds: int

  def instruction(self) -> str:
    ...

  def num_tasks(self, split: str) -> int:
    ...

  def reset(self, index: int, split: str = "train") -> str:
    ...

  def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
    ...

  def expert_action(self) -> str:
    ...


# ----------------------------------------------------------------------------------------------------------
# Parsing the raw assistant turn.
# ----------------------------------------------------------------------------------------------------------

_ACTION_MARK = "Action:"
_STRIP_CHARS = " \t\r\n`'\"*"


def action_text(turn: str) -> str:
  """Everything after the last `Action:` of a ReAct turn, or the whole turn when it has none (stripped)."""
  position = turn.rfind(_ACTION_MARK)
  if position >= 0:
    turn = turn[position + len(_ACTION_MARK):]
  return turn.strip()


def parse_action(turn: str) -> str:
  """The single-line action of a turn: the first non-empty line of `action_text`, without quotes or a final dot.

  AgentGym's templates put the action either on the `Action:` line or on the line below it; both parse.
  """
  for line in action_text(turn).splitlines():
    line = line.strip(_STRIP_CHARS)
    if line:
      return line.rstrip(".").strip(_STRIP_CHARS)
  return ""


_JSON_DECODER = json.JSONDecoder()
_INPUT_MARK = re.compile(r"Action\s+Input\s*:", re.IGNORECASE)


def parse_tool_call(turn: str) -> tuple[str, Any, str | None]:
  """A tool call `Action: fn` + `Action Input: {json}` (the JSON may span lines).

  Returns:
    (function name, parsed arguments or None when absent, an error message or None). The JSON is read with
    `raw_decode`, so trailing text after the object is ignored.
  """
  body = action_text(turn)
  match = _INPUT_MARK.search(body)
  head = body[:match.start()] if match else body
  name = ""
  for line in head.splitlines():
    line = line.strip(_STRIP_CHARS)
    if line:
      name = line.rstrip(".").strip(_STRIP_CHARS)
      break
  if match is None:
    return name, None, None
  rest = body[match.end():].strip()
  if rest.startswith("```"):
    rest = rest.strip("`").removeprefix("json").strip()
  if not rest:
    return name, None, None
  try:
    arguments, _ = _JSON_DECODER.raw_decode(rest)
  except ValueError as error:
    return name, None, f"Action Input is not valid JSON ({error.__class__.__name__}: {error})."
  return name, arguments, None


def react_turn(thought: str, action: str) -> str:
  """The expert's whole assistant turn."""
  return f"Thought: {thought}\nAction: {action}"


# ----------------------------------------------------------------------------------------------------------
# Deterministic, disjoint task splits.
# ----------------------------------------------------------------------------------------------------------


def stable_hash(text: str) -> int:
  """A process-independent 32-bit hash (Python's `hash` is salted per process)."""
  return zlib.crc32(text.encode("utf-8"))


def split_of(key: str, eval_every: int) -> str:
  """Which split a task belongs to, from its content key alone: equal tasks always land in the same split."""
  return "eval" if stable_hash(key) % eval_every == 0 else "train"


TaskT = TypeVar("TaskT")


class SplitIndex(Generic[TaskT]):
  """Index -> task for procedurally generated envs, with train and eval disjoint by construction.

  Tasks are generated from seeds 0, 1, 2, ...; each goes to the split chosen by a hash of its content key
  (`split_of`), duplicates are dropped, and the i-th task of a split is the i-th that landed there. The lists
  grow lazily and are shared by every env instance of the process (generation is deterministic).
  """

  def __init__(self, generate: Callable[[int], TaskT | None], key: Callable[[TaskT], str],
               sizes: dict[str, int], eval_every: int):
    self._generate = generate
    self._key = key
    self.sizes = dict(sizes)
    self._eval_every = eval_every
    self._tasks: dict[str, list[TaskT]] = {split: [] for split in SPLITS}
    self._seen: set[str] = set()
    self._next_seed = 0
    self._lock = threading.Lock()

  def get(self, index: int, split: str) -> TaskT:
    check_index(index, split, self.sizes[split] if split in self.sizes else 0)
    tasks = self._tasks[split]
    if len(tasks) <= index:
      with self._lock:
        while len(tasks) <= index:
          self._grow()
    return tasks[index]

  def key(self, index: int, split: str) -> str:
    return self._key(self.get(index, split))

  def _grow(self) -> None:
    seed = self._next_seed
    self._next_seed += 1
    if seed > 1000 * sum(self.sizes.values()) + 10_000:
      raise RuntimeError("task generator keeps producing duplicates; the task space is too small")
    task = self._generate(seed)
    if task is None:
      return
    key = self._key(task)
    if key in self._seen:
      return
    self._seen.add(key)
    self._tasks[split_of(key, self._eval_every)].append(task)


def check_split(split: str) -> None:
  if split not in SPLITS:
    raise EnvError(f"unknown split {split!r}; use one of {list(SPLITS)}")


def check_index(index: int, split: str, size: int) -> None:
  check_split(split)
  if isinstance(index, bool) or not isinstance(index, int):
    raise EnvError(f"task index must be an int, got {type(index).__name__}")
  if not 0 <= index < size:
    raise EnvError(f"task index {index} out of range for split {split!r} (0 <= index < {size})")


# ----------------------------------------------------------------------------------------------------------
# The shared episode bookkeeping.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
  """What one action did: the observation, the episode's score so far, whether it ended, whether it succeeded."""
  observation: str
  score: float
  done: bool = False
  success: bool = False


class TextEnv:
  """Base class of the built-in envs: episode bookkeeping around four env-specific methods."""

  name: str = ""
  version: str = ""
  max_rounds: int = 20

  def __init__(self):
    self._started = False
    self._done = False
    self._success = False
    self._score = 0.0
    self._rounds = 0
    self._observation = ""
    self._index = -1
    self._split = "train"

  # --- the Env protocol ---------------------------------------------------------------------------------

  def instruction(self) -> str:
    raise NotImplementedError

  def num_tasks(self, split: str) -> int:
    check_split(split)
    return self._num_tasks(split)

  def reset(self, index: int, split: str = "train") -> str:
    check_index(index, split, self.num_tasks(split))
    observation = self._reset_task(index, split)
    self._started = True
    self._done = False
    self._success = False
    self._score = 0.0
    self._rounds = 0
    self._index = index
    self._split = split
    self._observation = observation
    return observation

  def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
    if not self._started:
      raise EpisodeNotStartedError(f"{self.name}: call reset(index, split) before step()")
    if not isinstance(text, str):
      raise EnvError(f"action must be a string, got {type(text).__name__}")
    if self._done:
      observation = "The episode is over; no further actions are accepted. Reset to start a new task."
      return observation, self._score, True, {"success": self._success}
    self._rounds += 1
    outcome = self._act(text)
    self._score = min(1.0, max(0.0, float(outcome.score)))
    self._success = self._success or outcome.success
    self._done = outcome.done or self._success
    observation = outcome.observation
    if not self._done and self._rounds >= self.max_rounds:
      self._done = True
      observation += f"\nOut of rounds ({self.max_rounds}); the episode is over."
    self._observation = observation
    return observation, self._score, self._done, {"success": self._success}

  def expert_action(self) -> str:
    if not self._started:
      raise EpisodeNotStartedError(f"{self.name}: call reset(index, split) before expert_action()")
    return self._expert_turn()

  # --- conveniences beyond the protocol -----------------------------------------------------------------

  @property
  def observation(self) -> str:
    """The latest observation (what `GET /observation` answers)."""
    return self._observation

  @property
  def done(self) -> bool:
    return self._done

  def sample_action(self, rng: random.Random) -> str:
    """A uniformly random well-formed action of the current state's action space, as a whole turn.

    This is the random baseline agent: uniform over what a policy could sensibly type, not over strings.
    """
    if not self._started:
      raise EpisodeNotStartedError(f"{self.name}: call reset(index, split) before sample_action()")
    return react_turn("I try something.", self._sample_action(rng))

  def close(self) -> None:
    """Releases what the env holds (files, connections); the server calls it when a session ends."""

  def task_key(self, index: int, split: str) -> str:
    """A canonical description of task `index` of `split`; two tasks are the same task iff their keys are."""
    check_index(index, split, self.num_tasks(split))
    return self._task_key(index, split)

  # --- what a subclass writes ---------------------------------------------------------------------------

  def _num_tasks(self, split: str) -> int:
    raise NotImplementedError

  def _task_key(self, index: int, split: str) -> str:
    raise NotImplementedError

  def _reset_task(self, index: int, split: str) -> str:
    """Sets up task `index` of `split` and returns the first observation (the task description)."""
    raise NotImplementedError

  def _act(self, text: str) -> Outcome:
    """Applies the raw assistant turn `text`; must not raise on any string."""
    raise NotImplementedError

  def _expert_turn(self) -> str:
    raise NotImplementedError

  def _sample_action(self, rng: random.Random) -> str:
    raise NotImplementedError
