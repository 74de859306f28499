"""Step-level credit (ADCA decouple / allocation, its alpha schedule and skip rules; GiGPO's anchor-state grouping)
against numbers worked out by hand, eagerly and under jax.jit; and the 0-based numbering of steps and updates as
AdcaAdvantages hands them to these functions."""

import inspect
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from evolver.data.trajectory import Message
from evolver.rl import step_credit as sc
from evolver.rollout import Rollout
from evolver.train import credit

STATIC = ("num_groups", "num_states", "outcome_on_all_steps", "sqrt_k", "equal_trajectory_weight", "normalize_std",
          "cross_steps", "cosine", "prm_steps", "total_steps")


def call(fn, jit, *args, **kwargs):
  """fn(*args, **kwargs), under jax.jit (the static arguments marked) when `jit`; numpy results."""
  if jit:
    params = inspect.signature(fn).parameters
    fn = jax.jit(fn, static_argnames=[name for name in STATIC if name in params])
  return jax.tree.map(np.asarray, fn(*args, **kwargs))


JIT = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])

# Five trajectories padded to K = 4 steps. Group 0: T0 (success, GOOD BAD GOOD), T1 (failure, BAD BAD), T2 (success,
# one GOOD step). Group 1, whose outcomes are all equal (std 0): T3 (GOOD BAD), T4 (GOOD GOOD). Padded entries
# hold junk labels that must not matter.
MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]], np.float32)
LABELS = np.array([[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 0, 1], [1, 0, 1, 1], [1, 1, 0, 0]], bool)
OUTCOME = np.array([1.0, 0.0, 1.0, 1.0, 1.0], np.float32)
GROUP = np.array([0, 0, 0, 1, 1], np.int32)
ALPHA = 0.5


def args(labels=LABELS):
  return jnp.asarray(labels), jnp.asarray(MASK), jnp.asarray(OUTCOME), jnp.asarray(GROUP), 2


def padded(rows, k=4):
  out = np.zeros((len(rows), k), np.float32)
  for i, row in enumerate(rows):
    out[i, :len(row)] = row
  return out


def suffix(row):
  return [sum(row[j:]) for j in range(len(row))]


# ADCA's outcome z-scores, population std: group 0 [1, 0, 1] has mean 2/3, std sqrt(2/9); group 1 has std 0 and is
# only centred.
O_STD = math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 3)
O = [(1 - 2 / 3) / O_STD, (0 - 2 / 3) / O_STD, (1 - 2 / 3) / O_STD, 0.0, 0.0]

# Decouple step rewards +-0.2, z-scored with equal trajectory weight (mean of trajectory means; mean over
# trajectories of each one's mean squared deviation; sd = sqrt(var + 1e-8)).
# Group 0: T0 [.2, -.2, .2], T1 [-.2, -.2], T2 [.2].
MU0 = (0.2 / 3 + -0.2 + 0.2) / 3
VAR0 = (((0.2 - MU0) ** 2 * 2 + (-0.2 - MU0) ** 2) / 3 + (-0.2 - MU0) ** 2 + (0.2 - MU0) ** 2) / 3
G0, B0 = (0.2 - MU0) / math.sqrt(VAR0 + 1e-8), (-0.2 - MU0) / math.sqrt(VAR0 + 1e-8)
# Group 1: T3 [.2, -.2] (mean 0), T4 [.2, .2] (mean .2): mu .1; var ((.01 + .09) / 2 + .01) / 2 = .03.
G1, B1 = 0.1 / math.sqrt(0.03 + 1e-8), -0.3 / math.sqrt(0.03 + 1e-8)
DECOUPLE_Z = [[G0, B0, G0], [B0, B0], [G0], [G1, B1], [G1, G1]]


def combine(z_rows, outcome_z, *, all_steps=False, scales=None):
  rows = []
  for i, z in enumerate(z_rows):
    r = [ALPHA * v + (outcome_z[i] if all_steps or j == len(z) - 1 else 0.0) for j, v in enumerate(z)]
    if scales is not None:
      r = [v * scales[i] for v in r]
    rows.append(suffix(r))
  return padded(rows)


def test_hand_numbers_of_the_decouple_example():
  # The z-scores above, to the digits: GOOD 0.894427 / BAD -1.118034 in group 0, 0.57735 / -1.732051 in group 1.
  np.testing.assert_allclose([G0, B0, G1, B1], [0.894427, -1.118034, 0.577350, -1.732051], atol=1e-5)
  np.testing.assert_allclose(O[:3], [0.707107, -1.414214, 0.707107], atol=1e-5)


@JIT
def test_decouple_outcome_on_last_step(jit):
  got = call(sc.adca_decouple, jit, *args(), alpha=ALPHA)
  expected = combine(DECOUPLE_Z, O)
  np.testing.assert_allclose(got, expected, atol=1e-5)
  # T0 by hand: r = [.5 G0, .5 B0, .5 G0 + o0]; A = suffix sums.
  r0 = [ALPHA * G0, ALPHA * B0, ALPHA * G0 + O[0]]
  np.testing.assert_allclose(got[0, :3], [r0[0] + r0[1] + r0[2], r0[1] + r0[2], r0[2]], atol=1e-5)
  # Group 1 has equal outcomes (std 0): no outcome part, only the step part.
  np.testing.assert_allclose(got[3, :2], [ALPHA * (G1 + B1), ALPHA * B1], atol=1e-5)
  # The one-step trajectory: A = alpha z + o.
  np.testing.assert_allclose(got[2, 0], ALPHA * G0 + O[2], atol=1e-5)
  assert np.all(got[MASK == 0] == 0)


@JIT
def test_decouple_outcome_on_all_steps(jit):
  got = call(sc.adca_decouple, jit, *args(), alpha=ALPHA, outcome_on_all_steps=True)
  np.testing.assert_allclose(got, combine(DECOUPLE_Z, O, all_steps=True), atol=1e-5)
  np.testing.assert_allclose(got[1, :2], [ALPHA * 2 * B0 + 2 * O[1], ALPHA * B0 + O[1]], atol=1e-5)
  assert np.all(got[MASK == 0] == 0)


@JIT
@pytest.mark.parametrize("all_steps", [False, True])
def test_decouple_sqrt_k_scales_each_trajectory_by_its_length(jit, all_steps):
  got = call(sc.adca_decouple, jit, *args(), alpha=ALPHA, outcome_on_all_steps=all_steps, sqrt_k=True)
  scales = [1 / math.sqrt(3), 1 / math.sqrt(2), 1.0, 1 / math.sqrt(2), 1 / math.sqrt(2)]
  np.testing.assert_allclose(got, combine(DECOUPLE_Z, O, all_steps=all_steps, scales=scales), atol=1e-5)


@JIT
def test_decouple_all_equal_group_is_exactly_zero_and_fix_base_cancels(jit):
  # All steps of group 1 GOOD and all outcomes equal: every advantage there is exactly 0 (no 0/0, no rounding noise).
  labels = LABELS.copy()
  labels[3:] = True
  got = call(sc.adca_decouple, jit, *args(labels), alpha=ALPHA, fix_base=0.3)
  assert np.all(got[3:] == 0)
  # fix_base only scales the raw rewards, which the z-score removes (up to the 1e-8 variance floor).
  np.testing.assert_allclose(got[:3], call(sc.adca_decouple, jit, *args(labels), alpha=ALPHA)[:3], atol=1e-5)


# Allocation: success GOOD 1 / BAD .2, failure GOOD .2 / BAD 1, each trajectory's rewards adding up to +-1.
ALLOC_RAW = [[1 / 2.2, 0.2 / 2.2, 1 / 2.2], [-0.5, -0.5], [1.0], [1 / 1.2, 0.2 / 1.2], [0.5, 0.5]]


def equal_weight_z(rows, eps=1e-8):
  """AgentEvolver's equal-trajectory-weight group z-score of one group's step rewards, in plain Python."""
  mu = sum(sum(r) / len(r) for r in rows) / len(rows)
  var = sum(sum((x - mu) ** 2 for x in r) / len(r) for r in rows) / len(rows)
  sd = math.sqrt(var + eps)
  return [[(x - mu) / sd for x in r] for r in rows]


def test_allocation_raw_rewards():
  got = np.asarray(sc.allocation_rewards(jnp.asarray(LABELS), jnp.asarray(MASK), jnp.asarray(OUTCOME)))
  np.testing.assert_allclose(got, padded(ALLOC_RAW), atol=1e-6)
  np.testing.assert_allclose(got.sum(axis=1), [1, -1, 1, 1, 1], atol=1e-6)


@JIT
@pytest.mark.parametrize("all_steps", [False, True])
def test_allocation(jit, all_steps):
  z = equal_weight_z(ALLOC_RAW[:3]) + equal_weight_z(ALLOC_RAW[3:])
  got = call(sc.adca_allocation, jit, *args(), alpha=ALPHA, outcome_on_all_steps=all_steps)
  np.testing.assert_allclose(got, combine(z, O, all_steps=all_steps), atol=1e-5)
  # Group 1 by hand: T3 [1/1.2, .2/1.2] (mean .5), T4 [.5, .5]: mu .5; var = (1/3)^2 / 2; T4's steps sit at the mean.
  sd = math.sqrt((1 / 3) ** 2 / 2 + 1e-8)
  np.testing.assert_allclose(got[3, :2], [ALPHA * 0.0, ALPHA * (0.2 / 1.2 - 0.5) / sd], atol=1e-5)
  np.testing.assert_allclose(got[4, :2], [0.0, 0.0], atol=1e-5)
  assert np.all(got[MASK == 0] == 0)


@JIT
def test_step_zscore_pooled_variant(jit):
  # equal_trajectory_weight off: all the group's steps pooled, population std.
  raw = jnp.asarray(padded([[0.2, -0.2, 0.2], [-0.2, -0.2], [0.2], [0.2, -0.2], [0.2, 0.2]]))
  got = call(sc.adca_step_zscore, jit, raw, jnp.asarray(MASK), jnp.asarray(GROUP), 2, equal_trajectory_weight=False)
  # Group 0 steps [.2, -.2, .2, -.2, -.2, .2]: mean 0, std .2 -> +-1. Group 1 [.2, -.2, .2, .2]: mean .1, std sqrt(.03).
  s1 = math.sqrt(0.03)
  np.testing.assert_allclose(got, padded([[1, -1, 1], [-1, -1], [1], [0.1 / s1, -0.3 / s1], [0.1 / s1, 0.1 / s1]]),
                             atol=1e-5)


@JIT
def test_empty_trajectory_and_lone_sample(jit):
  # A trajectory without steps gets nothing and stays out of the step statistics, but its outcome counts in the
  # outcome statistics; a group of one sample has outcome z 0 and step z 0 (its steps are all one label).
  mask = jnp.asarray([[1, 1], [0, 0], [1, 0]], jnp.float32)
  labels = jnp.asarray([[1, 0], [1, 1], [1, 1]], bool)
  outcome, group = jnp.asarray([1.0, 0.0, 1.0]), jnp.asarray([0, 0, 1])
  got = call(sc.adca_decouple, jit, labels, mask, outcome, group, 2, alpha=ALPHA)
  # Group 0 outcomes [1, 0]: mean .5, std .5 -> o = 1 for T0. T0's steps [.2, -.2]: z = +-.2 / sqrt(.04 + 1e-8).
  z = 0.2 / math.sqrt(0.04 + 1e-8)
  np.testing.assert_allclose(got, [[ALPHA * z - ALPHA * z + 1.0, -ALPHA * z + 1.0], [0, 0], [0, 0]], atol=1e-5)


@JIT
def test_outcome_zscores(jit):
  outcome, group = jnp.asarray(OUTCOME), jnp.asarray(GROUP)
  np.testing.assert_allclose(call(sc.adca_outcome_zscore, jit, outcome, group, 2), O, atol=1e-5)
  # verl's GRPO: unbiased std; group 0 [1, 0, 1]: mean 2/3, std sqrt(1/3); group 1 equal -> 0.
  std = math.sqrt(((1 / 3) ** 2 * 2 + (2 / 3) ** 2) / 2)
  np.testing.assert_allclose(call(sc.grpo_outcome_advantages, jit, outcome, group, 2),
                             [(1 / 3) / (std + 1e-6), (-2 / 3) / (std + 1e-6), (1 / 3) / (std + 1e-6), 0, 0],
                             atol=1e-5)


@JIT
def test_alpha_schedule(jit):
  def alpha(step, **kwargs):
    return float(call(sc.adca_alpha, jit, step, alpha=0.1, prm_steps=20, **kwargs))

  # Updates are counted from 0: prm_steps = 20 covers updates 0 .. 19.
  assert [alpha(s) for s in (0, 1, 19, 20, 25)] == pytest.approx([0.1, 0.1, 0.1, 0.0, 0.0])
  # Cosine over prm_steps (total_steps defaults to it): p = step / 20, the full alpha at update 0.
  assert alpha(0, cosine=True) == pytest.approx(0.1)
  assert alpha(5, cosine=True) == pytest.approx(0.1 * (1 + math.cos(math.pi / 4)) / 2, abs=1e-7)
  assert alpha(10, cosine=True) == pytest.approx(0.05, abs=1e-7)
  assert alpha(10, cosine=True, alpha_min=0.02) == pytest.approx(0.02 + 0.08 * 0.5, abs=1e-7)
  assert alpha(20, cosine=True) == 0.0
  # A shorter decay horizon than prm_steps: p clamps at 1 -> alpha_min.
  assert alpha(15, cosine=True, total_steps=10, alpha_min=0.01) == pytest.approx(0.01, abs=1e-7)


def test_adca_advantages_number_updates_and_steps_from_zero():
  """AdcaAdvantages passes its 0-based update index to `adca_alpha` unchanged (the numbering the module docstring
  states): update 0 has the full alpha, prm_steps - 1 is the last ADCA update, prm_steps the first GRPO one; and a
  judgment about a trajectory's first step (`step_measures[0]`) lands on its first turn's advantage. Following the
  old `adca_alpha` docstring (pass index + 1) gives update 0 a decayed alpha and update prm_steps - 1 alpha 0."""

  def rollout(sample, reward, costs):
    turns = len(costs) - 1
    messages = [Message("user", "rules"), Message("assistant", "Ok."), Message("user", "Reach the goal.")]
    for turn in range(turns):
      messages += [Message("assistant", f"Action: a{turn}"), Message("user", f"o{turn}")]
    measures = [{"before": {"cost_to_go": costs[i], "progress": None},
                 "after": {"cost_to_go": costs[i + 1], "progress": None}} for i in range(turns)]
    return Rollout(item_id="maze/train/0", messages=messages, env="maze", reward=reward, group=0, sample=sample,
                   turns=turns, opening_len=3, step_rewards=[0.0] * (turns - 1) + [reward],
                   state_keys=[f"s{sample}.{t}" for t in range(turns)], step_measures=measures)

  # A success whose first step is GOOD (cost 2 -> 1) and second BAD, a failure the other way round.
  rollouts = [rollout(0, 1.0, [2, 1, 2]), rollout(1, 0.0, [2, 3, 2])]
  fn = credit.AdcaAdvantages(judge="oracle", prm_steps=4, cosine=True, alpha=0.2)
  outs = [fn(rollouts, step=s) for s in range(5)]
  assert [o.metrics["adca_active"] for o in outs] == [1.0, 1.0, 1.0, 1.0, 0.0]
  assert [o.metrics["adca_alpha"] for o in outs[:4]] == pytest.approx(
      [0.2, 0.1 * (1 + math.cos(math.pi / 4)), 0.1, 0.1 * (1 + math.cos(3 * math.pi / 4))], abs=1e-7)
  # Step z-scores +-1 (each trajectory's mean is 0; sd = sqrt(.04 + 1e-8)), outcome z-scores +-1 on the last step:
  # success r = [a, -a + 1] -> A = [1, 1 - a]; failure r = [-a, a - 1] -> A = [-1, a - 1], a = 0.2 at update 0.
  # Labels read one step off (the judge's step 1 on turn 0) would give the success [1, 1 + a].
  np.testing.assert_allclose(np.stack(outs[0].advantages), [[1.0, 0.8], [-1.0, -0.8]], atol=1e-5)
  # Update prm_steps is GRPO's: +-0.5 / unbiased std sqrt(.5) on every turn.
  np.testing.assert_allclose(np.stack(outs[4].advantages), [[0.5 ** 0.5] * 2, [-(0.5 ** 0.5)] * 2], atol=1e-5)


@JIT
def test_skip_rules(jit):
  outcome = jnp.asarray([1.0, 1.0, 0.0, 0.3, 0.0])
  group = jnp.asarray([0, 0, 1, 1, 2])
  advantages = call(sc.grpo_outcome_advantages, jit, outcome, group, 3)
  # Group 0 all equal -> A = 0 (skipped); group 1 mixed (kept); the lone sample of group 2 keeps A = R = 0 (skipped).
  assert call(sc.skip_small_adv, jit, jnp.asarray(advantages)).tolist() == [True, True, False, False, True]
  # skip_all_neg compares with THRESHOLD = 0: 0.3 is not skipped.
  assert call(sc.skip_all_neg, jit, outcome).tolist() == [False, False, True, False, True]
  # Skipped trajectories get one flag on every step: GOOD iff R > 0.5.
  labels = jnp.asarray([[0, 1], [0, 0], [1, 0], [1, 0], [1, 1]], bool)
  skipped = jnp.asarray([True, False, True, True, True])
  got = call(sc.skipped_labels, jit, labels, skipped, outcome)
  assert got.tolist() == [[True, True], [False, False], [False, False], [False, False], [False, False]]


@JIT
def test_skipped_all_equal_group_gets_zero_adca(jit):
  # skip_small_adv on an all-equal group: uniform labels, so step z 0 and outcome z 0 -> ADCA advantages 0.
  labels = jnp.asarray(LABELS)
  skipped = call(sc.skip_small_adv, jit, call(sc.grpo_outcome_advantages, jit, jnp.asarray(OUTCOME),
                                              jnp.asarray(GROUP), 2))
  assert skipped.tolist() == [False, False, False, True, True]
  labels = call(sc.skipped_labels, jit, labels, jnp.asarray(skipped), jnp.asarray(OUTCOME))
  got = call(sc.adca_decouple, jit, *args(labels), alpha=ALPHA)
  assert np.all(got[3:] == 0)
  np.testing.assert_allclose(got[:3], combine(DECOUPLE_Z, O)[:3], atol=1e-5)


# Anchor-state example. Group 0: T0 visits states A B A (A repeated within the trajectory), rewards [0, 1, 0],
# outcome 1; T1 visits A C, rewards [0, .5], outcome 0 (A repeated across trajectories). Group 1: T2, a lone
# one-step sample in state D, outcome 1. State id 4 is unused; padded ids are -1.
A_REWARDS = np.array([[0, 1, 0, 9], [0, 0.5, 9, 9], [0, 9, 9, 9]], np.float32)
A_MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]], np.float32)
A_STATES = np.array([[0, 1, 0, -1], [0, 2, -1, -1], [3, -1, -1, -1]], np.int32)
A_OUTCOME = np.array([1.0, 0.0, 1.0], np.float32)
A_GROUP = np.array([0, 0, 1], np.int32)


def anchor(jit, **kwargs):
  return call(sc.anchor_state_advantages, jit, jnp.asarray(A_REWARDS), jnp.asarray(A_MASK), jnp.asarray(A_OUTCOME),
              jnp.asarray(A_GROUP), 2, jnp.asarray(A_STATES), 5, gamma=0.5, **kwargs)


@JIT
def test_discounted_returns(jit):
  got = call(sc.discounted_returns, jit, jnp.asarray(A_REWARDS), jnp.asarray(A_MASK), 0.5)
  # T0: G2 = 0, G1 = 1 + .5 * 0, G0 = 0 + .5 * 1. T1: G1 = .5, G0 = .25. Padding 0.
  np.testing.assert_allclose(got, [[0.5, 1.0, 0.0, 0], [0.25, 0.5, 0, 0], [0, 0, 0, 0]], atol=1e-6)


@JIT
def test_anchor_state_mean_norm(jit):
  got, metrics = anchor(jit)
  # Episode part, mean over group 0's step rows [1, 1, 1, 0, 0] = .6: T0 +.4, T1 -.6; T2 alone: mean 0 -> 1.
  # Step group A = {T0 s0: .5, T0 s2: 0, T1 s0: .25}, mean .25 -> [.25, -.25, 0]; B, C, D are singletons -> 0.
  np.testing.assert_allclose(got, [[0.4 + 0.25, 0.4, 0.4 - 0.25, 0], [-0.6, -0.6, 0, 0], [1.0, 0, 0, 0]], atol=1e-6)
  # 3 of the 6 real steps share a step group; 4 non-empty step groups (A B C D), 6 / 4 steps each.
  assert float(metrics["shared_step_fraction"]) == pytest.approx(0.5)
  assert float(metrics["num_step_groups"]) == 4
  assert float(metrics["mean_step_group_size"]) == pytest.approx(1.5)


@JIT
def test_anchor_state_mean_std_norm_and_omega(jit):
  got, _ = anchor(jit, normalize_std=True, omega=2.0)
  # Episode: rows [1, 1, 1, 0, 0], mean .6, unbiased std sqrt((3 * .16 + 2 * .36) / 4) = sqrt(.3).
  s = math.sqrt(0.3) + 1e-6
  # Step group A [.5, 0, .25]: mean .25, unbiased std sqrt((.0625 + .0625 + 0) / 2) = .25 -> [1, -1, 0].
  a = 0.25 + 1e-6
  np.testing.assert_allclose(got, [[0.4 / s + 2 * 0.25 / a, 0.4 / s, 0.4 / s - 2 * 0.25 / a, 0],
                                   [-0.6 / s, -0.6 / s, 0, 0], [1.0, 0, 0, 0]], atol=1e-5)


@JIT
def test_anchor_state_episode_stats_per_trajectory(jit):
  got, _ = anchor(jit, cross_steps=False)
  # Each trajectory once: group 0 [1, 0], mean .5.
  np.testing.assert_allclose(got, [[0.75, 0.5, 0.25, 0], [-0.5, -0.5, 0, 0], [1.0, 0, 0, 0]], atol=1e-6)
