"""Synthetic task sets and their mixture with the original tasks (self-questioning 4/4).

A task set is a list of `SyntheticTask` records, one JSON object a line:

  {"spec": <TaskSpec JSON>, "actions": [raw action, ...], "description": "...",
   "source": {"proposer": "hindsight" | "llm", "world": <train index explored>, "episode": <its episode>}}

`save_taskset` writes atomically through the path layer (`evolver.paths`: local or `gs://`); `load_taskset`
validates every line and names the line that is wrong.

`TaskMixture` is AgentEvolver's `UnifiedMixtureStrategy.mix_data` (`agentevolver/module/task_manager/
data_mixture.py`, configured by `task_manager.mixture.use_original_tasks` and `.synthetic_data_ratio`):

  - with `use_original_tasks`, the pool holds every original task; without, none;
  - plus n = floor(len(originals) * synthetic_data_ratio) synthetic tasks, drawn without replacement (all of them,
    with a warning, when fewer exist: how AgentEvolver's `run_overall.sh` asks for synthetic tasks only, with
    `use_original_tasks=False, synthetic_data_ratio=999999`);
  - shuffled, with the mixture's seed.

AgentEvolver computes n as `int(len(original_tasks) * synthetic_ratio)` in floating point, which gives 28 for
0.29 x 100; here the ratio is taken as the decimal it is written as (`fractions.Fraction(repr(ratio))`), so n is
exact. The pool is built once; `draw(step, per_step)` walks it in epochs, each epoch a permutation seeded by
(seed, epoch), so a step's tasks are a pure function of (seed, step, per_step) and every pool task comes once
per epoch.
"""

from __future__ import annotations

import dataclasses
import fractions
import io
import json
import math
import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from evolver import paths
from evolver.data.trajectory import OPENING_REPLY, Message, Trajectory
from evolver.envs.base import EnvError, TaskSpec, react_turn
from evolver.rollout import Task

STATE_FILE = "synthetic_tasks.jsonl"
_FIELDS = ("spec", "actions", "description", "source")
_SOURCE_FIELDS = ("proposer", "world", "episode")


class TaskSetError(ValueError):
  """A task set file or record that is malformed; the message names the line."""


@dataclasses.dataclass(frozen=True)
class SyntheticTask:
  """One generated task: its spec, the ground-truth actions (raw, what `step` accepts) that solve it, a
  description of the outcome, and its source {"proposer", "world", "episode"}."""

  spec: TaskSpec
  actions: tuple[str, ...]
  description: str
  source: Mapping[str, Any]

  def to_json(self) -> dict[str, Any]:
    return {"spec": self.spec.to_json(), "actions": list(self.actions), "description": self.description,
            "source": dict(self.source)}

  @classmethod
  def from_json(cls, data: Any) -> "SyntheticTask":
    if not isinstance(data, dict):
      raise TaskSetError(f"a task record must be a JSON object, got {type(data).__name__}")
    if sorted(data) != sorted(_FIELDS):
      raise TaskSetError(f"a task record has exactly the fields {list(_FIELDS)}, got {sorted(data)}")
    try:
      spec = TaskSpec.from_json(data["spec"])
    except EnvError as error:
      raise TaskSetError(f"bad spec: {error}") from None
    actions, description, source = data["actions"], data["description"], data["source"]
    if not isinstance(actions, list) or not all(isinstance(a, str) for a in actions):
      raise TaskSetError("a task record's 'actions' must be a list of strings")
    if not isinstance(description, str):
      raise TaskSetError("a task record's 'description' must be a string")
    if not isinstance(source, dict) or sorted(source) != sorted(_SOURCE_FIELDS):
      raise TaskSetError(f"a task record's 'source' must have exactly {list(_SOURCE_FIELDS)}, got {source!r:.80}")
    return cls(spec=spec, actions=tuple(actions), description=description, source=dict(source))

  def to_task(self) -> Task:
    return Task.from_spec(self.spec)


def to_tasks(records: Sequence[SyntheticTask]) -> list[Task]:
  """The rollout tasks of `records` (`Task.from_spec`), in order."""
  return [record.to_task() for record in records]


def ground_truth_trajectory(record: SyntheticTask, env: Any) -> Trajectory:
  """The task solved by its ground truth, as an AgentGym conversation (instruction, "Ok.", the task, then each
  action as a ReAct turn and the env's answer), rewarded by `env` (a fresh built-in env of the task's name): what
  a synthetic task can give the experience pool or a BC set."""
  observation = env.reset_spec(record.spec)
  messages = [Message("user", env.instruction()), Message("assistant", OPENING_REPLY), Message("user", observation)]
  reward, success = 0.0, False
  for action in record.actions:
    messages.append(Message("assistant", react_turn("I follow the plan that reaches the goal.", action)))
    observation, reward, done, info = env.step(action)
    messages.append(Message("user", observation))
    success = bool(info["success"])
    if done:
      break
  return Trajectory(item_id=record.spec.item_id, messages=messages, env=record.spec.env, task_index=record.spec.world,
                    split=record.spec.split, reward=float(reward), success=success, task_spec=record.spec.to_json())


def dumps_taskset(records: Sequence[SyntheticTask]) -> bytes:
  """The JSONL bytes of `records` (one sorted-key JSON object a line)."""
  return "".join(json.dumps(r.to_json(), sort_keys=True, ensure_ascii=False) + "\n" for r in records).encode("utf-8")


def loads_taskset(data: bytes, *, name: str = "task set") -> list[SyntheticTask]:
  """Parses JSONL bytes (blank lines skipped); a malformed line raises TaskSetError naming it."""
  records = []
  for number, line in enumerate(io.StringIO(data.decode("utf-8")), start=1):
    if not line.strip():
      continue
    try:
      records.append(SyntheticTask.from_json(json.loads(line)))
    except (ValueError, TaskSetError) as error:
      raise TaskSetError(f"{name}, line {number}: {error}") from None
  return records


def save_taskset(path: paths.PathLike, records: Sequence[SyntheticTask]) -> None:
  """Writes `records` to `path` (local or a URI, `evolver.paths`) as JSONL, atomically (the file is either the old
  one or the whole new one)."""
  paths.write_bytes(path, dumps_taskset(records))


def load_taskset(path: paths.PathLike) -> list[SyntheticTask]:
  return loads_taskset(paths.as_path(path).read_bytes(), name=str(path))


# ----------------------------------------------------------------------------------------------------------
# The mixture.
# ----------------------------------------------------------------------------------------------------------


def synthetic_count(num_originals: int, ratio: float) -> int:
  """floor(num_originals * ratio), the ratio taken as the decimal it is written as (module docstring)."""
  if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio < 0:
    raise ValueError(f"synthetic_data_ratio must be a finite number >= 0, got {ratio!r}")
  return math.floor(num_originals * fractions.Fraction(repr(float(ratio))))


class TaskMixture:
  """The RL loop's task pool: original tasks and synthetic ones, mixed as AgentEvolver mixes them (module
  docstring).

  Args:
    originals: the original tasks (e.g. the exploration slice of each env's train split).
    synthetic: the synthetic tasks: records (`load_taskset(path)`, kept whole in the state files) or spec Tasks.
    use_original_tasks: whether the pool holds the originals.
    synthetic_data_ratio: synthetic tasks in the pool per original task (relative to len(originals) also when
      the originals are not used).
    seed: the pool's draw and shuffle, and `draw`'s epochs.

  Attributes:
    pool: the mixed, shuffled tasks.
    records, synthetic: the synthetic task set (records; a bare spec Task's has no ground truth), and its tasks.
    synthetic_wanted, synthetic_used: floor(len(originals) * ratio), and how many the pool holds.
  """

  def __init__(self, originals: Sequence[Task], synthetic: Sequence[Task | SyntheticTask], *,
               use_original_tasks: bool = True, synthetic_data_ratio: float = 0.0, seed: int = 0):
    self.originals = list(originals)
    self.use_original_tasks = bool(use_original_tasks)
    self.synthetic_data_ratio = synthetic_data_ratio
    self.seed = seed
    self.synthetic_wanted = synthetic_count(len(self.originals), synthetic_data_ratio)
    self._mix([_as_record(task) for task in synthetic])

  def _mix(self, records: list[SyntheticTask]) -> None:
    self.records = records
    self.synthetic = to_tasks(records)
    rng = np.random.default_rng([self.seed, 0])
    pool = list(self.originals) if self.use_original_tasks else []
    wanted = self.synthetic_wanted
    if wanted > len(self.synthetic):
      warnings.warn(f"the mixture wants {wanted} synthetic tasks ({len(self.originals)} originals x ratio "
                    f"{self.synthetic_data_ratio}) but the task set has {len(self.synthetic)}: using all of them",
                    stacklevel=3)
      chosen = list(self.synthetic)
    else:
      chosen = [self.synthetic[i] for i in sorted(rng.choice(len(self.synthetic), size=wanted, replace=False))]
    self.synthetic_used = len(chosen)
    pool.extend(chosen)
    if not pool:
      raise ValueError("the task mixture is empty: use_original_tasks is off and synthetic_data_ratio "
                       f"{self.synthetic_data_ratio} x {len(self.originals)} originals selects no synthetic task "
                       f"(the task set has {len(self.synthetic)})")
    self.pool = [pool[i] for i in rng.permutation(len(pool))]

  def draw(self, step: int, per_step: int) -> list[Task]:
    """The `per_step` tasks of RL step `step`: positions [step * per_step, (step + 1) * per_step) of the pool
    read epoch after epoch, each epoch in the order of a permutation seeded by (seed, epoch)."""
    if step < 0 or per_step < 1:
      raise ValueError(f"draw needs step >= 0 and per_step >= 1, got step {step}, per_step {per_step}")
    size = len(self.pool)
    out, orders = [], {}
    for position in range(step * per_step, (step + 1) * per_step):
      epoch = position // size
      if epoch not in orders:
        orders[epoch] = np.random.default_rng([self.seed, 1, epoch]).permutation(size)
      out.append(self.pool[orders[epoch][position % size]])
    return out

  def stats(self) -> dict[str, int]:
    return {"pool": len(self.pool), "originals": len(self.originals) if self.use_original_tasks else 0,
            "synthetic_available": len(self.synthetic), "synthetic_wanted": self.synthetic_wanted,
            "synthetic_used": self.synthetic_used}

  def state_files(self) -> dict[str, bytes]:
    """The synthetic task set the mixture draws from (`STATE_FILE`, JSONL), so that a resumed run mixes the same
    set even if the file it was generated into has changed since."""
    return {STATE_FILE: dumps_taskset(self.records)}

  def load_state_files(self, files: Mapping[str, bytes]) -> None:
    """Restores `state_files`' synthetic tasks and rebuilds the pool from them ({} = a fresh run: unchanged)."""
    if not files:
      return
    if STATE_FILE not in files:
      raise ValueError(f"the task mixture's state has no {STATE_FILE!r} (files: {sorted(files)})")
    self._mix(loads_taskset(files[STATE_FILE], name=STATE_FILE))


def _as_record(task: Task | SyntheticTask) -> SyntheticTask:
  """A synthetic task as a record; a bare spec Task gets no ground truth and an unknown source."""
  if isinstance(task, SyntheticTask):
    return task
  if not isinstance(task, Task) or task.spec is None:
    raise TypeError(f"synthetic tasks must be SyntheticTask records or spec Tasks (Task.from_spec), got {task!r:.80}")
  return SyntheticTask(spec=task.spec, actions=(), description="", source=dict.fromkeys(_SOURCE_FIELDS))
