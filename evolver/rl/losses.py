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
