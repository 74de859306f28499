"""Causal self-attention in query blocks (`ModelConfig.causal_block`) against the full square, and attention over
a KV cache read block by block (`cached_attention`) against full attention over the whole capacity."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evolver.models.config import ModelConfig
from evolver.models.decoder import Decoder, cached_attention, causal_block_attention, grouped_attention

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


@pytest.mark.parametrize("t", [1, 5])
@pytest.mark.parametrize("block", [4, 8, 32])
def test_cached_attention_reads_only_the_slots_in_use_and_equals_full_attention(t, block):
  """Rows hold 3, 17 and 9 tokens (after the chunk's writes) in a 32-slot cache whose unused slots hold garbage:
  the blockwise online softmax over the used blocks equals softmax attention over each row's own slots, queries
  see their own slot and earlier ones; slots past the blocks that cover the longest row are never read (NaN
  there would spread), masked slots inside them are ignored."""
  b, h, hkv, hd, capacity = 3, 4, 2, 8, 32
  rng = np.random.default_rng(t * 100 + block)
  q = jnp.asarray(rng.standard_normal((b, t, h, hd)), jnp.float32)
  k, v = (rng.standard_normal((b, hkv, capacity, hd)).astype(np.float32) for _ in range(2))
  lengths = np.array([3, 17, 9])
  used = -(-17 // block) * block
  k[:, :, 17:used], v[:, :, 17:used] = 50.0, -50.0  # in a block that is read, past every row: masked
  k[:, :, used:], v[:, :, used:] = np.nan, np.nan  # in blocks past the longest row: never read
  query_slots = lengths[:, None] - t + np.arange(t)[None, :]  # the chunk's last t slots of each row
  mask = np.arange(capacity)[None, None, :] <= query_slots[:, :, None]
  expected = grouped_attention(q, jnp.asarray(np.nan_to_num(k)), jnp.asarray(np.nan_to_num(v)), jnp.asarray(mask))
  got = cached_attention(q, jnp.asarray(k), jnp.asarray(v), jnp.asarray(query_slots, jnp.int32),
                         jnp.int32(lengths.max()), block)
  real = query_slots >= 0  # row 0 has 3 tokens: with t = 5 its first two queries are padding (outputs unused)
  assert real.sum() == b * t - (2 if t == 5 else 0)
  np.testing.assert_allclose(np.asarray(got)[real], np.asarray(expected)[real], atol=2e-6, rtol=0)


def test_cached_attention_needs_whole_blocks():
  q = jnp.zeros((1, 1, 4, 8))
  kv = jnp.zeros((1, 2, 30, 8))
  with pytest.raises(ValueError, match="capacity 30 must be a multiple of the attention block 8"):
    cached_attention(q, kv, kv, jnp.zeros((1, 1), jnp.int32), jnp.int32(1), 8)


def test_cached_attention_on_some_rows_of_the_cache_equals_attention_over_those_rows():
  """`rows` [2, 0, pad]: queries of cache rows 2 and 0 read those rows' blocks only (the padding entry reads the
  last row; its output is unused), as if the rows had been copied out first."""
  b, t, h, hkv, hd, capacity, block = 4, 3, 4, 2, 8, 16, 4
  rng = np.random.default_rng(3)
  k, v = (jnp.asarray(rng.standard_normal((b, hkv, capacity, hd)), jnp.float32) for _ in range(2))
  q = jnp.asarray(rng.standard_normal((3, t, h, hd)), jnp.float32)
  rows = jnp.asarray([2, 0, 4], jnp.int32)
  query_slots = jnp.asarray([[6, 7, 8], [1, 2, 3], [0, 0, 0]], jnp.int32)
  got = cached_attention(q, k, v, query_slots, jnp.int32(9), block, rows)
  copied = cached_attention(q[:2], k[jnp.asarray([2, 0])], v[jnp.asarray([2, 0])], query_slots[:2], jnp.int32(9),
                            block)
  np.testing.assert_allclose(np.asarray(got)[:2], np.asarray(copied), atol=1e-6, rtol=0)
