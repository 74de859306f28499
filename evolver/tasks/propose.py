"""Proposers: exploration episodes -> candidate tasks with ground truth (self-questioning 2/4).

  hindsight  every outcome the env reports for an episode (`Exploration.hindsight`) is a proposal: its spec, the
             raw actions that reach it, the env's description.
  llm        AgentEvolver's task-summarize step (`agentevolver/module/task_manager/strategies/common/prompts/
             prompt_summarize.py`): an LLM reads the env's rules, the world's first observation and the episode's
             action/observation log, and answers with tasks `{"query", "confidence", "action_sequence"}` as JSON
             (a list; AgentEvolver's `<task>{...}</task>` blocks are read too). A proposal must become a task the
             env checks: its `action_sequence` is replayed on the goal-hidden world (`reset_world`) and the env's
             hindsight says what it reached. The task is then the reached outcome's spec with the LLM's query as
             its goal text (what the agent reads) and the outcome's actions as ground truth; among several
             outcomes, the one whose description shares the most words with the query (ties: the latest). A reply
             that is no JSON is dropped and counted (`unparseable`), so is a task without a string query, a
             numeric confidence or a list of string actions (`malformed`), and one whose replay reaches
             nothing (`reaches_nothing`).

`generate(prompts) -> texts` is any batched LLM call: an adapter of `evolver.models.generate` (an endpoint, a
checkpoint, or the live policy inside an RL run).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from evolver.envs.base import TaskSpec, action_text
from evolver.tasks.explore import EnvFactory, Exploration, check_explorable
from evolver.tasks.filters import Candidate, words

PROPOSERS = ("hindsight", "llm")
LLM_STATS = ("prompts", "unparseable", "items", "malformed", "reaches_nothing", "proposals")


@dataclasses.dataclass(frozen=True)
class Proposal:
  """A candidate task: a spec the env checks, its ground-truth actions, a description, and where it came from."""

  spec: TaskSpec
  actions: tuple[str, ...]
  description: str
  proposer: str
  world: int
  episode: int
  confidence: float | None = None

  def candidate(self) -> Candidate:
    """What the filters read; an LLM proposal's goal text is model-written."""
    return Candidate(self.spec, self.actions, self.confidence, model_written=self.proposer == "llm")


def _check_outcome(outcome: Any, episode: Exploration) -> None:
  spec = outcome.spec
  if not isinstance(spec, TaskSpec):
    raise TypeError(f"{episode.env}.hindsight_tasks() gave a spec of type {type(spec).__name__}, not a TaskSpec")
  if (spec.env, spec.split) != (episode.env, "train"):
    raise ValueError(f"{episode.env}.hindsight_tasks() of train world {episode.world} gave a spec of "
                     f"{spec.env!r}/{spec.split!r}: hindsight tasks must stay on the explored train world")
  check_explorable(spec.split)


def propose_hindsight(explorations: Sequence[Exploration]) -> list[Proposal]:
  """Every hindsight outcome of every episode that did not fail, in order."""
  out = []
  for episode in explorations:
    if episode.failed:
      continue
    for outcome in episode.hindsight:
      _check_outcome(outcome, episode)
      out.append(Proposal(spec=outcome.spec, actions=tuple(outcome.actions), description=outcome.description,
                          proposer="hindsight", world=episode.world, episode=episode.episode))
  return out


# ----------------------------------------------------------------------------------------------------------
# The LLM proposer.
# ----------------------------------------------------------------------------------------------------------

LLM_PROMPT = """\
# Role
You are a task discovery expert. An agent explored an environment without a goal. From what its actions \
actually achieved, write realistic, specific tasks that a user could ask in this same world, each with the \
sequence of actions that accomplishes it.

# Environment rules
{instruction}

# The world at the start
{first_observation}

# What the agent did
{log}

# Rules
- Each task must be achieved by actions like the ones above, starting from the world's start; leave out \
steps that only explored or failed.
- The query must be precise enough that success can be checked: name concrete things (items, places, values).
- Write each action exactly as the agent typed it after "Action:", one action per list entry.

# Output
Answer with JSON only: a list of at most {max_tasks} objects
[{{"query": "<the task, as a user would ask it>", "confidence": <0.0-1.0, how sure you are that it is a real, \
achievable task>, "action_sequence": ["<action 1>", "<action 2>", ...]}}]
"""


def _clip(text: str, limit: int) -> str:
  return text if len(text) <= limit else text[:limit] + " [...]"


def llm_prompt(instruction: str, episode: Exploration, *, max_log_steps: int = 30, max_chars: int = 800,
               max_tasks: int = 3) -> str:
  """The proposer prompt for one episode: the env's rules, the world's first observation, the first
  `max_log_steps` actions (what followed "Action:" in each turn) with their observations (each text cut at
  `max_chars`), and the JSON answer format."""
  steps = []
  for number, (action, observation) in enumerate(zip(episode.actions, episode.observations)):
    if number >= max_log_steps:
      steps.append(f"... ({len(episode.actions) - max_log_steps} more steps)")
      break
    steps.append(f">>> STEP {number}\nAction: {_clip(action_text(action), max_chars)}\n"
                 f"Observation: {_clip(observation, max_chars)}")
  return LLM_PROMPT.format(instruction=instruction, first_observation=_clip(episode.first_observation, 4 * max_chars),
                           log="\n".join(steps) or "(no actions)", max_tasks=max_tasks)


_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)
_TASK_BLOCK = re.compile(r"<task>(.*?)</task>", re.DOTALL)


def parse_reply(text: str) -> list[Any] | None:
  """The items of a reply: a JSON list (or one object) as the whole text or in a ``` fence; else AgentEvolver's
  `<task>{json}</task>` blocks; else the span from the first "[" or "{" to the last bracket that closes it.
  None when nothing parses."""
  for attempt in [text.strip()] + _FENCE.findall(text):
    items = _json_items(attempt)
    if items is not None:
      return items
  blocks = [item for block in _TASK_BLOCK.findall(text) for item in (_json_items(block) or [])]
  if blocks:
    return blocks
  openings = [i for i in (text.find("["), text.find("{")) if i >= 0]
  if openings:
    first = min(openings)
    last = text.rfind("]" if text[first] == "[" else "}")
    if first < last:
      return _json_items(text[first:last + 1])
  return None


def _json_items(text: str) -> list[Any] | None:
  try:
    value = json.loads(text)
  except ValueError:
    return None
  if isinstance(value, dict):
    return [value]
  return value if isinstance(value, list) else None


_STEP_COMMENT = re.compile(r"^#\s*step\s*\d+\s*$", re.IGNORECASE)


def parse_item(item: Any) -> tuple[str, float, list[str]] | None:
  """(query, confidence, actions) of one proposed task, or None when it is malformed. `action_sequence` is a list
  of strings, or one string of lines (AgentEvolver's "# stepN" comment lines and blank lines left out)."""
  if not isinstance(item, dict):
    return None
  query, confidence, sequence = item.get("query"), item.get("confidence"), item.get("action_sequence")
  if not isinstance(query, str) or not query.strip():
    return None
  if isinstance(confidence, bool) or not isinstance(confidence, (int, float)) or not 0.0 <= confidence <= 1.0:
    return None
  if isinstance(sequence, str):
    sequence = [line for line in sequence.splitlines() if line.strip() and not _STEP_COMMENT.match(line.strip())]
  if not isinstance(sequence, list) or not sequence or not all(isinstance(a, str) and a.strip() for a in sequence):
    return None
  return query.strip(), float(confidence), [a.strip() for a in sequence]


def choose_outcome(query: str, outcomes: Sequence[Any]) -> Any:
  """The outcome whose description shares the most words with the query; ties go to the latest reached (the
  longest ground truth, then the later in the list)."""
  mine = words(query)
  ranked = [(len(mine & words(o.description)), len(o.actions), position) for position, o in enumerate(outcomes)]
  return outcomes[max(range(len(outcomes)), key=lambda i: ranked[i])]


def replay_outcomes(env: Any, world: int, actions: Sequence[str]) -> list[Any]:
  """Replays `actions` on the goal-hidden train world (`reset_world`) until the episode ends; the env's
  `hindsight_tasks()` then."""
  env.reset_world(world, "train")
  for action in actions[:env.max_rounds]:
    _, _, done, _ = env.step(action)
    if done:
      break
  return list(env.hindsight_tasks())


def propose_llm(explorations: Sequence[Exploration], generate: Callable[[list[str]], list[str]],
                env_factory: EnvFactory, *, max_log_steps: int = 30, max_chars: int = 800, max_tasks: int = 3
                ) -> tuple[list[Proposal], dict[str, int], list[dict[str, Any]]]:
  """Asks `generate` for tasks from each episode (one prompt per episode that did not fail) and turns each into a
  checkable proposal (module docstring).

  Returns:
    (proposals, counts, replies): counts of `LLM_STATS` (prompts; unparseable replies; items in the parsed
    replies; malformed items; items whose replay reached nothing; proposals); one record per prompt: its episode
    (`env`, `world`, `episode`), the `reply` text and what became of it (`parsed`, and `items`, `malformed`,
    `reaches_nothing`, `proposals` counted as above): what the proposer wrote, for the records.
  """
  counts = collections.Counter(dict.fromkeys(LLM_STATS, 0))
  records: list[dict[str, Any]] = []
  episodes = [e for e in explorations if not e.failed]
  envs: dict[str, Any] = {}
  try:
    for episode in episodes:
      if episode.env not in envs:
        envs[episode.env] = env_factory(episode.env)
    prompts = [llm_prompt(envs[e.env].instruction(), e, max_log_steps=max_log_steps, max_chars=max_chars,
                          max_tasks=max_tasks) for e in episodes]
    counts["prompts"] = len(prompts)
    replies = list(generate(prompts)) if prompts else []
    if len(replies) != len(prompts):
      raise ValueError(f"generate returned {len(replies)} texts for {len(prompts)} prompts")
    proposals = []
    for episode, reply in zip(episodes, replies):
      text = reply if isinstance(reply, str) else ""
      items = parse_reply(text)
      mine = collections.Counter(dict.fromkeys(LLM_STATS[2:], 0))
      records.append({"env": episode.env, "world": episode.world, "episode": episode.episode, "reply": text,
                      "parsed": items is not None, **mine})
      if items is None:
        counts["unparseable"] += 1
        continue
      mine["items"] = len(items)
      for item in items:
        parsed = parse_item(item)
        if parsed is None:
          mine["malformed"] += 1
          continue
        query, confidence, actions = parsed
        outcomes = replay_outcomes(envs[episode.env], episode.world, actions)
        if not outcomes:
          mine["reaches_nothing"] += 1
          continue
        outcome = choose_outcome(query, outcomes)
        _check_outcome(outcome, episode)
        mine["proposals"] += 1
        proposals.append(Proposal(spec=dataclasses.replace(outcome.spec, goal=query), actions=tuple(outcome.actions),
                                  description=outcome.description, proposer="llm", world=episode.world,
                                  episode=episode.episode, confidence=confidence))
      records[-1].update(mine)
      counts.update(mine)
    return proposals, dict(counts), records
  finally:
    for env in envs.values():
      close = getattr(env, "close", None)
      if close is not None:
        close()

