"""The Env protocol, the shared episode bookkeeping, action parsing and task splits.

Every built-in environment subclasses `TextEnv`, which owns what is common to all of them: split and index
checks, the round counter and `max_rounds`, the "episode is over" answer after `done`, the error before any
`reset`, parsing the raw assistant turn into an action, and `info["success"]`. A subclass writes four things:
`_reset_task`, `_act`, `_expert_turn` and `_sample_action`; and, for tasks given as specs (`TaskSpec`) and
per-turn state keys, `_reset_spec` and `_state_key`; for self-questioning (exploring a world with its goal
hidden, then reading the outcomes reached as new tasks), `_reset_world` and the `_act` bookkeeping that calls
`_add_hindsight`; for held-out decontamination, `_target_key_now`; for the step judges' measures (cost to go
and progress, `measures`), `_measures`.

Rewards follow AgentGym: the reward of a step is the episode's score so far, in [0, 1], so a trajectory's
reward is the reward of its last step.
"""

from __future__ import annotations

import dataclasses
import hashlib
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

  def reset_spec(self, spec: "TaskSpec | dict[str, Any]") -> str:
    ...

  def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
    ...

  def expert_action(self) -> str:
    ...

  def state_key(self) -> str:
    ...


@runtime_checkable
class ExplorableEnv(Env, Protocol):
  """An Env that self-questioning can use (`TextEnv`, and `RemoteEnv` on our servers): it opens a task's world
  with no goal, describes what an exploration reached as tasks, and keys what tasks ask for decontamination."""

  @property
  def exploring(self) -> bool:
    ...

  def reset_world(self, index: int, split: str = "train", max_rounds: int | None = None) -> str:
    ...

  def hindsight_tasks(self) -> "list[HindsightTask]":
    ...

  def target_key(self, index: int, split: str) -> str:
    ...

  def spec_target_key(self, spec: "TaskSpec | dict[str, Any]") -> str:
    ...


# ----------------------------------------------------------------------------------------------------------
# Tasks given as specs.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskSpec:
  """A task given by what it asks rather than by an index: the world of an existing task, a goal, and the target
  the env checks, so that self-generated tasks are run and rewarded by the environment, never guessed.

  Attributes:
    env: the env's name.
    world: index of the task whose world (map, recipe set, database, level seed, ...) this task takes.
    split: that task's split. Self-questioning explores only "train" worlds, so held-out worlds never leak.
    target: what the env checks, JSON-able and env-specific (each env's `_reset_spec` documents its keys),
      e.g. maze {"cell": [row, col]}, textcraft {"item": name}.
    goal: the goal as the agent reads it; "" lets the env write its own text from the target.
  """

  env: str
  world: int
  split: str
  target: dict[str, Any]
  goal: str = ""

  def __post_init__(self):
    if not isinstance(self.env, str) or not self.env:
      raise EnvError("a task spec needs the env's name ('env')")
    if isinstance(self.world, bool) or not isinstance(self.world, int):
      raise EnvError(f"a task spec's 'world' must be a task index (int), got {type(self.world).__name__}")
    check_split(self.split)
    if not isinstance(self.target, dict) or not self.target:
      raise EnvError("a task spec's 'target' must be a non-empty JSON object")
    if not isinstance(self.goal, str):
      raise EnvError(f"a task spec's 'goal' must be a string, got {type(self.goal).__name__}")
    try:
      text = json.dumps(self.target, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as error:
      raise EnvError(f"a task spec's 'target' must be JSON: {error}") from None
    # Hold the target in its JSON form (tuples become lists), so that a spec equals itself after transport.
    object.__setattr__(self, "target", json.loads(text))

  def to_json(self) -> dict[str, Any]:
    return {"env": self.env, "world": self.world, "split": self.split, "target": self.target, "goal": self.goal}

  @classmethod
  def from_json(cls, data: Any) -> "TaskSpec":
    """Validates a spec given as JSON (an HTTP body, a stored task set); EnvError says what is wrong."""
    if isinstance(data, TaskSpec):
      return data
    if not isinstance(data, dict):
      raise EnvError(f"a task spec must be a JSON object, got {type(data).__name__}")
    unknown = sorted(set(data) - {"env", "world", "split", "target", "goal"})
    if unknown:
      raise EnvError(f"unknown task spec fields {unknown}; a spec has env, world, split, target and goal")
    missing = [k for k in ("env", "world", "target") if k not in data]
    if missing:
      raise EnvError(f"a task spec needs {missing}")
    return cls(env=data["env"], world=data["world"], split=data.get("split", "train"), target=data["target"],
               goal=data.get("goal", ""))

  def key(self) -> str:
    """A canonical text of the spec: two specs are the same task iff their keys are equal."""
    return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))

  def __hash__(self) -> int:
    return hash(self.key())

  @property
  def item_id(self) -> str:
    """The episode id of this task: `<env>_spec_<64-bit digest of the key>`, never equal to an indexed task's
    `<env>_<index>` (a 32-bit hash would let two of many thousand generated specs share an id)."""
    return f"{self.env}_spec_{stable_digest(self.key())}"


def check_target_keys(env: str, target: dict[str, Any], required: tuple[str, ...],
                      optional: tuple[str, ...] = ()) -> None:
  """Raises EnvError unless `target` has every key of `required` and no key outside `required + optional`."""
  allowed = required + optional
  unknown = sorted(set(target) - set(allowed))
  missing = [key for key in required if key not in target]
  if unknown or missing:
    what = f"unknown keys {unknown}" if unknown else f"missing keys {missing}"
    shape = " and ".join(part for part in (f"needs {list(required)}" if required else "",
                                           f"may have {list(optional)}" if optional else "") if part)
    raise EnvError(f"{env} spec target has {what}; a {env} target {shape}")


def spec_int(env: str, name: str, value: Any, low: int, high: int) -> int:
  """`value` as an int in [low, high], or EnvError naming the target field."""
  if isinstance(value, bool) or not isinstance(value, int):
    raise EnvError(f"{env} spec target {name!r} must be an integer, got {type(value).__name__}")
  if not low <= value <= high:
    raise EnvError(f"{env} spec target {name!r} must be in [{low}, {high}], got {value}")
  return value


def spec_str(env: str, name: str, value: Any) -> str:
  """`value` as a non-empty string, or EnvError naming the target field."""
  if not isinstance(value, str) or not value.strip():
    raise EnvError(f"{env} spec target {name!r} must be a non-empty string, got {value!r:.60}")
  return value


@dataclasses.dataclass(frozen=True)
class HindsightTask:
  """An outcome reached in an exploration episode (`TextEnv.reset_world`), described as a task.

  Attributes:
    spec: the task: the explored world (`world`, `split`), a target the env checks, and usually an empty goal
      (the env words its own) - sql words the goal itself (see `SqlEnv`).
    actions: the actions that reach the outcome from the world's start, in order, each what goes after
      "Action:" in a turn (`react_turn(thought, action)` makes the turn): `reset_spec(spec)` then `step` of each
      succeeds on the last, with the env's reward. Only effective actions: each env documents what it keeps.
    description: the outcome in a few words ("reached cell (3, 5)"), for whoever words a question from it.
  """

  spec: TaskSpec
  actions: list[str]
  description: str

  def __post_init__(self):
    if not isinstance(self.spec, TaskSpec):
      raise EnvError(f"a hindsight task's 'spec' must be a TaskSpec, got {type(self.spec).__name__}")
    if not isinstance(self.actions, list) or not self.actions or not all(isinstance(a, str) for a in self.actions):
      raise EnvError(f"a hindsight task's 'actions' must be a non-empty list of strings, got {self.actions!r:.80}")
    if not isinstance(self.description, str):
      raise EnvError(f"a hindsight task's 'description' must be a string, got {type(self.description).__name__}")

  def to_json(self) -> dict[str, Any]:
    return {"spec": self.spec.to_json(), "actions": list(self.actions), "description": self.description}

  @classmethod
  def from_json(cls, data: Any) -> "HindsightTask":
    """Validates a hindsight task given as JSON (`GET /hindsight`); EnvError says what is wrong."""
    if not isinstance(data, dict) or set(data) != {"spec", "actions", "description"}:
      raise EnvError(f"a hindsight task is a JSON object with spec, actions and description, got {data!r:.80}")
    return cls(TaskSpec.from_json(data["spec"]), data["actions"], data["description"])


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


def stable_digest(text: str) -> str:
  """A process-independent 64-bit digest of `text`, 16 hex digits: for spec ids and the long parts of state
  keys, where a 32-bit hash would collide too often among many specs or the many states of one task."""
  return hashlib.blake2b(text.encode("utf-8"), digest_size=8).hexdigest()


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


_MAX_STATE_CHARS = 96  # longer env states are hashed in state keys
MAX_EXPLORE_ROUNDS = 200  # the most rounds an exploration episode may be given


class TextEnv:
  """Base class of the built-in envs: episode bookkeeping around the env-specific methods.

  A task is either indexed (`reset(index, split)`) or given as a spec (`reset_spec(spec)`: the world of an
  indexed task, and a target that the env checks from its own true state). Both run and reward alike.

  Self-questioning: `reset_world(index, split)` opens the world of a task with no goal (an exploration
  episode), and `hindsight_tasks()` describes the outcomes reached so far as spec tasks, each with the actions
  that reach it. `target_key` and `spec_target_key` name what a task asks on which world, so that generated
  tasks that ask what a held-out task asks can be found and dropped.
  """

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
    self._spec: TaskSpec | None = None
    self._exploring = False
    self._round_limit = self.max_rounds
    self._hindsight: dict[str, HindsightTask] = {}  # dedupe key -> the first task with it
    self._key_env: TextEnv | None = None  # a scratch instance for target keys

  # --- the Env protocol ---------------------------------------------------------------------------------

  def instruction(self) -> str:
    raise NotImplementedError

  def num_tasks(self, split: str) -> int:
    check_split(split)
    return self._num_tasks(split)

  def reset(self, index: int, split: str = "train") -> str:
    check_index(index, split, self.num_tasks(split))
    observation = self._reset_guarded(lambda: self._reset_task(index, split))
    return self._begin(observation, index, split, None)

  def reset_spec(self, spec: TaskSpec | dict[str, Any]) -> str:
    """Starts the task that `spec` describes (a `TaskSpec` or its JSON form); returns the first observation.

    Raises:
      EnvError: the spec is malformed, names another env, its world is out of range, or the env cannot check
        its target (each env's `_reset_spec` documents its target keys). A call ends the current episode even
        when the spec is refused: then no episode is running, and `step` raises `EpisodeNotStartedError`
        until the next reset.
    """
    self._started = False  # whatever happens next, the current episode is over
    self._spec = None
    self._exploring = False
    spec = TaskSpec.from_json(spec)
    if spec.env != self.name:
      raise EnvError(f"this is the {self.name!r} env; the spec is for {spec.env!r}")
    check_index(spec.world, spec.split, self.num_tasks(spec.split))
    observation = self._reset_guarded(lambda: self._reset_spec(spec))
    return self._begin(observation, spec.world, spec.split, spec)

  def reset_world(self, index: int, split: str = "train", max_rounds: int | None = None) -> str:
    """Opens the world of task `index` of `split` with no goal: an exploration episode; returns the first
    observation, which describes the world without the task's goal (each env's `_reset_world` says what it
    shows).

    `step`, `sample_action` and `state_key` work as usual; the episode never succeeds, every reward is 0, and
    it ends after `max_rounds` rounds (default: the env's `max_rounds`) or at a world-specific end. There is no
    expert (`expert_action` raises EnvError). `hindsight_tasks()` reads what was reached.

    Raises:
      EnvError: bad split or index, or `max_rounds` not an int in [1, MAX_EXPLORE_ROUNDS]. A call ends the
        current episode even when refused, as `reset_spec` does.
    """
    self._started = False  # whatever happens next, the current episode is over
    self._spec = None
    self._exploring = False
    check_index(index, split, self.num_tasks(split))
    if max_rounds is not None and (isinstance(max_rounds, bool) or not isinstance(max_rounds, int)
                                   or not 1 <= max_rounds <= MAX_EXPLORE_ROUNDS):
      raise EnvError(f"an exploration's max_rounds must be an int in [1, {MAX_EXPLORE_ROUNDS}], got {max_rounds!r}")
    observation = self._reset_guarded(lambda: self._reset_world(index, split))
    return self._begin(observation, index, split, None, exploring=True, round_limit=max_rounds)

  @property
  def exploring(self) -> bool:
    """Whether the current (or last) episode is an exploration (`reset_world`)."""
    return self._started and self._exploring

  def hindsight_tasks(self) -> list[HindsightTask]:
    """The outcomes the exploration episode reached so far, one task per distinct target, in the order they
    were first reached; each replays: `reset_spec(task.spec)` then `step` of each of `task.actions` succeeds
    on the last one with the env's reward. Each env's `_reset_world` documents its outcomes and actions.

    Raises:
      EpisodeNotStartedError: no episode was started.
      EnvError: the current episode is not an exploration (hindsight tasks come from `reset_world`).
    """
    if not self._started:
      raise EpisodeNotStartedError(f"{self.name}: call reset_world(index, split) before hindsight_tasks()")
    if not self._exploring:
      raise EnvError(f"{self.name}: hindsight tasks come from an exploration episode (reset_world); the current "
                     "episode plays a task")
    return list(self._hindsight.values())

  def target_key(self, index: int, split: str) -> str:
    """What task `index` of `split` asks, on which world: `<env>|<world content>|<target>`, with the world named
    by its content (a digest of the map, recipe set, database, grid, ...), never by its index, and the target in
    a canonical form that ignores the goal's wording. A spec that asks what an indexed task asks on the same
    world has the same key (`spec_target_key`), whatever its split, index or goal text."""
    check_index(index, split, self.num_tasks(split))
    scratch = self._scratch()
    scratch.reset(index, split)
    return scratch._target_key_now()

  def spec_target_key(self, spec: TaskSpec | dict[str, Any]) -> str:
    """`target_key` for a task given as a spec. Raises EnvError for a spec `reset_spec` would refuse."""
    scratch = self._scratch()
    scratch.reset_spec(spec)
    return scratch._target_key_now()

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
    if self._exploring and (outcome.success or outcome.score):
      raise RuntimeError(f"{self.name}: an exploration episode scored or succeeded; the env's _act must not "
                         "reward an episode without a goal")
    self._score = min(1.0, max(0.0, float(outcome.score)))
    self._success = self._success or outcome.success
    self._done = outcome.done or self._success
    observation = outcome.observation
    if not self._done and self._rounds >= self._round_limit:
      self._done = True
      observation += f"\nOut of rounds ({self._round_limit}); the episode is over."
    self._observation = observation
    return observation, self._score, self._done, {"success": self._success}

  def expert_action(self) -> str:
    if not self._started:
      raise EpisodeNotStartedError(f"{self.name}: call reset(index, split) before expert_action()")
    if self._exploring:
      raise EnvError(f"{self.name}: an exploration episode (reset_world) has no goal, so there is no expert")
    return self._expert_turn()

  def state_key(self) -> str:
    """A key of the true state that the next action is taken in: `<task identity>|<env state>`.

    Built from the env's own state, never from the observation text (equal texts such as "Got 1 oak log" come
    from different states). Equal states of the same task give equal keys, in any episode and whatever the
    actions that led there; two tasks never share a key: the identity is `<env>/<split>/<index>` for an
    indexed task, `<env>/spec/<digest of the spec's key>` for a spec task and `<env>/explore/<split>/<index>`
    for an exploration of a task's world. An env state longer than
    `_MAX_STATE_CHARS` characters is replaced by `#<its stable_digest>`. The round counter is not part of the
    state. After the episode ends it is the key of the final state.
    """
    if not self._started:
      raise EpisodeNotStartedError(f"{self.name}: call reset(index, split) before state_key()")
    state = self._state_key()
    if len(state) > _MAX_STATE_CHARS:
      state = "#" + stable_digest(state)
    return f"{self._task_identity()}|{state}"

  def measures(self) -> dict[str, Any]:
    """The step judges' measures of the current true state (`evolver.credit.judges`), read before and after each
    step by rollouts that record them (`RolloutConfig.record_measures`):

      cost_to_go: int, the env's own measure of the least remaining cost to finish the task from this state;
        0 once the task is solved. An optimal step lowers it (every step of the env's expert, where the expert
        plays optimally), and so does an equally short alternative; an invalid action, a repeated no-op or a
        move away does not.
      progress: float in [0, 1], the env's own measure of how much of the task is done (sub-goals met, or the
        cost to go against the start's); 1.0 once the task is solved.

    Each env's `_measures` says what it counts. An exploration (`reset_world`) has no task: both are None. After
    the episode ends they measure the final state.

    Raises:
      EpisodeNotStartedError: no episode was started.
    """
    if not self._started:
      raise EpisodeNotStartedError(f"{self.name}: call reset(index, split) before measures()")
    if self._exploring:
      return {"cost_to_go": None, "progress": None}
    if self._success:
      return {"cost_to_go": 0, "progress": 1.0}
    cost, progress = self._measures()
    return {"cost_to_go": int(cost), "progress": min(1.0, max(0.0, float(progress)))}

  # --- conveniences beyond the protocol -----------------------------------------------------------------

  @property
  def observation(self) -> str:
    """The latest observation (what `GET /observation` answers)."""
    return self._observation

  @property
  def done(self) -> bool:
    return self._done

  @property
  def spec(self) -> TaskSpec | None:
    """The spec of the task being played, or None for an indexed task (and before any reset)."""
    return self._spec

  def sample_action(self, rng: random.Random) -> str:
    """A uniformly random well-formed action of the current state's action space, as a whole turn.

    This is the random baseline agent: uniform over what a policy could sensibly type, not over strings.
    """
    if not self._started:
      raise EpisodeNotStartedError(f"{self.name}: call reset(index, split) before sample_action()")
    return react_turn("I try something.", self._sample_action(rng))

  def close(self) -> None:
    """Releases what the env holds (files, connections); the server calls it when a session ends."""
    if self._key_env is not None:
      self._key_env.close()
      self._key_env = None

  def task_key(self, index: int, split: str) -> str:
    """A canonical description of task `index` of `split`; two tasks are the same task iff their keys are."""
    check_index(index, split, self.num_tasks(split))
    return self._task_key(index, split)

  def current_task_key(self) -> str:
    """The canonical key of the task being played: `task_key(index, split)` for an indexed task, `spec.key()`
    (a JSON object's text, which no indexed task's key is) for a spec task. An exploration plays no task:
    EnvError."""
    if not self._started:
      raise EpisodeNotStartedError(f"{self.name}: call reset(index, split) before current_task_key()")
    if self._exploring:
      raise EnvError(f"{self.name}: an exploration episode (reset_world) plays no task, so it has no task key")
    return self._spec.key() if self._spec is not None else self._task_key(self._index, self._split)

  # --- the shared bookkeeping ---------------------------------------------------------------------------

  def _reset_guarded(self, reset: Callable[[], str]) -> str:
    """Runs a subclass's reset; if it raises, the env is left with no episode rather than a half-reset one."""
    try:
      return reset()
    except BaseException:
      self._started = False
      self._spec = None
      self._exploring = False
      raise

  def _begin(self, observation: str, index: int, split: str, spec: TaskSpec | None, exploring: bool = False,
             round_limit: int | None = None) -> str:
    self._started = True
    self._exploring = exploring
    self._round_limit = self.max_rounds if round_limit is None else round_limit
    self._hindsight = {}
    self._done = False
    self._success = False
    self._score = 0.0
    self._rounds = 0
    self._index = index
    self._split = split
    self._spec = spec
    self._observation = observation
    return observation

  def _task_identity(self) -> str:
    if self._spec is not None:
      return f"{self.name}/spec/{stable_digest(self._spec.key())}"
    if self._exploring:
      return f"{self.name}/explore/{self._split}/{self._index}"
    return f"{self.name}/{self._split}/{self._index}"

  def _add_hindsight(self, target: dict[str, Any], actions: list[str], description: str, goal: str = "",
                     dedupe: str | None = None) -> None:
    """Records an outcome of the exploration: the task `target` (with `goal`, "" for the env's own words) on the
    explored world, reached by `actions`; the first outcome with a dedupe key (default: the target's JSON) wins.
    """
    spec = TaskSpec(self.name, self._index, self._split, target, goal)
    key = dedupe if dedupe is not None else json.dumps(spec.target, sort_keys=True)
    if key not in self._hindsight:
      self._hindsight[key] = HindsightTask(spec, list(actions), description)

  def _scratch(self) -> "TextEnv":
    """A private instance of this env for `target_key` (its episodes leave this one's untouched)."""
    if self._key_env is None:
      self._key_env = type(self)()
    return self._key_env

  # --- what a subclass writes ---------------------------------------------------------------------------

  def _num_tasks(self, split: str) -> int:
    raise NotImplementedError

  def _task_key(self, index: int, split: str) -> str:
    raise NotImplementedError

  def _reset_task(self, index: int, split: str) -> str:
    """Sets up task `index` of `split` and returns the first observation (the task description)."""
    raise NotImplementedError

  def _reset_spec(self, spec: TaskSpec) -> str:
    """Sets up the task `spec` describes and returns the first observation; `spec.env`, `spec.world` and
    `spec.split` are already checked. Raises EnvError, with what is wrong, for a target the env cannot check."""
    raise EnvError(f"the {self.name} env takes no task specs")

  def _reset_world(self, index: int, split: str) -> str:
    """Sets up the world of task `index` of `split` with no goal and returns the first observation, which must
    not give the task's goal away; `_act` must then never score, and records outcomes with `_add_hindsight`
    (`self._exploring` is True during the episode)."""
    raise EnvError(f"the {self.name} env cannot open a world without its goal")

  def _target_key_now(self) -> str:
    """The target key (see `target_key`) of the task just reset (indexed or spec), from the env's state."""
    raise NotImplementedError

  def _act(self, text: str) -> Outcome:
    """Applies the raw assistant turn `text`; must not raise on any string."""
    raise NotImplementedError

  def _expert_turn(self) -> str:
    raise NotImplementedError

  def _sample_action(self, rng: random.Random) -> str:
    raise NotImplementedError

  def _measures(self) -> tuple[int, float]:
    """(cost_to_go, progress) of the current state of an unsolved task (see `measures`; a solved one is (0, 1.0))."""
    raise NotImplementedError

  def _state_key(self) -> str:
    """The env-specific part of `state_key`: a short canonical text of the true state, without the task, made of
    `name=value` parts joined by "|" (never starting with "#", which marks a hashed state)."""
    raise NotImplementedError
