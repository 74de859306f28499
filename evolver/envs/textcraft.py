"""textcraft (game): craft a goal item through a recipe tree, AgentGym TextCraft's syntax and rules.

Each task draws its own recipe tree (depth 1 to 3) over a small universe of raw materials and made-up
intermediate and product names, plus distractor recipes that lead elsewhere. The first observation lists
the crafting commands and the goal. Actions, as in AgentGym: `get N item` (raw materials only),
`craft N X using A, B` (one listed recipe, applied k times: N and every input count multiplied by k) and
`inventory`. The expert is a planner: from the current inventory it works out what is still missing, gets
the raw materials, then crafts bottom-up.

A spec task (`reset_spec`) keeps a task's recipes and asks for another item any of them outputs (or several of
one); see `TextCraftEnv._reset_spec`. An exploration (`reset_world`) shows the recipes with no goal and yields
one task per item crafted; see `TextCraftEnv._reset_world`. The state key is the inventory; the step judges' cost
to go is the number of turns the expert's plan still takes (`TextCraftEnv._measures`).
"""

from __future__ import annotations

import dataclasses
import math
import random
import re

from evolver.envs import base

RAW_MATERIALS = (
    "oak log", "birch log", "spruce log", "cobblestone", "sand", "clay", "iron ingot", "gold ingot",
    "copper ingot", "coal", "redstone", "lapis lazuli", "diamond", "emerald", "string", "feather", "flint",
    "leather", "wool", "wheat", "sugar cane", "bone", "slime ball", "gunpowder", "glowstone dust", "quartz",
    "obsidian", "honeycomb")
_MATERIALS = ("oak", "birch", "spruce", "stone", "glass", "brick", "iron", "gold", "copper", "quartz",
              "obsidian", "diamond", "emerald", "bone")
_PARTS = ("planks", "rod", "plate", "gear", "wire", "ring", "hinge", "tile", "frame", "panel", "bolt", "dust")
_PRODUCTS = ("lantern", "compass", "clock", "bucket", "chest", "sign", "door", "fence", "ladder", "cart",
             "shield", "lamp", "anvil", "bell", "cage", "crate", "helmet", "boots", "sword", "pickaxe", "table",
             "stool", "barrel", "hopper", "trapdoor", "easel", "loom", "drum", "kite", "sled")
_MAX_EXPERT_TURNS = 12


@dataclasses.dataclass(frozen=True)
class Recipe:
  output: str
  count: int  # how many one application yields
  inputs: tuple[tuple[str, int], ...]  # (item, count) per application

  def command(self, times: int = 1) -> str:
    ingredients = ", ".join(f"{n * times} {item}" for item, n in self.inputs)
    return f"craft {self.count * times} {self.output} using {ingredients}"


@dataclasses.dataclass(frozen=True)
class CraftTask:
  goal: str
  recipes: tuple[Recipe, ...]  # the goal's tree first (goal recipe first), then distractors
  commands: tuple[str, ...]  # the recipes as shown, shuffled
  goal_count: int = 1  # how many of `goal` the inventory must hold (a spec's "count"; 1 for indexed tasks)

  def recipe_for(self, item: str) -> Recipe | None:
    for recipe in self.recipes:
      if recipe.output == item:
        return recipe
    return None


class _TreeBuilder:
  """Draws one recipe tree; names are unique within a task."""

  def __init__(self, rng: random.Random):
    self.rng = rng
    self.used: set[str] = set()
    self.recipes: list[Recipe] = []

  def fresh_name(self, nouns: tuple[str, ...]) -> str:
    while True:
      name = f"{self.rng.choice(_MATERIALS)} {self.rng.choice(nouns)}"
      if name not in self.used:
        self.used.add(name)
        return name

  def raw(self) -> str:
    return self.rng.choice(RAW_MATERIALS)

  def item(self, level: int, nouns: tuple[str, ...] = _PARTS) -> str:
    """An item `level` crafting steps above raw materials (level 0 is a raw material)."""
    if level == 0:
      return self.raw()
    name = self.fresh_name(nouns)
    n_inputs = self.rng.randint(1, 3) if nouns is _PRODUCTS else self.rng.randint(1, 2)
    inputs: dict[str, int] = {}
    for i in range(n_inputs):
      child_level = level - 1 if i == 0 else self.rng.randint(0, level - 1)
      child = self.item(child_level)
      inputs[child] = inputs.get(child, 0) + self.rng.randint(1, 4)
    count = 1 if nouns is _PRODUCTS else self.rng.choice((1, 1, 2, 4))
    self.recipes.append(Recipe(name, count, tuple(inputs.items())))
    return name


def generate_task(seed: int) -> CraftTask | None:
  rng = random.Random(f"textcraft:{seed}")
  depth = rng.choices((1, 2, 3), weights=(0.1, 0.45, 0.45))[0]
  builder = _TreeBuilder(rng)
  goal = builder.item(depth, _PRODUCTS)
  tree = list(reversed(builder.recipes))  # goal recipe first
  # Distractors: recipes for other things, built from the same ingredients, so reading matters.
  ingredients = sorted({item for recipe in tree for item, _ in recipe.inputs})
  distractors = []
  for _ in range(rng.randint(2, 4)):
    output = builder.fresh_name(rng.choice((_PARTS, _PRODUCTS)))
    picks = rng.sample(ingredients, min(len(ingredients), rng.randint(1, 2)))
    if rng.random() < 0.5:
      picks.append(builder.raw())
    inputs = tuple((item, rng.randint(1, 4)) for item in dict.fromkeys(picks))
    distractors.append(Recipe(output, rng.choice((1, 1, 2)), inputs))
  task_recipes = tuple(tree + distractors)
  commands = [recipe.command() for recipe in task_recipes]
  rng.shuffle(commands)
  task = CraftTask(goal, task_recipes, tuple(commands))
  if len(_plan(task, {})) > _MAX_EXPERT_TURNS:
    return None
  return task


def _task_key(task: CraftTask) -> str:
  return task.goal + "|" + "|".join(sorted(task.commands))


_TASKS = base.SplitIndex(generate_task, _task_key, sizes={"train": 2000, "eval": 200}, eval_every=5)


def _tree_order(task: CraftTask) -> list[Recipe]:
  """The goal's recipes, every recipe before the recipes of its ingredients (parents first)."""
  order: list[Recipe] = []
  seen: set[str] = set()

  def visit(item: str) -> None:
    recipe = task.recipe_for(item)
    if recipe is None or item in seen:
      return
    seen.add(item)
    for child, _ in recipe.inputs:
      visit(child)
    order.append(recipe)

  visit(task.goal)
  return order[::-1]


def _plan(task: CraftTask, inventory: dict[str, int]) -> list[tuple[str, str, int]]:
  """What is left to do from `inventory`: ('get', raw, n) then ('craft', item, times), bottom-up."""
  need = {task.goal: task.goal_count}
  crafts: list[tuple[str, str, int]] = []
  gets: dict[str, int] = {}
  for recipe in _tree_order(task):
    short = need.get(recipe.output, 0) - inventory.get(recipe.output, 0)
    if short <= 0:
      continue
    times = math.ceil(short / recipe.count)
    crafts.append(("craft", recipe.output, times))
    for item, n in recipe.inputs:
      if task.recipe_for(item) is None:
        gets[item] = gets.get(item, 0) + n * times
      else:
        need[item] = need.get(item, 0) + n * times
  steps = [("get", item, n - inventory.get(item, 0)) for item, n in gets.items() if n > inventory.get(item, 0)]
  return steps + crafts[::-1]


def _expert_turns(plan: list[tuple[str, str, int]]) -> int:
  """How many turns the expert takes for `plan`: a `get` takes at most 64 at a time."""
  return sum(math.ceil(n / 64) if kind == "get" else 1 for kind, _, n in plan)


_INSTRUCTION = """\
You are given crafting recipes to craft items, Minecraft style. Crafting commands have the format \
"craft [target object] using [input ingredients]". Every round I give you an observation and you respond \
with one action. You can "get" raw materials (items that no listed command crafts) from the environment, \
look at your inventory with "inventory", or "craft" an item using one of the listed crafting commands.

Each turn, reply with a short thought and one action:
Thought: <your reasoning>
Action: <one action>

Rules:
1. Always give the quantity with "get" and "craft". Examples: get 2 iron ingot; craft 4 oak planks using 1 oak log.
2. Use only the crafting commands given. A command may be applied several times at once by multiplying \
every number in it: "craft 2 oak door using 6 oak planks" applies "craft 1 oak door using 3 oak planks" twice.
3. Crafted items cannot be fetched with "get"; craft them.

Example:
Thought: The oak door needs 3 oak planks, and one oak log gives 4 planks. First I get the log.
Action: get 1 oak log"""

_GET = re.compile(r"^get\s+(\d+)\s+(.+)$")
_CRAFT = re.compile(r"^craft\s+(\d+)\s+(.+?)\s+using\s+(.+)$")
_COUNTED = re.compile(r"^(\d+)\s+(.+)$")
_JUNK = re.compile(r"[^a-z0-9, ]+")


def _normalise(action: str) -> str:
  return " ".join(_JUNK.sub(" ", action.lower()).split())


class TextCraftEnv(base.TextEnv):
  name = "textcraft"
  version = "textcraft-v2"  # v2: the expert splits gets above 64
  max_rounds = 20

  def __init__(self):
    super().__init__()
    self._task: CraftTask | None = None
    self._inventory: dict[str, int] = {}
    # Exploration: the actions that changed the inventory, as (action, items consumed, item produced).
    self._log: list[tuple[str, tuple[str, ...], str]] = []

  def instruction(self) -> str:
    return _INSTRUCTION

  def _num_tasks(self, split: str) -> int:
    return _TASKS.sizes[split]

  def _task_key(self, index: int, split: str) -> str:
    return _TASKS.key(index, split)

  def _reset_task(self, index: int, split: str) -> str:
    self._task = _TASKS.get(index, split)
    self._inventory = {}
    return "Crafting commands:\n" + "\n".join(self._task.commands) + f"\n\nGoal: craft {self._task.goal}."

  def _reset_spec(self, spec: base.TaskSpec) -> str:
    """Target: `{"item": name}` or `{"item": name, "count": n}` (1 <= n <= 64, default 1): hold at least n of
    `item`, an item that some recipe of the world outputs (any of the world's recipes, not only the goal's
    tree), whose expert plan fits in `max_rounds` turns. Success: crafting it so that the inventory holds n,
    reward 1. The world's crafting commands are shown unchanged; the goal line reads "Goal: craft <item>."
    ("craft <n> <item>" for n > 1), or "Goal: <spec.goal>" when the spec gives a goal text.
    """
    base.check_target_keys(self.name, spec.target, ("item",), ("count",))
    world = _TASKS.get(spec.world, spec.split)
    item = base.spec_str(self.name, "item", spec.target["item"])
    count = base.spec_int(self.name, "count", spec.target.get("count", 1), 1, 64)
    if world.recipe_for(item) is None:
      craftable = sorted(recipe.output for recipe in world.recipes)
      raise base.EnvError(f"textcraft spec target item {item!r:.60} is made by no recipe of world "
                          f"{spec.split}[{spec.world}]; its recipes make {craftable}")
    task = dataclasses.replace(world, goal=item, goal_count=count)
    turns = _expert_turns(_plan(task, {}))
    if turns > self.max_rounds:
      raise base.EnvError(f"textcraft spec target {count} {item} takes {turns} turns to craft, more than an "
                          f"episode's {self.max_rounds} rounds")
    self._task = task
    self._inventory = {}
    goal = spec.goal or (f"craft {item}." if count == 1 else f"craft {count} {item}.")
    return "Crafting commands:\n" + "\n".join(self._task.commands) + f"\n\nGoal: {goal}"

  def _reset_world(self, index: int, split: str) -> str:
    """The world's crafting commands, without the "Goal: ..." line.

    Outcomes: each item crafted for the first time, as `{"item": item, "count": n}`, n the number that craft
    made (at most 64), with the gets and crafts it depended on, in order: walking back from that craft, an
    earlier get or craft is kept when it produced an item that a kept craft consumes (so whatever the
    exploration did besides, spent or refused is dropped; keeping every producer of a needed item makes the
    kept crafts find at least what they found in the exploration). `inventory` and refused actions are
    dropped. Raw materials are no outcome: a spec's item must be crafted.
    """
    self._task = dataclasses.replace(_TASKS.get(index, split), goal="")
    self._inventory = {}
    self._log = []
    return "Crafting commands:\n" + "\n".join(self._task.commands)

  def _target_key_now(self) -> str:
    world = base.stable_digest("|".join(sorted(self._task.commands)))
    return f"textcraft|world={world}|item={self._task.goal}|count={self._task.goal_count}"

  def _explored(self, action: str, consumed: tuple[str, ...], produced: str, crafted: int) -> None:
    """Logs an inventory change; a first craft of `produced` becomes a task (see `_reset_world`)."""
    first = crafted and all(item != produced for _, _, item in self._log)
    self._log.append((action, consumed, produced))
    if not first:
      return
    needed: set[str] = set(consumed)
    kept = [action]
    for earlier, inputs, output in reversed(self._log[:-1]):
      if output in needed:
        kept.append(earlier)
        needed.update(inputs)
    if len(kept) <= self.max_rounds:
      count = min(crafted, 64)
      self._add_hindsight({"item": produced, "count": count}, kept[::-1], f"crafted {count} {produced}")

  def _state_key(self) -> str:
    """The inventory, sorted by item: the recipes and the goal belong to the task."""
    return "inv=" + ",".join(f"{item}:{n}" for item, n in sorted(self._inventory.items()))

  def _measures(self) -> tuple[int, float]:
    """cost_to_go: the turns the expert's plan takes from the current inventory (the gets, 64 items a turn, and
    the crafts still needed toward the goal), so that a needed ingredient crafted early or late counts alike;
    progress: the fraction of the crafts of the plan from an empty inventory that are no longer needed."""
    plan = _plan(self._task, self._inventory)
    crafts = sum(kind == "craft" for kind, _, _ in _plan(self._task, {}))
    left = sum(kind == "craft" for kind, _, _ in plan)
    return _expert_turns(plan), 1.0 - left / crafts

  def _inventory_text(self) -> str:
    if not self._inventory:
      return "Inventory: You are not carrying anything."
    return "Inventory: " + " ".join(f"[{item}] ({n})" for item, n in self._inventory.items())

  def _add(self, item: str, n: int) -> None:
    self._inventory[item] = self._inventory.get(item, 0) + n

  def _act(self, text: str) -> base.Outcome:
    action = _normalise(base.parse_action(text))
    if action in ("inventory", "look", "check inventory"):
      return base.Outcome(self._inventory_text(), 0.0)
    if match := _GET.match(action):
      return self._get(int(match.group(1)), match.group(2))
    if match := _CRAFT.match(action):
      return self._craft(int(match.group(1)), match.group(2), match.group(3))
    return base.Outcome(f"Could not execute {action[:60]!r}. Use \"get N item\", \"craft N item using N a, "
                        "N b\" or \"inventory\".", 0.0)

  def _get(self, n: int, item: str) -> base.Outcome:
    if self._task.recipe_for(item) is not None:
      return base.Outcome(f"Could not find {item}: it has to be crafted.", 0.0)
    if item not in RAW_MATERIALS:
      return base.Outcome(f"Could not find {item}.", 0.0)
    if not 1 <= n <= 64:
      return base.Outcome(f"Could not get {n} {item}: get between 1 and 64 at a time.", 0.0)
    self._add(item, n)
    if self._exploring:
      self._explored(f"get {n} {item}", (), item, 0)
    return base.Outcome(f"Got {n} {item}", 0.0)

  def _craft(self, n: int, item: str, ingredients: str) -> base.Outcome:
    recipe = self._task.recipe_for(item)
    if recipe is None:
      return base.Outcome(f"Could not find a valid recipe for {item}.", 0.0)
    given: dict[str, int] = {}
    for part in ingredients.split(","):
      match = _COUNTED.match(part.strip())
      if match is None:
        return base.Outcome(f"Wrong item format: {part.strip()[:40]!r}; write counts like \"2 iron ingot\".", 0.0)
      given[match.group(2)] = given.get(match.group(2), 0) + int(match.group(1))
    times = n // recipe.count
    expected = {ingredient: k * times for ingredient, k in recipe.inputs}
    if n <= 0 or n % recipe.count or given != expected:
      return base.Outcome(f"Could not find a valid recipe for {item} matching that command. The recipe is: "
                          f"{recipe.command()}.", 0.0)
    missing = [f"{k - self._inventory.get(x, 0)} {x}" for x, k in expected.items() if self._inventory.get(x, 0) < k]
    if missing:
      return base.Outcome(f"Could not find enough items to craft {item}: missing {', '.join(missing)}.", 0.0)
    for x, k in expected.items():
      self._inventory[x] -= k
      if not self._inventory[x]:
        del self._inventory[x]
    self._add(item, n)
    if self._exploring:
      self._explored(recipe.command(times), tuple(expected), item, n)
    if item == self._task.goal and self._inventory[item] >= self._task.goal_count:
      return base.Outcome(f"Crafted {n} {item}. You crafted the goal. Success!", 1.0, True, True)
    return base.Outcome(f"Crafted {n} {item}", 0.0)

  def _expert_turn(self) -> str:
    plan = _plan(self._task, self._inventory)
    if not plan:
      return base.react_turn("I already have the goal item.", "inventory")
    kind, item, n = plan[0]
    if kind == "get":
      # One `get` takes at most 64; larger needs take several turns.
      return base.react_turn(f"To craft {self._task.goal} I still need {n} {item}, a raw material.",
                             f"get {min(n, 64)} {item}")
    recipe = self._task.recipe_for(item)
    reason = "the goal" if item == self._task.goal else f"needed for {self._task.goal}"
    return base.react_turn(f"I have the ingredients for {item}, {reason}.", recipe.command(n))

  def _sample_action(self, rng) -> str:
    raws = sorted({x for recipe in self._task.recipes for x, _ in recipe.inputs if self._task.recipe_for(x) is None})
    actions = ["inventory"] + [f"get {n} {x}" for x in raws for n in range(1, 5)]
    actions += [recipe.command() for recipe in self._task.recipes]
    return rng.choice(actions)
