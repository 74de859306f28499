"""babyai (embodied): minigrid's BabyAI levels through a text wrapper.

The agent reads, in words, what its 7x7 egocentric view shows (objects with their distance ahead and to the
side, what is right in front of it, what it carries) and acts with `turn left`, `turn right`,
`move forward`, `pick up <object>`, `drop`, `toggle`, or the macro `go to <object>` (a shortest walk until
the object is right in front). Actions that cannot work (walking into a wall, picking up nothing) are
refused with a reason and leave the world unchanged.

The expert is minigrid's own `BabyAIBot`, kept in step with the world after every primitive action (the
bot may drop things). Only seeds that the bot solves in at most `_MAX_BOT_STEPS` steps are tasks; those
lists are computed once and stored in `data/babyai_seeds.json` (`python -m evolver.envs.babyai --build`).
The reward is BabyAI's own: `1 - 0.9 * steps / max_steps` on success (so success is not reward 1), else 0.

A spec task (`reset_spec`) keeps a level's world (level and seed) and gives it another mission in BabyAI's
instruction language, checked by minigrid's own verifier; see `BabyAIEnv._reset_spec`. An exploration
(`reset_world`) loads the world with no mission and yields one task per object picked up, gone to or door
opened, as minigrid's verifiers judge them; see `BabyAIEnv._reset_world`. The state key is the agent's
position, direction and load, the whole grid (objects, doors open or locked) and the mission's progress.

For the step judges, the cost to go is the length of an optimal plan of primitive actions from the true state
(`optimal_cost`, a breadth-first search knowing the whole world), not the bot's: the bot sees only its view
and looks around for what it has not seen, which the full-knowledge plan never needs (`BabyAIEnv._measures`).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import functools
import json
import os
import re

import gymnasium as gym
import minigrid  # noqa: F401  (registers the BabyAI levels with gymnasium)
from minigrid.core.actions import Actions
from minigrid.core.constants import COLOR_NAMES
from minigrid.envs.babyai.core import roomgrid_level
from minigrid.envs.babyai.core import verifier
from minigrid.utils.baby_ai_bot import BabyAIBot

from evolver.envs import base

# Levels where one macro `go to` would finish the mission (GoTo*) are left out: a random agent solves them.
LEVELS = ("BabyAI-PickupDist-v0", "BabyAI-PickupLoc-v0", "BabyAI-PutNextLocalS5N3-v0", "BabyAI-OpenDoorColor-v0",
          "BabyAI-SynthS5R2-v0", "BabyAI-OpenDoorsOrderN2-v0")
_SEEDS_FILE = os.path.join(os.path.dirname(__file__), "data", "babyai_seeds.json")
_TASKS_PER_LEVEL = {"train": 100, "eval": 20}
_FIRST_SEED = {"train": 0, "eval": 1_000_000}  # disjoint seed ranges
_MAX_BOT_STEPS = 16
_MAX_MACRO_STEPS = 40
_MAX_LISTED_OBJECTS = 6

# A spec's verb -> minigrid's instruction, and the object types each accepts.
_SPEC_VERBS = {"pick up": (verifier.PickupInstr, ("ball", "box", "key")),
               "go to": (verifier.GoToInstr, ("ball", "box", "key", "door")),
               "open": (verifier.OpenInstr, ("door",))}

_ACTION_WORDS = {Actions.left: "turn left", Actions.right: "turn right", Actions.forward: "move forward",
                 Actions.pickup: "pick up", Actions.drop: "drop", Actions.toggle: "toggle", Actions.done: "done"}


@functools.cache
def seed_lists() -> dict[str, dict[str, list[int]]]:
  """level -> split -> the seeds that are tasks, from the stored file."""
  with open(_SEEDS_FILE) as f:
    stored = json.load(f)
  return stored["levels"]


def task_of(index: int, split: str) -> tuple[str, int]:
  """(level, seed) of task `index`: levels interleave, so any prefix of a split mixes them."""
  level = LEVELS[index % len(LEVELS)]
  return level, seed_lists()[level][split][index // len(LEVELS)]


def _silence_level_generator() -> None:
  """BabyAI's level generator prints every rejected sample ("Sampling rejected: ..."); keep that out of server
  logs and tables: its module gets a `print` of its own that drops them (once, at import).

  Not `contextlib.redirect_stdout`: that swaps the process-wide sys.stdout, and resets running in the rollout
  engine's threads raced each other and left the process's stdout on a discarded buffer, losing every later print.
  """
  roomgrid_level.print = lambda *args, **kwargs: None


_silence_level_generator()


def bot_solution_length(env: gym.Env, seed: int, limit: int) -> int | None:
  """Steps the BabyAI bot needs on `seed`, or None if it fails or needs more than `limit`."""
  env.reset(seed=seed)
  bot = BabyAIBot(env.unwrapped)
  for step in range(1, limit + 1):
    try:
      action = bot.replan()
    except Exception:  # The bot gives up on some layouts (e.g. a box it opened); such seeds are not tasks.
      return None
    _, reward, terminated, truncated, _ = env.step(action)
    if terminated or truncated:
      return step if reward > 0 else None
  return None


def build_seed_lists() -> dict:
  levels = {}
  for level in LEVELS:
    env = gym.make(level)
    levels[level] = {}
    for split, first in _FIRST_SEED.items():
      seeds, seed = [], first
      while len(seeds) < _TASKS_PER_LEVEL[split]:
        if bot_solution_length(env, seed, _MAX_BOT_STEPS) is not None:
          seeds.append(seed)
        seed += 1
      levels[level][split] = seeds
  return {"version": BabyAIEnv.version, "max_bot_steps": _MAX_BOT_STEPS, "levels": levels}


def _object_name(obj) -> str:
  if obj.type == "door":
    state = "locked" if obj.is_locked else ("open" if obj.is_open else "closed")
    return f"{state} {obj.color} door"
  return f"{obj.color} {obj.type}"


def _described(kind: str, color: str | None) -> str:
  return f"{color} {kind}" if color else kind


def _world_objects(world) -> list[str]:
  """The distinct non-wall objects of the whole grid, as "color type", sorted."""
  names = {f"{cell.color} {cell.type}" for cell in world.grid.grid if cell is not None and cell.type != "wall"}
  return sorted(names)


class _NoMission(verifier.Instr):
  """An exploration's mission: nothing to do, never done (minigrid's level calls `verify` every step)."""

  def surface(self, env) -> str:
    return "explore"

  def verify(self, action) -> str:
    return "continue"


def _instr_key(instruction) -> str:
  """A canonical text of a mission on the loaded world: the kind of each clause and the start positions of the
  objects its descriptions match (so "the ball on your left" and "the red ball" are one mission when they name
  the same ball); read right after the world's reset."""
  if isinstance(instruction, verifier.SeqInstr):
    return (f"{type(instruction).__name__}({_instr_key(instruction.instr_a)},"
            f"{_instr_key(instruction.instr_b)})")
  parts = [type(instruction).__name__]
  for attr in ("desc", "desc_move", "desc_fixed"):
    if hasattr(instruction, attr):
      positions = sorted((int(x), int(y)) for x, y in getattr(instruction, attr).obj_poss)
      parts.append(";".join(f"{x},{y}" for x, y in positions))
  return "[" + "|".join(parts) + "]"


def _progress(instruction) -> str:
  """Which parts of a sequenced mission are done ("s" success, "f" failure, "-" not yet), depth first."""
  if not isinstance(instruction, verifier.SeqInstr):
    return ""
  marks = "".join({"success": "s", "failure": "f"}.get(done, "-") if isinstance(done, str) else "-"
                  for done in (instruction.a_done, instruction.b_done))
  return marks + _progress(instruction.instr_a) + _progress(instruction.instr_b)


def _checked_mission(world, verb: str, kind: str, color: str | None, where: str):
  """Minigrid's instruction for `verb` `kind` `color` on the freshly reset `world`, checked as a spec's mission
  is (see `BabyAIEnv._reset_spec`); EnvError says why it is refused."""
  mission = _SPEC_VERBS[verb][0](verifier.ObjDesc(kind, color))
  mission.reset_verifier(world)
  if not mission.desc.obj_set:
    raise base.EnvError(f"babyai spec: {where} has no {_described(kind, color)}; its objects: "
                        f"{_world_objects(world)}")
  if verb == "go to" and any(tuple(position) == tuple(world.front_pos) for position in mission.desc.obj_poss):
    raise base.EnvError(f"babyai spec: in {where} the agent starts facing the {_described(kind, color)}: "
                        "there would be nothing to do")
  try:
    world.validate_instrs(mission)
  except roomgrid_level.RejectSampling as error:
    raise base.EnvError(f"babyai spec: the level of {where} refuses the mission {verb} "
                        f"{_described(kind, color)}: {error}") from None
  return mission


def _step_limit(world, mission) -> int:
  """BabyAI's step limit for `mission` on `world`, as `RoomGridLevel.reset` sets it."""
  if world.fixed_max_steps:
    return world.max_steps
  return world.num_navs_needed(mission) * world.room_size**2 * world.num_rows * world.num_cols


# --- the step judges' cost to go: an optimal plan of primitive actions, searched on the true world ------------

NO_WAY = 1000  # cost_to_go when no way to complete the mission is found (a box it names was toggled away, ...)
_MAX_SEARCH_STATES = 50_000  # states a search reaches before it gives up (NO_WAY); from expert states: < 5000
_VECTORS = ((1, 0), (0, 1), (-1, 0), (0, -1))  # minigrid's directions 0..3
_CLOSED, _OPEN, _LOCKED = 0, 1, 2
_SEQUENCES = {verifier.BeforeInstr: "before", verifier.AfterInstr: "after", verifier.AndInstr: "and"}
_CLAUSES = {verifier.GoToInstr: "go to", verifier.PickupInstr: "pick up", verifier.OpenInstr: "open"}

# A world state for the search: (x, y, direction, index of the object carried or None, each object's position
# (None when carried or gone), each door's state, each clause of the mission done or not).
_State = tuple


@dataclasses.dataclass(frozen=True)
class _Layout:
  """What a search needs besides the state: the walls, the doors, the movable objects and the mission.

  `clauses` are the mission's clauses, ("go to" | "pick up" | "open", targets) or ("put next", moved, fixed),
  each target a frozenset of ("door", i) and ("object", i); `mission` is the mission's tree over them:
  ("clause", k) or ("before" | "after" | "and", a, b), with minigrid's order of verification.
  """

  width: int
  height: int
  walls: frozenset[tuple[int, int]]
  doors: tuple[tuple[tuple[int, int], str], ...]  # (position, color)
  objects: tuple[tuple[str, str], ...]  # (type, color)
  clauses: tuple[tuple, ...]
  mission: tuple


def _snapshot(world) -> tuple[_Layout, _State]:
  """The search's view of a minigrid level: its layout and its current state (read, never changed).

  Cells other than walls, doors, balls, boxes and keys (none in the levels used) count as walls. The mission's
  clauses done so far are read from minigrid's sequencing verifiers (`a_done`, `b_done`)."""
  walls, doors, objects, entity = set(), [], [], {}
  positions, door_states, carrying = [], [], None
  for y in range(world.height):
    for x in range(world.width):
      cell = world.grid.get(x, y)
      if cell is None:
        continue
      if cell.type == "door":
        entity[id(cell)] = ("door", len(doors))
        doors.append(((x, y), cell.color))
        door_states.append(_LOCKED if cell.is_locked else _OPEN if cell.is_open else _CLOSED)
      elif cell.type in ("ball", "box", "key"):
        entity[id(cell)] = ("object", len(objects))
        objects.append((cell.type, cell.color))
        positions.append((x, y))
      else:
        walls.add((x, y))
  if world.carrying is not None:
    carrying = len(objects)
    entity[id(world.carrying)] = ("object", carrying)
    objects.append((world.carrying.type, world.carrying.color))
    positions.append(None)
  clauses: list[tuple] = []
  done: list[bool] = []

  def targets(description) -> frozenset:
    return frozenset(entity[id(obj)] for obj in description.obj_set if id(obj) in entity)

  def read(instruction, finished: bool) -> tuple:
    if type(instruction) in _SEQUENCES:
      return (_SEQUENCES[type(instruction)],
              read(instruction.instr_a, finished or instruction.a_done == "success"),
              read(instruction.instr_b, finished or instruction.b_done == "success"))
    if isinstance(instruction, verifier.PutNextInstr):
      clauses.append(("put next", targets(instruction.desc_move), targets(instruction.desc_fixed)))
    elif type(instruction) in _CLAUSES:
      clauses.append((_CLAUSES[type(instruction)], targets(instruction.desc)))
    else:
      raise TypeError(f"babyai measures: no search for a mission of type {type(instruction).__name__}")
    done.append(finished)
    return ("clause", len(clauses) - 1)

  mission = read(world.instrs, False)
  x, y = (int(v) for v in world.agent_pos)
  layout = _Layout(world.width, world.height, frozenset(walls), tuple(doors), tuple(objects), tuple(clauses), mission)
  return layout, (x, y, int(world.agent_dir), carrying, tuple(positions), tuple(door_states), tuple(done))


def _moves(layout: _Layout, door_at: dict[tuple[int, int], int], state: _State):
  """(action, the state after it without the clauses' marks) of each primitive action that minigrid carries out
  in `state`, by its rules for turning, walking, picking up, dropping and toggling (a box toggled is gone, as
  BabyAI's boxes hold nothing); actions it would refuse are left out, and `done`, which changes nothing, is kept
  because the verifiers run on it like on any action."""
  x, y, d, carrying, positions, doors, _ = state
  yield Actions.left, (x, y, (d - 1) % 4, carrying, positions, doors)
  yield Actions.right, (x, y, (d + 1) % 4, carrying, positions, doors)
  yield Actions.done, (x, y, d, carrying, positions, doors)
  front = (x + _VECTORS[d][0], y + _VECTORS[d][1])
  if not (0 <= front[0] < layout.width and 0 <= front[1] < layout.height) or front in layout.walls:
    return
  door = door_at.get(front)
  thing = next((i for i, position in enumerate(positions) if position == front), None)
  if thing is None and (door is None or doors[door] == _OPEN):
    yield Actions.forward, (front[0], front[1], d, carrying, positions, doors)
  if thing is not None and carrying is None:
    yield Actions.pickup, (x, y, d, thing, _replaced(positions, thing, None), doors)
  if carrying is not None and thing is None and door is None:
    yield Actions.drop, (x, y, d, None, _replaced(positions, carrying, front), doors)
  if door is not None:
    if doors[door] != _LOCKED:
      yield Actions.toggle, (x, y, d, carrying, positions, _replaced(doors, door, _CLOSED + _OPEN - doors[door]))
    elif carrying is not None and layout.objects[carrying] == ("key", layout.doors[door][1]):
      yield Actions.toggle, (x, y, d, carrying, positions, _replaced(doors, door, _OPEN))
  elif thing is not None and layout.objects[thing][0] == "box":
    yield Actions.toggle, (x, y, d, carrying, _replaced(positions, thing, None), doors)


def _replaced(values: tuple, index: int, value) -> tuple:
  return values[:index] + (value,) + values[index + 1:]


def _fired(layout: _Layout, door_at: dict[tuple[int, int], int], action: int, carried: int | None,
           after: tuple) -> list[bool]:
  """Whether each clause's verifier says success on `action` (taken carrying `carried`) that led to `after`, as
  minigrid's verifiers judge it: facing a target (go to, after any action), picking one up, toggling a target
  door open, dropping a moved object next to a fixed one."""
  x, y, d, carrying, positions, doors = after
  front = (x + _VECTORS[d][0], y + _VECTORS[d][1])

  def where(target) -> tuple[int, int] | None:
    kind, i = target
    return layout.doors[i][0] if kind == "door" else positions[i]

  fired = []
  for clause in layout.clauses:
    verb = clause[0]
    if verb == "go to":
      fired.append(any(where(target) == front for target in clause[1]))
    elif verb == "pick up":
      fired.append(action == Actions.pickup and ("object", carrying) in clause[1])
    elif verb == "open":
      door = door_at.get(front)
      fired.append(action == Actions.toggle and door is not None and ("door", door) in clause[1]
                   and doors[door] == _OPEN)
    else:
      fired.append(action == Actions.drop and ("object", carried) in clause[1] and any(
          (p := where(target)) is not None and abs(p[0] - front[0]) + abs(p[1] - front[1]) == 1
          for target in clause[2]))
  return fired


def _verified(mission: tuple, done: list[bool], fired: list[bool]) -> bool:
  """Marks the clauses that `fired` completes, in minigrid's order (a clause after "then" is verified only once
  the one before it is done); returns whether the whole mission is done."""
  kind = mission[0]
  if kind == "clause":
    done[mission[1]] = done[mission[1]] or fired[mission[1]]
    return done[mission[1]]
  if kind == "before":
    return _verified(mission[1], done, fired) and _verified(mission[2], done, fired)
  if kind == "after":
    return _verified(mission[2], done, fired) and _verified(mission[1], done, fired)
  first, second = _verified(mission[1], done, fired), _verified(mission[2], done, fired)
  return first and second


def _gone(layout: _Layout, state: _State) -> bool:
  """Whether a clause not yet done names only objects that are gone (boxes toggled away), as all its targets,
  or all the objects to move or to put something next to."""
  positions, carrying, done = state[4], state[3], state[6]
  for clause, finished in zip(layout.clauses, done):
    for targets in ([] if finished else clause[1:]):
      if all(kind == "object" and positions[i] is None and i != carrying for kind, i in targets):
        return True
  return False


def optimal_cost(layout: _Layout, state: _State) -> int:
  """The fewest primitive actions that complete the mission from `state` (breadth-first search over whole world
  states with minigrid's rules and verifiers, with full knowledge of the world), or NO_WAY when the search finds
  none among the first `_MAX_SEARCH_STATES` states it reaches."""
  if _gone(layout, state):
    return NO_WAY
  door_at = {position: i for i, (position, _) in enumerate(layout.doors)}
  cost = {state: 0}
  queue = collections.deque([state])
  while queue and len(cost) <= _MAX_SEARCH_STATES:
    current = queue.popleft()
    for action, after in _moves(layout, door_at, current):
      done = list(current[6])
      if _verified(layout.mission, done, _fired(layout, door_at, action, current[3], after)):
        return cost[current] + 1
      following = after + (tuple(done),)
      if following not in cost:
        cost[following] = cost[current] + 1
        queue.append(following)
  return NO_WAY


def _offset_text(ahead: int, right: int) -> str:
  parts = []
  if ahead:
    parts.append(f"{ahead} ahead")
  if right:
    parts.append(f"{abs(right)} {'right' if right > 0 else 'left'}")
  return " and ".join(parts) or "here"


_INSTRUCTION = """\
You are an agent in a grid world of rooms and must reach the goal you are given. Each turn you are told \
what you see: objects with how many steps ahead and to the left or right they are, what is right in front \
of you, and what you carry.

Each turn, reply with a short thought and one action:
Thought: <your reasoning>
Action: <one action>

Actions:
- turn left / turn right: turn in place
- move forward: step one square ahead
- pick up <object>: pick up the object right in front of you, e.g. pick up red ball
- drop: put what you carry on the square in front of you
- toggle: open or close the door in front of you (a locked door needs a key of its color)
- go to <object>: walk until the object you see is right in front of you, e.g. go to blue key

Example:
Thought: The red ball I must pick up is 2 ahead; one step forward puts it right in front of me.
Action: move forward"""


class BabyAIEnv(base.TextEnv):
  name = "babyai"
  version = "babyai-v1"
  max_rounds = 20

  def __init__(self):
    super().__init__()
    self._worlds: dict[str, gym.Env] = {}  # one minigrid env per level, reused across resets
    self._world: gym.Env | None = None
    self._bot: BabyAIBot | None = None
    self._suggestion: int | None = None
    self._mission = ""
    self._seen: list | None = None  # _visible_objects() of the current state; computing it is the slow part
    # Exploration (reset_world): the actions that moved the world (loops cut), the world's signature and the
    # primitive steps taken at the start and after each of them, the action being taken until its first
    # primitive step, the drops so far, and the missions not yet met (target, surface, verifier, step limit).
    self._trail: list[str] = []
    self._marks: list[tuple[str, int]] = []
    self._action: str | None = None
    self._primitives = 0
    self._drops = 0
    self._candidates: list[tuple[dict, str, verifier.Instr, int]] = []
    # The step judges' measures: the world at the episode's start (searched once needed), its cost to go, and
    # the last state searched with its cost (the state after a step is the state before the next).
    self._start_world: tuple[_Layout, tuple] | None = None
    self._start_cost: int | None = None
    self._searched: tuple[tuple, int] | None = None

  def instruction(self) -> str:
    return _INSTRUCTION

  def _num_tasks(self, split: str) -> int:
    return len(LEVELS) * _TASKS_PER_LEVEL[split]

  def _task_key(self, index: int, split: str) -> str:
    level, seed = task_of(index, split)
    return f"{level}:{seed}"

  def _reset_task(self, index: int, split: str) -> str:
    self._load_world(*task_of(index, split))
    return self._start(self._world.unwrapped.mission)

  def _reset_spec(self, spec: base.TaskSpec) -> str:
    """Target: `{"verb": "pick up" | "go to" | "open", "object": {"type": t, "color": c}}`, a mission in BabyAI's
    instruction language on the world of task `spec.world` (its level and seed): minigrid's `PickupInstr`,
    `GoToInstr` or `OpenInstr` of `ObjDesc(t, c)`. `t` is ball, box or key for "pick up", also door for "go to",
    and door for "open"; `c` is one of minigrid's colors, or absent for any color. Some object of the world must
    match, the level's own checks of a mission must pass (on levels with locked doors, no mission about a key
    that opens one), and for "go to" the agent must not face a matching object at the start.

    The mission replaces the level's after `reset(seed=...)`: minigrid's verifier checks it, the step limit is
    BabyAI's for that mission, the reward is BabyAI's (`1 - 0.9 * steps / max_steps` on success, else 0),
    and the BabyAI bot plans from it (the expert). The goal line shows minigrid's surface form of the mission
    ("pick up the red ball"), or `spec.goal` when given.

    The bot takes one primitive step a round, so it may run out of rounds on far objects that an agent reaches
    with the `go to` macro; and a "go to" mission of an object in sight is one macro away (why the indexed
    levels leave out GoTo levels): how hard a spec is, is the spec writer's business.
    """
    base.check_target_keys(self.name, spec.target, ("verb", "object"))
    verb, description = spec.target["verb"], spec.target["object"]
    if verb not in _SPEC_VERBS:
      raise base.EnvError(f"babyai spec target verb {verb!r:.40} is not one of {list(_SPEC_VERBS)}")
    instruction, types = _SPEC_VERBS[verb]
    if not isinstance(description, dict):
      raise base.EnvError(f"babyai spec target 'object' must be {{\"type\": ..., \"color\": ...}}, got "
                          f"{description!r:.60}")
    base.check_target_keys("babyai", description, ("type",), ("color",))
    kind, color = description["type"], description.get("color")
    if kind not in types:
      raise base.EnvError(f"babyai spec: {verb!r} takes an object of type {list(types)}, got {kind!r:.40}")
    if color is not None and color not in COLOR_NAMES:
      raise base.EnvError(f"babyai spec target color {color!r:.40} is not one of {list(COLOR_NAMES)}")
    level, seed = task_of(spec.world, spec.split)
    self._load_world(level, seed)
    world = self._world.unwrapped
    mission = _checked_mission(world, verb, kind, color, f"world {spec.split}[{spec.world}] ({level}, seed {seed})")
    world.instrs = mission
    world.surface = world.mission = mission.surface(world)
    mission.reset_verifier(world)
    world.max_steps = _step_limit(world, mission)
    return self._start(spec.goal.strip().rstrip(".") if spec.goal else world.mission)

  def _reset_world(self, index: int, split: str) -> str:
    """The world of task `index` (its level and seed) with no mission: the first observation says what the
    agent sees, without "Your goal: ..."; the level's step limit stays (running out of steps ends the episode).

    Outcomes: the missions `_reset_spec` takes, `{"verb": "pick up" | "go to" | "open", "object": {"type": t,
    "color": c}}` for each object of the world (always with its color) that the spec would accept, judged by
    minigrid's own verifier of that mission run alongside the exploration from the start (picked up; faced,
    at a position the verifier tracks; a door toggled open), the first time it says success, and only when
    the primitive steps so far fit within that mission's step limit and the actions within `max_rounds`.
    Actions: the actions that moved the world (primitives and `go to` macros), up to the one during which
    the verifier said success; refused actions changed nothing and are dropped, and so are loops: actions
    after which the world (grid, agent's pose and load) is as it was earlier, with no drop in between (a drop
    moves what the verifiers track), are cut out, so the actions left lead through the same states. A macro
    that passed the outcome midway is kept whole: on replay the episode ends where the outcome is reached.
    """
    self._load_world(*task_of(index, split))
    world = self._world.unwrapped
    world.instrs = _NoMission()
    world.instrs.reset_verifier(world)
    world.mission = world.surface = ""
    self._mission = ""
    self._bot = None
    self._suggestion = None
    self._trail, self._action, self._primitives, self._drops, self._candidates = [], None, 0, 0, []
    self._marks = [(self._signature(), 0)]
    for name in _world_objects(world):
      color, kind = name.split()
      for verb, (_, types) in _SPEC_VERBS.items():
        if kind not in types:
          continue
        try:
          mission = _checked_mission(world, verb, kind, color, "")
        except base.EnvError:
          continue
        mission.reset_verifier(world)
        self._candidates.append(({"verb": verb, "object": {"type": kind, "color": color}},
                                 mission.surface(world), mission, _step_limit(world, mission)))
    return self._describe()

  def _target_key_now(self) -> str:
    world = self._world.unwrapped
    x, y = (int(v) for v in world.agent_pos)
    content = base.stable_digest(f"{world.grid.encode().tobytes().hex()}|{x},{y},{int(world.agent_dir)}")
    return f"babyai|world={content}|mission={_instr_key(world.instrs)}"

  def _signature(self) -> str:
    """The exploration's state for cutting loops: the drops so far and the world (see `_reset_world`)."""
    world = self._world.unwrapped
    carrying = "-" if world.carrying is None else ".".join(str(int(v)) for v in world.carrying.encode())
    grid = base.stable_digest(world.grid.encode().tobytes().hex())
    x, y = (int(v) for v in world.agent_pos)
    return f"{self._drops}|{x},{y},{int(world.agent_dir)}|{carrying}|{grid}"

  def _act(self, text: str) -> base.Outcome:
    outcome = self._act_once(text)
    if self._exploring and self._action is None:  # the action moved the world: extend the trail, cut loops
      signature = self._signature()
      earlier = [mark for mark, _ in self._marks]
      if signature in earlier:
        k = earlier.index(signature)
        del self._trail[k:], self._marks[k + 1:]
        self._primitives = self._marks[k][1]
      else:
        self._marks.append((signature, self._primitives))
    return outcome

  def _explored(self, primitive: int) -> None:
    """After a primitive step of an exploration: runs the candidate missions' verifiers on it, as the level's
    own `step` runs its mission's, and records those that succeed for the first time (see `_reset_world`)."""
    if self._action is not None:  # the first primitive of this action: the action moved the world
      self._trail.append(self._action)
      self._action = None
    self._primitives += 1
    self._drops += primitive == Actions.drop
    world = self._world.unwrapped
    still = []
    for target, surface, mission, limit in self._candidates:
      if primitive == Actions.drop:
        world.update_objs_poss(mission)
      if mission.verify(primitive) != "success":
        still.append((target, surface, mission, limit))
      elif self._primitives <= limit and len(self._trail) <= self.max_rounds:
        self._add_hindsight(target, list(self._trail), surface)
    self._candidates = still

  def _load_world(self, level: str, seed: int) -> None:
    if level not in self._worlds:
      self._worlds[level] = gym.make(level)
    self._world = self._worlds[level]
    self._world.reset(seed=seed)
    self._seen = None

  def _start(self, mission: str) -> str:
    """Starts the episode on the loaded world; the bot plans from the world's `instrs`."""
    self._mission = mission
    self._start_cost, self._searched = None, None
    try:
      self._start_world = _snapshot(self._world.unwrapped)
    except TypeError:  # a mission the search cannot read: `measures` raises, the episode runs as usual
      self._start_world = None
    self._bot = BabyAIBot(self._world.unwrapped)
    self._suggestion = self._replan(None)
    return f"Your goal: {self._mission}.\n{self._describe()}"

  def _state_key(self) -> str:
    """The agent's position, direction and load, a digest of the whole grid (every object with its color and
    state: doors open, closed or locked, objects where they lie) and the progress of a sequenced mission
    ("open the red door, then ..."). The step count is left out: it changes the reward, not the situation."""
    world = self._world.unwrapped
    x, y = (int(v) for v in world.agent_pos)
    carrying = "-" if world.carrying is None else ".".join(str(int(v)) for v in world.carrying.encode())
    grid = base.stable_digest(world.grid.encode().tobytes().hex())
    return f"at={x},{y},{int(world.agent_dir)}|carry={carrying}|grid={grid}|progress={_progress(world.instrs)}"

  def _measures(self) -> tuple[int, float]:
    """cost_to_go: the fewest primitive actions (turns, steps, pick up, drop, toggle) that complete the mission
    from the true state, knowing the whole world (`optimal_cost`; a `go to` macro lowers it by the steps it
    takes), or NO_WAY when there is none (e.g. the box to pick up was toggled away); progress: for a mission of
    several clauses ("open the red door, then ..."), the fraction of its clauses done; else 1 - cost_to_go / its
    value at the start."""
    layout, state = _snapshot(self._world.unwrapped)
    if self._searched is None or self._searched[0] != (layout, state):
      self._searched = ((layout, state), optimal_cost(layout, state))
    cost = self._searched[1]
    if len(layout.clauses) > 1:
      return cost, sum(state[6]) / len(layout.clauses)
    if self._start_cost is None:
      self._start_cost = optimal_cost(*self._start_world)
    return cost, 1.0 - min(cost, self._start_cost) / self._start_cost

  # --- what the agent sees --------------------------------------------------------------------------------

  def _visible_objects(self) -> list[tuple[int, str, int, int, tuple[int, int]]]:
    """(distance, name, ahead, right, world position) of each visible non-wall object, nearest first."""
    if self._seen is not None:
      return self._seen
    world = self._world.unwrapped
    grid, visible = world.gen_obs_grid()
    view = world.agent_view_size
    seen = []
    for i in range(view):
      for j in range(view):
        ahead, right = view - 1 - j, i - view // 2
        if not visible[i, j] or (ahead, right) == (0, 0):
          continue
        cell = grid.get(i, j)
        if cell is None or cell.type in ("wall", "floor", "empty", "unseen"):
          continue
        position = tuple(int(v) for v in world.agent_pos + ahead * world.dir_vec + right * world.right_vec)
        seen.append((ahead + abs(right), _object_name(cell), ahead, right, position))
    seen.sort()
    self._seen = seen
    return seen

  def _describe(self) -> str:
    world = self._world.unwrapped
    objects = self._visible_objects()[:_MAX_LISTED_OBJECTS]
    if objects:
      sight = "You see: " + "; ".join(f"a {name} {_offset_text(ahead, right)}" for _, name, ahead, right, _ in objects)
    else:
      sight = "You see no objects."
    front = world.grid.get(*world.front_pos)
    facing = "nothing (the way ahead is free)" if front is None else f"a {_object_name(front)}"
    if front is not None and front.type == "wall":
      facing = "a wall"
    carrying = f"a {_object_name(world.carrying)}" if world.carrying else "nothing"
    return f"{sight}. In front of you: {facing}. You carry {carrying}."

  # --- acting ---------------------------------------------------------------------------------------------

  def _replan(self, action_taken: int | None) -> int | None:
    """Keeps the bot in step with the world; rebuilds it when it gets confused by the agent's detours."""
    if self._bot is None:  # an exploration: no mission, no bot
      return None
    try:
      return self._bot.replan(action_taken)
    except Exception:
      try:
        self._bot = BabyAIBot(self._world.unwrapped)
        return self._bot.replan()
      except Exception:
        return None

  def _primitive(self, action: int) -> tuple[bool, float]:
    """One minigrid step; returns (episode over, reward)."""
    _, reward, terminated, truncated, _ = self._world.step(action)
    self._seen = None
    self._suggestion = self._replan(action)
    if self._exploring:
      self._explored(action)
    return terminated or truncated, float(reward)

  def _finish(self, over: bool, reward: float, what: str) -> base.Outcome:
    if over and reward > 0:
      return base.Outcome(f"{what} You completed the goal: {self._mission}. Success!", reward, True, True)
    if over:
      return base.Outcome(f"{what} The level is over: you ran out of steps.", 0.0, True)
    return base.Outcome(f"{what} {self._describe()}", 0.0)

  def _refuse(self, why: str) -> base.Outcome:
    return base.Outcome(f"{why} {self._describe()}", 0.0)

  def _act_once(self, text: str) -> base.Outcome:
    action = " ".join(re.sub(r"[^a-z ]+", " ", base.parse_action(text).lower()).split())
    self._action = action
    world = self._world.unwrapped
    front = world.grid.get(*world.front_pos)
    if action in ("turn left", "left"):
      return self._finish(*self._primitive(Actions.left), "You turned left.")
    if action in ("turn right", "right"):
      return self._finish(*self._primitive(Actions.right), "You turned right.")
    if action in ("move forward", "forward", "go forward", "move ahead"):
      if front is not None and not front.can_overlap():
        return self._refuse(f"You cannot move forward: a {_object_name(front)} is in the way.")
      return self._finish(*self._primitive(Actions.forward), "You moved forward.")
    if action.startswith("pick up") or action == "pickup":
      wanted = action.removeprefix("pick up").removeprefix("pickup").strip().removeprefix("the ").strip()
      if front is None or not front.can_pickup():
        return self._refuse("There is nothing you can pick up right in front of you.")
      if world.carrying is not None:
        return self._refuse(f"You already carry a {_object_name(world.carrying)}; drop it first.")
      if wanted and not _object_name(front).endswith(wanted):
        return self._refuse(f"The object in front of you is a {_object_name(front)}, not a {wanted}.")
      return self._finish(*self._primitive(Actions.pickup), f"You picked up the {_object_name(front)}.")
    if action == "drop":
      if world.carrying is None:
        return self._refuse("You carry nothing to drop.")
      if front is not None:
        return self._refuse(f"You cannot drop here: a {_object_name(front)} is in front of you.")
      name = _object_name(world.carrying)
      return self._finish(*self._primitive(Actions.drop), f"You dropped the {name}.")
    if action in ("toggle", "open", "open door", "close door"):
      if front is None or front.type not in ("door", "box"):
        return self._refuse("There is no door or box right in front of you to toggle.")
      if front.type == "door" and front.is_locked and not (
          world.carrying is not None and world.carrying.type == "key" and world.carrying.color == front.color):
        return self._refuse(f"The {front.color} door is locked; you need to carry a {front.color} key.")
      return self._finish(*self._primitive(Actions.toggle), f"You toggled the {_object_name(front)}.")
    if action == "done":
      return self._finish(*self._primitive(Actions.done), "You declared that you are done.")
    if action.startswith("go to"):
      return self._go_to(action.removeprefix("go to").strip().removeprefix("the ").strip())
    return self._refuse(f"Unknown action {action[:60]!r}. Use: turn left, turn right, move forward, pick up "
                        "<object>, drop, toggle, go to <object>.")

  def _go_to(self, wanted: str) -> base.Outcome:
    if not wanted:
      return self._refuse("Say what to go to, e.g. go to red ball.")
    targets = [position for _, name, _, _, position in self._visible_objects() if name.endswith(wanted)]
    if not targets:
      return self._refuse(f"You do not see a {wanted}.")
    path = self._path_to_face(set(targets))
    if path is None:
      return self._refuse(f"You cannot find a way to the {wanted} from here.")
    if not path:
      return self._refuse(f"The {wanted} is already right in front of you.")
    over, reward = False, 0.0
    for action in path:
      over, reward = self._primitive(action)
      if over:
        break
    return self._finish(over, reward, f"You walked to the {wanted}.")

  def _path_to_face(self, targets: set[tuple[int, int]]) -> list[int] | None:
    """Shortest primitive-action path (turns and steps over free squares) to face one of `targets`."""
    world = self._world.unwrapped
    vectors = ((1, 0), (0, 1), (-1, 0), (0, -1))  # minigrid's directions 0..3
    start = (int(world.agent_pos[0]), int(world.agent_pos[1]), int(world.agent_dir))
    parent: dict[tuple[int, int, int], tuple[tuple[int, int, int], int] | None] = {start: None}
    queue = collections.deque([start])
    while queue:
      state = queue.popleft()
      x, y, d = state
      if (x + vectors[d][0], y + vectors[d][1]) in targets:
        path = []
        while parent[state] is not None:
          state, action = parent[state]
          path.append(action)
        return path[::-1][:_MAX_MACRO_STEPS]
      fx, fy = x + vectors[d][0], y + vectors[d][1]
      moves = [((x, y, (d - 1) % 4), Actions.left), ((x, y, (d + 1) % 4), Actions.right)]
      if 0 <= fx < world.width and 0 <= fy < world.height:
        cell = world.grid.get(fx, fy)
        if cell is None or cell.can_overlap():
          moves.append(((fx, fy, d), Actions.forward))
      for nxt, action in moves:
        if nxt not in parent:
          parent[nxt] = (state, action)
          queue.append(nxt)
    return None

  # --- the expert and the random baseline ------------------------------------------------------------------

  def _expert_turn(self) -> str:
    action = self._suggestion
    world = self._world.unwrapped
    front = world.grid.get(*world.front_pos)
    if action is None:
      return base.react_turn("I am not sure where to go, so I look around.", "turn left")
    words = _ACTION_WORDS[Actions(action)]
    if action == Actions.pickup and front is not None:
      words = f"pick up {_object_name(front)}"
    reasons = {
        Actions.left: "turning left", Actions.right: "turning right", Actions.forward: "moving forward",
        Actions.pickup: "picking up what is in front of me", Actions.drop: "dropping what I carry here",
        Actions.toggle: "toggling what is in front of me", Actions.done: "stopping here"}
    return base.react_turn(f"My goal is to {self._mission}; the next step is {reasons[Actions(action)]}.", words)

  def _sample_action(self, rng) -> str:
    actions = ["turn left", "turn right", "move forward", "pick up", "drop", "toggle"]
    actions += [f"go to {name.split()[-2]} {name.split()[-1]}" for _, name, _, _, _ in self._visible_objects()]
    return rng.choice(actions)


def main() -> None:
  parser = argparse.ArgumentParser(description="Rebuild the stored lists of bot-solvable BabyAI seeds.")
  parser.add_argument("--build", action="store_true", required=True)
  parser.parse_args()
  stored = build_seed_lists()
  with open(_SEEDS_FILE, "w") as f:
    json.dump(stored, f, separators=(",", ":"))
    f.write("\n")
  print(f"wrote {_SEEDS_FILE}")


if __name__ == "__main__":
  main()
