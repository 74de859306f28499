"""Causal self-attention in query blocks (`ModelConfig.causal_block`) against the full square, attention over a KV
cache read block by block (`cached_attention`) against full attention over the whole capacity, and the fused
implementations behind `attention` (`ModelConfig.attention_impl`) against the einsum path."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evolver.models import decoder, sharding
from evolver.models.config import ModelConfig
from evolver.models.decoder import (Decoder, attention, attention_impl_for, cached_attention, causal_block_attention,
                                    grouped_attention)

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
  # Jitted: one compile, not an eager dispatch per block.
  blocked = np.asarray(jax.jit(causal_block_attention, static_argnums=4)(q, k, v, mask, block))
  assert blocked.shape == full.shape
  np.testing.assert_allclose(blocked[valid], full[valid], atol=1e-6, rtol=0)


@pytest.mark.slow
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

    logits = np.asarray(jax.jit(lambda params, graphdef=graphdef: nnx.merge(graphdef, params)(ids, valid=valid))(
        params))
    results.append((logits, jax.jit(jax.grad(loss))(params)))  # jitted: eager dispatch took most of the time
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


def _padded(b, t):
  """Row 0 all real, row 1 left-padded (its first 40 queries see no real key), row 2 with holes anywhere."""
  valid = np.ones((b, t), bool)
  valid[1, :40] = False
  valid[2, ::3] = False
  return valid


# Max abs differences observed against the einsum path on these inputs (values of order 1): float32 <= 1e-6 for
# xla and splash; bfloat16 0 (xla) and 8e-3 (splash: q is scaled in bfloat16 before the kernel).
TOLERANCE = {("xla", jnp.float32): 1e-5, ("splash", jnp.float32): 1e-5, ("xla", jnp.bfloat16): 1e-2,
             ("splash", jnp.bfloat16): 3e-2}


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("impl", ["xla", "splash"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_attention_implementations_equal_the_einsum_path(impl, dtype, padded):
  """`jax.nn.dot_product_attention` (XLA) and the splash kernel (interpreted on CPU) give the einsum path's outputs
  for GQA (4 query heads over 2 KV heads) with causal masks and padding; queries that see no real key stay
  finite."""
  b, t, h, hkv, hd = 3, 128, 4, 2, 8
  rng = np.random.default_rng(7)
  q = jnp.asarray(rng.standard_normal((b, t, h, hd)), dtype)
  k, v = (jnp.asarray(rng.standard_normal((b, hkv, t, hd)), dtype) for _ in range(2))
  valid = jnp.asarray(_padded(b, t)) if padded else None
  expected = np.asarray(attention(q, k, v, valid=valid, impl="einsum", causal_block=32), np.float32)
  got = np.asarray(jax.jit(lambda *a: attention(*a, valid=valid, impl=impl))(q, k, v), np.float32)
  assert got.shape == (b, t, h, hd) and np.isfinite(got).all()
  real = _padded(b, t) if padded else np.ones((b, t), bool)
  np.testing.assert_allclose(got[real], expected[real], atol=TOLERANCE[impl, dtype], rtol=0)


@pytest.mark.parametrize("impl", ["xla", "splash"])
def test_decoder_logits_and_gradients_do_not_depend_on_the_attention_impl(impl):
  """The whole decoder (GQA, left padding) forced onto another implementation: same logits on real tokens, same
  gradients, nothing NaN (padding queries included)."""
  t = 128
  ids = jnp.asarray(np.random.default_rng(2).integers(0, 64, (2, t)), jnp.int32)
  valid = jnp.asarray(_left_padded_valid([t, 70], t))
  results = []
  for name in ("einsum", impl):
    graphdef, params = nnx.split(Decoder(dataclasses.replace(SMALL, attention_impl=name, causal_block=32),
                                         rngs=nnx.Rngs(0)))

    def loss(params, graphdef=graphdef):
      logits = nnx.merge(graphdef, params)(ids, valid=valid)
      return jnp.sum(jnp.where(valid[..., None], jax.nn.log_softmax(logits), 0.0)) / 1000.0

    logits = np.asarray(jax.jit(lambda p, g=graphdef: nnx.merge(g, p)(ids, valid=valid))(params))
    results.append((logits, jax.jit(jax.grad(loss))(params)))
  (ref_logits, ref_grads), (logits, grads) = results
  assert np.isfinite(logits).all()
  mask = np.asarray(valid)
  np.testing.assert_allclose(logits[mask], ref_logits[mask], atol=1e-5, rtol=0)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(ref_grads)):
    assert np.isfinite(np.asarray(a)).all()
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5, rtol=1e-4)


def test_auto_picks_the_platform_kernel_where_the_shapes_fit(monkeypatch):
  assert attention_impl_for("auto", jnp.float32, 128, 64) == "einsum"  # tests run on the CPU backend
  assert attention_impl_for("auto", jnp.bfloat16, 128, 64, platform="cpu") == "einsum"
  assert attention_impl_for("auto", jnp.bfloat16, 256, 128, platform="tpu") == "splash"
  assert attention_impl_for("auto", jnp.bfloat16, 200, 128, platform="tpu") == "xla"
  assert attention_impl_for("auto", jnp.bfloat16, 256, 64, platform="tpu") == "xla"
  monkeypatch.setattr(decoder, "_is_cuda", lambda: True)
  assert attention_impl_for("auto", jnp.bfloat16, 128, 64, platform="gpu") == "cudnn"
  assert attention_impl_for("auto", jnp.float32, 128, 64, platform="gpu") == "xla"  # cuDNN takes 16-bit only
  assert attention_impl_for("auto", jnp.bfloat16, 127, 64, platform="gpu") == "xla"
  assert attention_impl_for("auto", jnp.bfloat16, 128, 12, platform="gpu") == "xla"
  monkeypatch.setattr(decoder, "_is_cuda", lambda: False)
  assert attention_impl_for("auto", jnp.bfloat16, 128, 64, platform="gpu") == "xla"
  assert attention_impl_for("xla", jnp.float32, 5, 8) == "xla"  # forced
  with pytest.raises(ValueError, match="attention impl must be one of"):
    attention_impl_for("flash", jnp.float32, 128, 64)
  with pytest.raises(ValueError, match="attention_impl must be one of"):
    ModelConfig(attention_impl="flash")


def test_splash_runs_per_shard_on_a_mesh():
  """Under an active data x fsdp x tensor mesh of 8 the splash kernel runs per shard (rows over data x fsdp, heads
  over tensor) and equals the einsum path on one device."""
  if len(jax.devices()) < 8:
    pytest.skip("needs 8 (fake) devices: XLA_FLAGS=--xla_force_host_platform_device_count=8")
  b, t, h, hkv, hd = 4, 128, 4, 2, 8
  rng = np.random.default_rng(9)
  q = jnp.asarray(rng.standard_normal((b, t, h, hd)), jnp.float32)
  k, v = (jnp.asarray(rng.standard_normal((b, hkv, t, hd)), jnp.float32) for _ in range(2))
  valid = jnp.asarray(_padded(b, t))
  expected = np.asarray(attention(q, k, v, valid=valid, impl="einsum"))
  mesh = sharding.make_mesh(data=2, fsdp=2, tensor=2)

  def on_mesh(*args):
    with sharding.activate(mesh):
      return attention(*args, valid=valid, impl="splash")

  got = jax.jit(on_mesh)(q, k, v)
  assert got.sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"), None, "tensor")
  real = _padded(b, t)
  np.testing.assert_allclose(np.asarray(got)[real], expected[real], atol=1e-5, rtol=0)
