"""Trajectories -> task memories: ReMe 0.2's `summary_task_memory` pipeline.

  preprocess     success if score >= success_threshold (ReMe's `TrajectoryPreprocessOp`, default 1.0), unless
                 the trajectory carries its env's verdict (an evolver Trajectory's `success`, `metadata.success`)
  extraction     success / failure / comparative records (ReMe's `SuccessExtractionOp`, `FailureExtractionOp`,
                 `ComparativeExtractionOp`)
  validation     rules every record must pass (non-empty, bounded, content not the condition again), plus, for
                 the LLM backend, ReMe's validation prompt (`MemoryValidationOp`: valid and score >= 0.5)
  dedup          ReMe's `MemoryDeduplicationOp`: the text `f"{when_to_use} {content}"` is a duplicate when its
                 cosine to the workspace (`ExperiencePool.similar`), to a stored record near it or to a record
                 kept earlier in the batch reaches `dedup_threshold` (`deduplicate`)
  commit         the caller's (`summarize_and_commit` does both), so that retrieval right after finds them

Input trajectories are ReMe's / AgentEvolver's `{"messages": [...], "score": r}` dicts (optionally `task_id`,
`metadata` with `env`, `item_id`) or evolver `Trajectory`s (failed rollouts are skipped). Backends:

  ExtractiveSummarizer  deterministic, no model: `when_to_use` is the task's own text (`manager.task_query`);
                        `content` the successful actions in order, compressed; for a failure what was done last
                        and what the env answered; for a task with both, where a success and a failure diverged.
  LLMSummarizer         ReMe's prompts through a `generate(prompts) -> texts` (`evolver.models.generate`: an
                        OpenAI-compatible endpoint, another checkpoint or the live policy); unparseable output is
                        dropped and counted, never raised; a model that fails raises SummarizerUnavailable.

Record metadata: task_id, env, tags, source (ids of the trajectories), kind (success | failure | comparative),
and from the LLM confidence, step_type, tools_used; `author` is "extractive" or the model's name.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import numpy as np

from evolver.envs.base import action_text
from evolver.experience import manager
from evolver.experience.records import ExperienceError, TaskMemory, check_workspace_id
from evolver.models.generate import Generate

SUCCESS_THRESHOLD = 1.0  # ReMe's TrajectoryPreprocessOp default
DEDUP_THRESHOLD = 0.9  # ReMe's MemoryDeduplicationOp uses 0.5 with API embeddings; see `Summarizer`
VALIDATION_THRESHOLD = 0.5  # ReMe's MemoryValidationOp default
KINDS = ("success", "failure", "comparative")
STATS = ("trajectories", "skipped", "successes", "failures", "extracted", "invalid", "duplicates", "unparseable")


class SummarizerUnavailable(RuntimeError):
  """The model behind a summarizer could not be reached or answered with an error (the service answers 503)."""


# ----------------------------------------------------------------------------------------------------------
# Input: trajectories as episodes.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class Episode:
  """One trajectory, normalised: role/content messages, its score, and where it came from."""

  messages: list[dict[str, str]]
  score: float
  task_id: str = ""
  env: str = ""
  source: str = ""
  query: str = ""  # the task's own text (`manager.task_query`)
  success: bool | None = None  # what the env said (evolver trajectories, `metadata.success`); None: by score

  @property
  def group(self) -> str:
    """Episodes of the same task share a group: the task id, or the task's text when there is none."""
    return self.task_id or self.query


def _number(value: Any, what: str) -> float:
  if (isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
      or not np.isfinite(value)):
    raise ExperienceError(f"{what} must be a finite number, got {str(value)[:40]!r}")
  return float(value)


def _from_dict(data: Mapping[str, Any], index: int) -> Episode | None:
  """The episode of a ReMe-shaped trajectory; None for one marked `metadata.failed` (a broken rollout)."""
  if "messages" not in data:
    raise ExperienceError(f"trajectory {index} has no 'messages'")
  try:
    messages = manager.as_messages(data["messages"])
  except ValueError as error:
    raise ExperienceError(f"trajectory {index}: {error}") from None
  metadata = data.get("metadata") or {}
  if not isinstance(metadata, Mapping):
    raise ExperienceError(f"trajectory {index}: 'metadata' must be an object")
  if metadata.get("failed"):
    return None
  task_id = data.get("task_id") or metadata.get("task_id") or ""
  source = data.get("id") or metadata.get("trajectory_id") or metadata.get("item_id") or task_id
  success = metadata.get("success")
  return Episode(messages=messages, score=_number(data.get("score", 0.0), f"trajectory {index}'s score"),
                 task_id=str(task_id), env=str(metadata.get("env", data.get("env", "")) or ""), source=str(source),
                 success=success if isinstance(success, bool) else None)


def to_episodes(trajectories: Sequence[Any]) -> tuple[list[Episode], int]:
  """Episodes from ReMe-shaped dicts or evolver `Trajectory`s.

  Returns:
    (the episodes, how many trajectories were skipped: failed rollouts and ones without a user message).

  Raises:
    ExperienceError: a malformed trajectory (the message says which and why).
  """
  if isinstance(trajectories, (str, bytes, Mapping)) or not isinstance(trajectories, Sequence):
    raise ExperienceError(f"trajectories must be a list, got {type(trajectories).__name__}")
  episodes, skipped = [], 0
  for index, trajectory in enumerate(trajectories):
    if isinstance(trajectory, Mapping):
      episode = _from_dict(trajectory, index)
    elif hasattr(trajectory, "messages") and hasattr(trajectory, "reward"):
      episode = None if getattr(trajectory, "failed", False) else _from_dict(trajectory_payload(trajectory), index)
    else:
      raise ExperienceError(f"trajectory {index} must be a {{'messages', 'score'}} object or a Trajectory, got "
                            f"{type(trajectory).__name__}")
    if episode is None:
      skipped += 1
      continue
    try:
      episode.query = manager.task_query(episode.messages)
    except ValueError:
      skipped += 1
      continue
    if not episode.query:
      skipped += 1
      continue
    episodes.append(episode)
  return episodes, skipped


def trajectory_payload(trajectory: Any) -> dict[str, Any]:
  """A trajectory as the JSON object `/summary_task_memory` takes (ReMe's Trajectory: task_id, messages, score,
  metadata)."""
  if isinstance(trajectory, Mapping):
    return dict(trajectory)
  item_id = str(getattr(trajectory, "item_id", "") or "")
  sample = getattr(trajectory, "sample", None)  # a Rollout's index among its task's samples
  metadata = {"env": str(getattr(trajectory, "env", "") or ""), "item_id": item_id,
              "success": bool(getattr(trajectory, "success", False)),
              "failed": bool(getattr(trajectory, "failed", False))}
  if isinstance(sample, int) and item_id:
    metadata["trajectory_id"] = f"{item_id}#{sample}"
  return {"task_id": item_id, "messages": manager.as_messages(trajectory.messages),
          "score": float(trajectory.reward), "metadata": metadata}


def _steps(messages: Sequence[Mapping[str, str]]) -> list[tuple[str, str]]:
  """The agent's turns after the opening: (the turn's text, the env's answer to it or "")."""
  body = messages[len(manager.initial_messages(messages)):]
  steps = []
  for i, message in enumerate(body):
    if message["role"] != "assistant":
      continue
    answer = body[i + 1]["content"] if i + 1 < len(body) and body[i + 1]["role"] == "user" else ""
    steps.append((message["content"], answer))
  return steps


# ----------------------------------------------------------------------------------------------------------
# Results, validation and deduplication (shared by the backends).
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class SummaryResult:
  """The records to commit and what happened on the way (`STATS` keys)."""

  memories: list[TaskMemory]
  stats: dict[str, int]


def _normalised(text: str) -> str:
  return " ".join(text.split()).lower()


def dedup_text(memory: TaskMemory) -> str:
  """What deduplication compares (ReMe's `MemoryDeduplicationOp`): the condition and the content together."""
  return f"{memory.when_to_use} {memory.content}"


def _embed(embedder: Any, texts: list[str]) -> np.ndarray:
  vectors = np.asarray(embedder.embed(texts), dtype=np.float32)
  norms = np.linalg.norm(vectors, axis=1, keepdims=True)
  return vectors / np.maximum(norms, 1e-12)


def deduplicate(memories: Sequence[TaskMemory], *, pool: Any = None, embedder: Any = None,
                threshold: float = DEDUP_THRESHOLD, neighbours: int = 8) -> tuple[list[TaskMemory], int]:
  """Drops near-duplicates against the workspace and within the batch (first come, first kept).

  A candidate is a duplicate when (1) its `dedup_text` reaches `threshold` against the workspace's conditions
  (`pool.similar`: ReMe's check, text against the indexed `when_to_use` embeddings), (2) it reaches `threshold`
  against the `dedup_text` of one of the `neighbours` stored records nearest to its condition (the same
  comparison as within the batch, so a pair is judged alike whether it arrives together or in two calls), or
  (3) its condition and content equal a stored or earlier record's (whitespace and case aside).

  Args:
    memories: candidate records, in order of preference.
    pool: an `ExperiencePool` for the workspace (None: only the batch is checked).
    embedder: embeds the texts compared (default: the pool's `embedder`); without one only (1) and exact
      duplicates are caught.
    threshold: a cosine at or above it is a duplicate.
    neighbours: how many stored records, nearest by condition, each candidate is compared with.

  Returns:
    (the records kept, how many were dropped).
  """
  if not memories:
    return [], 0
  texts = [dedup_text(m) for m in memories]
  embedder = embedder if embedder is not None else getattr(pool, "embedder", None)
  vectors = _embed(embedder, texts) if embedder is not None else None
  duplicate = [False] * len(memories)
  if pool is not None and pool_size(pool):
    best = [float(s) for s in pool.similar(texts, threshold)]
    stored = pool.retrieve([m.when_to_use for m in memories], neighbours)
    near = {m.memory_id: m for row in stored for m, _ in row}
    near_ids = list(near)
    near_vectors = _embed(embedder, [dedup_text(near[i]) for i in near_ids]) if vectors is not None and near else None
    row_of = {memory_id: k for k, memory_id in enumerate(near_ids)}
    for i, memory in enumerate(memories):
      key = (_normalised(memory.when_to_use), _normalised(memory.content))
      rows = [row_of[m.memory_id] for m, _ in stored[i]]
      duplicate[i] = (best[i] >= threshold
                      or any((_normalised(m.when_to_use), _normalised(m.content)) == key for m, _ in stored[i])
                      or (near_vectors is not None and bool(rows)
                          and float(np.max(near_vectors[rows] @ vectors[i])) >= threshold))
  kept: list[int] = []
  seen: set[str] = set()
  for i in range(len(memories)):
    if duplicate[i]:
      continue
    key = _normalised(texts[i])
    if key in seen or (vectors is not None and kept and float(np.max(vectors[kept] @ vectors[i])) >= threshold):
      duplicate[i] = True
      continue
    seen.add(key)
    kept.append(i)
  return [memories[i] for i in kept], sum(duplicate)


def pool_size(pool: Any) -> int:
  """The pool's size (0 when it does not say)."""
  size = getattr(pool, "size", 0)
  return int(size() if callable(size) else size)


def _bounded(text: str, limit: int) -> str:
  return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


# ----------------------------------------------------------------------------------------------------------
# The pipeline and its backends.
# ----------------------------------------------------------------------------------------------------------


class Summarizer:
  """The pipeline (module docstring); backends implement `extract`.

  `dedup_threshold` defaults to 0.9, not ReMe's 0.5: the memories of one env's tasks share most of their words
  (the goal differs in a colour or a name), and at 0.5 the second task's memory would be dropped as a copy of
  the first's.
  """

  author = "summarizer"

  def __init__(self, *, success_threshold: float = SUCCESS_THRESHOLD, dedup_threshold: float = DEDUP_THRESHOLD,
               max_when_to_use_chars: int = 4000, max_content_chars: int = 4000, min_content_chars: int = 8):
    self.success_threshold = float(success_threshold)
    self.dedup_threshold = float(dedup_threshold)
    self.max_when_to_use_chars = max_when_to_use_chars
    self.max_content_chars = max_content_chars
    self.min_content_chars = min_content_chars

  # -- what a backend provides ----------------------------------------------------------------------------

  def extract(self, successes: list[Episode], failures: list[Episode], workspace_id: str,
              stats: dict[str, int]) -> list[TaskMemory]:
    """Candidate records from the classified episodes (it may add to stats["unparseable"])."""
    raise NotImplementedError

  def validate_more(self, memories: list[TaskMemory], stats: dict[str, int]) -> list[TaskMemory]:
    """A backend's own validation after the rules (the LLM's prompt); the default keeps all."""
    del stats
    return memories

  # -- the pipeline ---------------------------------------------------------------------------------------

  def valid(self, memory: TaskMemory) -> bool:
    """The rules every record passes: a condition and a content of bounded length, the content saying more than
    the condition does."""
    condition, content = memory.when_to_use.strip(), memory.content.strip()
    return (bool(condition) and self.min_content_chars <= len(content) <= self.max_content_chars
            and len(condition) <= self.max_when_to_use_chars and _normalised(content) != _normalised(condition))

  def succeeded(self, episode: Episode) -> bool:
    """ReMe's preprocess: score >= success_threshold, unless the episode carries its env's verdict."""
    return episode.success if episode.success is not None else episode.score >= self.success_threshold

  def propose(self, trajectories: Sequence[Any], workspace_id: str) -> SummaryResult:
    """Preprocess, extract and validate: the candidates before deduplication (no pool needed; safe to run
    concurrently with the pool's users).

    Raises:
      ExperienceError: malformed trajectories or workspace id.
      SummarizerUnavailable: the backend's model could not be reached.
    """
    check_workspace_id(workspace_id)
    episodes, skipped = to_episodes(trajectories)
    stats = dict.fromkeys(STATS, 0)
    stats["trajectories"], stats["skipped"] = len(trajectories), skipped
    successes = [e for e in episodes if self.succeeded(e)]
    failures = [e for e in episodes if not self.succeeded(e)]
    stats["successes"], stats["failures"] = len(successes), len(failures)
    candidates = self.extract(successes, failures, workspace_id, stats) if episodes else []
    stats["extracted"] = len(candidates)
    valid = [m for m in candidates if self.valid(m)]
    valid = self.validate_more(valid, stats)
    stats["invalid"] = len(candidates) - len(valid)
    for memory in valid:  # the same record gets the same id: a run resumed from a checkpoint remakes it exactly
      memory.memory_id = content_id(memory)
    return SummaryResult(valid, stats)

  def deduplicate(self, result: SummaryResult, *, pool: Any = None, embedder: Any = None) -> SummaryResult:
    """`result` without the records that duplicate the workspace (`pool`) or each other."""
    kept, dropped = deduplicate(result.memories, pool=pool, embedder=embedder, threshold=self.dedup_threshold)
    stats = dict(result.stats)
    stats["duplicates"] += dropped
    return SummaryResult(kept, stats)

  def summarize(self, trajectories: Sequence[Any], workspace: Any, *, pool: Any = None,
                embedder: Any = None) -> SummaryResult:
    """The records to commit (not committed): `propose`, then `deduplicate`.

    Args:
      trajectories: ReMe-shaped dicts or evolver Trajectories.
      workspace: the workspace id, or an `ExperiencePool` (its workspace, deduplicated against).
      pool: the pool to deduplicate against (default: `workspace` when it is one).
      embedder: for the comparisons (default: the pool's).
    """
    if not isinstance(workspace, str):
      pool = workspace if pool is None else pool
      workspace = workspace.workspace_id
    return self.deduplicate(self.propose(trajectories, workspace), pool=pool, embedder=embedder)


def content_id(memory: TaskMemory) -> str:
  """A memory id from what the record says (workspace, condition, content): 32 hex digits, like ReMe's uuid4 hex."""
  text = "\x1f".join((memory.workspace_id, memory.when_to_use, memory.content))
  return hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()


def summarize_and_commit(pool: Any, trajectories: Sequence[Any], step: int | None = None, *,
                         summarizer: Summarizer | None = None) -> SummaryResult:
  """Summarizes into `pool`'s workspace and commits the records (indexed on return), stamped with `step`."""
  summarizer = summarizer or ExtractiveSummarizer()
  result = summarizer.summarize(trajectories, pool.workspace_id, pool=pool)
  if result.memories:
    pool.commit(result.memories, step=step)
  return result


def _metadata(episodes: Sequence[Episode], kind: str, **extra: Any) -> dict[str, Any]:
  first = episodes[0]
  sources = list(dict.fromkeys(e.source for e in episodes if e.source))
  tags = extra.pop("tags", None) or [t for t in (first.env, kind) if t]
  return {"task_id": first.task_id, "env": first.env, "tags": tags, "source": sources, "kind": kind, **extra}


def _shared_prefix(a: Sequence[str], b: Sequence[str]) -> int:
  """How many leading actions two episodes share."""
  n = 0
  while n < min(len(a), len(b)) and a[n] == b[n]:
    n += 1
  return n


def _groups(episodes: Sequence[Episode]) -> dict[str, list[Episode]]:
  groups: dict[str, list[Episode]] = {}
  for episode in episodes:
    groups.setdefault(episode.group, []).append(episode)
  return groups


class ExtractiveSummarizer(Summarizer):
  """Deterministic records from the actions themselves (no model).

  Per task (task id, else the task's text) and call: one success record (the best-scoring success, fewest
  actions first), one failure record (the first failure that acted), and, when the task has both, one
  comparative record (the best success against the failure that followed it longest: where they diverged).
  """

  author = "extractive"

  def __init__(self, *, max_actions: int = 40, max_action_chars: int = 160, max_observation_chars: int = 300,
               failure_tail: int = 3, **kwargs):
    super().__init__(**kwargs)
    self.max_actions = max_actions
    self.max_action_chars = max_action_chars
    self.max_observation_chars = max_observation_chars
    self.failure_tail = failure_tail

  def _actions(self, episode: Episode) -> list[str]:
    return [_bounded(" ".join(action_text(turn).split()), self.max_action_chars) for turn, _ in
            _steps(episode.messages)]

  def _compact(self, actions: Sequence[str]) -> str:
    """Actions in order, consecutive repeats folded ("go north x3"), at most `max_actions` runs."""
    runs: list[list[Any]] = []
    for action in actions:
      if runs and runs[-1][0] == action:
        runs[-1][1] += 1
      else:
        runs.append([action, 1])
    parts = [f"{a} x{n}" if n > 1 else a for a, n in runs[:self.max_actions]]
    if len(runs) > self.max_actions:
      parts.append(f"... ({sum(n for _, n in runs[self.max_actions:])} more)")
    return " -> ".join(f'"{p}"' if " -> " in p else p for p in parts)

  def _memory(self, workspace_id: str, episodes: Sequence[Episode], kind: str, content: str) -> TaskMemory:
    return TaskMemory(workspace_id=workspace_id, when_to_use=episodes[0].query, content=content, score=1.0,
                      author=self.author, metadata=_metadata(episodes, kind))

  def _success(self, workspace_id: str, episode: Episode, actions: list[str]) -> TaskMemory:
    content = (f"This worked (score {episode.score:.2f}, {len(actions)} action{'s' * (len(actions) != 1)}): "
               f"{self._compact(actions)}.")
    return self._memory(workspace_id, [episode], "success", content)

  def _failure(self, workspace_id: str, episode: Episode, actions: list[str]) -> TaskMemory:
    steps = _steps(episode.messages)
    last = " ".join(steps[-1][1].split())
    tail = actions[-self.failure_tail:]
    where = "The last actions were" if len(actions) > len(tail) else "The actions were"
    content = (f"This failed (score {episode.score:.2f}) after {len(actions)} action{'s' * (len(actions) != 1)}. "
               f"{where}: {self._compact(tail)}.")
    if last:
      content += f' The environment then said: "{_bounded(last, self.max_observation_chars)}".'
    content += " Do not repeat this; try something else at that point."
    return self._memory(workspace_id, [episode], "failure", content)

  def _comparative(self, workspace_id: str, success: Episode, good: list[str], failure: Episode,
                   bad: list[str]) -> TaskMemory | None:
    shared = _shared_prefix(good, bad)
    if shared >= len(good):
      return None  # the failure did everything the success did: no divergence to report
    if shared:
      content = (f"A success and a failure agreed on the first {shared} action{'s' * (shared != 1)} "
                 f"({self._compact(good[:shared])}); then the success did \"{good[shared]}\"")
    else:
      content = f"A success and a failure differed from the first action: the success did \"{good[shared]}\""
    content += f" where the failure did \"{bad[shared]}\"." if shared < len(bad) else " where the failure stopped."
    if shared + 1 < len(good):
      content += f" The success went on: {self._compact(good[shared + 1:])}."
    return self._memory(workspace_id, [success, failure], "comparative", content)

  def extract(self, successes: list[Episode], failures: list[Episode], workspace_id: str,
              stats: dict[str, int]) -> list[TaskMemory]:
    del stats
    memories = []
    failure_groups = _groups(failures)
    for group, group_successes in _groups(successes).items():
      ranked = sorted(((e, self._actions(e)) for e in group_successes), key=lambda p: (-p[0].score, len(p[1])))
      ranked = [(e, a) for e, a in ranked if a]
      if not ranked:
        continue
      best, good = ranked[0]
      memories.append(self._success(workspace_id, best, good))
      acted = [(e, a) for e, a in ((e, self._actions(e)) for e in failure_groups.get(group, [])) if a]
      if acted:
        failure, bad = max(acted, key=lambda pair: _shared_prefix(good, pair[1]))  # the first of the longest
        comparative = self._comparative(workspace_id, best, good, failure, bad)
        if comparative is not None:
          memories.append(comparative)
    for group_failures in failure_groups.values():
      for episode in group_failures:
        actions = self._actions(episode)
        if actions:
          memories.append(self._failure(workspace_id, episode, actions))
          break
    return memories


# ----------------------------------------------------------------------------------------------------------
# The LLM backend: ReMe 0.2's prompts (reme_ai/summary/task/*_prompt.yaml), shortened only where noted.
# ----------------------------------------------------------------------------------------------------------

_OUTPUT_FORMAT = """OUTPUT FORMAT:
Generate COUNT WHAT as JSON objects:
```json
[
  {{
    "when_to_use": "WHEN",
    "experience": "EXPERIENCE",
    "tags": ["relevant", "keywords", "for", "categorization"],
    "confidence": 0.8,
    "step_type": "reasoning|action|observation|decision",
    "tools_used": ["list", "of", "tools"]
  }}
]
```"""


def _output_format(count: str, what: str, when: str, experience: str) -> str:
  """ReMe's OUTPUT FORMAT section (its braces stay doubled for the prompt's own `str.format`)."""
  return (_OUTPUT_FORMAT.replace("COUNT", count, 1).replace("WHAT", what, 1).replace("WHEN", when, 1)
          .replace("EXPERIENCE", experience, 1))


SUCCESS_PROMPT = """You are an expert AI analyst reviewing successful step sequences from an AI agent execution.

Your task is to extract reusable, actionable step-level task memories that can guide future agent executions.
Focus on identifying specific patterns, techniques, and decision points that contributed to success.

ANALYSIS FRAMEWORK:
- STEP PATTERN ANALYSIS: Identify the specific sequence of actions that led to success
- DECISION POINTS: Highlight critical decisions made during these steps
- TECHNIQUE EFFECTIVENESS: Analyze why specific approaches worked well
- REUSABILITY: Extract patterns that can be applied to similar scenarios

EXTRACTION PRINCIPLES:
- Focus on TRANSFERABLE TECHNIQUES and decision frameworks
- Frame insights as actionable guidelines and best practices

# Original Query
{query}

# Step Sequence Analysis
{step_sequence}

# Context Information
{context}

# Outcome
This step sequence was part of a successful trajectory.

""" + _output_format(count="1-3", what="step-level success insights",
                            when="Specific conditions when this step pattern should be applied",
                            experience="Detailed description of the successful step pattern and why it works")

FAILURE_PROMPT = """You are an expert AI analyst reviewing failed step sequences from an AI agent execution.

Your task is to extract learning task memories from failures to prevent similar mistakes in future executions.
Focus on identifying error patterns, missed opportunities, and alternative approaches.

ANALYSIS FRAMEWORK:
- FAILURE POINT IDENTIFICATION: Pinpoint where and why the steps went wrong
- ERROR PATTERN ANALYSIS: Identify recurring mistakes or problematic approaches
- ALTERNATIVE APPROACHES: Suggest what could have been done differently
- PREVENTION STRATEGIES: Extract actionable insights to avoid similar failures

EXTRACTION PRINCIPLES:
- Extract GENERAL PRINCIPLES as well as SPECIFIC INSTRUCTIONS
- Focus on PATTERNS and RULES as well as particular instances

# Original Query
{query}

# Step Sequence Analysis
{step_sequence}

# Context Information
{context}

# Outcome
This step sequence was part of a failed trajectory.

""" + _output_format(count="1-3", what="step-level failure prevention insights",
                            when="Specific situations where this lesson should be remembered",
                            experience="Universal principle or rule extracted from the failure pattern")

COMPARATIVE_PROMPT = """You are an expert AI analyst comparing higher-scoring and lower-scoring step sequences to \
extract performance insights.

Your task is to identify the key differences between higher and lower performing approaches at the step level.
Focus on what made the higher-scoring approach more effective, even when both approaches may have had partial success.

SOFT COMPARATIVE ANALYSIS FRAMEWORK:
- PERFORMANCE FACTORS: Identify what specifically contributed to the higher score
- APPROACH DIFFERENCES: Compare methodologies and execution strategies
- EFFICIENCY ANALYSIS: Analyze why one approach was more efficient or effective
- OPTIMIZATION INSIGHTS: Extract lessons for improving performance

EXTRACTION PRINCIPLES:
- Focus on INCREMENTAL IMPROVEMENTS and performance optimization
- Extract QUALITY INDICATORS that differentiate better vs good approaches
- Identify REFINEMENT STRATEGIES that lead to higher scores
- Frame insights as PERFORMANCE ENHANCEMENT guidelines

# Original Query
{query}

# Higher-Scoring Step Sequence (Score: {higher_score})
{higher_steps}

# Lower-Scoring Step Sequence (Score: {lower_score})
{lower_steps}

""" + _output_format(count="1-2", what="performance improvement insights",
                            when="Specific scenarios where this performance insight applies",
                            experience="Detailed analysis of what made the higher-scoring approach more effective")

VALIDATION_PROMPT = """You are an expert AI analyst tasked with validating the quality and usefulness of extracted \
step-level task memories.

Your task is to assess whether the extracted task memory is actionable, accurate, and valuable for future agent \
executions.

VALIDATION CRITERIA:
- ACTIONABILITY: Is the task memory specific enough to guide future actions?
- ACCURACY: Does the task memory correctly reflect the patterns observed?
- RELEVANCE: Is the task memory applicable to similar future scenarios?
- CLARITY: Is the task memory clearly articulated and understandable?
- UNIQUENESS: Does the task memory provide novel insights or common knowledge?

# Task Memory to Validate
Condition: {condition}
Task Memory Content: {task_memory_content}

OUTPUT FORMAT:
Provide validation assessment:
```json
{{
  "is_valid": true/false,
  "score": 0.8,
  "feedback": "Detailed explanation of validation decision",
  "recommendations": "Suggestions for improvement if applicable"
}}
```

Score should be between 0.0 (poor quality) and 1.0 (excellent quality).
Mark as invalid if score is below 0.3 or if there are fundamental issues with the task memory."""

_JSON_BLOCK = re.compile(r"```(?:json)?\s*([\s\S]*?)\s*```")


def parse_json_output(text: str) -> Any:
  """The JSON a model answered: the first fenced block (```json ... ```, as ReMe parses), else the whole text,
  else the outermost [...] or {...} span. Raises ValueError when none parses."""
  if not isinstance(text, str):
    raise ValueError(f"model output must be a string, got {type(text).__name__}")
  candidates = _JSON_BLOCK.findall(text) + [text.strip()]
  for opening, closing in (("[", "]"), ("{", "}")):
    start, end = text.find(opening), text.rfind(closing)
    if 0 <= start < end:
      candidates.append(text[start:end + 1])
  for candidate in candidates:
    try:
      return json.loads(candidate)
    except (ValueError, RecursionError):
      continue
  raise ValueError("no JSON in the model's output")


def parse_insights(text: str) -> list[dict[str, Any]]:
  """The insights in a model's extraction output: objects with `when_to_use` (or ReMe's `condition`) and
  `experience` (others are left out). Raises ValueError when the output holds no JSON list or object."""
  parsed = parse_json_output(text)
  items = parsed if isinstance(parsed, list) else [parsed] if isinstance(parsed, dict) else None
  if items is None:
    raise ValueError(f"expected a JSON list of insights, got {type(parsed).__name__}")
  insights = []
  for item in items:
    if not isinstance(item, dict):
      continue
    condition = item.get("when_to_use", item.get("condition"))
    experience = item.get("experience")
    if isinstance(condition, str) and isinstance(experience, str) and condition.strip() and experience.strip():
      insights.append(item)
  return insights


def render_steps(messages: Sequence[Mapping[str, str]], max_message_chars: int = 2000) -> str:
  """Messages as text for a prompt (as flowllm's `merge_messages_content`: role, then content)."""
  return "\n".join(f"{m['role']}:\n{_bounded(m['content'], max_message_chars)}\n" for m in messages)


@gin.configurable
class LLMSummarizer(Summarizer):
  """ReMe's extraction and validation prompts through `generate` (a batch of prompts -> a batch of texts; gin:
  `LLMSummarizer.generate = @summarizer/OpenAIGenerate()`, `@summarizer/CheckpointGenerate()` or
  `@summarizer/LivePolicyGenerate()`, `evolver.models.generate`). A memory's `author` is `model`, by default the
  adapter's `model` (the endpoint's model, the checkpoint, "live_policy"), else "llm". Any failure of `generate`
  raises SummarizerUnavailable with its message.

  Per task group: one success prompt per success, one failure prompt per failure (at most `max_per_kind` of
  each), and, when scores differ, ReMe's soft comparison of the highest against the lowest scoring episode.
  Records are validated with ReMe's validation prompt (`validate=False` skips it): kept when not marked invalid
  and scored at least `validation_threshold` (the score becomes the record's `score`). An answer without
  parseable JSON, at extraction or validation, is dropped and counted in stats["unparseable"] (ReMe would keep
  an unparseable validation at 0.5).
  """

  def __init__(self, generate: Generate, *, model: str | None = None, validate: bool = True,
               validation_threshold: float = VALIDATION_THRESHOLD, max_per_kind: int = 2,
               max_message_chars: int = 2000, **kwargs):
    super().__init__(**kwargs)
    self.generate = generate
    self.author = model or str(getattr(generate, "model", None) or "llm")
    self.validate = validate
    self.validation_threshold = validation_threshold
    self.max_per_kind = max_per_kind
    self.max_message_chars = max_message_chars

  def _generate(self, prompts: list[str]) -> list[str]:
    if not prompts:
      return []
    try:
      outputs = list(self.generate(prompts))
    except SummarizerUnavailable:
      raise
    except Exception as error:
      raise SummarizerUnavailable(f"the summarizer's model failed: {error.__class__.__name__}: {error}") from error
    if len(outputs) != len(prompts):
      raise SummarizerUnavailable(f"the summarizer's model answered {len(outputs)} texts for {len(prompts)} prompts")
    return outputs

  def _context(self, episode: Episode) -> str:
    return f"Query: {episode.query}\nScore: {episode.score:.2f}"

  def extract(self, successes: list[Episode], failures: list[Episode], workspace_id: str,
              stats: dict[str, int]) -> list[TaskMemory]:
    jobs: list[tuple[str, list[Episode], str]] = []  # (kind, episodes, prompt)
    for kind, episodes, template in (("success", successes, SUCCESS_PROMPT), ("failure", failures, FAILURE_PROMPT)):
      for group in _groups(episodes).values():
        for episode in group[:self.max_per_kind]:
          jobs.append((kind, [episode], template.format(
              query=episode.query, context=self._context(episode),
              step_sequence=render_steps(episode.messages, self.max_message_chars))))
    for group in _groups(successes + failures).values():
      ranked = sorted(group, key=lambda e: -e.score)
      high, low = ranked[0], ranked[-1]
      if high.score > low.score:
        jobs.append(("comparative", [high, low], COMPARATIVE_PROMPT.format(
            query=high.query, higher_score=f"{high.score:.2f}", lower_score=f"{low.score:.2f}",
            higher_steps=render_steps(high.messages, self.max_message_chars),
            lower_steps=render_steps(low.messages, self.max_message_chars))))
    memories = []
    for (kind, episodes, _), output in zip(jobs, self._generate([prompt for _, _, prompt in jobs])):
      try:
        insights = parse_insights(output)
      except ValueError:
        stats["unparseable"] += 1
        continue
      for insight in insights:
        tags = insight.get("tags")
        extra = {"tags": [str(t) for t in tags] if isinstance(tags, list) else None}
        for key in ("confidence", "step_type", "tools_used"):
          if key in insight:
            extra[key] = insight[key]
        try:
          memories.append(TaskMemory(
              workspace_id=workspace_id, when_to_use=str(insight.get("when_to_use", insight.get("condition"))),
              content=str(insight["experience"]), score=0.0, author=self.author,
              metadata=_metadata(episodes, kind, **extra)))
        except ExperienceError:
          continue
    return memories

  def validate_more(self, memories: list[TaskMemory], stats: dict[str, int]) -> list[TaskMemory]:
    if not self.validate or not memories:
      return memories
    outputs = self._generate([VALIDATION_PROMPT.format(condition=m.when_to_use, task_memory_content=m.content)
                              for m in memories])
    kept = []
    for memory, output in zip(memories, outputs):
      try:
        verdict = parse_json_output(output)
        if not isinstance(verdict, dict):
          raise ValueError("not an object")
        score = _number(verdict.get("score", 0.5), "score")
      except (ValueError, ExperienceError):
        stats["unparseable"] += 1
        continue
      if verdict.get("is_valid", True) is not False and score >= self.validation_threshold:
        memory.score = score
        kept.append(memory)
    return kept
