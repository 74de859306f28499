"""sciworld: ScienceWorld's science tasks, simulated and scored offline, presented as AgentGym's SciWorld server does.

Task source: the `scienceworld` wheel (a py4j wrapper around its `scienceworld.jar` simulator; its version is in
`SciWorldEnv.version` and so in every result; it needs Java). The games are AgentGym's: ScienceWorld's tasks in the
library's task order (`scienceworld.constants.ID2TASK`) except AgentGym's seven exceptions (5-1, 5-2, 9-1, 9-2, 9-3,
10-1, 10-2: growing plants, inclined planes, Mendelian genetics), each task in its variations.

Split: ScienceWorld's own variation split, per task: `train` is each task's training variations
(`getVariationsTrain`), `eval` its test variations (`getVariationsTest`); its dev variations are in neither split.
Within a split, the tasks take turns: the first variation of every task (library order), then the second of
every task that has one, and so on, so that any prefix of a split (a `TaskSlices` slice, the first N `eval` tasks)
covers every task type while it can. With scienceworld 1.2.3 that is 2312 train and 1171 eval variations, less
`EXCLUDED` (below): 2307 train and 1156 eval tasks. A task's key is `<task id>:<task name>:<variation>`. Listing
the variations needs the simulator loaded once per task, so the lists are computed once per process.

Simulator: one JVM per process, launched on first use (py4j's `launch_gateway`, as the wrapper launches it), and
one simulator (`PythonInterface`) per env instance, called directly: the wrapper's `step` also builds every valid
action-object combination on each step, which we do not need. ScienceWorld keeps some state per JVM rather than
per simulator (its random generator, seeded by each load and drawn from as the world runs, and its object id
counter, reset by each load), and hashes its world objects by identity, so by default a variation can play
differently from one load to the next. The env makes each variation play the same in every load, thread and
process: the JVM runs with equal identity hashes (HotSpot's `-XX:hashCode=2`: hash sets iterate in insertion
order; loads take up to about twice as long), every call holds the JVM's lock and runs on the simulator's own
saved generator state and id counter (`_Jvm`), and the first load of a variation in a JVM, which can differ from
all later ones, is done twice. Env instances may so be stepped from many threads at once (each instance from one
thread at a time), with the same results as alone; their calls into the JVM take turns.

Observation: after a reset (`load(task, variation, "", generateGoldPath=False)`, as AgentGym's server loads: making
the gold path takes 1-15 s on some tasks, a load without it ~0.1 s), the task description, a newline
and the output of "look around", as AgentGym's client shows it; after each step, the simulator's output.

Action (the text after the last `Action:`): one ScienceWorld command ("go to kitchen", "focus on substance in
metal pot", "wait1"), cleaned up as `base.parse_action` cleans it (and so as AgentGym's adapter sends it: quotes,
backticks and a final period dropped), and sent as it is. An action longer than `MAX_ACTION_CHARS` characters,
or with a line break or another control character, is not sent: its observation says why, and no time passes in
the world. An ambiguous command gets ScienceWorld's numbered list of what it could mean ("Ambiguous request:
Please enter the number for the action you intended (or blank to cancel): 0: ..."), and no time passes; the next
action is then the number of the one meant (an out-of-range number is an unknown action, anything else cancels
and is read as a command), as in ScienceWorld. Unknown or malformed commands get ScienceWorld's own answers
("Unknown action. ...", "No known action matches that input.") and take a move, as there.

Scoring: ScienceWorld's own (`getScore`, its goal checks), as its wrapper and AgentGym's server report it: score =
round(100 * getScore()); the episode ends when the simulator says the task is completed, when the simulator has
counted more than `STEP_LIMIT` (100, the wrapper's default that AgentGym keeps) moves, or when the score is
negative (a wrong `focus on` fails the task at once). The reward of a step is max(score, 0) / 100, the score so far
(AgentGym's convention), and the episode succeeds when score >= 100.

Expert: ScienceWorld's gold action sequence for the loaded variation (generated only when the expert or
`measures()` first needs it, on a simulator of its own, and kept for the process), played in order; a pointer
into it advances whenever the agent plays the action at the pointer (case and spacing ignored), so the expert can
take over an episode the agent began with gold actions. Gold paths run on a little past the point where the task completes;
on the tasks kept they have 2 to 143 actions (median 20, 90th percentile 43, 99th 94; the state-change tasks 1-x
and 2-3 have the longest) and the expert needs at most 108 steps (median 19), so `max_rounds` is 150.
`measures()` counts the gold actions left (cost to go) and the score / 100 (progress).

Excluded (`EXCLUDED`, in neither split): variations whose gold path does not reach score 100 under these rules.
The gold path of every variation of both splits was played once (`gold_outcome`; deterministic, see Simulator):
17 state-change variations (boil, melt, freeze, change state: 15 eval, 2 train) whose gold path takes more than
`STEP_LIMIT` moves (heating or cooling slowly, examining the substance again and again), ending with scores of 37
to 87; and 3 train variations of the melting-point tasks (2-2: 211; 2-3: 10, 60) whose gold path ends by focusing
on an answer box the task does not accept (score -100). Every other variation's gold path reached 100 in that
survey.

The env takes no spec tasks and opens no explorations (the tasks are ScienceWorld's, fixed).
"""

from __future__ import annotations

import collections
import dataclasses
import importlib.metadata
import random
import threading
import unicodedata
from typing import Any, Callable, TypeVar

from evolver.envs import base
from evolver.envs.adapters import SCIWORLD_INSTRUCTION

try:
  from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
  from py4j.protocol import Py4JJavaError
  from scienceworld.constants import BASEPATH, ID2TASK, JAR_PATH
except ImportError as error:  # pragma: no cover - depends on the install
  raise ImportError("the sciworld env needs scienceworld (and Java): pip install scienceworld==1.2.3 "
                    f"(launch/setup_venv.sh does it); {error}") from error

SCIENCEWORLD_VERSION = importlib.metadata.version("scienceworld")
AGENTGYM_EXCEPTIONS = frozenset({"5-1", "5-2", "9-1", "9-2", "9-3", "10-1", "10-2"})
STEP_LIMIT = 100  # moves; the wrapper's default `envStepLimit`, which AgentGym's server keeps
MAX_ACTION_CHARS = 300

# Variations whose gold path does not reach score 100 under the env's rules (see the module docstring): task id ->
# variations, with why; test_sciworld checks that each still fails.
EXCLUDED: dict[str, tuple[int, ...]] = {
    "1-1": (22, 23, 24, 26, 28),  # boil: more than STEP_LIMIT moves
    "1-2": (22, 24, 25),  # melt: more than STEP_LIMIT moves
    "1-3": (5, 11, 22, 24, 25, 27),  # freeze: more than STEP_LIMIT moves
    "1-4": (22, 24, 25),  # change-the-state-of-matter-of: more than STEP_LIMIT moves
    "2-2": (211,),  # measure-melting-point-known-substance: a wrong final focus
    "2-3": (10, 60),  # measure-melting-point-unknown-substance: a wrong final focus
}


@dataclasses.dataclass(frozen=True)
class Task:
  """One ScienceWorld game: a task in one of its variations."""
  id: str  # ScienceWorld's task id, e.g. "1-1"
  name: str  # ScienceWorld's task name, e.g. "boil"
  variation: int

  @property
  def key(self) -> str:
    return f"{self.id}:{self.name}:{self.variation}"


# ----------------------------------------------------------------------------------------------------------
# The JVM: one per process, launched on first use.
# ----------------------------------------------------------------------------------------------------------

_JAVA_OPTIONS = (
    # Identity hash codes all equal (HotSpot's `hashCode=2`): ScienceWorld keeps world objects in hash sets and
    # hashes them by identity, so by default their order (and with it gold paths, ambiguity lists and what an
    # action picks) varies between loads of the same variation; with equal hashes the sets iterate in insertion
    # order, and a variation plays the same in every load, thread and process.
    "-XX:+UnlockExperimentalVMOptions", "-XX:hashCode=2",
    # To save and restore the state of ScienceWorld's global random generator per simulator (`_Jvm.save`).
    "--add-opens=java.base/java.util=ALL-UNNAMED",
    # A bounded heap: the JVM's default (a quarter of the machine's memory) grew to 5 GB over a survey of every
    # variation, memory the training process beside it needs; a simulator's world takes a few MB.
    "-Xmx1g",
)


class _Jvm:
  """ScienceWorld's JVM and the process-wide state its simulators share.

  All simulators of a JVM share ScienceWorld's global random generator (`scala.util.Random`, seeded by each load
  and drawn from by wandering animals, bees, ...) and its object id counter (`util.UniqueIdentifier`, reset by each
  load; world objects are equal iff their ids are). So every call into a simulator holds `lock` and runs on that
  simulator's own saved generator state and counter (`restore` before, `save` after): each simulator then plays as
  if it had the JVM to itself.
  """

  def __init__(self):
    port, process = launch_gateway(classpath=JAR_PATH, die_on_exit=True, cwd=BASEPATH, return_proc=True,
                                   javaopts=list(_JAVA_OPTIONS))
    self.gateway = JavaGateway(gateway_parameters=GatewayParameters(auto_field=True, port=port),
                               java_process=process)
    self.lock = threading.Lock()
    self.loaded: set[tuple[str, int, bool]] = set()  # (task name, variation, with gold path) loaded at least once
    self.gold: dict[str, list[str]] = {}  # task key -> its gold action sequence (`gold_path`)
    self._oracle: Any = None  # the simulator that generates gold paths
    find_class = self.gateway.jvm.java.lang.Class.forName
    self._ids = find_class("util.UniqueIdentifier$").getField("MODULE$").get(None)
    self._random = find_class("scala.util.Random$").getField("MODULE$").get(None).self()
    fields = {}
    for field_name in ("seed", "haveNextNextGaussian", "nextNextGaussian"):
      fields[field_name] = find_class("java.util.Random").getDeclaredField(field_name)
      fields[field_name].setAccessible(True)
    self._seed = fields["seed"]  # an AtomicLong, which py4j reads as its value
    self._have_gaussian, self._gaussian = fields["haveNextNextGaussian"], fields["nextNextGaussian"]

  @property
  def alive(self) -> bool:
    return self.gateway.java_process.poll() is None

  def simulator(self) -> Any:
    return self.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()

  def load(self, simulator: Any, task: "Task", with_gold: bool) -> None:
    """Loads `task` into `simulator`, twice the first time this JVM loads it so (see the module docstring); hold
    `lock`."""
    if (task.name, task.variation, with_gold) not in self.loaded:
      simulator.load(task.name, task.variation, "", with_gold)
      self.loaded.add((task.name, task.variation, with_gold))
    simulator.load(task.name, task.variation, "", with_gold)

  def gold_path(self, task: "Task") -> list[str]:
    """ScienceWorld's gold action sequence of `task`, generated once per JVM on a simulator of its own; hold
    `lock` (every env restores its own share of the JVM's state before its next call)."""
    if task.key not in self.gold:
      if self._oracle is None:
        self._oracle = self.simulator()
      self.load(self._oracle, task, with_gold=True)
      self.gold[task.key] = [str(action) for action in self._oracle.getGoldActionSequence()]
    return self.gold[task.key]

  def save(self) -> tuple[int, int, bool, float]:
    """The shared state (object id counter, random generator) as the last call left it; hold `lock`."""
    random = self._random
    return (int(self._ids.count()), int(self._seed.get(random)), bool(self._have_gaussian.getBoolean(random)),
            float(self._gaussian.getDouble(random)))

  def restore(self, state: tuple[int, int, bool, float]) -> None:
    """Puts back a state from `save`; hold `lock`."""
    count, seed, have_gaussian, gaussian = state
    getattr(self._ids, "count_$eq")(count)
    self._random.setSeed(seed ^ 0x5DEECE66D)  # java.util.Random scrambles a seed by this multiplier
    self._have_gaussian.setBoolean(self._random, have_gaussian)
    self._gaussian.setDouble(self._random, gaussian)


_JVM_LOCK = threading.Lock()
_JVM: _Jvm | None = None
_GAMES_LOCK = threading.Lock()
_GAMES: list[tuple[Task, str]] = []
_TASKS_LOCK = threading.Lock()
_TASKS: dict[str, list[Task]] = {}


def jvm() -> _Jvm:
  """The process's ScienceWorld JVM, launched (again, if it died) on first use."""
  global _JVM
  with _JVM_LOCK:
    if _JVM is None or not _JVM.alive:
      _JVM = _Jvm()
    return _JVM


def all_games() -> list[tuple[Task, str]]:
  """Every (task, split) of AgentGym's tasks before exclusions: train then test variations of each task (listed
  once per process)."""
  with _GAMES_LOCK:
    if not _GAMES:
      _GAMES.extend(_list_games())
  return list(_GAMES)


def _list_games() -> list[tuple[Task, str]]:
  machine = jvm()
  games = []
  with machine.lock:
    simulator = machine.simulator()
    names = set(simulator.getTaskNames())
    for task_id, name in ID2TASK.items():
      if task_id in AGENTGYM_EXCEPTIONS:
        continue
      if name not in names:
        raise RuntimeError(f"scienceworld {SCIENCEWORLD_VERSION}: the simulator has no task {name!r}")
      simulator.load(name, 0, "", False)
      games += [(Task(task_id, name, int(v)), "train") for v in simulator.getVariationsTrain()]
      games += [(Task(task_id, name, int(v)), "eval") for v in simulator.getVariationsTest()]
  return games


def tasks(split: str) -> list[Task]:
  """The tasks of `split`, by task then variation, without `EXCLUDED` (listed once per process)."""
  base.check_split(split)
  with _TASKS_LOCK:
    if not _TASKS:
      found: dict[str, list[Task]] = {name: [] for name in base.SPLITS}
      for task, task_split in all_games():
        if task.variation not in EXCLUDED.get(task.id, ()):
          found[task_split].append(task)
      order = list(ID2TASK)
      for task_list in found.values():
        seen: collections.Counter[str] = collections.Counter()
        rank = {}
        for task in sorted(task_list, key=lambda task: task.variation):
          rank[task], seen[task.id] = seen[task.id], seen[task.id] + 1
        task_list.sort(key=lambda task: (rank[task], order.index(task.id)))
      _TASKS.update(found)
  return _TASKS[split]


# ----------------------------------------------------------------------------------------------------------
# The env.
# ----------------------------------------------------------------------------------------------------------

_THOUGHTS = (  # the expert's thought by the gold action's first word(s); says why, never what comes next
    (("go to",), "I go where the task takes me next."),
    (("open", "close"), "I need this open (or closed) to go on."),
    (("pick up", "take"), "I will need this, so I take it."),
    (("focus on",), "This is what the task is about, so I focus on it."),
    (("move", "put", "pour", "dunk", "mix"), "I put things where the task needs them."),
    (("activate", "deactivate"), "I switch this as the task needs."),
    (("use",), "I use this to find out what I need to know."),
    (("connect", "disconnect"), "I wire the circuit as the task needs."),
    (("wait",), "I let time pass so that the change can happen."),
    (("look", "examine", "read", "inventory", "teleport"), "I check what is around me."),
)
_SAMPLE_ACTIONS = (
    "look around", "inventory", "wait1", "wait", "go to kitchen", "go to hallway", "go to outside",
    "go to workshop", "go to greenhouse", "go to bedroom", "go to living room", "go to art studio",
    "go to foundry", "open door to kitchen", "open door to hallway", "open door to greenhouse",
    "open cupboard", "open freezer", "open fridge", "pick up thermometer", "pick up metal pot",
    "activate stove", "deactivate stove", "activate sink", "examine substance in metal pot", "focus on water",
    "focus on thermometer", "use thermometer in inventory on water", "move metal pot to stove",
    "read recipe", "look at table",
)
_AMBIGUOUS = "Ambiguous request"
T = TypeVar("T")


def _normal(action: str) -> str:
  return " ".join(action.lower().split())


def _has_control(text: str) -> bool:
  return any(unicodedata.category(char) in ("Cc", "Cs", "Zl", "Zp") for char in text)


class SciWorldEnv(base.TextEnv):
  name = "sciworld"
  version = f"scienceworld-{SCIENCEWORLD_VERSION}"
  max_rounds = 150

  def __init__(self):
    super().__init__()
    self._jvm: _Jvm | None = None
    self._simulator: Any = None
    self._shared: tuple[int, int, bool, float] | None = None  # this simulator's share of the JVM's state
    self._task: Task | None = None
    self._played: list[str] = []  # the actions sent to the simulator this episode, normalized
    self._points = 0  # ScienceWorld's score, round(100 * getScore())
    self._moves = 0
    self._pending = ""  # the ambiguity question awaiting a number, or ""

  def instruction(self) -> str:
    return SCIWORLD_INSTRUCTION

  @property
  def task(self) -> Task | None:
    """The task being played."""
    return self._task

  @property
  def gold(self) -> list[str]:
    """ScienceWorld's gold action sequence of the loaded variation (generated on first use, once per process)."""
    return list(self._gold_path())

  def _gold_path(self) -> list[str]:
    machine = jvm()
    with machine.lock:
      return machine.gold_path(self._task)

  def _pointer(self, gold: list[str]) -> int:
    """How far the episode has followed `gold`: each played action equal to the gold action at the pointer
    advances it."""
    pointer = 0
    for action in self._played:
      if pointer < len(gold) and action == _normal(gold[pointer]):
        pointer += 1
    return pointer

  def simulator_score(self) -> int:
    """ScienceWorld's own score of the episode, round(100 * getScore()), read from the simulator now."""
    return self._call(lambda simulator: int(round(100 * simulator.getScore())))

  def goal_progress(self) -> str:
    """ScienceWorld's report of its goal checks (`getGoalProgressStr`)."""
    return self._call(lambda simulator: str(simulator.getGoalProgressStr()))

  def close(self) -> None:
    self._simulator = None  # py4j frees the JVM object once its Python proxy is collected
    self._jvm = None
    super().close()

  def _call(self, function: Callable[[Any], T], load: bool = False) -> T:
    """`function(simulator)` with the JVM to this env alone (see `_Jvm`); `load` for a call that loads a task."""
    machine = jvm()
    with machine.lock:  # making a simulator touches the JVM's shared state too
      if self._simulator is None or self._jvm is not machine:
        if not load and self._simulator is not None:
          raise RuntimeError("sciworld: ScienceWorld's JVM died during the episode; reset the env")
        self._jvm, self._simulator, self._shared = machine, machine.simulator(), None
      if self._shared is not None:
        machine.restore(self._shared)
      try:
        return function(self._simulator)
      finally:
        self._shared = machine.save()

  def _num_tasks(self, split: str) -> int:
    return len(tasks(split))

  def _task_key(self, index: int, split: str) -> str:
    return tasks(split)[index].key

  def _reset_task(self, index: int, split: str) -> str:
    return self._load(tasks(split)[index])

  def _load(self, task: Task) -> str:
    def reset(simulator: Any) -> tuple[str, str, int, int]:
      self._jvm.load(simulator, task, with_gold=False)
      description, observation = str(simulator.getTaskDescription()), str(simulator.step("look around"))
      return description, observation, int(round(100 * simulator.getScore())), int(simulator.getNumMoves())

    description, observation, self._points, self._moves = self._call(reset, load=True)
    self._task = task
    self._played = []
    self._pending = ""
    return f"{description}\n{observation}"

  def _act(self, text: str) -> base.Outcome:
    action = base.action_text(text)
    if len(action) > MAX_ACTION_CHARS:
      return self._refuse(f"The action is {len(action)} characters long; at most {MAX_ACTION_CHARS} are read. "
                          "Write one short command, such as: go to kitchen")
    if _has_control(action):
      return self._refuse("The action has a line break or another control character; write one command on one "
                          "line, such as: go to kitchen")
    action = base.parse_action(action)  # one line, cleaned up as AgentGym's adapter cleans it

    def step(simulator: Any) -> tuple[str, int, int, bool] | None:
      try:
        observation = str(simulator.step(action))
      except Py4JJavaError:  # the simulator failed on this input
        return None
      return (observation, int(round(100 * simulator.getScore())), int(simulator.getNumMoves()),
              bool(simulator.getCompleted()))

    result = self._call(step)
    if result is None:
      return self._refuse("The simulator could not process this action; try another command.")
    observation, self._points, self._moves, completed = result
    self._played.append(_normal(action))
    self._pending = observation if observation.startswith(_AMBIGUOUS) else ""
    done = completed or self._moves > STEP_LIMIT or self._points < 0
    return base.Outcome(observation, max(self._points, 0) / 100, done=done, success=self._points >= 100)

  def _refuse(self, observation: str) -> base.Outcome:
    return base.Outcome(observation, max(self._points, 0) / 100)

  def _expert_turn(self) -> str:
    gold = self._gold_path()
    pointer = self._pointer(gold)
    if pointer >= len(gold):  # the gold path is spent (it reached its end without completing)
      return base.react_turn("I wait for the world to change.", "wait1")
    action = gold[pointer]
    words = _normal(action)
    thought = next((thought for starts, thought in _THOUGHTS if words.startswith(starts)),
                   "I take the next step of my plan.")
    return base.react_turn(thought, action)

  def _sample_action(self, rng: random.Random) -> str:
    return rng.choice(_SAMPLE_ACTIONS)

  def _measures(self) -> tuple[int, float]:
    gold = self._gold_path()
    return len(gold) - self._pointer(gold), max(self._points, 0) / 100

  def _state_key(self) -> str:
    look, inventory = self._call(lambda simulator: (str(simulator.freeActionLook()),
                                                    str(simulator.freeActionInventory())))
    world = "\n".join((self._task.key, str(self._moves), look, inventory, self._pending))
    return f"moves={self._moves}|score={self._points}|world={base.stable_digest(world)}"


def gold_outcome(task: Task) -> tuple[int, int]:
  """(ScienceWorld's score, moves) at the end of an episode of `task` (listed or excluded) in which the gold path
  is played, under the env's rules (step limit, negative score); for checking `EXCLUDED`."""
  env = SciWorldEnv()
  env._load(task)  # pylint: disable=protected-access
  for action in env.gold:
    outcome = env._act(action)  # pylint: disable=protected-access
    if outcome.done:
      break
  return env._points, env._moves  # pylint: disable=protected-access
