"""AgentEvolver's experience manager: which rollouts get experience, which samples keep it, and the text itself.

The functions at the top are pure (`rng` is a `numpy.random.Generator`, nothing else is drawn); the
`ExperienceManager` that wires them into the RL loop follows them in this file.

Semantics (AgentEvolver, `agentevolver/module/exp_manager/exp_manager.py`, except where noted):
  rollout level   `allocate_rollout_exp`: `woexp` none of a task's n rollouts, `all` every one, `mixed`
                  round(n * ratio) of them (Python's round: halves to even) at random positions.
  sample level    `allocate_train_modes`: `alldiscard`, `allkeep`, `hybrid` (int(num_tasks * keepratio) tasks
                  keep, shuffled). AgentEvolver reads the mode under the wrong key and so always strips; here
                  `keep` keeps. Unknown modes raise ValueError (AgentEvolver falls back to the keep ratio).
  template        `EXPERIENCE_TEMPLATE`, appended to the end of the last initial user message (AgentEvolver puts
                  it in front; the end keeps the hint next to where generation starts); `strip_experience`
                  removes every occurrence with the template turned into a regex, as AgentEvolver does.
  query           `task_query`: the task's own text (the first observation after reset). AgentEvolver's
                  `EMClient.call_context_generator` sends the JSON of the initial messages; it is reduced to the
                  same text (an embedding of the whole opening matches every task of an env alike: the env's rules
                  dominate it), so evolver's manager and AgentEvolver's client retrieve alike.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# ----------------------------------------------------------------------------------------------------------
# Pure functions: allocation, the experience template, retrieval queries.
# ----------------------------------------------------------------------------------------------------------

EXPERIENCE_TEMPLATE = "\n\nSome Related Experience to help you to complete the task:<EXP>{}</EXP>\n\n"
ROLLOUT_MODES = ("woexp", "all", "mixed")
TRAIN_SAMPLE_MODES = ("alldiscard", "allkeep", "hybrid")

# The template as AgentEvolver's `manage_training_context` turns it into a regex.
_EXPERIENCE_PATTERN = re.compile(re.escape(EXPERIENCE_TEMPLATE).replace(r"\{\}", "(.*?)"), re.DOTALL)
_CLOSING_TAG = "</EXP>"
_CLOSING_TAG_ESCAPED = "</ EXP>"
# AgentGym's conversations open with the instruction (user) and this fixed agent reply (assistant).
_OPENING_REPLY = "Ok."
_ROLE_ALIASES = {"human": "user", "gpt": "assistant", "system": "system", "user": "user", "assistant": "assistant",
                 "tool": "user", "function": "user"}


def _check_count(name: str, value: Any) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
    raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
  return int(value)


def _check_ratio(name: str, value: Any) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
    raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
  value = float(value)
  if not 0.0 <= value <= 1.0:
    raise ValueError(f"{name} must be in [0, 1], got {value}")
  return value


def _check_rng(rng: Any) -> np.random.Generator:
  if not isinstance(rng, np.random.Generator):
    raise ValueError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {type(rng).__name__}")
  return rng


def allocate_rollout_exp(n: int, mode: str, ratio: float, rng: np.random.Generator) -> np.ndarray:
  """Which of a task's `n` rollouts get experience injected.

  Args:
    n: rollouts of the task.
    mode: "woexp" (none), "all" (every rollout) or "mixed" (round(n * ratio) of them, Python's round).
    ratio: the share of rollouts with experience under "mixed", in [0, 1] (ignored by the other modes).
    rng: draws the positions under "mixed" (a permutation; nothing is drawn otherwise).

  Returns:
    A bool array of length n.

  Raises:
    ValueError: an unknown mode, a negative n, or (under "mixed") a ratio outside [0, 1].
  """
  n = _check_count("n", n)
  if mode == "woexp":
    return np.zeros(n, dtype=bool)
  if mode == "all":
    return np.ones(n, dtype=bool)
  if mode == "mixed":
    count = round(n * _check_ratio("rollout_ratio", ratio))
    chosen = np.zeros(n, dtype=bool)
    chosen[_check_rng(rng).permutation(n)[:count]] = True
    return chosen
  raise ValueError(f"unknown rollout mode {mode!r}; use one of {ROLLOUT_MODES}")


def allocate_train_modes(num_tasks: int, mode: str, keepratio: float, rng: np.random.Generator) -> list[str]:
  """Per task, whether its training samples keep the injected experience text ("keep") or lose it ("discard").

  Args:
    num_tasks: tasks in the batch.
    mode: "alldiscard", "allkeep" or "hybrid" (int(num_tasks * keepratio) tasks keep, at random positions).
    keepratio: the share of tasks that keep under "hybrid", in [0, 1] (ignored by the other modes).
    rng: shuffles the modes under "hybrid" (nothing is drawn otherwise).

  Returns:
    A list of num_tasks strings, each "keep" or "discard".

  Raises:
    ValueError: an unknown mode, a negative num_tasks, or (under "hybrid") a keepratio outside [0, 1].
  """
  num_tasks = _check_count("num_tasks", num_tasks)
  if mode == "alldiscard":
    return ["discard"] * num_tasks
  if mode == "allkeep":
    return ["keep"] * num_tasks
  if mode == "hybrid":
    keep = int(num_tasks * _check_ratio("train_sample_keepratio", keepratio))
    modes = np.array(["keep"] * keep + ["discard"] * (num_tasks - keep), dtype=object)
    return [str(m) for m in modes[_check_rng(rng).permutation(num_tasks)]]
  raise ValueError(f"unknown train sample mode {mode!r}; use one of {TRAIN_SAMPLE_MODES}")


def inject_experience(text: str, experience: str) -> str:
  """`text` with `EXPERIENCE_TEMPLATE` filled with `experience` appended (text is the last initial user message).

  An empty (or all-whitespace) experience leaves the text unchanged, as AgentEvolver does when retrieval finds
  nothing. A closing tag `</EXP>` inside the experience is written `</ EXP>`, so that `strip_experience` finds
  the template's own closing tag and the round trip is exact.
  """
  if not isinstance(text, str) or not isinstance(experience, str):
    raise TypeError(f"text and experience must be strings, got {type(text).__name__} and "
                    f"{type(experience).__name__}")
  if not experience.strip():
    return text
  return text + EXPERIENCE_TEMPLATE.format(experience.replace(_CLOSING_TAG, _CLOSING_TAG_ESCAPED))


def strip_experience(text: str) -> tuple[str, list[str]]:
  """Removes every filled `EXPERIENCE_TEMPLATE` from `text`.

  Returns:
    (the text without them, the experiences they held, in order of appearance).
  """
  if not isinstance(text, str):
    raise TypeError(f"text must be a string, got {type(text).__name__}")
  experiences = _EXPERIENCE_PATTERN.findall(text)
  if not experiences:
    return text, []
  return _EXPERIENCE_PATTERN.sub("", text), experiences


def _memory_fields(memory: Any) -> tuple[str, str]:
  if isinstance(memory, tuple) and len(memory) == 2 and not isinstance(memory[0], str):
    memory = memory[0]  # (TaskMemory, score) as ExperiencePool.retrieve gives them
  if isinstance(memory, Mapping):
    return str(memory.get("when_to_use", "")), str(memory.get("content", ""))
  return str(getattr(memory, "when_to_use", "")), str(getattr(memory, "content", ""))


def format_experiences(memories: Sequence[Any], *, when_to_use: bool = True) -> str:
  """Several retrieved memories as one experience text, numbered as ReMe 0.2's retrieval answer writes them.

  ReMe 0.2's default `retrieve_task_memory` flow ends in `RewriteMemoryOp(enable_llm_rewrite=False)`, whose
  answer is `"Memory {i} :\\n When to use: {when_to_use}\\n Content: {content}\\n"` per memory (i from 1), joined
  by newlines (`reme_ai/retrieve/task/rewrite_memory_op.py`, `_format_memories_for_context`).

  Args:
    memories: TaskMemory records, (TaskMemory, score) pairs or ReMe memory dicts, best first. Memories with an
      empty content are skipped.
    when_to_use: False leaves out the "When to use" lines (only the numbered contents).

  Returns:
    The text; "" when there is nothing to say.
  """
  parts = []
  for memory in memories:
    condition, content = _memory_fields(memory)
    if not content.strip():
      continue
    number = len(parts) + 1
    if when_to_use:
      parts.append(f"Memory {number} :\n When to use: {condition}\n Content: {content}\n")
    else:
      parts.append(f"Memory {number} :\n Content: {content}\n")
  return "\n".join(parts)


def _content_text(content: Any) -> str:
  if isinstance(content, str):
    return content
  if isinstance(content, list):  # OpenAI-style content blocks
    texts = []
    for block in content:
      if isinstance(block, Mapping):
        texts.append(str(block.get("text", block.get("content", ""))))
      else:
        texts.append(str(block))
    return "".join(texts)
  if content is None:
    return ""
  return str(content)


def as_messages(messages: Any) -> list[dict[str, str]]:
  """Messages as `[{"role", "content"}]` dicts: from dicts (role/content, or AgentTraj's from/value with
  human/gpt), from objects with `role` and `content` (evolver's `Message`), or from a JSON string of a list of
  them. Tool and function messages count as user (the environment's) messages.

  Raises:
    ValueError: the input is not a list of messages.
  """
  if isinstance(messages, str):
    try:
      messages = json.loads(messages)
    except (ValueError, RecursionError):
      raise ValueError("not a JSON list of messages") from None
  if not isinstance(messages, Sequence) or isinstance(messages, (str, bytes)):
    raise ValueError(f"messages must be a list, got {type(messages).__name__}")
  result = []
  for i, message in enumerate(messages):
    if isinstance(message, Mapping):
      role = message.get("role", message.get("from"))
      content = message.get("content", message.get("value"))
    else:
      role, content = getattr(message, "role", None), getattr(message, "content", None)
    role = getattr(role, "value", role)  # enums
    if not isinstance(role, str) or role.lower() not in _ROLE_ALIASES:
      raise ValueError(f"message {i} has no known role ({str(role)[:40]!r}); use one of "
                       f"{sorted(set(_ROLE_ALIASES.values()))}")
    result.append({"role": _ROLE_ALIASES[role.lower()], "content": _content_text(content)})
  return result


def initial_messages(messages: Sequence[Mapping[str, str]]) -> list[dict[str, str]]:
  """The messages before the agent's first own turn: system messages, the user messages, and AgentGym's opening
  reply "Ok." (when it answers the first user message)."""
  initial: list[dict[str, str]] = []
  for message in messages:
    if message["role"] == "assistant":
      is_opening = (message["content"].strip() == _OPENING_REPLY and initial and initial[-1]["role"] == "user"
                    and not any(m["role"] == "assistant" for m in initial))
      if not is_opening:
        break
    initial.append(dict(message))
  return initial


def _task_text(messages: Sequence[Mapping[str, str]]) -> str:
  users = [m for m in initial_messages(messages) if m["role"] == "user"]
  if not users:
    users = [m for m in messages if m["role"] == "user"]
  if not users:
    raise ValueError("no user message: the task's text is the last initial user message")
  return strip_experience(users[-1]["content"])[0].strip()


def _looks_like_messages(text: str) -> list[dict[str, str]] | None:
  if not text.lstrip().startswith("["):
    return None
  try:
    messages = as_messages(text)
  except ValueError:
    return None
  return messages or None


def task_query(messages_or_text: Any) -> str:
  """The retrieval query for a task (and the `when_to_use` an extractive summary gets): the task's own text, the
  last initial user message (the first observation after reset, not the env's rules in the first message),
  without any injected experience, stripped of outer whitespace.

  Args:
    messages_or_text: the episode's messages (dicts or `Message`s), a JSON string of them (what AgentEvolver's
      EMClient sends as `query`: reduced the same way), or the task's text itself.

  Raises:
    ValueError: messages without a user message.
  """
  if isinstance(messages_or_text, str):
    messages = _looks_like_messages(messages_or_text)
    if messages is None:
      return strip_experience(messages_or_text)[0].strip()
  else:
    messages = as_messages(messages_or_text)
  return _task_text(messages)
