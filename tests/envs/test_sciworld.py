"""The sciworld env: ScienceWorld's gold paths against its own scorer, hostile actions, the split and threads."""

import collections
import concurrent.futures
import re
import shutil

import pytest

if shutil.which("java") is None:
  pytest.skip("the sciworld env runs ScienceWorld's simulator on Java, and no `java` is installed here",
              allow_module_level=True)

from evolver import envs  # pylint: disable=wrong-import-position
from evolver.envs import sciworld  # pylint: disable=wrong-import-position


@pytest.fixture(scope="module")
def env():
  made = envs.make("sciworld")
  yield made
  made.close()


def play(env, policy, limit: int = 1000) -> tuple[str, float, bool, dict]:
  done, steps = False, 0
  while not done and steps < limit:
    observation, reward, done, info = env.step(policy(env))
    steps += 1
  return observation, reward, done, info


def first_index(split: str, task_id: str) -> int:
  return next(i for i, task in enumerate(sciworld.tasks(split)) if task.id == task_id)


def spread_sample(split: str) -> list[int]:
  """One index of `split` per task type: its first variation for the even-numbered types, its last for the odd."""
  by_task = collections.defaultdict(list)
  for index, task in enumerate(sciworld.tasks(split)):
    by_task[task.id].append(index)
  return sorted(group[0] if rank % 2 == 0 else group[-1] for rank, group in enumerate(by_task.values()))


@pytest.mark.slow
def test_expert_solves_a_spread_of_held_out_tasks_and_scienceworld_s_score_agrees(env):
  sample = spread_sample("eval")
  task_types = {task.id for task in sciworld.tasks("eval")}
  assert len(sample) == len(task_types) >= 20 and {sciworld.tasks("eval")[i].id for i in sample} == task_types
  for index in sample:
    first = env.reset(index, "eval")
    task = env.task
    assert first.startswith("Your task is to ") and re.search(r"\nThis (room|outside location) is called the ", first), task
    observation, reward, done, info = play(env, lambda e: e.expert_action())
    assert done and reward == 1.0 and info["success"], (task, observation, env.goal_progress())
    assert env.simulator_score() == 100 == round(100 * reward), task  # ScienceWorld's own scorer


def test_expert_turns_are_react_with_the_gold_action_and_a_thought_that_does_not_leak(env):
  index = first_index("train", "4-1")
  env.reset(index, "train")
  gold = env.gold
  assert gold and env.measures() == {"cost_to_go": len(gold), "progress": 0.0}
  for position, action in enumerate(gold[:4]):
    turn = env.expert_action()
    thought, played = re.fullmatch(r"Thought: ([^\n]+)\nAction: ([^\n]+)", turn).groups()
    assert played == action and action not in thought
    env.step(turn)
    assert env.measures()["cost_to_go"] == len(gold) - position - 1
  assert gold[4] != "inventory"
  env.step("Action: inventory")  # an action off the gold path leaves the pointer where it was
  assert env.measures()["cost_to_go"] == len(gold) - 4


_HOSTILE = [
    "", " ", "Action:", "\n\n", "xyzzy", "fly to the moon", "go to", "go to nowhere", "pick up", "focus on",
    "focus", "open", "use", "connect", "wait0", "wait-1", "wait99999999999999999999", "1", "0", "-1", "99",
    "4294967296", "1e9", "0.5", "NaN", "None", "null", "true", "[]", "{}", "()", "look around;", "look around && ls",
    "look around | rm -rf /", "$(rm -rf /)", "`rm -rf /`", "__import__('os').system('rm -rf /')",
    "eval('1+1')", "exec('import os')", "import os", "os.system('ls')", "lambda: 0", "print(1)",
    "open('/etc/passwd').read()", "go to kitchen\nlook around", "look around\r", "look\taround", "\x00", "look\x00",
    "\x1b[31mred", "\x7f", "\u200b", "\ufeffinventory", "é", "ü" * 50, "日本語", "🧪" * 30, "\ud800",
    "go to " + "kitchen " * 40, "x" * 301, "x" * 100_000, "a " * 150, "%s%s%s%n", "{0}{1}", "<script>alert(1)</script>",
    "' OR 1=1 --", "\\", "\\n", "'", '"', "Action: Action: look around", "Thought: hm", "open door", "open door\n7",
    "focus on focus on", "pick up pick up", "move to to", "use thermometer on", "connect to", "pour into",
]


def hostile_actions() -> list[str]:
  bare = list(_HOSTILE)
  return bare + [f"Thought: try\nAction: {text}" for text in bare] + [f"Action: `{text}`" for text in bare]


def test_200_hostile_actions_never_raise_and_the_expert_still_solves_the_task(env):
  actions = hostile_actions()
  assert len(actions) >= 200
  index = first_index("train", "4-1")
  chunk = 25
  for start in range(0, len(actions), chunk):
    env.reset(index, "train")
    for action in actions[start:start + chunk]:
      observation, reward, done, info = env.step(action)
      assert isinstance(observation, str) and observation, repr(action[:80])
      assert 0.0 <= reward <= 1.0 and isinstance(done, bool) and set(info) == {"success"}
      text = sciworld.base.action_text(action)
      if len(text) > sciworld.MAX_ACTION_CHARS:
        assert observation.startswith("The action is "), observation
      elif any(char in text for char in "\n\r\t\x00\x1b\x7f\ud800"):
        assert observation.startswith("The action has a line break or another control character"), observation
      if done:
        break
    if not done:
      observation, reward, done, info = play(env, lambda e: e.expert_action())
      assert reward == 1.0 and info["success"], (start, observation)
    else:
      assert not info["success"] and reward == 0.0


def test_ambiguous_actions_get_scienceworld_s_numbered_list_and_a_number_picks(env):
  for index in (i for i, task in enumerate(sciworld.tasks("train")) if task.id == "1-1"):
    if "This room is called the hallway." in env.reset(index, "train"):
      break
  else:
    pytest.fail("no boil variation starts in the hallway")
  key, moves = env.state_key(), env._moves  # pylint: disable=protected-access
  observation, reward, done, _ = env.step("Action: open door")
  assert observation.startswith("Ambiguous request: Please enter the number") and not done and reward == 0.0
  assert env._moves == moves and env.state_key() != key  # pylint: disable=protected-access
  choices = dict(re.findall(r"\n(\d+):\topen door between ([^\n]+)", observation))
  number = next(n for n, doors in choices.items() if "kitchen" in doors)
  assert env.step(f"Action: {number}")[0] == "The door is now open."
  env.step("Action: open door")
  observation, _, done, _ = env.step("Action: 99")  # out of range: an unknown action, as in ScienceWorld
  assert observation.startswith("Unknown action.") and not done


def test_a_wrong_focus_ends_the_episode_with_reward_0(env):
  env.reset(first_index("eval", "1-1"), "eval")
  observation, reward, done, info = env.step("Thought: the air it is.\nAction: focus on air")
  assert observation == "You focus on the air."
  assert done and reward == 0.0 and info == {"success": False} and env.simulator_score() < 0
  assert env.step("Action: look around")[0].startswith("The episode is over")


def test_split_is_scienceworld_s_train_and_test_variations_deterministic_and_disjoint(env):
  assert "sciworld" in envs.benchmark_names() and "sciworld" not in envs.names()
  assert isinstance(envs.make("sciworld"), sciworld.SciWorldEnv)
  excluded = {split: sum(task.variation in sciworld.EXCLUDED.get(task.id, ()) for task, s in sciworld.all_games()
                         if s == split) for split in ("train", "eval")}
  assert (env.num_tasks("train") + excluded["train"], env.num_tasks("eval") + excluded["eval"]) == (2312, 1171)
  assert sum(excluded.values()) == sum(len(variations) for variations in sciworld.EXCLUDED.values())
  keys = {split: [env.task_key(i, split) for i in range(env.num_tasks(split))] for split in ("train", "eval")}
  assert not set(keys["train"]) & set(keys["eval"]) and all(len(set(k)) == len(k) for k in keys.values())
  assert keys["train"][:2] == ["1-1:boil:0", "1-2:melt:0"]
  order = list(sciworld.ID2TASK)
  for split in ("train", "eval"):
    listed = sciworld.tasks(split)
    kinds = set(order) - sciworld.AGENTGYM_EXCEPTIONS
    assert {t.id for t in listed} == kinds and {t.id for t in listed[:len(kinds)]} == kinds  # tasks take turns
    rank = {t: sum(other.id == t.id and other.variation < t.variation for other in listed) for t in listed}
    assert [(rank[t], order.index(t.id)) for t in listed] == sorted((rank[t], order.index(t.id)) for t in listed)
  expected = [task for task, split in sciworld.all_games() if split == "eval"
              and task.variation not in sciworld.EXCLUDED.get(task.id, ())]
  assert sorted(sciworld.tasks("eval"), key=str) == sorted(expected, key=str) and len(expected) == env.num_tasks("eval")
  assert env.version == "scienceworld-1.2.3" and env.instruction() == envs.adapters.SciWorldAdapter.instruction


def test_excluded_variations_still_fail_on_their_gold_path():
  # One of each kind (`sciworld.gold_outcome` over all of EXCLUDED takes ~90 s): past the step limit, a wrong focus.
  for task_id, variation in (("1-1", 22), ("2-2", 211)):
    assert variation in sciworld.EXCLUDED[task_id]
    task = sciworld.Task(task_id, sciworld.ID2TASK[task_id], variation)
    points, moves = sciworld.gold_outcome(task)
    assert points < 100, f"{task.key} reaches {points} in {moves} moves: drop it from EXCLUDED"
    assert (moves > sciworld.STEP_LIMIT) if task_id == "1-1" else (points < 0), (task.key, points, moves)


def _episode(index: int) -> list:
  """An episode of eval task `index` in a fresh env: the expert, with waits between (animals wander meanwhile)."""
  env = envs.make("sciworld")
  trace = [env.reset(index, "eval"), env.state_key()]
  for turn in range(30):
    result = env.step("Action: wait1" if turn % 3 == 2 else env.expert_action())
    trace += [result, env.state_key(), env.measures()]
    if result[2]:
      break
  env.close()
  return trace


def test_envs_stepped_from_threads_play_as_they_do_alone():
  indices = [first_index("eval", task_id) for task_id in ("4-4", "4-1", "1-1", "6-1", "3-3", "2-1")]
  alone = [_episode(index) for index in indices]
  with concurrent.futures.ThreadPoolExecutor(len(indices)) as pool:
    together = list(pool.map(_episode, indices))
  for index, expected, got in zip(indices, alone, together):
    assert got == expected, sciworld.tasks("eval")[index]


def test_state_keys_follow_the_world_not_the_text(env):
  index = first_index("eval", "4-1")
  env.reset(index, "eval")
  start = env.state_key()
  assert re.fullmatch(rf"sciworld/eval/{index}\|moves=0\|score=0\|world=[0-9a-f]{{16}}", start)
  env.step(env.expert_action())
  after = env.state_key()
  other = envs.make("sciworld")
  other.reset(index, "eval")
  assert other.state_key() == start
  other.step(other.expert_action())
  assert other.state_key() == after != start
  other.close()
