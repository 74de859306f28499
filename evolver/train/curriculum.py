"""Which exploration tasks an RL step draws: uniformly (the old behaviour) or by a pass-rate curriculum.

  source = PassRateCurriculum()                        # gin: train_grpo.task_source = @PassRateCurriculum()
  source.bind(envs, start=80, count=320, seed=0)       # the exploration slice of each env's `train` split
  tasks = source.draw(step, round_index, count)        # a pure function of (seed, step, round) and the state
  source.observe(rollouts)                             # the step's scored episodes update the pass rates

A GRPO group whose episodes all succeed or all fail has zero advantage: it spends its episodes and trains nothing.
`PassRateCurriculum` keeps each task's recent pass rate (its last `window` scored episodes) and draws the tasks whose
rate is strictly between 0 and 1, and those never drawn, with weight 1, the settled ones (every recent episode
succeeded, or every one failed) with weight `floor`: a floor of exploration, since a settled task's rate is an
estimate and the policy changes. An env is chosen uniformly first, as `draw_tasks` does, so the env mix is the
uniform draw's. The rates are kept with every checkpoint (`state_files`: the source is a `StateOwner` of the
loop), so a resumed run draws exactly what it would have drawn.

How it meets the other pieces of the RL step (`evolver.train.rl`): the source draws the step's tasks before the
extensions' `choose_tasks` (self-questioning's mixture then replaces the step's tasks with its own draw, so the
curriculum then only decides DAPO's refills); DAPO's dynamic sampling asks it for its refill rounds (round >= 1),
which no extension's `choose_tasks` changes; only tasks of the exploration slice have rates (synthetic tasks and
other splits are not counted); the experience pool's hybrid keep ratio acts within each group, whichever task it is.
"""

from __future__ import annotations

import collections
import json
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import numpy as np

from evolver.rollout import Rollout, Task
from evolver.train.slices import draw_tasks

STATE_FILE = "pass_rates.json"


class UniformTasks:
  """Each task of the exploration slice equally likely (`slices.draw_tasks`): the draw before the curriculum."""

  name = "task_source"

  def bind(self, envs: Sequence[str], *, start: int, count: int, seed: int) -> None:
    self.envs, self.start, self.count, self.seed = list(envs), start, count, seed

  def draw(self, step: int, round_index: int, count: int) -> list[Task]:
    """`count` tasks for RL step `step`; round 0 is the step's draw, later rounds DAPO's refills."""
    if round_index == 0:
      return draw_tasks(self.envs, self.start, self.count, count, self.seed, step)
    return draw_tasks(self.envs, self.start, self.count, count, self.seed * 1_000_003 + round_index, step)

  def observe(self, rollouts: Sequence[Rollout]) -> dict[str, Any]:
    del rollouts
    return {}

  def state_files(self) -> dict[str, bytes]:
    return {}

  def load_state_files(self, files: Mapping[str, bytes]) -> None:
    del files


@gin.configurable
class ShuffledTasks(UniformTasks):
  """Every task of the exploration slice (all envs together) once per epoch, in an order seeded by (seed, epoch):
  step s takes positions [s * n, (s + 1) * n) of that sequence, so a short run covers its slice evenly (uniform
  draws with replacement leave some tasks undrawn: 64 draws reach ~35 of 48). Refill rounds draw uniformly."""

  name = "shuffled_tasks"

  def draw(self, step: int, round_index: int, count: int) -> list[Task]:
    if round_index:
      return super().draw(step, round_index, count)
    pool = [Task(env, self.start + i, "train") for env in self.envs for i in range(self.count)]
    out = []
    for position in range(step * count, (step + 1) * count):
      epoch, offset = divmod(position, len(pool))
      out.append(pool[np.random.default_rng([self.seed, 3, epoch]).permutation(len(pool))[offset]])
    return out


@gin.configurable
class PassRateCurriculum(UniformTasks):
  """Draws tasks whose recent pass rate is in (0, 1) (and unseen ones) more often than settled ones (module
  docstring).

  Args:
    window: the recent scored episodes a task's pass rate is the mean of (e.g. two groups of 8).
    floor: the weight of a settled task (all of its recent episodes succeeded, or all failed), against 1 for a
      task whose rate is in (0, 1) and for a task not yet drawn; in (0, 1].
  """

  name = "curriculum"

  def __init__(self, window: int = 16, floor: float = 0.1):
    if window < 1 or not 0.0 < floor <= 1.0:
      raise ValueError(f"PassRateCurriculum needs window >= 1 and 0 < floor <= 1, got {window}, {floor}")
    self.window, self.floor = window, floor
    self.outcomes: dict[str, collections.deque[float]] = {}

  @staticmethod
  def key(env: str, index: int) -> str:
    return f"{env}/{index}"

  def pass_rate(self, env: str, index: int) -> float | None:
    """The mean success of the task's last `window` scored episodes, or None before its first."""
    recent = self.outcomes.get(self.key(env, index))
    return float(np.mean(recent)) if recent else None

  def weights(self, env: str) -> np.ndarray:
    """`[count]` draw weights of the env's slice tasks (1: mixed or unseen; `floor`: settled)."""
    out = np.ones(self.count)
    for i in range(self.count):
      recent = self.outcomes.get(self.key(env, self.start + i))
      if recent and (min(recent) == max(recent)):
        out[i] = self.floor
    return out

  def draw(self, step: int, round_index: int, count: int) -> list[Task]:
    rng = np.random.default_rng([self.seed, step, round_index, 2])
    names = rng.choice(self.envs, size=count)
    tasks = []
    for name in names:
      weights = self.weights(str(name))
      tasks.append(Task(str(name), self.start + int(rng.choice(self.count, p=weights / weights.sum())), "train"))
    return tasks

  def observe(self, rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """Adds the scored episodes of the slice's tasks to their recent outcomes; returns the curriculum's counts
    over the slice: `mixed`, `settled`, `unseen` tasks."""
    for r in rollouts:
      if r.failed or r.split != "train" or getattr(r, "task_spec", None) is not None or r.env not in self.envs:
        continue
      if not self.start <= r.task_index < self.start + self.count:
        continue
      self.outcomes.setdefault(self.key(r.env, r.task_index),
                               collections.deque(maxlen=self.window)).append(float(r.success))
    settled = sum(min(d) == max(d) for d in self.outcomes.values())
    total = len(self.envs) * self.count
    return {"mixed": len(self.outcomes) - settled, "settled": settled, "unseen": total - len(self.outcomes)}

  def state_files(self) -> dict[str, bytes]:
    return {STATE_FILE: json.dumps({k: list(v) for k, v in sorted(self.outcomes.items())}).encode()}

  def load_state_files(self, files: Mapping[str, bytes]) -> None:
    self.outcomes = {}
    if STATE_FILE in files:
      try:
        saved = json.loads(files[STATE_FILE])
      except ValueError as error:
        raise ValueError(f"the checkpoint's {STATE_FILE} is not JSON: {error}") from None
      self.outcomes = {k: collections.deque((float(x) for x in v), maxlen=self.window) for k, v in saved.items()}
