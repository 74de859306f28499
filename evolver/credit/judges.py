"""The `oracle` and `env` step judges: each step of a rollout GOOD or BAD from the measures the env reported
right before and right after it (`Rollout.step_measures`, one `{"before": {...}, "after": {...}}` per sampled
turn; each side `TextEnv.measures()`: `{"cost_to_go": int | None, "progress": float | None}`).

  good, known = oracle_labels(rollout.step_measures)   # [turns] bool each
  good, known = env_labels(rollout.step_measures)

- oracle: GOOD when the env's cost to go (its own measure of the least remaining cost to finish) went down;
  where it is unchanged and both progress values are numbers, GOOD when progress went up (sql, where every
  query costs a turn: the result moved toward the answer); BAD otherwise (the cost rose, or nothing moved).
- env: GOOD when the env's own progress measure went up; BAD when it stayed or fell.

A step that misses a measure the judge reads (None: an env without `measures()`, or one that raised) is not
judged: `known` is False there and the label False; the caller decides what such steps get
(`evolver.train.credit` gives them the outcome's label).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

StepMeasures = Sequence[Mapping[str, Mapping[str, Any] | None] | None]


def _read(step: Mapping[str, Mapping[str, Any] | None] | None, side: str, name: str) -> Any:
  """`step[side][name]`, or None where any part is missing."""
  if step is None or step.get(side) is None:
    return None
  return step[side].get(name)


def _number(value: Any) -> bool:
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def _step_oracle(step: Mapping[str, Mapping[str, Any] | None] | None) -> tuple[bool, bool]:
  """(GOOD, known) of one step by the oracle rule (see the module docstring)."""
  cost_before, cost_after = _read(step, "before", "cost_to_go"), _read(step, "after", "cost_to_go")
  if not (_number(cost_before) and _number(cost_after)):
    return False, False
  if cost_after != cost_before:
    return cost_after < cost_before, True
  progress_before, progress_after = _read(step, "before", "progress"), _read(step, "after", "progress")
  return _number(progress_before) and _number(progress_after) and progress_after > progress_before, True


def _step_env(step: Mapping[str, Mapping[str, Any] | None] | None) -> tuple[bool, bool]:
  """(GOOD, known) of one step by the env rule: progress rose."""
  before, after = _read(step, "before", "progress"), _read(step, "after", "progress")
  if not (_number(before) and _number(after)):
    return False, False
  return after > before, True


def _labels(step_measures: StepMeasures, judge) -> tuple[np.ndarray, np.ndarray]:
  pairs = [judge(step) for step in step_measures]
  good = np.asarray([g for g, _ in pairs], bool).reshape(len(pairs))
  known = np.asarray([k for _, k in pairs], bool).reshape(len(pairs))
  return good, known


def oracle_labels(step_measures: StepMeasures) -> tuple[np.ndarray, np.ndarray]:
  """The oracle judge's labels of a rollout's steps.

  Args:
    step_measures: `Rollout.step_measures`, one `{"before": measures, "after": measures}` per turn.
  Returns:
    good: [turns] bool, True = GOOD: the cost to go fell, or it held and progress rose (both progress values
      numbers); False = BAD, and False where not known.
    known: [turns] bool, False where the cost to go before or after the step is missing (None).
  """
  return _labels(step_measures, _step_oracle)


def env_labels(step_measures: StepMeasures) -> tuple[np.ndarray, np.ndarray]:
  """The env judge's labels of a rollout's steps.

  Args:
    step_measures: `Rollout.step_measures`, one `{"before": measures, "after": measures}` per turn.
  Returns:
    good: [turns] bool, True = GOOD: progress rose; False = BAD, and False where not known.
    known: [turns] bool, False where progress before or after the step is missing (None).
  """
  return _labels(step_measures, _step_env)
