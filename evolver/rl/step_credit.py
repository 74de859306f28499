"""Step-level advantages as pure functions on padded `[N, K]` arrays: ADCA (AgentEvolver) and anchor-state grouping
(GiGPO).

Layout shared by every function: N trajectories (episodes) padded to K steps (turns).
  step_mask `[N, K]` float32: 1 on a real step, 0 on padding (real steps are usually a prefix; any mask works).
  group `[N]` int32: dense group ids in [0, num_groups); the samples of one task share a group.
  outcome `[N]` float32: the episode's reward.
Numbering, for this module and its callers (evolver.train.credit): steps are counted from 0. Column k of an
`[N, K]` array is a trajectory's step k, its k-th sampled turn (the rollout's `turn_spans[k]`, `step_measures[k]`);
the "first step" is column 0 and the "last step" the last real one. The RL update index `step` of `adca_alpha` is
0-based too, as every advantage function receives it (`evolver.train.advantages`): the first update is step 0.
AgentEvolver counts its updates (`global_steps`) from 1; its llm judge prompt, like evolver.credit.llm's, numbers a
trajectory's steps from 0 (`>>> EVAL-STEP 0 <<<`, `Step 0 Judgment:`), so the judge's step n is column n.
Outputs are `[N, K]` float32 advantages, 0 on padded steps (the caller broadcasts each step's value to that step's
sampled tokens). `num_groups` / `num_states` and the Python flags are static under `jax.jit`; alpha, gamma, omega
may be traced.

Sources, read for their semantics (file and function named where each rule is used):
  AgentEvolver: agentevolver/module/adv_processor/adca_grpo.py (`_group_zscore_on_steps`, `_build_allocation`,
    `_build_decouple`, `suffix_sum_on_steps`, `compute_prm_grpo_advantages`), adca_grpo_pipeline.py
    (`apply_adca_grpo`), semantic_attribution.py (`evaluate_step_flags_parallel`), candidate_prompt.py
    (THRESHOLD = 0), prompt.py (`rescale_score`, `get_positive_mask`).
  GiGPO (arXiv 2505.10978), verl-agent: gigpo/core_gigpo.py (`compute_step_discounted_returns`,
    `compute_gigpo_outcome_advantage`, `episode_norm_reward`, `build_step_group`, `step_norm_reward`).
Deviation common to all: float32 throughout (AgentEvolver's step statistics run in Python float64 with math.fsum).
Group statistics are taken on values shifted by the group's largest member, so a group of equal values gives
exactly 0 (not float32 rounding noise divided by a tiny std).
"""

import math

import jax
import jax.numpy as jnp

from evolver.rl import losses

# AgentEvolver's PRMHyper.eps (adca_grpo.py): the variance floor of the step z-score, the ORM "std is 0" test,
# and the allocation weights' degenerate-total test.
ADCA_EPS = 1e-8
# adca_grpo.py adds 1e-12 to every std it divides by.
_TINY = 1e-12


# ---------------------------------------------------------------------------------------------------------------
# Small helpers.
# ---------------------------------------------------------------------------------------------------------------

def _group_moments(values: jax.Array, weights: jax.Array, ids: jax.Array, num_segments: int):
  """Weighted moments per segment. values, weights `[M]` float32 (weight 0 drops a member), ids `[M]` int ->
  (weight sum `[S]`, weighted mean `[S]`, weighted sum of squared deviations `[S]`), all float32.

  Values are shifted by the segment's largest member first (exact 0 deviations for equal values)."""
  values = values.astype(jnp.float32)
  weights = weights.astype(jnp.float32)
  live = weights > 0
  ids = jnp.where(live, ids, 0)
  ref = jax.ops.segment_max(jnp.where(live, values, -jnp.inf), ids, num_segments)
  ref = jnp.where(jnp.isfinite(ref), ref, 0.0)
  shifted = jnp.where(live, values - ref[ids], 0.0)
  count = jax.ops.segment_sum(weights, ids, num_segments)
  mean_shifted = jax.ops.segment_sum(weights * shifted, ids, num_segments) / jnp.where(count > 0, count, 1.0)
  m2 = jax.ops.segment_sum(weights * (shifted - mean_shifted[ids]) ** 2, ids, num_segments)
  return count, mean_shifted + ref, m2


def _step_groups(group: jax.Array, step_mask: jax.Array) -> jax.Array:
  """`[N]` group ids -> `[N, K]` int32, each step tagged with its trajectory's group."""
  return jnp.broadcast_to(group.astype(jnp.int32)[:, None], step_mask.shape)


def _last_step(step_mask: jax.Array) -> jax.Array:
  """`[N, K]` float32 one-hot of each row's last real step (all 0 for a row without steps)."""
  mask = step_mask.astype(jnp.float32)
  k = mask.shape[1]
  last = k - 1 - jnp.argmax(mask[:, ::-1] > 0, axis=1)
  return jax.nn.one_hot(last, k, dtype=jnp.float32) * mask


def suffix_sums(step_rewards: jax.Array, step_mask: jax.Array) -> jax.Array:
  """A_k = sum of r_j over real steps j >= k (AgentEvolver adca_grpo.py `suffix_sum_on_steps`).
  `[N, K]` float32 -> `[N, K]` float32, 0 on padded steps."""
  mask = step_mask.astype(jnp.float32)
  masked = jnp.where(mask > 0, step_rewards.astype(jnp.float32), 0.0)
  return jnp.where(mask > 0, jnp.cumsum(masked[:, ::-1], axis=1)[:, ::-1], 0.0)


def discounted_returns(step_rewards: jax.Array, step_mask: jax.Array, gamma) -> jax.Array:
  """G_k = r_k + gamma * G_next, the gamma-discounted sum of a trajectory's rewards from step k on (GiGPO's Eq. 5,
  verl-agent core_gigpo.py `compute_step_discounted_returns`). Padded steps are skipped (a hole passes the running
  return through undiscounted) and get 0. step_rewards, step_mask `[N, K]` float32 -> `[N, K]` float32."""
  rewards = step_rewards.astype(jnp.float32)
  mask = step_mask.astype(jnp.float32)
  gamma = jnp.asarray(gamma, jnp.float32)

  def step(carry, inputs):
    reward, live = inputs
    carry = jnp.where(live > 0, reward + gamma * carry, carry)
    return carry, jnp.where(live > 0, carry, 0.0)

  init = jnp.zeros(rewards.shape[:1], jnp.float32)
  _, returns = jax.lax.scan(step, init, (rewards.T, mask.T), reverse=True)
  return returns.T


# ---------------------------------------------------------------------------------------------------------------
# Outcome (episode) advantages.
# ---------------------------------------------------------------------------------------------------------------

def grpo_outcome_advantages(outcome: jax.Array, group: jax.Array, num_groups: int, eps: float = 1e-6) -> jax.Array:
  """verl's GRPO outcome advantage `[N]` float32: (R - group mean) / (group std + eps), std unbiased (torch.std),
  a group of one gets mean 0 and std 1 (A = R). This is `evolver.rl.losses.grpo_advantages`; AgentEvolver's trainer
  computes it (ae_ray_trainer.py `compute_grpo_outcome_advantage`, epsilon 1e-6) before ADCA, its `skip_small_adv`
  reads it, and it stays the advantage at and after `prm_steps`."""
  return losses.grpo_advantages(outcome, group, num_groups, eps=eps)


def adca_outcome_zscore(outcome: jax.Array, group: jax.Array, num_groups: int, eps: float = ADCA_EPS) -> jax.Array:
  """ADCA's group-normalised outcome `[N]` float32 (adca_grpo.py `_build_decouple` step 3; `_build_allocation`
  stage 3 is the same): m, s = mean and *population* std (torch.std(unbiased=False)) over every trajectory of the
  group; (R - m) / (s + 1e-12) where s > eps, else R - m. Unlike GRPO, a group of one gets 0."""
  outcome = outcome.astype(jnp.float32)
  group = group.astype(jnp.int32)
  count, mean, m2 = _group_moments(outcome, jnp.ones_like(outcome), group, num_groups)
  std = jnp.sqrt(m2 / jnp.maximum(count, 1.0))[group]
  centred = outcome - mean[group]
  return jnp.where(std > eps, centred / (std + _TINY), centred)


# ---------------------------------------------------------------------------------------------------------------
# ADCA (AgentEvolver's attribution-driven credit assignment).
# ---------------------------------------------------------------------------------------------------------------

def adca_step_zscore(step_rewards: jax.Array, step_mask: jax.Array, group: jax.Array, num_groups: int, *,
                     equal_trajectory_weight: bool = True, eps: float = ADCA_EPS) -> jax.Array:
  """Group z-score of step rewards (adca_grpo.py `_group_zscore_on_steps`, do_batch_norm on). `[N, K]` -> `[N, K]`
  float32, 0 on padded steps. Trajectories without real steps are left out of the statistics.

  equal_trajectory_weight (AgentEvolver's default and recommended setting): mu = mean over the group's trajectories
    of each trajectory's step mean; var = mean over trajectories of each one's mean of (r - mu)^2 (each trajectory
    weighs 1 however many steps it has); sd = sqrt(var + eps).
  Otherwise all the group's steps are pooled: population mean and std, sd = max(std, eps).
  z = (r - mu) / (sd + 1e-12). A group whose steps are all equal gets 0.
  """
  mask = step_mask.astype(jnp.float32)
  lengths = jnp.sum(mask, axis=1, keepdims=True)
  # Per-step weight 1/len_i makes the weighted moments the equal-trajectory ones (weights sum to 1 per trajectory).
  weights = mask / jnp.maximum(lengths, 1.0) if equal_trajectory_weight else mask
  ids = _step_groups(group, mask)
  count, mean, m2 = _group_moments(step_rewards.reshape(-1), weights.reshape(-1), ids.reshape(-1), num_groups)
  var = m2 / jnp.maximum(count, _TINY)
  sd = jnp.sqrt(var + eps) if equal_trajectory_weight else jnp.maximum(jnp.sqrt(var), eps)
  sd = jnp.where(count > 0, sd, 1.0)
  return jnp.where(mask > 0, (step_rewards.astype(jnp.float32) - mean[ids]) / (sd[ids] + _TINY), 0.0)


def _adca_combine(step_z: jax.Array, step_mask: jax.Array, outcome_z: jax.Array, alpha, outcome_on_all_steps: bool,
                  length_scale: jax.Array | None) -> jax.Array:
  """r_k = alpha * z_k (+ o on the last real step, or on every step); times the length scale; suffix-summed."""
  mask = step_mask.astype(jnp.float32)
  placement = mask if outcome_on_all_steps else _last_step(mask)
  rewards = jnp.asarray(alpha, jnp.float32) * step_z + outcome_z[:, None] * placement
  if length_scale is not None:
    rewards = rewards * length_scale[:, None]
  return suffix_sums(rewards, mask)


def adca_decouple(labels: jax.Array, step_mask: jax.Array, outcome: jax.Array, group: jax.Array, num_groups: int, *,
                  alpha, fix_base: float = 0.2, outcome_on_all_steps: bool = False, sqrt_k: bool = False,
                  equal_trajectory_weight: bool = True, eps: float = ADCA_EPS) -> jax.Array:
  """ADCA-GRPO "decouple" advantages `[N, K]` float32 (adca_grpo.py `_build_decouple` + `suffix_sum_on_steps`).

  1. p_k = +fix_base for a GOOD step (labels True), -fix_base for a BAD one.
  2. z_k = `adca_step_zscore(p)` per group (equal trajectory weight by default).
  3. o = `adca_outcome_zscore(outcome)` per group (population std; a zero-std group is only centred).
  4. r_k = alpha * z_k + [k = last real step] * o (orm_distribution "last_step", the default), or + o on every real
     step (outcome_on_all_steps, "all_steps"); with sqrt_k (enable_length_normalization) r_k /= sqrt(K_i), K_i the
     trajectory's real step count.
  5. A_k = sum of r_j for real j >= k.

  Args:
    labels: `[N, K]` bool, the judge's GOOD (True) / BAD verdict of each step; padded entries are ignored. The caller
      supplies a verdict for every real step (AgentEvolver pads missing decouple flags with GOOD).
    step_mask, outcome, group, num_groups: the module's layout.
    alpha: the weight of the step part (AgentEvolver's default 0.1; `adca_alpha` gives its schedule).
    fix_base: the magnitude of a step reward before the z-score.
    eps: PRMHyper.eps (1e-8), not GRPO's 1e-6.
  AgentEvolver's third orm_distribution, "only_prm" (r_k = z_k, no alpha, no outcome), is not provided.
  """
  mask = step_mask.astype(jnp.float32)
  raw = jnp.where(labels, fix_base, -fix_base).astype(jnp.float32) * mask
  step_z = adca_step_zscore(raw, mask, group, num_groups, equal_trajectory_weight=equal_trajectory_weight, eps=eps)
  outcome_z = adca_outcome_zscore(outcome, group, num_groups, eps=eps)
  length_scale = jax.lax.rsqrt(jnp.maximum(jnp.sum(mask, axis=1), 1.0)) if sqrt_k else None
  return _adca_combine(step_z, mask, outcome_z, alpha, outcome_on_all_steps, length_scale)


def allocation_rewards(labels: jax.Array, step_mask: jax.Array, outcome: jax.Array, *, consistent_scale: float = 1.0,
                       pos_unconsistent_scale: float = 0.2, neg_unconsistent_scale: float = 0.2,
                       success_threshold: float = 0.5, eps: float = ADCA_EPS) -> jax.Array:
  """The allocation scheme's raw step rewards `[N, K]` float32 (adca_grpo.py `_build_allocation` stage 1).

  A trajectory succeeds when outcome > success_threshold (`get_positive_mask(raw_orm, threshold=0.5)`). Success:
  GOOD weighs consistent_scale (1.0), BAD pos_unconsistent_scale (0.2), sign +1. Failure: GOOD weighs
  neg_unconsistent_scale (0.2), BAD consistent_scale (1.0), sign -1. r_k = sign * w_k / sum_j w_j, so each
  trajectory's rewards add up to +-1 (all 0 if the weight total is <= eps). Scales are magnitudes (AgentEvolver's
  pipeline takes abs of neg_unconsistent_scale, configured as -0.2).
  """
  mask = step_mask.astype(jnp.float32)
  success = (outcome.astype(jnp.float32) > success_threshold)[:, None]
  good_weight = jnp.where(success, consistent_scale, neg_unconsistent_scale)
  bad_weight = jnp.where(success, pos_unconsistent_scale, consistent_scale)
  weights = jnp.where(labels, good_weight, bad_weight).astype(jnp.float32) * mask
  total = jnp.sum(weights, axis=1, keepdims=True)
  unit = jnp.where(total > eps, 1.0 / jnp.where(total > eps, total, 1.0), 0.0)
  return jnp.where(success, 1.0, -1.0) * weights * unit


def adca_allocation(labels: jax.Array, step_mask: jax.Array, outcome: jax.Array, group: jax.Array, num_groups: int, *,
                    alpha, outcome_on_all_steps: bool = False, consistent_scale: float = 1.0,
                    pos_unconsistent_scale: float = 0.2, neg_unconsistent_scale: float = 0.2,
                    success_threshold: float = 0.5, equal_trajectory_weight: bool = True,
                    eps: float = ADCA_EPS) -> jax.Array:
  """ADCA-GRPO "allocation" advantages `[N, K]` float32 (adca_grpo.py `_build_allocation` + `suffix_sum_on_steps`).

  The raw step rewards are `allocation_rewards` (+-1 per trajectory, split by the GOOD/BAD weights); then exactly as
  decouple: z-scored per group (`adca_step_zscore`), combined with the group-normalised outcome
  (`adca_outcome_zscore`) as r_k = alpha * z_k + o on the last step (or on all steps), and suffix-summed. There is
  no length normalisation in this scheme (AgentEvolver applies it in decouple only).
  """
  mask = step_mask.astype(jnp.float32)
  raw = allocation_rewards(labels, mask, outcome, consistent_scale=consistent_scale,
                           pos_unconsistent_scale=pos_unconsistent_scale,
                           neg_unconsistent_scale=neg_unconsistent_scale, success_threshold=success_threshold,
                           eps=eps)
  step_z = adca_step_zscore(raw, mask, group, num_groups, equal_trajectory_weight=equal_trajectory_weight, eps=eps)
  outcome_z = adca_outcome_zscore(outcome, group, num_groups, eps=eps)
  return _adca_combine(step_z, mask, outcome_z, alpha, outcome_on_all_steps, None)


def adca_alpha(step, *, alpha: float, prm_steps: int, cosine: bool = False, total_steps: int | None = None,
               alpha_min: float = 0.0) -> jax.Array:
  """ADCA's alpha at RL update `step`, a float32 scalar (adca_grpo_pipeline.py `apply_adca_grpo`).

  `step` is the 0-based index of the update (the module's numbering: the first update is step 0, as
  `AdcaAdvantages` receives it). ADCA is on while step < prm_steps, i.e. for the prm_steps updates 0 .. prm_steps - 1;
  at and after prm_steps this returns 0, meaning "off": the caller then keeps the GRPO advantages
  (`grpo_outcome_advantages`), which differ from ADCA with alpha 0 (unbiased std, eps 1e-6, a lone sample keeps
  A = R). With cosine (alpha_cosine_decay_enable): p = clip(step / total_steps, 0, 1) (p = 0 if total_steps <= 0),
  alpha_t = alpha_min + (alpha - alpha_min) * (1 + cos(pi p)) / 2, so the first update gets the full alpha.
  AgentEvolver applies the same formulas to its `global_steps`, which verl's trainer starts at 1: there the same
  prm_steps covers prm_steps - 1 updates and each update's p is one update further along (1 / total_steps at the
  first). AgentEvolver reads total_steps from its own setting (default 100, the same as prm_steps' default); here
  it defaults to prm_steps.
  """
  step = jnp.asarray(step, jnp.float32)
  total = float(prm_steps if total_steps is None else total_steps)
  if cosine:
    progress = jnp.clip(step / total, 0.0, 1.0) if total > 0 else jnp.zeros_like(step)
    value = alpha_min + 0.5 * (alpha - alpha_min) * (1.0 + jnp.cos(math.pi * progress))
  else:
    value = jnp.full_like(step, alpha)
  return jnp.where(step < prm_steps, value, 0.0).astype(jnp.float32)


def skip_small_adv(outcome_advantages: jax.Array, tol: float = 1e-8) -> jax.Array:
  """AgentEvolver's `skip_small_adv` (semantic_attribution.py `evaluate_step_flags_parallel`): a trajectory is not
  sent to the judge when |its current advantage| < 1e-8; the advantage is the trainer's GRPO one
  (`grpo_outcome_advantages`: 0 for every member of an all-equal group, and for a lone sample with reward 0).
  outcome_advantages `[N]` float32 -> `[N]` bool (True: skipped). Apply with `skipped_labels`."""
  return jnp.abs(outcome_advantages.astype(jnp.float32)) < tol


def skip_all_neg(outcome: jax.Array, threshold: float = 0.0) -> jax.Array:
  """AgentEvolver's `skip_all_neg` (semantic_attribution.py `evaluate_step_flags_parallel`): skip a trajectory whose
  summed reward is <= THRESHOLD, which candidate_prompt.py sets to 0 (the code's comment speaks of 0.5, the code
  compares with 0). outcome `[N]` float32 -> `[N]` bool (True: skipped). Apply with `skipped_labels`."""
  return outcome.astype(jnp.float32) <= threshold


def skipped_labels(labels: jax.Array, skipped: jax.Array, outcome: jax.Array,
                   success_threshold: float = 0.5) -> jax.Array:
  """What a skip does (semantic_attribution.py `evaluate_step_flags_parallel`): a skipped trajectory gets no judge
  call and every step gets one flag, `overall_score > THRESHOLD` with overall_score = rescale_score(R) = (R - 0.5) * 2
  (THRESHOLD 0), i.e. GOOD iff R > 0.5; the same flags replace a failed judge call. Skipped trajectories stay in the
  ADCA computation (they are not switched to GRPO): an all-equal group whose samples were all skipped gets uniform
  labels, hence step z-scores 0, and ADCA leaves it with its (zero) outcome part.
  labels `[N, K]` bool, skipped `[N]` bool, outcome `[N]` float32 -> `[N, K]` bool."""
  uniform = (outcome.astype(jnp.float32) > success_threshold)[:, None]
  return jnp.where(skipped[:, None], uniform, labels.astype(bool))


# ---------------------------------------------------------------------------------------------------------------
# Anchor-state grouping (GiGPO).
# ---------------------------------------------------------------------------------------------------------------

def gigpo_episode_advantages(outcome: jax.Array, step_mask: jax.Array, group: jax.Array, num_groups: int, *,
                             normalize_std: bool = False, cross_steps: bool = True, eps: float = 1e-6) -> jax.Array:
  """GiGPO's episode-relative advantage `[N]` float32 (Eq. 3; core_gigpo.py `episode_norm_reward`).

  verl-agent trains on one row per step, each carrying its episode's reward; with compute_mean_std_cross_steps
  (its default, `cross_steps`) the group's mean and unbiased std run over those rows, so a trajectory weighs as
  many times as it has steps; otherwise each trajectory counts once. A group with a single row (or trajectory)
  gets mean 0, std 1 (A = R). mode "mean_norm" (verl-agent's default config): A = R - mean; "mean_std_norm"
  (`normalize_std`): (R - mean) / (std + eps). Trajectories without real steps are left out of the statistics
  (verl-agent has no rows for them).
  """
  outcome = outcome.astype(jnp.float32)
  group = group.astype(jnp.int32)
  steps = jnp.sum(step_mask.astype(jnp.float32), axis=1)
  weights = steps if cross_steps else (steps > 0).astype(jnp.float32)
  count, mean, m2 = _group_moments(outcome, weights, group, num_groups)
  single = count[group] <= 1
  mean = jnp.where(single, 0.0, mean[group])
  if not normalize_std:
    return outcome - mean
  std = jnp.where(single, 1.0, jnp.sqrt(m2 / jnp.maximum(count - 1.0, 1.0))[group])
  return (outcome - mean) / (std + eps)


def anchor_state_advantages(step_rewards: jax.Array, step_mask: jax.Array, outcome: jax.Array, group: jax.Array,
                            num_groups: int, state_ids: jax.Array, num_states: int, *, gamma=0.95, omega=1.0,
                            normalize_std: bool = False, cross_steps: bool = True,
                            eps: float = 1e-6) -> tuple[jax.Array, dict[str, jax.Array]]:
  """GiGPO advantages `[N, K]` float32 (core_gigpo.py `compute_gigpo_outcome_advantage`, Eq. 8):
  A_k = episode advantage + omega * step-relative advantage of step k.

  Episode part: `gigpo_episode_advantages` (mode "mean_norm" by default, as verl-agent's config), broadcast to the
  trajectory's real steps. Step part (Eq. 7, `step_norm_reward`): G = `discounted_returns(step_rewards, gamma)`;
  the real steps sharing a state id form a step group (`build_step_group`: identical anchor observations within
  one task's group, so a state repeated inside one trajectory and across trajectories joins one step group);
  G - step group mean ("mean_norm"), or (G - mean) / (unbiased std + eps) ("mean_std_norm", `normalize_std`). A
  step group of one member gets 0 in both modes (its mean is itself; std 1).

  Args:
    step_rewards: `[N, K]` float32, each step's reward (e.g. the increase of the env's score at that step).
    step_mask, outcome, group, num_groups: the module's layout.
    state_ids: `[N, K]` int32, dense ids in [0, num_states) of the (group, state) pair each step starts from,
      computed on the host; padded entries are ignored (any value).
    num_states: static count of state ids.
    gamma: discount of the returns (the paper's 0.95). omega: the step part's weight (step_advantage_w).

  Returns:
    (advantages `[N, K]`, metrics: shared_step_fraction (real steps whose step group has > 1 member),
    mean_step_group_size (real steps per non-empty step group, verl-agent's printed average), num_step_groups).
  """
  mask = step_mask.astype(jnp.float32)
  episode = gigpo_episode_advantages(outcome, mask, group, num_groups, normalize_std=normalize_std,
                                     cross_steps=cross_steps, eps=eps)
  returns = discounted_returns(step_rewards, mask, gamma)
  ids = jnp.where(mask > 0, state_ids.astype(jnp.int32), 0)
  count, mean, m2 = _group_moments(returns.reshape(-1), mask.reshape(-1), ids.reshape(-1), num_states)
  count_k, mean_k = count[ids], mean[ids]
  centred = returns - mean_k
  if normalize_std:
    std_k = jnp.sqrt(m2 / jnp.maximum(count - 1.0, 1.0))[ids]
    centred = centred / (std_k + eps)
  step_part = jnp.where(count_k > 1, centred, 0.0)
  advantages = jnp.where(mask > 0, episode[:, None] + jnp.asarray(omega, jnp.float32) * step_part, 0.0)
  num_steps = jnp.sum(mask)
  num_step_groups = jnp.sum((count > 0).astype(jnp.float32))
  metrics = {
      "shared_step_fraction": jnp.sum((count_k > 1) * mask) / jnp.maximum(num_steps, 1.0),
      "mean_step_group_size": num_steps / jnp.maximum(num_step_groups, 1.0),
      "num_step_groups": num_step_groups,
  }
  return advantages, metrics
