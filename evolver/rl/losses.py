"""Losses as pure functions on `[B, T]` arrays. Every function returns `(loss, metrics)`.

Conventions: `logp` are log-probabilities of the *target* tokens, already aligned so that position t scores
token t (see `target_logprobs`); masks are 0/1 (float or bool); float32 throughout. Token-mean losses take an
optional `normalizer` (the token count to divide by): under gradient accumulation the caller passes the
*global* count of the whole batch, so microbatches add up to exactly the full-batch loss.
"""

import jax
import jax.numpy as jnp


def target_logprobs(logits: jax.Array, input_ids: jax.Array) -> jax.Array:
  """Log-probability of each next token. logits `[B, T, V]`, input_ids `[B, T]` -> `[B, T]` float32 where
  column t scores input_ids[:, t] given the tokens before it; column 0 (nothing predicts it) is 0."""
  # Score every position against the next id (the last against a dummy) and shift the small [B, T] result:
  # slicing logits[:, :-1] instead would copy the whole [B, T, V] array.
  logits = logits.astype(jnp.float32)
  next_ids = jnp.pad(input_ids[:, 1:], ((0, 0), (0, 1)))
  picked = jnp.take_along_axis(logits, next_ids[..., None], axis=-1)[..., 0]
  logp_next = picked - jax.nn.logsumexp(logits, axis=-1)
  return jnp.pad(logp_next[:, :-1], ((0, 0), (1, 0)))


def token_entropy(logits: jax.Array) -> jax.Array:
  """Entropy of each position's next-token distribution, `[B, T]` float32, aligned like `target_logprobs`."""
  logits = logits[:, :-1].astype(jnp.float32)
  logp = jax.nn.log_softmax(logits, axis=-1)
  return jnp.pad(-jnp.sum(jnp.exp(logp) * logp, axis=-1), ((0, 0), (1, 0)))


def masked_sum(x: jax.Array, mask: jax.Array) -> jax.Array:
  return jnp.sum(x * mask.astype(x.dtype))


def masked_mean(x: jax.Array, mask: jax.Array, normalizer=None) -> jax.Array:
  """sum(x * mask) / normalizer (default: sum(mask), at least 1)."""
  mask = mask.astype(jnp.float32)
  denominator = jnp.maximum(jnp.sum(mask), 1.0) if normalizer is None else normalizer
  return jnp.sum(x * mask) / denominator


def sft_loss(logp: jax.Array, loss_mask: jax.Array, *, normalizer=None) -> tuple[jax.Array, dict]:
  """Token-mean negative log-likelihood over the loss mask."""
  loss = -masked_mean(logp, loss_mask, normalizer)
  return loss, {"nll": loss, "num_tokens": jnp.sum(loss_mask.astype(jnp.float32))}


def weighted_sft_loss(logp: jax.Array, loss_mask: jax.Array, weights: jax.Array, *,
                      normalizer=None) -> tuple[jax.Array, dict]:
  """Reward-weighted SFT (AgentEvol's learning step): each trajectory's token NLLs scaled by its weight
  `[B]` (e.g. its reward; binary rewards keep successes only), token-mean over the loss mask."""
  weighted_mask = loss_mask.astype(jnp.float32) * weights.astype(jnp.float32)[:, None]
  loss = -masked_sum(logp, weighted_mask) / (
      jnp.maximum(jnp.sum(loss_mask.astype(jnp.float32)), 1.0) if normalizer is None else normalizer)
  return loss, {"nll": -masked_mean(logp, loss_mask, normalizer),
                "num_tokens": jnp.sum(loss_mask.astype(jnp.float32)),
                "mean_weight": jnp.mean(weights.astype(jnp.float32))}


AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def aggregate_loss(per_token: jax.Array, mask: jax.Array, agg_mode: str = "token-mean", *,
                   norm_len: float | None = None, normalizer=None) -> jax.Array:
  """Reduces a `[B, T]` per-token loss over `mask` (verl's modes, as AgentEvolver uses them).

  token-mean: sum / number of masked tokens.
  seq-mean-token-sum: mean over sequences of each sequence's sum.
  seq-mean-token-mean: mean over sequences of each sequence's token mean.
  seq-mean-token-sum-norm: sum over everything / `norm_len` (default: the padded length T, as AgentEvolver;
    pass a constant so bucketed lengths do not change the scale).
  Sequences with no masked token count as 0 in the sequence means, and are not counted.
  `normalizer`: the count a mode divides by, taken from the *whole* batch under gradient accumulation so that
  microbatch losses add up to the batch's: its masked tokens (token-mean) or its sequences with a masked token
  (the two seq-mean modes); default: this array's own. seq-mean-token-sum-norm divides by a constant.
  """
  mask = mask.astype(jnp.float32)
  if agg_mode == "token-mean":
    return masked_mean(per_token, mask, normalizer)
  seq_sum = jnp.sum(per_token * mask, axis=-1)
  seq_tokens = jnp.sum(mask, axis=-1)
  live = (seq_tokens > 0).astype(jnp.float32)
  num_seqs = jnp.maximum(jnp.sum(live), 1.0) if normalizer is None else normalizer
  if agg_mode == "seq-mean-token-sum":
    return jnp.sum(seq_sum) / num_seqs
  if agg_mode == "seq-mean-token-mean":
    return jnp.sum(seq_sum / jnp.maximum(seq_tokens, 1.0)) / num_seqs
  if agg_mode == "seq-mean-token-sum-norm":
    return jnp.sum(seq_sum) / (per_token.shape[-1] if norm_len is None else norm_len)
  raise ValueError(f"unknown agg_mode {agg_mode!r}; choose one of {AGG_MODES}")


def weight_negative(advantages: jax.Array, negative_weight: float = 1.0) -> jax.Array:
  """`advantages` with the negative ones scaled by `negative_weight` (any shape; 1.0 returns them unchanged)."""
  if negative_weight == 1.0:
    return advantages
  return jnp.where(advantages < 0, negative_weight * advantages, advantages)


def _clipped_pg(ratio, advantages, clip_low, clip_high, clip_c):
  """Per-token PPO loss with dual clip: max(-A r, -A clip(r, 1-lo, 1+hi)), capped at -clip_c A where A < 0."""
  loss1 = -advantages * ratio
  loss2 = -advantages * jnp.clip(ratio, 1.0 - clip_low, 1.0 + clip_high)
  clipped = jnp.maximum(loss1, loss2)
  dual = jnp.minimum(clipped, -clip_c * advantages)
  loss = jnp.where(advantages < 0, dual, clipped)
  return loss, (loss2 > loss1).astype(jnp.float32), ((advantages < 0) & (clipped > -clip_c * advantages)).astype(
      jnp.float32)


def het_ppo_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, response_mask: jax.Array,
                 exp_mask: jax.Array, *, clip_low: float = 0.2, clip_high: float = 0.28, off_clip_high: float = 0.6,
                 clip_c: float = 3.0, agg_mode: str = "token-mean", norm_len: float | None = None,
                 normalizer=None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """AgentEvolver's heterogeneous PPO policy loss. All arrays `[B, T]` float32 (masks 0/1, float or bool).

  r = exp(clamp(logp - old_logp, -20, 20)). On-policy tokens (exp_mask 0) use the upper clip `clip_high`;
  tokens sampled with experience in the prompt and trained without it (exp_mask 1, off-policy) use
  `off_clip_high`. Both use `clip_low` and the dual clip `clip_c` for negative advantages. Note the argument
  order (new, old); AgentEvolver's is (old, new).

  Returns (loss, metrics): pg_loss_on / pg_loss_off (token means over each part), clipfrac (the ratio clip
  active), clipfrac_lower (the dual clip active), approx_kl (mean of old - new log-probabilities).
  """
  response_mask = response_mask.astype(jnp.float32)
  exp_mask = exp_mask.astype(jnp.float32)
  log_ratio = jnp.clip(logp - old_logp, -20.0, 20.0)
  ratio = jnp.exp(log_ratio)
  loss_on, clip_on, dual_on = _clipped_pg(ratio, advantages, clip_low, clip_high, clip_c)
  loss_off, clip_off, dual_off = _clipped_pg(ratio, advantages, clip_low, off_clip_high, clip_c)
  per_token = exp_mask * loss_off + (1.0 - exp_mask) * loss_on
  loss = aggregate_loss(per_token, response_mask, agg_mode, norm_len=norm_len, normalizer=normalizer)
  on_mask, off_mask = response_mask * (1.0 - exp_mask), response_mask * exp_mask
  clipfrac = exp_mask * clip_off + (1.0 - exp_mask) * clip_on
  dualfrac = exp_mask * dual_off + (1.0 - exp_mask) * dual_on
  metrics = {
      "pg_loss": loss,
      "pg_loss_on": masked_mean(loss_on, on_mask),
      "pg_loss_off": masked_mean(loss_off, off_mask),
      "clipfrac": masked_mean(clipfrac, response_mask),
      "clipfrac_lower": masked_mean(dualfrac, response_mask),
      "approx_kl": masked_mean(-log_ratio, response_mask),
      "off_policy_fraction": masked_mean(exp_mask, response_mask),
  }
  return loss, metrics


def ppo_loss(logp, old_logp, advantages, response_mask, *, clip_low=0.2, clip_high=0.28, clip_c=3.0,
             agg_mode="token-mean", norm_len=None, normalizer=None):
  """Plain (dual-clip) PPO: HET-PPO with every token on-policy."""
  return het_ppo_loss(logp, old_logp, advantages, response_mask, jnp.zeros_like(response_mask, jnp.float32),
                      clip_low=clip_low, clip_high=clip_high, off_clip_high=clip_high, clip_c=clip_c,
                      agg_mode=agg_mode, norm_len=norm_len, normalizer=normalizer)


def kl_low_var(logp: jax.Array, ref_logp: jax.Array) -> jax.Array:
  """Per-token k3 estimator of KL(policy || reference), clamped to [-10, 10] as verl: exp(ref - logp) -
  (ref - logp) - 1, with the log-ratio clamped to [-20, 20]."""
  log_ratio = jnp.clip(ref_logp - logp, -20.0, 20.0)
  return jnp.clip(jnp.exp(log_ratio) - log_ratio - 1.0, -10.0, 10.0)


def grpo_advantages(rewards: jax.Array, group_ids: jax.Array, num_groups: int, eps: float = 1e-6) -> jax.Array:
  """GRPO outcome advantages: (R - group mean) / (group std + eps), std unbiased (ddof 1) as verl; a group of
  one gets mean 0 and std 1 (so A = R), as verl. rewards `[N]`, group_ids `[N]` int in [0, num_groups)."""
  rewards = rewards.astype(jnp.float32)
  counts = jax.ops.segment_sum(jnp.ones_like(rewards), group_ids, num_groups)
  sums = jax.ops.segment_sum(rewards, group_ids, num_groups)
  means = sums / jnp.maximum(counts, 1.0)
  sq = jax.ops.segment_sum((rewards - means[group_ids]) ** 2, group_ids, num_groups)
  stds = jnp.sqrt(sq / jnp.maximum(counts - 1.0, 1.0))
  single = counts[group_ids] <= 1
  mean = jnp.where(single, 0.0, means[group_ids])
  std = jnp.where(single, 1.0, stds[group_ids])
  return (rewards - mean) / (std + eps)


def sequence_logprobs(logp: jax.Array, loss_mask: jax.Array) -> jax.Array:
  """`[B]` sum of token log-probabilities `[B, T]` over each row's response tokens (`loss_mask`)."""
  return jnp.sum(logp * loss_mask.astype(logp.dtype), axis=-1)


def dpo_loss(chosen_logp: jax.Array, rejected_logp: jax.Array, ref_chosen_logp: jax.Array,
             ref_rejected_logp: jax.Array, *, beta: float = 0.5, pair_mask: jax.Array | None = None,
             normalizer: jax.Array | None = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """DPO on sequence log-probabilities `[P]` (sums over each response's tokens, `sequence_logprobs`):
  -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), summed over the real pairs / `normalizer`.

  Args:
    chosen_logp, rejected_logp: `[P]` the policy's sequence log-probabilities of each pair's two responses.
    ref_chosen_logp, ref_rejected_logp: `[P]` the frozen reference's.
    beta: DPO's inverse temperature.
    pair_mask: `[P]` 1 on real pairs, 0 on padding pairs (default: all real).
    normalizer: what the masked sum is divided by (default: the number of real pairs); a train step passes the
      whole batch's pair count so that microbatches add up to the full-batch loss.

  Returns:
    (loss, metrics: dpo_loss, reward_margin, reward_accuracy, chosen_logp, rejected_logp, num_pairs).
  """
  valid = jnp.ones_like(chosen_logp) if pair_mask is None else pair_mask.astype(chosen_logp.dtype)
  normalizer = jnp.maximum(jnp.sum(valid), 1.0) if normalizer is None else normalizer
  margin = (chosen_logp - ref_chosen_logp) - (rejected_logp - ref_rejected_logp)

  def mean(x):
    return jnp.sum(x * valid) / normalizer

  loss = mean(-jax.nn.log_sigmoid(beta * margin))
  return loss, {"dpo_loss": loss, "reward_margin": mean(beta * margin),
                "reward_accuracy": mean((margin > 0).astype(jnp.float32)), "chosen_logp": mean(chosen_logp),
                "rejected_logp": mean(rejected_logp), "num_pairs": jnp.sum(valid)}
