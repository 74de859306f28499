"""The oracle and env step judges: their rules on hand-written measures, and, on every built-in env, the oracle's
labels of the expert's own steps (GOOD), equally short alternatives (GOOD) and steps that make no progress:
invalid, repeated or moving away (BAD)."""

import json

import numpy as np
import pytest

from evolver import envs
from evolver.credit.judges import env_labels, oracle_labels
from evolver.envs import textcraft, wordle

NONE = {"cost_to_go": None, "progress": None}


def _m(cost, progress=None):
  return {"cost_to_go": cost, "progress": progress}


# ----------------------------------------------------------------------------------------------------------
# The rules.
# ----------------------------------------------------------------------------------------------------------


def test_oracle_rule_on_hand_written_measures():
  steps = [
      {"before": _m(3, 0.0), "after": _m(2, 0.3)},    # cost fell: GOOD
      {"before": _m(2, 0.3), "after": _m(2, 0.3)},    # nothing moved: BAD
      {"before": _m(2, 0.3), "after": _m(4, 0.1)},    # moved away: BAD
      {"before": _m(1, 0.2), "after": _m(1, 0.6)},    # cost flat, progress rose (sql): GOOD
      {"before": _m(1, 0.6), "after": _m(1, 0.1)},    # cost flat, progress fell: BAD
      {"before": _m(2, None), "after": _m(2, None)},  # cost flat, no progress measure: BAD, still judged
      {"before": _m(2, 0.9), "after": _m(1, 0.0)},    # cost fell while progress fell: the cost decides, GOOD
      {"before": NONE, "after": NONE},                # an env without measures: not judged
      {"before": _m(2, 0.1), "after": NONE},          # measures() raised after the step: not judged
      {"before": None, "after": _m(0, 1.0)},          # a side missing altogether: not judged
  ]
  good, known = oracle_labels(steps)
  assert good.dtype == bool and known.dtype == bool and good.shape == known.shape == (10,)
  np.testing.assert_array_equal(good, [True, False, False, True, False, False, True, False, False, False])
  np.testing.assert_array_equal(known, [True] * 7 + [False] * 3)


def test_env_rule_on_hand_written_measures():
  steps = [
      {"before": _m(3, 0.0), "after": _m(2, 0.3)},     # progress rose: GOOD
      {"before": _m(2, 0.3), "after": _m(1, 0.3)},     # progress flat (the cost is not read): BAD
      {"before": _m(2, 0.5), "after": _m(2, 0.25)},    # progress fell: BAD
      {"before": _m(2, None), "after": _m(1, 0.5)},    # progress missing before: not judged
      {"before": NONE, "after": NONE},
  ]
  good, known = env_labels(steps)
  np.testing.assert_array_equal(good, [True, False, False, False, False])
  np.testing.assert_array_equal(known, [True, True, True, False, False])


def test_no_steps_give_empty_labels():
  for judge in (oracle_labels, env_labels):
    good, known = judge([])
    assert good.shape == known.shape == (0,) and good.dtype == known.dtype == bool


# ----------------------------------------------------------------------------------------------------------
# The oracle on the built-in envs.
# ----------------------------------------------------------------------------------------------------------


def _step(env, action: str) -> dict:
  """Steps `env` with the turn `action` (a whole turn, or what goes after "Action:"); returns its measures."""
  turn = action if "Action:" in action else f"Thought: I act.\nAction: {action}"
  before = env.measures()
  env.step(turn)
  return {"before": before, "after": env.measures()}


def _oracle(steps: list[dict]) -> list[bool]:
  good, known = oracle_labels(steps)
  assert known.all()
  return good.tolist()


def _good(env, action: str) -> bool:
  return _oracle([_step(env, action)])[0]


def _expert_steps(env, index: int) -> list[dict]:
  env.reset(index, "train")
  steps = []
  while not env.done:
    steps.append(_step(env, env.expert_action()))
  return steps


# babyai's expert (minigrid's BabyAIBot) sees only its 7x7 view and looks around for what it has not seen, which a
# plan knowing the whole world never needs: on such turns (train tasks 4, 16 and 19 among the first 20, about 1
# turn in 22 over the train split) the oracle labels the bot's step BAD. The tasks here are ones it plays optimally.
EXPERT_TASKS = {"babyai": (0, 1, 2, 3, 5), "maze": range(5), "sql": range(5), "textcraft": range(5),
                "tools": range(5), "wordle": range(5)}


@pytest.mark.parametrize("name", envs.names())
def test_oracle_labels_every_expert_step_good(name):
  env = envs.make(name)
  for index in EXPERT_TASKS[name]:
    steps = _expert_steps(env, index)
    assert steps and all(_oracle(steps)), (name, index, steps)


def test_oracle_labels_the_babyai_bot_bad_where_it_looks_around():
  steps = _expert_steps(envs.make("babyai"), 4)
  assert env_labels(steps)[1].all()
  assert not all(_oracle(steps)) and sum(_oracle(steps)) >= len(steps) - 2


# --- maze ---------------------------------------------------------------------------------------------------

_DIRECTIONS = ("up", "down", "left", "right")


def _maze_costs_after(env, index: int) -> dict[str, int]:
  """The cost to go after each first move of train task `index`."""
  costs = {}
  for direction in _DIRECTIONS:
    env.reset(index, "train")
    env.step(f"Action: move {direction}")
    costs[direction] = env.measures()["cost_to_go"]
  return costs


def _maze_task_with(env, wanted) -> tuple[int, int, dict[str, int]]:
  """The first train task whose (start cost, costs after each first move) satisfy `wanted`."""
  for index in range(200):
    env.reset(index, "train")
    start = env.measures()["cost_to_go"]
    costs = _maze_costs_after(env, index)
    if wanted(start, costs):
      return index, start, costs
  pytest.fail("no maze task among the first 200 has what the test needs")


def test_maze_oracle_alternatives_and_no_progress():
  env = envs.make("maze")
  index, start, costs = _maze_task_with(env, lambda start, costs: sum(c == start - 1 for c in costs.values()) >= 2)
  env.reset(index, "train")
  expert = env.expert_action().rsplit("move ", 1)[1]
  other = next(d for d in _DIRECTIONS if costs[d] == start - 1 and d != expert)
  assert _good(env, f"move {other}")  # the equally short alternative
  assert not _good(env, "fly to the goal")  # invalid
  index, start, costs = _maze_task_with(env, lambda start, costs: start in costs.values()
                                        and any(c > start for c in costs.values()))
  env.reset(index, "train")
  wall = next(d for d in _DIRECTIONS if costs[d] == start)  # a wall there: the move changes nothing
  assert _oracle([_step(env, f"move {wall}"), _step(env, f"move {wall}")]) == [False, False]
  away = next(d for d in _DIRECTIONS if costs[d] > start)
  assert not _good(env, f"move {away}")  # moving away


# --- textcraft ----------------------------------------------------------------------------------------------


def _craft_first_action(env) -> str:
  """A craft of the expert's plan whose ingredients are in the inventory, else the plan's next get: the plan's
  steps in another order (crafts as early as possible), each as short as the expert's."""
  plan = textcraft._plan(env._task, env._inventory)
  for kind, item, times in plan:
    recipe = env._task.recipe_for(item) if kind == "craft" else None
    if recipe and all(env._inventory.get(x, 0) >= n * times for x, n in recipe.inputs):
      return recipe.command(times)
  kind, item, n = plan[0]
  return f"get {min(n, 64)} {item}"


def test_textcraft_oracle_alternatives_and_no_progress():
  env = envs.make("textcraft")
  reordered = 0
  for index in range(10):
    expert = _expert_steps(env, index)
    env.reset(index, "train")
    steps, actions = [], []
    while not env.done:
      actions.append(_craft_first_action(env))
      steps.append(_step(env, actions[-1]))
    assert all(_oracle(steps)) and len(steps) == len(expert)  # equally short, every step GOOD
    env.reset(index, "train")
    expert_actions = []
    while not env.done:
      expert_actions.append(env.expert_action().split("Action: ")[1])
      env.step(env.expert_action())
    reordered += actions != expert_actions
  assert reordered  # some tasks were played in another order than the expert's
  env.reset(0, "train")
  plan = textcraft._plan(env._task, {})
  gets = [(item, n) for kind, item, n in plan if kind == "get"]
  if len(gets) >= 2:  # another needed raw material first
    assert _good(env, f"get {min(gets[1][1], 64)} {gets[1][0]}")
  env.reset(0, "train")
  assert not _good(env, "dance around")  # invalid
  assert _oracle([_step(env, "inventory"), _step(env, "inventory")]) == [False, False]  # a no-op, repeated
  needed = {x for recipe in env._task.recipes for x, _ in recipe.inputs}
  unneeded = next(x for x in textcraft.RAW_MATERIALS if x not in needed)
  assert not _good(env, f"get 1 {unneeded}")  # an item nothing needs
  assert _textcraft_away_moves(env) > 0


def _textcraft_away_moves(env) -> int:
  """How many of the first 30 train tasks let the expert's gathered ingredients be spent on a distractor (a
  recipe outside the goal's tree), which moves away from the goal; asserts each such craft is BAD."""
  found = 0
  for index in range(30):
    env.reset(index, "train")
    while textcraft._plan(env._task, env._inventory)[0][0] == "get":
      env.step(env.expert_action())
    tree = {recipe.output for recipe in textcraft._tree_order(env._task)}
    for recipe in env._task.recipes:
      if recipe.output not in tree and all(env._inventory.get(x, 0) >= n for x, n in recipe.inputs):
        assert not _good(env, recipe.command())
        found += 1
        break
  return found


# --- sql ----------------------------------------------------------------------------------------------------


def test_sql_oracle_alternatives_and_no_progress():
  env = envs.make("sql")
  for index in range(3):  # the expert's query in another form: the same result
    env.reset(index, "train")
    gold = env._task.gold_sql
    assert _good(env, f"SELECT * FROM ({gold}) AS answer") and env.measures() == {"cost_to_go": 0, "progress": 1.0}
  env.reset(4, "train")  # 7 rows in order: partial results move toward the answer
  gold = env._task.gold_sql
  assert len(env._gold) == 7 and "LIMIT" not in gold.upper()
  steps = [_step(env, f"{gold} LIMIT 3"), _step(env, f"{gold} LIMIT 5"), _step(env, "SELECT 1"),
           _step(env, "SELEC nonsense"), _step(env, f"{gold} LIMIT 5"), _step(env, f"{gold} LIMIT 6")]
  # closer, closer, away, invalid, back to the best so far (a repeat after a detour: no progress), closer
  assert _oracle(steps) == [True, True, False, False, False, True]
  assert 0.0 < steps[0]["after"]["progress"] < steps[1]["after"]["progress"] < 1.0
  env.reset(4, "train")
  assert not _good(env, "DROP TABLE books")  # refused


# --- wordle -------------------------------------------------------------------------------------------------


def test_wordle_oracle_alternatives_and_no_progress():
  env = envs.make("wordle")
  env.reset(0, "train")
  assert _good(env, env.expert_action())  # the opener
  left = wordle.candidates_left(tuple(env._history))
  assert len(left) > 2
  blank = next(w for w in wordle.vocabulary()
               if w != wordle.OPENER and w not in left and len({wordle.feedback(w, c) for c in left}) == 1)
  assert not _good(env, " ".join(blank))  # a guess whose feedback rules none of the words left out
  expert = env.expert_action().split("Action: ")[1].replace(" ", "")
  other = next(w for w in left if w not in (expert, env._answer))
  assert _good(env, " ".join(other))  # another word that fits the feedback
  assert not _good(env, " ".join(wordle.OPENER))  # the opener again: repeated
  assert not _good(env, "x q z j k")  # not a word
  assert not _good(env, "hello there")  # not a guess


# --- tools --------------------------------------------------------------------------------------------------


def test_tools_oracle_alternatives_and_no_progress():
  env = envs.make("tools")
  index = next(i for i in range(50) if _second_call_differs(i))
  expert = _expert_steps(env, index)
  env.reset(index, "train")
  second = env._task.goals[1].plan[0]  # the second sub-goal's first call, before the first sub-goal's calls
  steps = [_step(env, f"{second.fn}\nAction Input: {json.dumps(second.args)}")]
  while not env.done:
    steps.append(_step(env, env.expert_action()))
  assert all(_oracle(steps)) and len(steps) == len(expert)  # the calls in another order: as short, all GOOD
  env.reset(index, "train")
  first = env.expert_action()
  assert _oracle([_step(env, first), _step(env, first)]) == [True, False]  # the same call again
  assert not _good(env, "teleport\nAction Input: {}")  # invalid: no such tool
  assert not _good(env, 'add_todo\nAction Input: {"title": "learn the banjo"}')  # nothing asked for
  assert not _good(env, 'finish\nAction Input: {"answer": "done"}')  # finishing before the work is done


def _second_call_differs(index: int) -> bool:
  """Whether train task `index` has two sub-goals whose first calls differ."""
  env = envs.make("tools")
  env.reset(index, "train")
  goals = env._task.goals
  return len(goals) >= 2 and goals[0].plan[0].key() != goals[1].plan[0].key()


# --- babyai -------------------------------------------------------------------------------------------------

_PRIMITIVES = ("turn left", "turn right", "move forward", "pick up", "drop", "toggle")


def _babyai_costs_after(env, index: int) -> tuple[int, dict[str, int]]:
  """The cost to go at the start of train task `index`, and after each primitive action from there."""
  env.reset(index, "train")
  start = env.measures()["cost_to_go"]
  costs = {}
  for action in _PRIMITIVES:
    env.reset(index, "train")
    env.step(f"Action: {action}")
    costs[action] = env.measures()["cost_to_go"]
  return start, costs


def test_babyai_oracle_alternatives_and_no_progress():
  env = envs.make("babyai")
  for index in range(30):  # a start with two shortest first actions (the target behind: turn either way)
    start, costs = _babyai_costs_after(env, index)
    shortest = [a for a in _PRIMITIVES if costs[a] == start - 1]
    if len(shortest) >= 2:
      break
  else:
    pytest.fail("no babyai task among the first 30 has two shortest first actions")
  env.reset(index, "train")
  expert = env.expert_action().split("Action: ")[1]
  expert = "pick up" if expert.startswith("pick up") else expert
  other = next(a for a in shortest if a != expert)
  assert _good(env, other)  # the equally short alternative
  env.reset(index, "train")
  assert not _good(env, "fly to the goal")  # invalid
  assert _oracle([_step(env, "drop"), _step(env, "drop")]) == [False, False]  # carrying nothing: refused, twice
  away = [a for a in _PRIMITIVES if costs[a] > start]
  if away:
    env.reset(index, "train")
    assert not _good(env, away[0])  # a move away
  env.reset(0, "train")  # the `go to` macro: several primitive steps toward the goal at once
  assert env._mission == "pick up the green key"
  step = _step(env, "go to green key")
  assert _oracle([step]) == [True] and step["before"]["cost_to_go"] - step["after"]["cost_to_go"] > 1


def test_babyai_away_moves_exist_and_are_bad():
  env = envs.make("babyai")
  found = 0
  for index in range(12):
    start, costs = _babyai_costs_after(env, index)
    for action in _PRIMITIVES:
      if costs[action] > start:
        env.reset(index, "train")
        assert not _good(env, action)
        found += 1
  assert found


def test_babyai_progress_counts_clauses_of_a_sequenced_mission():
  env = envs.make("babyai")
  index = next(i for i in range(5, 200, 6) if _babyai_mission(env, i) and ", then " in env._mission)
  steps = _expert_steps(env, index)
  progress = [steps[0]["before"]["progress"]] + [s["after"]["progress"] for s in steps]
  assert progress[0] == 0.0 and progress[-1] == 1.0 and 0.5 in progress
  good, known = env_labels(steps)
  assert known.all() and good.sum() == 2  # the env judge: GOOD exactly where a clause was done


def _babyai_mission(env, index: int) -> str:
  env.reset(index, "train")
  return env._mission
