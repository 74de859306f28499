"""The bfcl env: BFCL's multi-turn tasks, its checker's verdicts, hostile actions, the split and HTTP."""

import builtins
import itertools
import re

import pytest

from evolver import envs
from evolver.envs import bfcl
from tests.envs.helpers import ServerProcess, request

from bfcl_eval.eval_checker.multi_turn_eval import multi_turn_utils
from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

_RUN_IDS = itertools.count()


def bfcl_verdict(env) -> bool:
  """BFCL's own `multi_turn_checker` on the calls the env ran (the ground truth's own strings, safe to give it)."""
  name = f"evolver_bfcl_test_{next(_RUN_IDS)}"
  task = env.task
  try:
    result = multi_turn_checker(env.executed_steps, task.ground_truth, task.entry, task.category, name)
  finally:  # the checker keeps its instances as module globals named after the model
    for key in [key for key in vars(multi_turn_utils) if key.startswith(name)]:
      delattr(multi_turn_utils, key)
  return result["valid"]


def play(env, policy) -> tuple[str, float, dict]:
  done = False
  while not done:
    observation, reward, done, info = env.step(policy(env))
  return observation, reward, info


def test_expert_solves_every_held_out_task_and_bfcl_s_checker_agrees():
  env = envs.make("bfcl")
  assert env.num_tasks("eval") >= 50
  for index in range(env.num_tasks("eval")):
    first = env.reset(index, "eval")
    assert first.startswith("Functions you can call:\n- ") and "\n\nUser: " in first
    observation, reward, info = play(env, lambda e: e.expert_action())
    assert reward == 1.0 and info["success"], f"{env.task.id}: {observation}"
    assert bfcl_verdict(env) is True, env.task.id


def test_expert_turns_are_react_and_end_each_user_turn_with_a_reply():
  env = envs.make("bfcl")
  env.reset(0, "train")
  turn = env.expert_action()
  assert re.fullmatch(r"Thought: [^\n]+\nAction: \[\w+\(.*\)\]", turn, re.DOTALL), turn
  observation, reward, done, info = env.step(turn)
  assert observation.startswith("Results:\n") and reward == 0.0 and not done and info == {"success": False}
  reply = env.expert_action()
  assert reply == "Thought: The request is done.\nAction: Done."
  observation, _, _, _ = env.step(reply)
  assert observation.startswith("User: ") or observation.startswith("The conversation is over")


def _drop_last_calls(env):
  """The expert, except that it skips the calls of the last turn that has any."""
  last = max(turn for turn, calls in enumerate(env.task.ground_truth) if calls)
  if env._turn == last:  # pylint: disable=protected-access
    return "Thought: I am done.\nAction: Done."
  return env.expert_action()


def _drop_one_call(env):
  """The expert, with the last call of every multi-call step left out."""
  turn = env.expert_action()
  calls = bfcl.parse_calls(turn.split("Action: ", 1)[1]) if "Action: [" in turn else []
  if len(calls) > 1:
    return "Action: [" + ", ".join(call.text() for call in calls[:-1]) + "]"
  return turn


@pytest.mark.parametrize("policy", [_drop_last_calls, _drop_one_call, lambda env: "Action: Done."])
def test_failing_policies_get_reward_0_and_bfcl_s_checker_agrees(policy):
  env = envs.make("bfcl")
  verdicts = []
  for index in range(0, env.num_tasks("eval"), 8):
    env.reset(index, "eval")
    _, reward, info = play(env, policy)
    assert reward == float(info["success"])
    assert bfcl_verdict(env) == info["success"], env.task.id
    verdicts.append(info["success"])
  assert not any(verdicts) or policy is _drop_one_call
  assert verdicts.count(False) >= len(verdicts) // 2


def test_miss_func_reveals_held_back_functions_at_their_turn():
  env = envs.make("bfcl")
  index = next(i for i, task in enumerate(bfcl.tasks("eval")) if task.entry.get("missed_function"))
  first = env.reset(index, "eval")
  (turn, held), = env.task.entry["missed_function"].items()
  for name in held:
    assert f"\n- {name}(" not in first
  for _ in range(int(turn) * 3):
    observation, _, _, _ = env.step(env.expert_action())
    if observation.startswith("New functions you can call:"):
      break
  assert all(f"- {name}(" in observation for name in held)
  assert observation.endswith("User: I have updated some more functions you can choose from. What about now?")


_DANGEROUS = [
    "__import__('os').system('touch {marker}')", "[__import__('os').system('touch {marker}')]",
    "cd(folder=__import__('os').system('touch {marker}'))", "().__class__.__bases__[0].__subclasses__()",
    "cd.__globals__['os'].system('touch {marker}')", "getattr(cd, '__globals__')", "(lambda: 0)()",
    "[x for x in ()]", "[open('{marker}', 'w') for _ in 'a']", "cd(*['a'])", "cd(**{{'folder': 'a'}})",
    "cd(folder=ls())", "cd(folder=open('/etc/passwd').read())", "cd(folder='a' + 'b')", "cd(folder=f'{{1}}')",
    "cd(folder=x)", "cd(folder=(yield))", "cd(folder=[i for i in range(10**9)])", "power(base=2, exponent=10**9)",
    "exec(source='import os')", "eval(source='1+1')", "open(file='{marker}', mode='w')", "__import__(name='os')",
    "compile(source='1', filename='x', mode='eval')", "globals()", "breakpoint()", "exit()", "quit()",
    "_load_scenario(scenario={{}})", "__init__()", "[cd(folder='a')][0]", "cd(folder='a').x", "cd(folder='a')()",
    "cd(folder='a'); __import__('os')", "cd(folder='a')\n__import__('os').system('touch {marker}')",
    "print(x=1)", "setattr(obj=1, name='x', value=2)", "cd(folder=lambda: 1)", "cd(folder={{1, 2}} | {{3}})",
    "[cd(folder='a'), cd(folder=__builtins__)]",
]
_MALFORMED = [
    "[", "cd(", "cd(folder='a'", "[cd(folder='a')", "cd(folder=)", "cd(folder='a',,)", "[1, 2]", "['x']",
    "cd()()", "((((", "[" * 300, "cd(" * 300, "cd(folder=" + "[" * 300, "cd(folder='a' folder='b')",
    "cd(folder='a', folder='b')", "cd(1, 2, 3)", "cd('documents')", "[cd(folder='a'), 3]", "[,]", "[cd(folder='\\x')]",
    "cd(folder=\"unterminated)", "nope()", "rm_rf(path='/')", "kill()", "Popen(args=['ls'])", "\x00()", "é()",
    "cd(folder='a')" * 60, "[" + ", ".join(["ls()"] * 60) + "]", "mkdir(dir_name=None)", "cd(folder=b'x')",
    "cd(folder=1j)", "cd(folder=...)", "cd(folder={{1: 2}})", "ls(a='yes')", "cat(file_name=-1)",
]
_HUGE = [
    "echo(content='" + "x" * 20_000 + "', file_name='a.txt')",
    "echo(content='" + "x" * 15_000 + "', file_name='a.txt')",
    "power(base=10, exponent=" + "9" * 90 + ")", "power(base=" + "9" * 99 + ", exponent=" + "9" * 99 + ")",
    "logarithm(value=10, base=2, precision=" + "9" * 50 + ")", "square_root(number=2, precision=" + "9" * 50 + ")",
    "round_number(number=5, decimal_places=-" + "9" * 60 + ")", "mean(numbers=[" + "1," * 5_000 + "])",
    "cd(folder=" + "9" * 5_000 + ")", "sort(file_name='" + "a" * 10_000 + "')",
    "cd(folder=" + "[" * 100 + "]" * 100 + ")",
    "tail(file_name='a.txt', lines=" + "9" * 99 + ")", "tail(file_name='a.txt', lines=-" + "9" * 99 + ")",
    "mkdir(dir_name='" + "d" * 15_000 + "')", "standard_deviation(numbers=[" + "1e308," * 2_000 + "])",
]
_MESSAGES = ["", " ", "Done.", "I cannot do that.", "Sorry (no)", "lambda: 0", "yes", "[]", "Action:", "\n\n"]


def hostile_actions(marker: str) -> list[str]:
  bare = [text.format(marker=marker) for text in _DANGEROUS + _MALFORMED] + _HUGE + _MESSAGES
  return bare + [f"Thought: try\nAction: {text}" for text in bare] + [f"Action: ```python\n{text}\n```"
                                                                         for text in bare[:40]]


def test_200_hostile_actions_never_raise_and_say_what_was_wrong(tmp_path, monkeypatch):
  marker = str(tmp_path / "touched")
  actions = hostile_actions(marker)
  assert len(actions) >= 200

  def refuse(*args, **kwargs):
    raise AssertionError("eval/exec called")

  monkeypatch.setattr(builtins, "eval", refuse)
  monkeypatch.setattr(builtins, "exec", refuse)
  env = envs.make("bfcl")
  # Task 0 has the file system; a task with MathAPI gets the math ones too.
  math_index = next(i for i, task in enumerate(bfcl.tasks("train")) if "MathAPI" in task.entry["involved_classes"])
  for position, action in enumerate(actions):
    if position % 2 == 0 or env.done:
      env.reset(math_index if position % 4 == 0 else 0, "train")
    observation, reward, done, info = env.step(action)
    assert isinstance(observation, str) and observation, action[:80]
    assert 0.0 <= reward <= 1.0 and isinstance(done, bool) and set(info) == {"success"}
    text = bfcl.base.action_text(action)
    if bfcl.looks_like_calls(text) and text.strip("`\n ").removeprefix("python").strip() != "[]":  # [] ends the turn
      assert observation.startswith(("Invalid call: ", "Results:\n")), (action[:80], observation[:200])
  assert not (tmp_path / "touched").exists()
  for text in _DANGEROUS[:6]:
    env.reset(0, "train")
    observation, _, _, _ = env.step(f"Action: {text.format(marker=marker)}")
    assert observation.startswith("Invalid call: "), observation


def test_unbounded_math_is_refused_and_results_match_bfcl_s_rendering():
  env = envs.make("bfcl")
  index = next(i for i, task in enumerate(bfcl.tasks("train")) if "MathAPI" in task.entry["involved_classes"])
  env.reset(index, "train")
  observation, _, _, _ = env.step("Action: [power(base=10, exponent=" + "9" * 90 + "), add(a=1, b=2), nope()]")
  lines = observation.splitlines()
  assert lines[1].endswith("-> Error during execution: the result is too large")
  assert lines[2].endswith('-> {"result": 3}')
  assert "-> Error during execution: function 'nope' is not available" in lines[3]
  observation, _, _, _ = env.step("Action: mean(numbers='x')")
  assert "Error during execution" in observation or "error" in observation


def test_split_is_deterministic_disjoint_by_scenario_and_documented_sizes():
  env = envs.make("bfcl")
  assert (env.num_tasks("train"), env.num_tasks("eval")) == (600, 200)
  keys = {split: [env.task_key(i, split) for i in range(env.num_tasks(split))] for split in ("train", "eval")}
  assert not set(keys["train"]) & set(keys["eval"]) and len(set(keys["train"])) == 600
  scenarios = {split: {task.scenario for task in bfcl.tasks(split)} for split in ("train", "eval")}
  assert not scenarios["train"] & scenarios["eval"] and len(scenarios["eval"]) == 50
  for split in ("train", "eval"):
    for category in bfcl.CATEGORIES:
      assert sum(task.category == category for task in bfcl.tasks(split)) == len(scenarios[split])
  assert all(bfcl.scenario_split(task.scenario) == "eval" for task in bfcl.tasks("eval"))
  assert keys["eval"][:3] == [f"multi_turn_base_{s}" for s in sorted(scenarios["eval"])[:3]]
  assert env.version == f"bfcl-eval-{bfcl.BFCL_EVAL_VERSION}" == "bfcl-eval-2026.3.23"


def test_state_keys_and_measures_follow_the_episode():
  env = envs.make("bfcl")
  env.reset(3, "eval")
  start_key, start = env.state_key(), env.measures()
  assert start_key.startswith("bfcl/eval/3|turn=0|") and start["progress"] == 0.0
  env.step(env.expert_action())
  assert env.state_key() != start_key and env.measures()["cost_to_go"] == start["cost_to_go"] - 1
  other = envs.make("bfcl")
  other.reset(3, "eval")
  other.step(other.expert_action())
  assert other.state_key() == env.state_key()
  moved, staying = envs.make("bfcl"), envs.make("bfcl")
  for played in (moved, staying):
    played.reset(0, "train")
  moved.step("Action: cd(folder='document')")
  moved.step("Action: cd(folder='..')")
  staying.step("Action: cd(folder='document')")
  staying.step("Action: pwd()")
  assert moved.state_key() != staying.state_key()  # the working directory differs


def test_the_env_plays_over_http_like_in_process():
  server = ServerProcess("bfcl")
  try:
    status, info = request(server.port, "GET", "/info")
    assert status == 200 and info["name"] == "bfcl" and info["version"] == "bfcl-eval-2026.3.23"
    assert info["num_tasks"] == {"train": 600, "eval": 200}
    status, created = request(server.port, "POST", "/create", {})
    session = created["id"]
    local = envs.make("bfcl")
    status, reset = request(server.port, "POST", "/reset", {"id": session, "data_idx": 5, "split": "eval"})
    assert status == 200 and reset["observation"] == local.reset(5, "eval")
    done = False
    while not done:
      action = local.expert_action()
      expected = local.step(action)
      status, stepped = request(server.port, "POST", "/step", {"id": session, "action": action})
      assert status == 200
      assert (stepped["observation"], stepped["reward"], stepped["done"], stepped["info"]) == expected
      done = expected[2]
    assert stepped["reward"] == 1.0 and stepped["info"]["success"]
  finally:
    server.kill()


def test_expert_trajectories_record_the_bfcl_eval_version():
  from evolver.data import expert  # pylint: disable=import-outside-toplevel
  trajectory = expert.expert_trajectory("bfcl", 2, "train")
  assert trajectory.success and trajectory.reward == 1.0 and trajectory.env_version == "bfcl-eval-2026.3.23"
  assert trajectory.messages[2].content.startswith("Functions you can call:")


def test_expert_datasets_take_bfcl_by_name_and_all_leaves_benchmarks_out(tmp_path):
  from evolver.data import tfds_builders  # pylint: disable=import-outside-toplevel
  assert "bfcl" not in tfds_builders.expert_config("all", 0, 8).env_names
  source = tfds_builders.load_expert_source("bfcl", 0, 2, str(tmp_path))
  assert tfds_builders.expert_config("bfcl", 0, 2).name == "bfcl_2"
  assert [(t.env, t.env_version, t.success) for t in source] == [("bfcl", bfcl.BfclEnv.version, True)] * 2
  assert source[0].messages[2].content.startswith("Functions you can call:")

