"""SFT and reward-weighted SFT against hand computation."""

import jax
import jax.numpy as jnp
import numpy as np

from evolver.rl import losses


def test_target_logprobs_alignment():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 5, 7)).astype(np.float32)
  ids = rng.integers(0, 7, size=(2, 5))
  logp = np.asarray(losses.target_logprobs(jnp.asarray(logits), jnp.asarray(ids)))
  ref = np.asarray(jax.nn.log_softmax(logits, axis=-1))
  assert logp.shape == (2, 5)
  assert np.all(logp[:, 0] == 0)
  for b in range(2):
    for t in range(1, 5):
      np.testing.assert_allclose(logp[b, t], ref[b, t - 1, ids[b, t]], atol=1e-6)


def test_sft_is_token_mean_and_weighted_scales_rows():
  logp = jnp.asarray([[-1.0, -2.0, -3.0], [-4.0, -5.0, -6.0]])
  mask = jnp.asarray([[0, 1, 1], [1, 0, 0]], jnp.float32)
  loss, metrics = losses.sft_loss(logp, mask)
  np.testing.assert_allclose(loss, (2 + 3 + 4) / 3)
  assert float(metrics["num_tokens"]) == 3
  loss_w, _ = losses.weighted_sft_loss(logp, mask, jnp.asarray([1.0, 0.5]))
  np.testing.assert_allclose(loss_w, (2 + 3 + 0.5 * 4) / 3)
  # A global normalizer (gradient accumulation): two halves add up to the whole.
  half_a, _ = losses.sft_loss(logp[:1], mask[:1], normalizer=3.0)
  half_b, _ = losses.sft_loss(logp[1:], mask[1:], normalizer=3.0)
  np.testing.assert_allclose(half_a + half_b, loss, rtol=1e-6)


def test_empty_mask_gives_zero_not_nan():
  loss, _ = losses.sft_loss(jnp.full((1, 3), -1.0), jnp.zeros((1, 3)))
  assert float(loss) == 0.0


def test_chunked_head_logprobs_and_gradients_equal_full_logits():
  from flax import nnx
  from evolver.models import ModelConfig, make_model
  for tie in (True, False):
    config = ModelConfig(vocab_size=97, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2,
                         intermediate_size=64, tie_embeddings=tie)
    graphdef, params = nnx.split(make_model(config, seed=0))
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, 97, (3, 13)), jnp.int32)
    mask = jnp.asarray(rng.random((3, 13)) < 0.7, jnp.float32)
    full = lambda p: jnp.sum(losses.target_logprobs(nnx.merge(graphdef, p)(ids), ids) * mask)
    chunked = lambda p: jnp.sum(nnx.merge(graphdef, p).chunked_target_logprobs(ids, chunk_rows=8) * mask)
    np.testing.assert_allclose(chunked(params), full(params), rtol=1e-6)
    for a, b in zip(jax.tree.leaves(jax.grad(full)(params)), jax.tree.leaves(jax.grad(chunked)(params))):
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), atol=1e-5)
