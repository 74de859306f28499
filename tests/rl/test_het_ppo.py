"""HET-PPO, GRPO advantages, k3 KL and DPO against hand computation (plain Python loops)."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

from evolver.rl import losses

CLIP = dict(clip_low=0.2, clip_high=0.28, off_clip_high=0.6, clip_c=3.0)


def reference_token_loss(logp, old, adv, off, clip_low, clip_high, off_clip_high, clip_c):
  r = math.exp(max(-20.0, min(20.0, logp - old)))
  high = off_clip_high if off else clip_high
  clipped_r = min(max(r, 1 - clip_low), 1 + high)
  loss = max(-adv * r, -adv * clipped_r)
  if adv < 0:
    loss = min(loss, -clip_c * adv)
  return loss


def reference(logp, old, adv, mask, exp, agg_mode, norm_len=None, **clip):
  b, t = logp.shape
  per = [[reference_token_loss(logp[i, j], old[i, j], adv[i, j], exp[i, j] > 0, **clip) for j in range(t)]
         for i in range(b)]
  if agg_mode == "token-mean":
    return sum(per[i][j] * mask[i, j] for i in range(b) for j in range(t)) / mask.sum()
  sums = [sum(per[i][j] * mask[i, j] for j in range(t)) for i in range(b)]
  counts = [mask[i].sum() for i in range(b)]
  live = [i for i in range(b) if counts[i] > 0]
  if agg_mode == "seq-mean-token-sum":
    return sum(sums[i] for i in live) / len(live)
  if agg_mode == "seq-mean-token-mean":
    return sum(sums[i] / counts[i] for i in live) / len(live)
  return sum(sums) / (t if norm_len is None else norm_len)


def make_inputs(seed=0, b=4, t=7):
  rng = np.random.default_rng(seed)
  old = rng.normal(-2.0, 0.5, (b, t))
  # Ratios spread well past both clips: exp(+-0.9).
  logp = old + rng.uniform(-0.9, 0.9, (b, t))
  adv = rng.normal(0.0, 2.0, (b, t))
  adv[0, :3] = [-2.0, -3.0, -1.5]  # negative advantages ...
  logp[0, :3] = old[0, :3] + 2.0   # ... with ratio e^2 = 7.4 > clip_c: the dual clip binds
  mask = (rng.random((b, t)) < 0.8).astype(np.float64)
  mask[3] = 0.0  # an empty response row
  return logp, old, adv, mask


@pytest.mark.parametrize("agg_mode", losses.AGG_MODES)
@pytest.mark.parametrize("exp_kind", ["zeros", "ones", "mixed"])
def test_het_ppo_matches_hand_computation(agg_mode, exp_kind):
  logp, old, adv, mask = make_inputs()
  exp = {"zeros": np.zeros_like(mask), "ones": np.ones_like(mask),
         "mixed": (np.random.default_rng(5).random(mask.shape) < 0.5).astype(np.float64)}[exp_kind]
  expected = reference(logp, old, adv, mask, exp, agg_mode, **CLIP)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  loss, metrics = losses.het_ppo_loss(logp=f32(logp), old_logp=f32(old), advantages=f32(adv),
                                      response_mask=f32(mask), exp_mask=f32(exp), agg_mode=agg_mode, **CLIP)
  np.testing.assert_allclose(float(loss), expected, rtol=1e-5)
  assert float(metrics["clipfrac_lower"]) > 0  # the dual clip was hit
  assert 0 < float(metrics["clipfrac"]) < 1


def test_norm_len_constant_and_dual_clip_value():
  logp, old, adv, mask = make_inputs()
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  args = dict(logp=f32(logp), old_logp=f32(old), advantages=f32(adv), response_mask=f32(mask),
              exp_mask=jnp.zeros(mask.shape))
  a, _ = losses.het_ppo_loss(**args, agg_mode="seq-mean-token-sum-norm", norm_len=100.0)
  np.testing.assert_allclose(float(a), reference(logp, old, adv, mask, np.zeros_like(mask),
                                                 "seq-mean-token-sum-norm", norm_len=100.0, **CLIP), rtol=1e-5)
  # A single token: A = -2, r = e^2: l = max(2 e^2, 2 * 1.28) = 14.78, dual clip caps it at 3 * 2 = 6.
  one = lambda x: jnp.asarray([[x]], jnp.float32)
  loss, _ = losses.het_ppo_loss(logp=one(0.0), old_logp=one(-2.0), advantages=one(-2.0), response_mask=one(1.0),
                                exp_mask=one(0.0))
  np.testing.assert_allclose(float(loss), 6.0, rtol=1e-6)
  # Off-policy upper clip: A = 1, r = e^0.5 = 1.65: on-policy clip at 1.28, off-policy at 1.6.
  loss_on, _ = losses.het_ppo_loss(logp=one(0.5), old_logp=one(0.0), advantages=one(1.0), response_mask=one(1.0),
                                   exp_mask=one(0.0))
  loss_off, m = losses.het_ppo_loss(logp=one(0.5), old_logp=one(0.0), advantages=one(1.0), response_mask=one(1.0),
                                    exp_mask=one(1.0))
  np.testing.assert_allclose([float(loss_on), float(loss_off)], [-1.28, -1.6], rtol=1e-6)
  assert float(m["pg_loss_off"]) == pytest.approx(-1.6) and float(m["pg_loss_on"]) == 0.0


def test_exp_mask_zero_with_equal_clips_is_plain_ppo():
  logp, old, adv, mask = make_inputs(seed=3)
  f32 = lambda x: jnp.asarray(x, jnp.float32)
  exp = (np.random.default_rng(1).random(mask.shape) < 0.5)
  het, _ = losses.het_ppo_loss(logp=f32(logp), old_logp=f32(old), advantages=f32(adv), response_mask=f32(mask),
                               exp_mask=jnp.zeros(mask.shape), clip_high=0.28, off_clip_high=0.28)
  het_mixed_equal_clips, _ = losses.het_ppo_loss(
      logp=f32(logp), old_logp=f32(old), advantages=f32(adv), response_mask=f32(mask), exp_mask=f32(exp),
      clip_high=0.28, off_clip_high=0.28)
  plain, _ = losses.ppo_loss(f32(logp), f32(old), f32(adv), f32(mask), clip_high=0.28)
  np.testing.assert_allclose(float(het), float(plain), rtol=1e-6)
  np.testing.assert_allclose(float(het_mixed_equal_clips), float(plain), rtol=1e-6)


def test_unknown_agg_mode_raises():
  with pytest.raises(ValueError, match="unknown agg_mode"):
    losses.aggregate_loss(jnp.ones((1, 2)), jnp.ones((1, 2)), "mean-of-everything")


def test_grpo_advantages_as_verl():
  rewards = jnp.asarray([1.0, 0.0, 0.5, 0.0, 0.7, 0.3, 0.3])
  groups = jnp.asarray([0, 0, 0, 1, 2, 2, 2])
  adv = np.asarray(losses.grpo_advantages(rewards, groups, 3))
  g0 = np.array([1.0, 0.0, 0.5])
  np.testing.assert_allclose(adv[:3], (g0 - g0.mean()) / (g0.std(ddof=1) + 1e-6), rtol=1e-5)
  assert adv[3] == pytest.approx(0.0 / (1 + 1e-6))  # a group of one: mean 0, std 1
  g2 = np.array([0.7, 0.3, 0.3])
  np.testing.assert_allclose(adv[4:], (g2 - g2.mean()) / (g2.std(ddof=1) + 1e-6), rtol=1e-5)
  same = np.asarray(losses.grpo_advantages(jnp.asarray([1.0, 1.0]), jnp.asarray([0, 0]), 1))
  np.testing.assert_allclose(same, [0.0, 0.0])


def test_kl_low_var_and_dpo():
  logp, ref = jnp.asarray([[-1.0, -2.0, -50.0]]), jnp.asarray([[-1.5, -1.0, 0.0]])
  k3 = np.asarray(losses.kl_low_var(logp, ref))
  d = np.array([-0.5, 1.0, 20.0])
  np.testing.assert_allclose(k3[0, :2], np.exp(d[:2]) - d[:2] - 1, rtol=1e-6)
  assert k3[0, 2] == 10.0  # clamped
  loss, m = losses.dpo_loss(jnp.asarray([-3.0]), jnp.asarray([-5.0]), jnp.asarray([-4.0]), jnp.asarray([-4.0]),
                            beta=0.5)
  np.testing.assert_allclose(float(loss), -math.log(1 / (1 + math.exp(-0.5 * 2.0))), rtol=1e-6)
  assert float(m["reward_accuracy"]) == 1.0
