"""One layout of each env's `train` split that every run shares (gin_configs/base.gin: `TaskSlices.*`).

  expert      D_s, the expert demonstrations BC learns from              [0, 80)
  exploration the instructions AgentEvol, GRPO and DPO explore           [80, 400)
  val         model selection and early stopping                          [400, 412)

The `eval` split is never sliced: it is only for the final held-out figures. "BC on 5x the expert data" widens the
expert slice to [0, 400) (`TaskSlices.expert_count = 400`); such a run explores nothing, so its expert slice may
cover the exploration slice, but every slice a method uses must be disjoint from the others it uses
(`TaskSlices.check_disjoint`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import gin
import numpy as np

from evolver import envs as envs_lib
from evolver.rollout import Task


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TaskSlices:
  """[start, start + count) of each env's `train` split per use (module docstring); the defaults are base.gin's."""

  expert_start: int = 0
  expert_count: int = 80
  explore_start: int = 80
  explore_count: int = 320
  val_start: int = 400
  val_count: int = 12
  # An overfit probe's setting, never a result's: val may lie inside the exploration slice, so that val measures
  # the very tasks the run trains on (gin_configs/rl_signal/probe.gin).
  val_in_explore: bool = False

  def __post_init__(self):
    for name in ("expert", "explore", "val"):
      start, count = getattr(self, f"{name}_start"), getattr(self, f"{name}_count")
      if start < 0 or count < 0:
        raise ValueError(f"TaskSlices.{name}_start and _count must be >= 0, got [{start}, {start + count})")

  def bounds(self, name: str) -> tuple[int, int]:
    """(start, count) of the slice `name`: "expert", "explore" or "val"."""
    if name not in ("expert", "explore", "val"):
      raise ValueError(f"unknown slice {name!r}; use expert, explore or val")
    return getattr(self, f"{name}_start"), getattr(self, f"{name}_count")

  @property
  def val_indices(self) -> list[int]:
    return list(range(self.val_start, self.val_start + self.val_count))

  def check_disjoint(self, *names: str) -> None:
    """Raises ValueError when two of the named (non-empty) slices overlap (val and explore may, with
    `val_in_explore`)."""
    for i, a in enumerate(names):
      for b in names[i + 1:]:
        if self.val_in_explore and {a, b} == {"val", "explore"}:
          continue
        (sa, ca), (sb, cb) = self.bounds(a), self.bounds(b)
        if ca > 0 and cb > 0 and sa < sb + cb and sb < sa + ca:
          raise ValueError(f"the {a} slice [{sa}, {sa + ca}) of `train` overlaps the {b} slice [{sb}, {sb + cb}) "
                           "(TaskSlices in gin_configs/base.gin)")


def train_tasks_available(env_names: Sequence[str]) -> dict[str, int]:
  """{env: its number of `train` tasks}."""
  out = {}
  for name in env_names:
    env = envs_lib.make(name)
    try:
      out[name] = env.num_tasks("train")
    finally:
      env.close()
  return out


def slice_tasks(env_names: Sequence[str], start: int, count: int) -> list[Task]:
  """Tasks [start, start + count) of each env's `train` split; an error names an env that has fewer."""
  tasks = []
  for name, available in train_tasks_available(env_names).items():
    if start + count > available:
      raise ValueError(f"the slice [{start}, {start + count}) does not fit {name}'s {available} train tasks; "
                       "lower its count or start (TaskSlices)")
    tasks.extend(Task(name, index, "train") for index in range(start, start + count))
  return tasks


def draw_tasks(env_names: Sequence[str], start: int, count: int, per_step: int, seed: int, step: int) -> list[Task]:
  """The tasks of RL step `step`: `per_step` draws (env, index) from the slice, a pure function of (seed, step),
  so a resumed run draws the same ones."""
  rng = np.random.default_rng([seed, step])
  names = rng.choice(list(env_names), size=per_step)
  indices = rng.integers(start, start + count, size=per_step)
  return [Task(str(n), int(i), "train") for n, i in zip(names, indices)]
