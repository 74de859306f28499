"""bfcl: the Berkeley Function Calling Leaderboard's multi-turn tasks, played and scored offline.

Task source: the `bfcl-eval` wheel (installed with `--no-deps`; its version is in `BfclEnv.version` and so in
every result), categories `BFCL_v4_multi_turn_{base, miss_func, miss_param, long_context}`, 200 tasks each.
A task is a conversation of user turns over a few stateful API backends (a file system, messaging, posting,
tickets, trading, travel booking, vehicle control, math), loaded from the task's initial configuration as
BFCL's own executor loads them (`long_context` loads the long-context variants).

Observation: the functions the agent may call, as compact signatures with their descriptions, and the first user
turn; later observations carry the calls' results and the next user turns. `miss_func` tasks hold some functions
back until a given turn, as BFCL does: that turn's user message is BFCL's "I have updated some more functions
you can choose from. What about now?" with the new functions' docs.

Action (the text after the last `Action:`): one or more calls in BFCL's Python-call syntax with keyword
arguments, `cd(folder='documents')` or `[ls(a=True), cat(file_name='a.txt')]`. The text is read with `ast`,
never evaluated: only calls of plain function names with literal keyword arguments (`ast.literal_eval` on each)
are accepted, at most `_MAX_CALLS` calls in `_MAX_ACTION_CHARS` characters; anything else that starts like a
call (`[`, `(`, `name(` or `name[`) gets an observation saying what was wrong, and the turn goes on. The calls
run in order on the task's backend instances, dispatched by name among the functions of the task's backend
classes, all of which are documented (BFCL's own executor `eval`s them; as there, a function that `miss_func`
holds back is hidden from the agent but not refused, and one ground truth calls such a function early). Each
result is rendered as BFCL renders it (dicts as JSON, failures as "Error during execution: ..."); argument
values that would make a backend compute without bound (huge powers, precisions or roundings) get such an
error instead of running; results longer than `_MAX_RESULT_CHARS` characters are cut in the observation only.

Turn ending: as in BFCL, a reply with no call ends the user turn: plain text for the user (text that does not
start like a call), an empty action or `[]`. The next user turn follows, or the episode ends after the last one.
More than BFCL's `MAXIMUM_STEP_LIMIT` (20) steps of calls in one turn force-quits the episode, a failure, as in
BFCL.

Scoring: BFCL's own multi-turn checks (`bfcl_eval`'s `state_checker`, `response_checker` and empty-turn check)
at the end of each user turn, against the ground truth's calls run on their own instances: a turn whose ground
truth has calls needs at least one step of calls, the backends' public state equal to the ground truth's, and
every ground-truth result among all the results of the agent's calls so far. The reward is 0 until the last
turn ends, then 1 if every turn passed, else 0. The scripted expert plays the ground truth: each turn's calls in
one step (positional arguments written as keywords), then a reply that ends the turn; on a turn whose ground
truth is empty (a missing function or parameter) it only replies.

Split: by scenario, not by task: BFCL's four categories share their 200 scenarios (task `i` of each category
is scenario `i`), so scenario `i` and its four tasks are held out (`eval`) iff `crc32("bfcl-scenario:<i>") % 4 ==
0` (`base.split_of`), which puts 50 scenarios (200 tasks) in `eval` and 150 (600 tasks) in `train`. Within a
split, tasks are ordered by category (base, miss_func, miss_param, long_context), then by scenario.

Left out: BFCL's memory and web-search categories (their backends need faiss, sentence-transformers and a search
API). The env takes no spec tasks and opens no explorations (the tasks are BFCL's, fixed).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import decimal
import importlib
import importlib.metadata
import inspect
import json
import pathlib
import random
import re
import threading
from typing import Any

from evolver.envs import base

try:
  import bfcl_eval
  import mpmath
  from bfcl_eval.constants.default_prompts import (DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC,
                                                   MAXIMUM_STEP_LIMIT)
  from bfcl_eval.constants.executable_backend_config import (CLASS_FILE_PATH_MAPPING,
                                                             MULTI_TURN_FUNC_DOC_FILE_MAPPING, STATELESS_CLASSES)
  from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import response_checker, state_checker
  from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import is_empty_execute_response
except ImportError as error:  # pragma: no cover - depends on the install
  raise ImportError("the bfcl env needs bfcl-eval and mpmath: pip install mpmath && pip install --no-deps "
                    f"bfcl-eval==2026.3.23 (launch/setup_venv.sh does both); {error}") from error

BFCL_EVAL_VERSION = importlib.metadata.version("bfcl-eval")
CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
EVAL_EVERY = 4  # scenario i is held out iff crc32("bfcl-scenario:<i>") % EVAL_EVERY == 0

_MAX_ACTION_CHARS = 16_000
_MAX_CALLS = 50
_MAX_RESULT_CHARS = 8_000
_MAX_INT = 10**100
_MAX_PRECISION = 1_000  # digits, for MathAPI's logarithm and square_root
_MAX_POWER_BITS = 1_000_000
_CALL_START = re.compile(r"[\[(]|[A-Za-z_][\w.]*[(\[]")
_DATA = pathlib.Path(bfcl_eval.__file__).parent / "data"
_BACKEND_LOCK = threading.Lock()  # MathAPI sets process-wide precisions (mpmath, decimal)


@dataclasses.dataclass(frozen=True)
class Task:
  """One BFCL multi-turn task.

  Attributes:
    id: BFCL's id, e.g. "multi_turn_miss_func_12".
    category: one of CATEGORIES.
    scenario: the scenario index shared by the four categories.
    entry: BFCL's test entry (question, initial_config, involved_classes, missed_function names, ...).
    ground_truth: per user turn, BFCL's ground-truth calls as Python-call strings.
  """
  id: str
  category: str
  scenario: int
  entry: dict[str, Any]
  ground_truth: list[list[str]]

  @property
  def long_context(self) -> bool:
    return self.category == "long_context"


def _read_lines(path: pathlib.Path) -> list[dict[str, Any]]:
  with open(path, encoding="utf-8") as file:
    return [json.loads(line) for line in file if line.strip()]


_LOCK = threading.Lock()
_TASKS: dict[str, list[Task]] = {}
_DOCS: dict[str, list[dict[str, Any]]] = {}


def scenario_split(scenario: int) -> str:
  """The split of a scenario and of its four tasks."""
  return base.split_of(f"bfcl-scenario:{scenario}", EVAL_EVERY)


def tasks(split: str) -> list[Task]:
  """The tasks of `split`, by category then scenario (loaded once per process)."""
  base.check_split(split)
  with _LOCK:
    if not _TASKS:
      found: dict[str, list[Task]] = {name: [] for name in base.SPLITS}
      for category in CATEGORIES:
        entries = _read_lines(_DATA / f"BFCL_v4_multi_turn_{category}.json")
        answers = _read_lines(_DATA / "possible_answer" / f"BFCL_v4_multi_turn_{category}.json")
        for entry, answer in zip(entries, answers, strict=True):
          if entry["id"] != answer["id"] or len(entry["question"]) != len(answer["ground_truth"]):
            raise RuntimeError(f"bfcl-eval {BFCL_EVAL_VERSION}: {entry['id']} does not match its ground truth")
          scenario = int(entry["id"].rsplit("_", 1)[1])
          found[scenario_split(scenario)].append(Task(entry["id"], category, scenario, entry, answer["ground_truth"]))
      _TASKS.update(found)
  return _TASKS[split]


def function_docs(class_name: str) -> list[dict[str, Any]]:
  """BFCL's function docs of one backend class (JSON schema per function)."""
  with _LOCK:
    if class_name not in _DOCS:
      _DOCS[class_name] = _read_lines(_DATA / "multi_turn_func_doc" / MULTI_TURN_FUNC_DOC_FILE_MAPPING[class_name])
  return _DOCS[class_name]


def _describe(doc: dict[str, Any]) -> str:
  """One function as `- name(arg: type, opt: type = optional): description` and its arguments' descriptions."""
  parameters = doc["parameters"]
  required = set(parameters.get("required", ()))
  signature, lines = [], []
  for name, schema in parameters.get("properties", {}).items():
    signature.append(f"{name}: {schema.get('type', 'any')}" + ("" if name in required else " = optional"))
    if schema.get("description"):
      lines.append(f"    {name}: {schema['description'].strip()}")
  description = doc["description"].split("Tool description: ", 1)[-1].strip()
  return "\n".join([f"- {doc['name']}({', '.join(signature)}): {description}", *lines])


def render_docs(docs: list[dict[str, Any]]) -> str:
  """Function docs as the agent reads them."""
  return "\n".join(_describe(doc) for doc in docs)


# ----------------------------------------------------------------------------------------------------------
# Reading calls from text without evaluating it.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
  name: str
  kwargs: dict[str, Any]

  def text(self) -> str:
    """The call in BFCL's decoded form, `name(k=repr(v), ...)`."""
    return f"{self.name}({', '.join(f'{key}={value!r}' for key, value in self.kwargs.items())})"


class CallSyntaxError(ValueError):
  """An action that starts like a call but is not one the env accepts; the message says why."""


def looks_like_calls(action: str) -> bool:
  """Whether an action is meant as calls (starts with `[`, `(`, `name(` or `name[`), not as a reply to the user."""
  return _CALL_START.match(_strip_fence(action)) is not None


def _strip_fence(action: str) -> str:
  text = action.strip("`\n\r\t ")
  if text.startswith("python\n"):
    text = text[len("python\n"):].strip()
  return text


def _check_value(value: Any, depth: int = 0) -> None:
  if depth > 20:
    raise CallSyntaxError("an argument is nested too deeply")
  if value is Ellipsis:
    raise CallSyntaxError("`...` is not a value")
  if isinstance(value, int) and not isinstance(value, bool) and abs(value) > _MAX_INT:
    raise CallSyntaxError("an integer argument is too large")
  if isinstance(value, (list, tuple, set, frozenset)):
    for item in value:
      _check_value(item, depth + 1)
  elif isinstance(value, dict):
    for key, item in value.items():
      _check_value(key, depth + 1)
      _check_value(item, depth + 1)


def parse_calls(action: str, positional: bool = False) -> list[Call]:
  """The calls of an action, `f(a=1)`, `f(a=1), g()` or `[f(a=1), g()]` (an empty list: no call).

  Args:
    action: the text after `Action:`.
    positional: also accept positional arguments, returned under the keys "0", "1", ... (ground truth only).

  Raises:
    CallSyntaxError: the text is not calls of plain function names with literal keyword arguments, or it is too
      long; the message says what is wrong.
  """
  text = _strip_fence(action)
  if len(text) > _MAX_ACTION_CHARS:
    raise CallSyntaxError(f"the action is {len(text)} characters long; at most {_MAX_ACTION_CHARS} are read")
  if not text.startswith("["):
    text = "[" + text
  if not text.endswith("]"):
    text = text + "]"
  try:
    tree = ast.parse(text, mode="eval")
  except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
    raise CallSyntaxError(f"not valid call syntax ({error.__class__.__name__}: {str(error)[:120]})") from None
  if not isinstance(tree.body, ast.List):
    raise CallSyntaxError("write the calls as a list, [f(a=1), g(b='x')]")
  if not tree.body.elts and re.sub(r"\s", "", _strip_fence(action)) != "[]":
    raise CallSyntaxError("no call found")
  if len(tree.body.elts) > _MAX_CALLS:
    raise CallSyntaxError(f"{len(tree.body.elts)} calls in one action; at most {_MAX_CALLS}")
  calls = []
  for node in tree.body.elts:
    if not isinstance(node, ast.Call):
      raise CallSyntaxError(f"{ast.unparse(node)[:60]!r} is not a function call")
    if not isinstance(node.func, ast.Name):
      raise CallSyntaxError(f"{ast.unparse(node.func)[:60]!r} is not a plain function name (no attributes, "
                            "subscripts or calls)")
    kwargs: dict[str, Any] = {}
    for position, argument in enumerate(node.args):
      if not positional or isinstance(argument, ast.Starred):
        raise CallSyntaxError(f"{node.func.id}: pass arguments by keyword, as in {node.func.id}(name=value)")
      kwargs[str(position)] = _literal(node.func.id, str(position), argument)
    for keyword in node.keywords:
      if keyword.arg is None:
        raise CallSyntaxError(f"{node.func.id}: no **arguments; pass each argument by keyword")
      kwargs[keyword.arg] = _literal(node.func.id, keyword.arg, keyword.value)
    calls.append(Call(node.func.id, kwargs))
  return calls


def _literal(function: str, name: str, node: ast.AST) -> Any:
  try:
    value = ast.literal_eval(node)
  except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
    raise CallSyntaxError(f"{function}: argument {name!r} is not a literal value (strings, numbers, booleans, "
                          "None, lists, tuples and dicts of them)") from None
  _check_value(value)
  return value


# ----------------------------------------------------------------------------------------------------------
# The backends.
# ----------------------------------------------------------------------------------------------------------


def make_instances(task: Task) -> dict[str, Any]:
  """Fresh backend instances of a task, loaded from a deep copy of its initial configuration as BFCL loads them."""
  instances = {}
  config = task.entry.get("initial_config", {})
  for class_name in task.entry["involved_classes"]:
    module = importlib.import_module(CLASS_FILE_PATH_MAPPING[class_name])
    instance = getattr(module, class_name)()
    if class_name not in STATELESS_CLASSES:
      instance._load_scenario(copy.deepcopy(config.get(class_name, {})), long_context=task.long_context)
    instances[class_name] = instance
  return instances


def _unbounded(class_name: str, name: str, kwargs: dict[str, Any]) -> str | None:
  """Why a call would make a backend compute without bound, or None."""
  if class_name != "MathAPI":
    return None
  ints = {key: value for key, value in kwargs.items() if isinstance(value, int) and not isinstance(value, bool)}
  if name == "power" and "base" in ints and ints.get("exponent", 0) > 0 and abs(ints["base"]) > 1:
    if ints["exponent"] * abs(ints["base"]).bit_length() > _MAX_POWER_BITS:
      return "the result is too large"
  if name in ("logarithm", "square_root") and abs(ints.get("precision", 0)) > _MAX_PRECISION:
    return f"precision must be at most {_MAX_PRECISION}"
  if name == "round_number" and abs(ints.get("decimal_places", 0)) > _MAX_PRECISION:
    return f"decimal_places must be at most {_MAX_PRECISION} in magnitude"
  return None


def _canonical(value: Any) -> Any:
  """A JSON stand-in for a backend value that JSON lacks: sets sorted (their order varies by process), the rest
  by their repr (the backends' objects print their contents)."""
  if isinstance(value, (set, frozenset)):
    return sorted(repr(item) for item in value)
  return repr(value)


def _format_result(result: Any) -> str:
  """A call's result as BFCL's executor renders it."""
  if type(result) == str:  # noqa: E721 - BFCL's own test; str subclasses go through str()
    return result
  if type(result) == dict:  # noqa: E721
    try:
      return json.dumps(result)
    except Exception:  # pylint: disable=broad-except
      return str(result)
  return str(result)


def execute(calls: list[Call], instances: dict[str, Any], available: dict[str, str]) -> list[str]:
  """Runs calls on the instances; `available` maps each callable function name to its class. Never raises."""
  results = []
  with _BACKEND_LOCK:
    dps, precision = mpmath.mp.dps, decimal.getcontext().prec
    try:
      for call in calls:
        class_name = available.get(call.name)
        if class_name is None:
          results.append(f"Error during execution: function {call.name!r} is not available; call only the "
                         "functions listed")
          continue
        problem = _unbounded(class_name, call.name, call.kwargs)
        if problem is not None:
          results.append(f"Error during execution: {problem}")
          continue
        try:
          results.append(_format_result(getattr(instances[class_name], call.name)(**call.kwargs)))
        except Exception as error:  # pylint: disable=broad-except
          results.append(f"Error during execution: {error}")
    finally:
      mpmath.mp.dps, decimal.getcontext().prec = dps, precision
  return results


def _keyword_calls(task: Task, turn: int, instances: dict[str, Any]) -> list[Call]:
  """The ground truth's calls of a turn, with positional arguments bound to their keyword names."""
  owner = {doc["name"]: name for name in task.entry["involved_classes"] for doc in function_docs(name)}
  calls = []
  for text in task.ground_truth[turn]:
    for call in parse_calls(text, positional=True):
      method = getattr(instances[owner[call.name]], call.name)
      args = [call.kwargs[key] for key in call.kwargs if key.isdigit()]
      kwargs = {key: value for key, value in call.kwargs.items() if not key.isdigit()}
      bound = inspect.signature(method).bind(*args, **kwargs)
      calls.append(Call(call.name, dict(bound.arguments)))
  return calls


# ----------------------------------------------------------------------------------------------------------
# The env.
# ----------------------------------------------------------------------------------------------------------

_INSTRUCTION = """\
You are an assistant that serves a user by calling functions. Each task lists the functions you may call and \
then gives the user's requests, one turn at a time.

Each reply has a short thought and an action:
Thought: <your reasoning>
Action: <calls, or a reply to the user>

Calls use Python call syntax with keyword arguments and literal values, one or several in a list:
Action: [cd(folder='documents'), ls(a=True)]
You see each call's result and may call again. When the request is done, or cannot be done with the functions \
or the details you have, reply to the user in plain words without any call; that ends the turn and the next \
request follows.

Example:
Thought: The user wants the file listing of the documents folder.
Action: [cd(folder='documents'), ls()]"""

_END_TURN_TEXT = {
    "done": ("The request is done.", "Done."),
    "miss_func": ("None of the functions I have can do this.", "I cannot do that with the functions I have."),
    "miss_param": ("The request lacks details that the calls need.", "Please tell me the missing details."),
}


class BfclEnv(base.TextEnv):
  name = "bfcl"
  version = f"bfcl-eval-{BFCL_EVAL_VERSION}"
  max_rounds = 40

  def __init__(self):
    super().__init__()
    self._task: Task | None = None
    self._instances: dict[str, Any] = {}
    self._truth_instances: dict[str, Any] = {}
    self._available: dict[str, str] = {}
    self._turn = 0
    self._turn_steps: list[list[str]] = []  # this turn's steps of calls, BFCL's decoded form
    self._turn_has_expert_calls = False
    self._all_results: list[str] = []  # every result of the agent's calls, all turns
    self._steps: list[list[list[str]]] = []  # per finished turn, its steps of calls (what BFCL's checker reads)
    self._failure: str | None = None
    self._expert_calls: list[Call] = []

  def instruction(self) -> str:
    return _INSTRUCTION

  @property
  def task(self) -> Task | None:
    """The task being played."""
    return self._task

  @property
  def executed_steps(self) -> list[list[list[str]]]:
    """Per user turn so far (the current one included), the steps of calls run, each a list of calls in BFCL's
    decoded form: what BFCL's `multi_turn_checker` takes as the model's decoded results."""
    unfinished = self._task is not None and len(self._steps) == self._turn < len(self._task.ground_truth)
    return [list(turn) for turn in self._steps] + ([list(self._turn_steps)] if unfinished else [])

  @property
  def failure(self) -> str | None:
    """BFCL's error message for the first user turn that failed its checks, or None."""
    return self._failure

  def _num_tasks(self, split: str) -> int:
    return len(tasks(split))

  def _task_key(self, index: int, split: str) -> str:
    return tasks(split)[index].id

  def _reset_task(self, index: int, split: str) -> str:
    task = tasks(split)[index]
    self._task = task
    self._instances = make_instances(task)
    self._truth_instances = make_instances(task)
    self._available = {doc["name"]: name for name in task.entry["involved_classes"] for doc in function_docs(name)}
    self._turn = 0
    self._turn_steps = []
    self._steps = []
    self._all_results = []
    self._failure = None
    self._start_turn()
    return (f"Functions you can call:\n{render_docs(self._visible_docs(task))}\n\n"
            f"User: {self._user_message(0)}")

  def _visible_docs(self, task: Task) -> list[dict[str, Any]]:
    """The docs shown from the start: every function of the task's classes except those held back."""
    held = {name for names in task.entry.get("missed_function", {}).values() for name in names}
    return [doc for name in task.entry["involved_classes"] for doc in function_docs(name) if doc["name"] not in held]

  def _held_docs(self, turn: int) -> list[dict[str, Any]]:
    names = self._task.entry.get("missed_function", {}).get(str(turn), [])
    return [doc for name in self._task.entry["involved_classes"] for doc in function_docs(name)
            if doc["name"] in names]

  def _user_message(self, turn: int) -> str:
    messages = self._task.entry["question"][turn]
    if str(turn) in self._task.entry.get("missed_function", {}):
      return DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
    return "\n".join(message["content"] for message in messages)

  def _start_turn(self) -> None:
    self._turn_steps = []
    self._turn_has_expert_calls = False
    self._expert_calls = _keyword_calls(self._task, self._turn, self._instances)

  def _act(self, text: str) -> base.Outcome:
    action = base.action_text(text)
    if looks_like_calls(action):
      try:
        calls = parse_calls(action)
      except CallSyntaxError as error:
        return base.Outcome(f"Invalid call: {error}. Write calls as [func(arg=value), ...] with literal "
                            "values, or reply to the user without a call to end the turn.", 0.0)
      if calls:
        return self._run(calls)
    return self._end_turn()

  def _run(self, calls: list[Call]) -> base.Outcome:
    results = execute(calls, self._instances, self._available)
    self._turn_steps.append([call.text() for call in calls])
    self._all_results.extend(results)
    if calls == self._expert_calls:
      self._turn_has_expert_calls = True
    lines = []
    for call, result in zip(calls, results):
      if len(result) > _MAX_RESULT_CHARS:
        result = result[:_MAX_RESULT_CHARS] + f" ... ({len(result) - _MAX_RESULT_CHARS} more characters)"
      lines.append(f"{call.text()[:200]} -> {result}")
    observation = "Results:\n" + "\n".join(lines)
    if len(self._turn_steps) > MAXIMUM_STEP_LIMIT:
      self._failure = self._failure or f"Model was force-terminated after {MAXIMUM_STEP_LIMIT} steps in one turn."
      self._steps.append(self._turn_steps)
      return base.Outcome(observation + f"\nMore than {MAXIMUM_STEP_LIMIT} steps of calls in one turn; the episode "
                          "is over and failed.", 0.0, done=True)
    return base.Outcome(observation, 0.0)

  def _end_turn(self) -> base.Outcome:
    """Runs BFCL's checks for the turn that ends, then opens the next turn or ends the episode."""
    turn = self._turn
    truth_calls = _keyword_calls(self._task, turn, self._truth_instances)
    truth_results = execute(truth_calls, self._truth_instances, self._available)
    if self._failure is None and self._task.ground_truth[turn]:
      if is_empty_execute_response(self._turn_steps):
        self._failure = f"Model response list is empty for turn {turn}"
      else:
        for check in (state_checker(self._instances, self._truth_instances),
                      response_checker(self._all_results, truth_results, turn)):
          if not check["valid"]:
            self._failure = check["error_message"]
            break
    self._steps.append(self._turn_steps)
    self._turn += 1
    if self._turn >= len(self._task.ground_truth):
      passed = self._failure is None
      verdict = "passed BFCL's checks" if passed else f"failed BFCL's checks: {self._failure}"
      self._turn_steps = []
      return base.Outcome(f"The conversation is over; it {verdict}.", float(passed), done=True, success=passed)
    held = self._held_docs(self._turn)
    self._start_turn()
    prefix = f"New functions you can call:\n{render_docs(held)}\n" if held else ""
    return base.Outcome(f"{prefix}User: {self._user_message(self._turn)}", 0.0)

  def _expert_turn(self) -> str:
    if self._expert_calls and not self._turn_has_expert_calls:
      names = ", ".join(dict.fromkeys(call.name for call in self._expert_calls))
      action = "[" + ", ".join(call.text() for call in self._expert_calls) + "]"
      return base.react_turn(f"I call {names} for this request.", action)
    if self._expert_calls:
      kind = "done"
    else:
      kind = "miss_param" if self._task.category == "miss_param" else "miss_func"
    thought, reply = _END_TURN_TEXT[kind]
    return base.react_turn(thought, reply)

  def _sample_action(self, rng: random.Random) -> str:
    if rng.random() < 0.2:
      return "Done."
    return f"{rng.choice(sorted(self._available))}()"

  def _measures(self) -> tuple[int, float]:
    total = len(self._task.ground_truth)
    remaining = sum(1 + bool(calls) for calls in self._task.ground_truth[self._turn:])
    if self._turn_has_expert_calls:
      remaining -= 1
    return remaining, self._turn / total

  def _state_key(self) -> str:
    public = {name: {key: value for key, value in vars(instance).items() if not key.startswith("_")}
              for name, instance in self._instances.items()}
    for name, instance in self._instances.items():  # the file system's working directory is private there
      directory, path = getattr(instance, "_current_dir", None), []
      while directory is not None and len(path) < 1000:
        path.append(str(getattr(directory, "name", "")))
        directory = getattr(directory, "parent", None)
      if path:
        public[name]["_cwd"] = "/".join(reversed(path))
    try:
      state = json.dumps(public, sort_keys=True, default=_canonical)
    except TypeError:  # keys of mixed types cannot be sorted
      state = repr(public)
    return (f"turn={self._turn}|steps={len(self._turn_steps)}|failed={int(self._failure is not None)}"
            f"|state={base.stable_digest(state)}")
