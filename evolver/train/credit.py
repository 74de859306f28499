"""Step-level credit as the RL step's advantage function: ADCA (AgentEvolver's self-attributing, with three
judges) and anchor-state grouping (GiGPO), each turning the step's scored rollouts into one advantage per
sampled turn (`evolver.train.advantages.TurnCredit`).

  train_grpo.advantage_fn = @AdcaAdvantages()          # judge each step GOOD/BAD, then decouple or allocation
  AdcaAdvantages.judge = 'oracle'                       # 'oracle' | 'env' | 'llm'
  train_grpo.advantage_fn = @AnchorStateAdvantages()    # judge-free: steps from the same state form a group

Judging runs on the host, batched, outside the jitted step: `oracle` and `env` read the measures the rollout
recorded around each step (`RolloutConfig.record_measures`, which these functions ask `train_grpo` to turn on;
`evolver.credit.judges`), `llm` sends every trajectory to one batched `generate` call (`evolver.credit.llm`). A
step without a judgment (an env without measures, a reply that did not parse) gets the outcome's label (GOOD iff
its episode's group advantage is > 0) and is counted. The advantages themselves are pure jitted functions over
padded `[N, K]` step arrays (`evolver.rl.step_credit`); this file only lays the rollouts out as arrays and back.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import gin
import jax
import jax.numpy as jnp
import numpy as np

from evolver.credit import judges as judges_lib
from evolver.credit import llm as llm_lib
from evolver.experience.manager import task_query
from evolver.models.generate import Generate
from evolver.rl import step_credit
from evolver.rollout import Rollout
from evolver.train.advantages import TurnCredit, episode_advantages

JUDGES = ("oracle", "env", "llm")
SCHEMES = ("decouple", "allocation")


class StepLayout(NamedTuple):
  """The step's rollouts as padded step arrays: N rollouts, K >= the most turns (a power of two, >= 8, so that
  the jitted functions compile once for most steps)."""

  step_mask: np.ndarray   # [N, K] float32: 1 on each rollout's sampled turns
  group: np.ndarray       # [N] int32: dense ids of the rollouts' task groups, in [0, N)
  num_groups: int         # static size of the group axis (N: every id fits)


def step_layout(rollouts: Sequence[Rollout]) -> StepLayout:
  """Padded `[N, K]` step mask and dense group ids of `rollouts` (a task's samples share `group`)."""
  if not rollouts:
    raise ValueError("no rollouts to lay out")
  turns = np.asarray([r.turns for r in rollouts])
  width = max(8, 1 << int(max(int(turns.max()), 1) - 1).bit_length())
  step_mask = (np.arange(width)[None, :] < turns[:, None]).astype(np.float32)
  _, group = np.unique(np.asarray([r.group for r in rollouts]), return_inverse=True)
  return StepLayout(step_mask, group.astype(np.int32), len(rollouts))


def pad_steps(values: Sequence[np.ndarray], layout: StepLayout, dtype=np.float32) -> np.ndarray:
  """Per-rollout `[turns]` arrays -> `[N, K]` (zero past each rollout's turns)."""
  out = np.zeros(layout.step_mask.shape, dtype)
  for row, value in enumerate(values):
    out[row, :len(value)] = value
  return out


def unpad_steps(array: Any, rollouts: Sequence[Rollout]) -> list[np.ndarray]:
  """`[N, K]` -> each rollout's `[turns]` float32 slice."""
  array = np.asarray(array, np.float32)
  return [array[row, :r.turns].copy() for row, r in enumerate(rollouts)]


def score_gains(rollout: Rollout) -> np.ndarray:
  """`[turns]` float32: how much each step raised the env's score (`step_rewards` are the score after each step,
  so the first gain is measured from 0)."""
  scores = np.asarray(rollout.step_rewards, np.float32)
  if scores.shape != (rollout.turns,):
    raise ValueError(f"{rollout.item_id} (sample {rollout.sample}) recorded {scores.shape[0]} step rewards for "
                     f"{rollout.turns} sampled turns")
  return np.diff(scores, prepend=np.float32(0.0))


def anchor_state_ids(rollouts: Sequence[Rollout], layout: StepLayout) -> tuple[np.ndarray, int]:
  """Dense ids `[N, K]` int32 of each step's (task group, state key): steps of one task's samples taken from the
  same state share an id, as do repeats of a state inside one episode (padded steps: 0, ignored). Returns the ids
  and their static count N * K."""
  ids = np.zeros(layout.step_mask.shape, np.int32)
  seen: dict[tuple[int, str], int] = {}
  for row, rollout in enumerate(rollouts):
    if len(rollout.state_keys) != rollout.turns:
      raise ValueError(f"{rollout.item_id} (sample {rollout.sample}) recorded {len(rollout.state_keys)} state keys "
                       f"for {rollout.turns} sampled turns")
    for turn, key in enumerate(rollout.state_keys):
      ids[row, turn] = seen.setdefault((int(layout.group[row]), key), len(seen))
  return ids, ids.size


# ----------------------------------------------------------------------------------------------------------
# Judges
# ----------------------------------------------------------------------------------------------------------


def judge_scores(outcome: np.ndarray) -> np.ndarray:
  """The overall score a judge sees and the skip rules read, `[N]` float32: the reward rescaled to [-1, 1] by
  AgentEvolver's `rescale_score` with THRESHOLD 0 (prompt.py; its default `overall_score_source`
  "token_level_rewards", adca_grpo_pipeline.py), 2R - 1: > 0 (R > 0.5) is an advantageous outcome."""
  return 2.0 * np.asarray(outcome, np.float32) - 1.0


def judge_steps(rollouts: Sequence[Rollout], judge: str, scores: np.ndarray, *,
                generate: Generate | None = None) -> tuple[list[np.ndarray], int]:
  """Each rollout's step labels `[turns]` bool (True = GOOD) by `judge`, and how many steps fell back to the
  outcome's label (GOOD iff the rollout's overall score `scores[i]` > 0, as AgentEvolver falls back)."""
  if judge not in JUDGES:
    raise ValueError(f"unknown step judge {judge!r}; use one of {JUDGES}")
  if not rollouts:
    return [], 0
  if judge == "llm":
    if generate is None:
      raise ValueError("the llm judge needs a `generate` (e.g. AdcaAdvantages.generate = @judge/OpenAIGenerate())")
    prompts = [llm_lib.judge_prompt(task_query(r.messages[:r.opening_len]),
                                    llm_lib.trajectory_steps([m.content for m in r.messages[r.opening_len:]], r.turns),
                                    float(s))
               for r, s in zip(rollouts, scores)]
    labels, fell_back = llm_lib.llm_labels(generate, prompts, [r.turns for r in rollouts], [float(s) for s in scores])
    return [np.asarray(parsed, bool) for parsed in labels], sum(r.turns for r, f in zip(rollouts, fell_back) if f)
  label_fn = judges_lib.oracle_labels if judge == "oracle" else judges_lib.env_labels
  labels, fallbacks = [], 0
  for rollout, score in zip(rollouts, scores):
    if rollout.step_measures is None:
      raise ValueError(f"the {judge} judge reads the measures rollouts record around each step; "
                       f"{rollout.item_id} has none (RolloutConfig.record_measures is off)")
    good, known = label_fn(rollout.step_measures)
    fallbacks += int(np.sum(~known))
    labels.append(np.where(known, good, score > 0))
  return labels, fallbacks


# ----------------------------------------------------------------------------------------------------------
# Advantage functions
# ----------------------------------------------------------------------------------------------------------

_decouple = jax.jit(step_credit.adca_decouple,
                    static_argnames=("num_groups", "outcome_on_all_steps", "sqrt_k", "equal_trajectory_weight"))
_allocation = jax.jit(step_credit.adca_allocation,
                      static_argnames=("num_groups", "outcome_on_all_steps", "equal_trajectory_weight"))
_anchor_state = jax.jit(step_credit.anchor_state_advantages,
                        static_argnames=("num_groups", "num_states", "normalize_std", "cross_steps"))
SKIP_TYPES = (None, "skip_small_adv", "skip_all_neg")


@gin.configurable
class AdcaAdvantages:
  """ADCA step credit (AgentEvolver's self-attributing) for the first `prm_steps` RL steps, then GRPO's.

  Per step: the outcome's GRPO advantage; the trajectories a skip rule skips get no judge call and the outcome's
  label on every step (semantic_attribution.py `evaluate_step_flags_parallel`); the others are judged; then the
  scheme's step rewards, combined with the group-z-scored outcome and summed from each step to the end
  (`evolver.rl.step_credit`). Steps, of a trajectory and of training, are numbered from 0 (the numbering is
  stated in `evolver.rl.step_credit`'s docstring). Defaults are those of AgentEvolver's config/agentevolver.yaml
  `adca_grpo` except `skip_type` (below).

  Args:
    judge: "oracle" (the env's optimal cost to go shrinks, or its progress rises where the cost is flat), "env"
      (the env's own progress rises) or "llm" (`evolver.credit.llm`, through `generate`).
    scheme: "decouple" or "allocation".
    prm_steps: RL updates that use step credit: `step` (the 0-based update index `__call__` receives, passed
      unchanged to `step_credit.adca_alpha`) < prm_steps, i.e. updates 0 .. prm_steps - 1; later updates use
      GRPO's outcome advantage. AgentEvolver counts updates from 1 and tests `global_steps < prm_steps`, so its
      prm_steps = P covers P - 1 updates; here P covers P.
    alpha: the step rewards' weight; `cosine` decays it to `alpha_min` over `prm_steps` (p = step / prm_steps: the
      full alpha at update 0).
    fix_base: `decouple`'s step reward magnitude (+fix_base GOOD, -fix_base BAD).
    outcome_on_all_steps: add the outcome on every step instead of the last (orm_distribution "all_steps").
    sqrt_k: scale each trajectory's rewards by 1/sqrt(K), K its steps (enable_length_normalization).
    skip_type: None, "skip_small_adv" (|GRPO advantage| < 1e-8: e.g. a group whose outcomes are all equal) or
      "skip_all_neg" (R <= 0). The default "skip_small_adv" is not what AgentEvolver's config/agentevolver.yaml
      sets (`adca_grpo.skip_type: "none"`, i.e. None here); it is the fallback of its code when the key is absent
      (adca_grpo_pipeline.py, `getattr(prm_cfg, 'skip_type', "skip_small_adv")`) and the setting its
      docs/guidelines/adv_processor.md recommends. Pass None for the yaml's behaviour (every trajectory judged).
    generate: the llm judge's batched text generator (`evolver.models.generate`: `@judge/OpenAIGenerate()`, an
      endpoint; `@judge/CheckpointGenerate()`, another checkpoint; `@judge/LivePolicyGenerate()`, the policy being
      trained).
  """

  def __init__(self, *, judge: str = "oracle", scheme: str = "decouple", prm_steps: int = 100, alpha: float = 0.1,
               cosine: bool = False, alpha_min: float = 0.0, fix_base: float = 0.2,
               outcome_on_all_steps: bool = False, sqrt_k: bool = False, skip_type: str | None = "skip_small_adv",
               generate: Generate | None = None, eps: float = 1e-6):
    if judge not in JUDGES:
      raise ValueError(f"unknown step judge {judge!r}; use one of {JUDGES}")
    if scheme not in SCHEMES:
      raise ValueError(f"unknown ADCA scheme {scheme!r}; use one of {SCHEMES}")
    if skip_type not in SKIP_TYPES:
      raise ValueError(f"unknown skip_type {skip_type!r}; use one of {SKIP_TYPES}")
    if judge == "llm" and generate is None:
      raise ValueError("the llm judge needs a `generate` (e.g. AdcaAdvantages.generate = @judge/OpenAIGenerate())")
    self.judge, self.scheme, self.prm_steps, self.alpha, self.cosine = judge, scheme, prm_steps, alpha, cosine
    self.alpha_min, self.fix_base, self.outcome_on_all_steps = alpha_min, fix_base, outcome_on_all_steps
    self.sqrt_k, self.skip_type, self.generate, self.eps = sqrt_k, skip_type, generate, eps
    self.rollout_records = ("record_measures",) if judge in ("oracle", "env") else ()

  def skipped(self, outcome: np.ndarray, outcome_adv: np.ndarray) -> np.ndarray:
    """`[N]` bool: the trajectories the skip rule leaves unjudged."""
    if self.skip_type == "skip_small_adv":
      return np.asarray(step_credit.skip_small_adv(jnp.asarray(outcome_adv)))
    if self.skip_type == "skip_all_neg":
      return np.asarray(step_credit.skip_all_neg(jnp.asarray(outcome)))
    return np.zeros(len(outcome), bool)

  def __call__(self, rollouts: Sequence[Rollout], *, step: int) -> TurnCredit:
    outcome_adv = episode_advantages(rollouts, self.eps)
    if step >= self.prm_steps:
      return TurnCredit([np.full([r.turns], a, np.float32) for r, a in zip(rollouts, outcome_adv)],
                        {"adca_active": 0.0})
    outcome = np.asarray([r.reward for r in rollouts], np.float32)
    scores = judge_scores(outcome)
    skipped = self.skipped(outcome, outcome_adv)
    started = time.perf_counter()
    judged = [i for i in range(len(rollouts)) if not skipped[i]]
    labels = [np.full([r.turns], score > 0) for r, score in zip(rollouts, scores)]
    judged_labels, fallbacks = judge_steps([rollouts[i] for i in judged], self.judge, scores[judged],
                                           generate=self.generate)
    for i, value in zip(judged, judged_labels):
      labels[i] = value
    judge_s = time.perf_counter() - started
    layout = step_layout(rollouts)
    good = pad_steps(labels, layout, bool)
    alpha = step_credit.adca_alpha(step, alpha=self.alpha, prm_steps=self.prm_steps, cosine=self.cosine,
                                   alpha_min=self.alpha_min)
    args = (good, layout.step_mask, outcome, layout.group)
    if self.scheme == "decouple":
      values = _decouple(*args, num_groups=layout.num_groups, alpha=alpha, fix_base=self.fix_base,
                         outcome_on_all_steps=self.outcome_on_all_steps, sqrt_k=self.sqrt_k)
    else:
      values = _allocation(*args, num_groups=layout.num_groups, alpha=alpha,
                           outcome_on_all_steps=self.outcome_on_all_steps)
    real = layout.step_mask > 0
    metrics = {"adca_active": 1.0, "adca_alpha": float(alpha), "time/judge_s": judge_s,
               "good_fraction": float(good[real].mean()), "skipped_fraction": float(skipped.mean()),
               "judged_steps": float(sum(rollouts[i].turns for i in judged)),
               "judge_fallbacks": float(fallbacks),
               # Steps whose advantage differs from the episode's outcome advantage (GRPO's, on every step).
               "changed_steps": float(np.sum((np.abs(np.asarray(values) - outcome_adv[:, None]) > 1e-6) & real))}
    return TurnCredit(unpad_steps(values, rollouts), metrics)


@gin.configurable
class AnchorStateAdvantages:
  """GiGPO's anchor-state grouping: the episode's group advantage plus `omega` times the step's discounted return
  (gamma) normalised within its step group (the steps of one task's samples taken from the same state; mean-only
  by default, verl-agent's "mean_norm"; `normalize_std` divides by the step group's std too). A step's reward is
  how much it raised the env's score (`score_gains`)."""

  rollout_records = ()  # state keys and step rewards are always recorded

  def __init__(self, *, gamma: float = 0.95, omega: float = 1.0, normalize_std: bool = False, eps: float = 1e-6):
    self.gamma, self.omega, self.normalize_std, self.eps = gamma, omega, normalize_std, eps

  def __call__(self, rollouts: Sequence[Rollout], *, step: int) -> TurnCredit:
    del step
    layout = step_layout(rollouts)
    ids, num_states = anchor_state_ids(rollouts, layout)
    gains = pad_steps([score_gains(r) for r in rollouts], layout)
    outcome = np.asarray([r.reward for r in rollouts], np.float32)
    values, metrics = _anchor_state(gains, layout.step_mask, outcome, layout.group, state_ids=ids,
                                    num_groups=layout.num_groups, num_states=num_states, gamma=self.gamma,
                                    omega=self.omega, normalize_std=self.normalize_std, eps=self.eps)
    # shared_step_fraction: how often anchor states repeat (steps whose step group has another member).
    return TurnCredit(unpad_steps(values, rollouts), {k: float(v) for k, v in metrics.items()})
