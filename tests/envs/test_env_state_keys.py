"""Per-turn state keys: built from the env's true state, equal for equal states, distinct across tasks."""

import pytest

from evolver import envs
from evolver.envs import babyai, textcraft

from tests.envs.helpers import expert_readings

NAMES = envs.names()


def _expert_keys(env, index: int, split: str = "train") -> list[str]:
  """The state key before each expert turn of task `index`, and the final one."""
  return expert_readings(env, index, lambda e: e.state_key(), split)


@pytest.mark.parametrize("name", NAMES)
def test_keys_are_deterministic_short_and_name_the_task(name):
  first, second = envs.make(name), envs.make(name)
  with pytest.raises(envs.EpisodeNotStartedError, match="reset"):
    first.state_key()
  keys = _expert_keys(first, 3)
  assert keys == _expert_keys(second, 3)  # the same states in another episode, in another env instance
  assert all(key.startswith(f"{name}/train/3|") and len(key) <= 160 for key in keys)
  assert len(set(keys)) > 1  # the expert's actions change the state
  starts = set()
  for split, indices in (("train", range(6)), ("eval", range(3))):
    for index in indices:
      first.reset(index, split)
      starts.add(first.state_key())
  assert len(starts) == 9  # two tasks never share a key
  if name != "sql":  # a sql spec needs a question of its own
    first.reset(0, "train")
    indexed = first.state_key()
    first.reset_spec(_same_world_spec(first, name))
    assert first.state_key() != indexed and first.state_key().startswith(f"{name}/spec/")


def _same_world_spec(env, name: str) -> dict:
  """A spec on train world 0 with that world's own target, so that only the task's identity differs."""
  targets = {"maze": lambda: {"cell": list(env._task.goal)}, "textcraft": lambda: {"item": env._task.goal},
             "wordle": lambda: {"word": env._answer},
             "tools": lambda: {"goals": [{"kind": "delete", "todo": env._world.todos[0]["title"]}]},
             "babyai": lambda: _babyai_any_target(env)}
  return {"env": name, "world": 0, "split": "train", "target": targets[name]()}


def _babyai_any_target(env) -> dict:
  cell = next(c for c in env._world.unwrapped.grid.grid if c is not None and c.type not in ("wall", "door"))
  return {"verb": "pick up", "object": {"type": cell.type, "color": cell.color}}


def test_maze_moving_back_returns_to_the_same_key():
  env = envs.make("maze")
  env.reset(0)
  start = env.state_key()
  assert start.endswith(f"|at={env._task.start[0]},{env._task.start[1]}")
  opening, back = next((a, b) for a, b in (("right", "left"), ("left", "right"), ("up", "down"), ("down", "up"))
                       if a in env.observation.rsplit("Open:", 1)[1])
  env.step(f"Action: move {opening}")
  moved = env.state_key()
  env.step(f"Action: move {back}")
  assert moved != start and env.state_key() == start
  walls = [d for d in ("up", "down", "left", "right") if d not in env.observation.rsplit("Open:", 1)[1]]
  env.step(f"Action: move {walls[0]}")  # a wall: the agent stays, and so does the key
  assert env.state_key() == start
  env.step("Action: dance")
  assert env.state_key() == start


def test_textcraft_equal_texts_in_different_states_get_different_keys():
  env = envs.make("textcraft")
  env.reset(0)
  world = textcraft._TASKS.get(0, "train")
  raws = sorted({item for recipe in world.recipes for item, _ in recipe.inputs if world.recipe_for(item) is None})
  start = env.state_key()
  first = env.step(f"Action: get 1 {raws[0]}")[0]
  after_one = env.state_key()
  second = env.step(f"Action: get 1 {raws[0]}")[0]
  after_two = env.state_key()
  assert first == second == f"Got 1 {raws[0]}"  # the same text ...
  assert len({start, after_one, after_two}) == 3  # ... from three different inventories
  # Actions that fail or only look leave the key unchanged.
  recipe = world.recipes[0]
  assert env.step(f"Action: {recipe.command()}")[0].startswith("Could not")
  env.step("Action: inventory")
  env.step("Action: get 1 unobtainium")
  assert env.state_key() == after_two
  # The same inventory reached in another order is the same state.
  if len(raws) > 1:
    env.reset(0)
    env.step(f"Action: get 1 {raws[0]}")
    env.step(f"Action: get 2 {raws[1]}")
    one_way = env.state_key()
    env.reset(0)
    env.step(f"Action: get 2 {raws[1]}")
    env.step(f"Action: get 1 {raws[0]}")
    assert env.state_key() == one_way


def _parts(key: str) -> dict[str, str]:
  return dict(part.split("=", 1) for part in key.split("|")[1:])


def test_babyai_keys_follow_position_direction_load_and_doors():
  env = envs.make("babyai")
  env.reset(0)
  start = env.state_key()
  env.step("Action: turn left")
  turned = env.state_key()
  env.step("Action: turn right")
  assert turned != start and env.state_key() == start
  env.step("Action: drop")  # refused: nothing carried
  assert env.state_key() == start
  # Picking up changes the load and the grid, not where the agent stands.
  index = next(i for i in range(60) if babyai.task_of(i, "train")[0] == "BabyAI-PutNextLocalS5N3-v0")
  env.reset(index)
  while env._world.unwrapped.carrying is None:
    before = _parts(env.state_key())
    env.step(env.expert_action())
  after = _parts(env.state_key())
  assert before["carry"] == "-" and after["carry"] != "-" and after["grid"] != before["grid"]
  assert after["at"] == before["at"]
  # Opening a door changes the grid, not where the agent stands or what it carries.
  index = next(i for i in range(60) if babyai.task_of(i, "train")[0] == "BabyAI-OpenDoorsOrderN2-v0")
  env.reset(index)
  while "toggle" not in env.expert_action().splitlines()[-1]:
    env.step(env.expert_action())
  before = _parts(env.state_key())
  env.step(env.expert_action())
  after = _parts(env.state_key())
  assert (after["at"], after["carry"]) == (before["at"], before["carry"]) and after["grid"] != before["grid"]


def test_sql_key_is_the_set_of_results_seen():
  env = envs.make("sql")
  env.reset(0)
  start = env.state_key()
  assert start.endswith("|seen=")
  env.step("Action: SELECT nothing FROM nowhere")  # an error shows no data
  env.step("Action: DELETE FROM students")  # a refusal neither
  assert env.state_key() == start
  env.step("Action: SELECT 1")
  one = env.state_key()
  env.step("Action: SELECT 1")  # the same result again: nothing new learned
  assert one != start and env.state_key() == one
  env.step("Action: SELECT 2")
  both = env.state_key()
  env.reset(0)
  env.step("Action: SELECT 2")
  env.step("Action: SELECT 1")
  assert both != one and env.state_key() == both


def test_tools_key_is_the_todo_list_and_the_goals_met():
  env = envs.make("tools")
  env.reset(0)
  start = env.state_key()
  cities = sorted({city for city, _ in env._world.weather})
  env.step("Action: list_todos")
  env.step(f'Action: get_weather\nAction Input: {{"city": "{cities[0]}", "day": "Monday"}}')
  env.step('Action: delete_todo\nAction Input: {"id": 999}')  # an error
  assert env.state_key() == start  # lookups and errors leave the world as it was
  todo = env._world.todos[0]
  env.step(f'Action: complete_todo\nAction Input: {{"id": {todo["id"]}}}')
  completed = env.state_key()
  assert completed != start
  env.step('Action: add_todo\nAction Input: {"title": "something new"}')
  added = env.state_key()
  assert added != completed
  assert _parts(start)["met"] == "0" * len(env._task.goals)


def test_wordle_key_is_the_guesses_in_any_order():
  env = envs.make("wordle")
  env.reset(0)
  start = env.state_key()
  env.step("Action: z z z z z")  # not a word: costs a round, not a guess
  assert env.state_key() == start
  env.step("Action: c r a t e")
  env.step("Action: l e m o n")
  one_way = env.state_key()
  env.reset(0)
  env.step("Action: l e m o n")
  env.step("Action: c r a t e")
  assert env.state_key() == one_way != start and one_way.endswith("|guesses=crate,lemon")
  env.reset(1)
  env.step("Action: l e m o n")
  env.step("Action: c r a t e")
  assert env.state_key() != one_way  # another word: another task
