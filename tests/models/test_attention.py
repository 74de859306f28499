"""Causal self-attention in query blocks (`ModelConfig.causal_block`) against the full square."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evolver.models.config import ModelConfig
from evolver.models.decoder import Decoder, causal_block_attention, grouped_attention

SMALL = ModelConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=48,
                    qkv_bias=True, max_position_embeddings=64)


def _left_padded_valid(lengths, t):
  return np.arange(t)[None, :] >= (t - np.asarray(lengths))[:, None]


@pytest.mark.parametrize("block", [1, 4, 5, 11, 32])
def test_blocks_equal_the_full_square_on_real_queries(block):
  b, t, h, hkv, hd = 3, 11, 4, 2, 8
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.standard_normal((b, t, h, hd)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((b, hkv, t, hd)), jnp.float32) for _ in range(2))
  valid = _left_padded_valid([11, 7, 1], t)
  mask = jnp.asarray(np.tril(np.ones((t, t), bool))[None] & valid[:, None, :])
  full = np.asarray(grouped_attention(q, k, v, mask))
  blocked = np.asarray(causal_block_attention(q, k, v, mask, block))
  assert blocked.shape == full.shape
  np.testing.assert_allclose(blocked[valid], full[valid], atol=1e-6, rtol=0)


def test_decoder_logits_and_gradients_do_not_depend_on_the_block():
  ids = jnp.asarray(np.random.default_rng(1).integers(0, 64, (2, 13)), jnp.int32)
  valid = jnp.asarray(_left_padded_valid([13, 6], 13))
  mask = np.asarray(valid)
  results = []
  for block in (0, 4):
    graphdef, params = nnx.split(Decoder(dataclasses.replace(SMALL, causal_block=block), rngs=nnx.Rngs(0)))

    def loss(params, graphdef=graphdef):
      logits = nnx.merge(graphdef, params)(ids, valid=valid)
      return jnp.sum(jnp.where(valid[..., None], jax.nn.log_softmax(logits), 0.0)) / 100.0

    logits = np.asarray(nnx.merge(graphdef, params)(ids, valid=valid))
    results.append((logits, jax.grad(loss)(params)))
  (full_logits, full_grads), (block_logits, block_grads) = results
  np.testing.assert_allclose(block_logits[mask], full_logits[mask], atol=1e-5, rtol=0)
  for a, b in zip(jax.tree.leaves(block_grads), jax.tree.leaves(full_grads)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-5)


def test_negative_block_is_refused():
  with pytest.raises(ValueError, match="causal_block must be >= 0"):
    ModelConfig(causal_block=-1)
