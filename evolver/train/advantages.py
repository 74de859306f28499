"""Advantage functions of the RL step: the step's scored rollouts -> one advantage per sampled turn of each.

  credit = grpo_turn_advantages(rollouts, step=step)   # TurnCredit: [np.ndarray [turns] float32 per rollout]

This is the RL step's pluggable credit assignment (gin: `train_grpo.advantage_fn = @grpo_turn_advantages`). The
loop broadcasts each turn's value to that turn's sampled tokens (the rollout's `turn_spans`), so a function that
returns different values per turn (step-level credit: ADCA, anchor-state grouping) changes which actions are
reinforced without touching the loss. Plain GRPO gives every turn of an episode its episode's group advantage.

An `AdvantageFn` takes the rollouts that train this step (errored episodes already left out; a task's samples
share `group`) and the step's 0-based index, and returns a `TurnCredit`: a list aligned with the rollouts, each
`[r.turns]` float32, and the step's credit metrics (logged under `credit/`). One that needs more than the default
per-turn records names the `RolloutConfig` flags in its `rollout_records` attribute (e.g. `("record_measures",)`
for the judges of step-level credit, `evolver.train.credit`); `train_grpo` turns them on.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gin
import jax.numpy as jnp
import numpy as np

from evolver.rl import losses
from evolver.rollout import Rollout



class TurnCredit(NamedTuple):
  """An advantage function's answer: one `[turns]` float32 array per rollout, and metrics (name -> number)."""

  advantages: list[np.ndarray]
  metrics: dict[str, Any]


AdvantageFn = Callable[..., TurnCredit]  # (rollouts, *, step: int) -> TurnCredit


def rollout_records(advantage_fn: AdvantageFn) -> tuple[str, ...]:
  """The `RolloutConfig` flags `advantage_fn` needs on (its `rollout_records` attribute; () for none)."""
  return tuple(getattr(advantage_fn, "rollout_records", ()))


def group_advantages(rewards: Sequence[float], groups: Sequence[int], eps: float = 1e-6) -> np.ndarray:
  """GRPO advantages per trajectory `[N]` float32: (R - group mean) / (group std + eps), std unbiased; group ids
  are renumbered densely (`rl.losses.grpo_advantages`)."""
  if not len(rewards):
    return np.zeros([0], np.float32)
  _, dense = np.unique(np.asarray(groups), return_inverse=True)
  return np.asarray(losses.grpo_advantages(jnp.asarray(rewards, jnp.float32), jnp.asarray(dense),
                                           int(dense.max()) + 1, eps=eps))


def episode_advantages(rollouts: Sequence[Rollout], eps: float = 1e-6) -> np.ndarray:
  """GRPO's group advantage of each rollout `[N]` float32 (its reward against its group's)."""
  return group_advantages([r.reward for r in rollouts], [r.group for r in rollouts], eps=eps)


@gin.configurable
def grpo_turn_advantages(rollouts: Sequence[Rollout], *, step: int = 0, eps: float = 1e-6) -> TurnCredit:
  """Outcome credit: every turn of a rollout gets its episode's GRPO group advantage."""
  del step
  values = episode_advantages(rollouts, eps)
  return TurnCredit([np.full([r.turns], value, np.float32) for r, value in zip(rollouts, values)], {})


def check_turn_advantages(rollouts: Sequence[Rollout], credit: TurnCredit) -> list[np.ndarray]:
  """Validates an AdvantageFn's output: one finite `[turns]` array per rollout."""
  if not isinstance(credit, TurnCredit):
    raise TypeError(f"an advantage function must return a TurnCredit (advantages, metrics), got "
                    f"{type(credit).__name__}")
  advantages = credit.advantages
  if len(advantages) != len(rollouts):
    raise ValueError(f"the advantage function returned {len(advantages)} arrays for {len(rollouts)} rollouts")
  out = []
  for rollout, values in zip(rollouts, advantages):
    values = np.asarray(values, np.float32)
    if values.shape != (rollout.turns,):
      raise ValueError(f"{rollout.item_id} (sample {rollout.sample}) has {rollout.turns} sampled turns but the "
                       f"advantage function gave shape {values.shape}")
    if not np.all(np.isfinite(values)):
      raise ValueError(f"{rollout.item_id} (sample {rollout.sample}) got non-finite advantages {values}")
    out.append(values)
  return out
