"""Flax NNX decoder of the Llama / Qwen2 family: RMSNorm, RoPE, GQA, SwiGLU, optional biases, tied embeddings.

Weights are laid out for the matmuls that run, not for the checkpoint: projections are `[in, ..., out]`,
query/key/value kernels keep a heads axis (`[D, H, hd]`) so sharding by heads is a plain axis, and the gate
and up projections are one `[D, 2, F]` kernel (one matmul). `evolver.models.hf` converts to and from
transformers' layout.

Two entry points:
- `model(input_ids [B, T] int) -> logits [B, T, V] float32`: full causal forward (training, scoring).
- `model.forward_chunk(tokens, valid, cache) -> (logits, cache)`: runs a chunk of new tokens against a KV cache
  (prefill is a chunk on an empty cache, decoding a chunk of one). Used by the sampler.

Every layer's attention goes through `attention`, which picks the implementation: over a KV cache the cache-aware
`cached_attention` (reads only the slots in use), without one the platform's fused kernel
(`ModelConfig.attention_impl`: cuDNN on GPU, splash on TPU, XLA's otherwise) or, on CPU, blocked einsums.
"""

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from evolver.models import sharding as sharding_lib
from evolver.models.config import ATTENTION_IMPLS, ModelConfig, resolve_dtype
from evolver.models.sharding import constrain

_MASK_VALUE = -0.7 * float(np.finfo(np.float32).max)


# The logical axes of a KV cache buffer `[B, Hkv, S, hd]` (`evolver.models.sharding` maps them to the mesh).
CACHE_AXES = ("cache_batch", "cache_kv_heads", "cache_length", "head_dim")


class KVCache(NamedTuple):
  """Per-layer key/value buffers plus each row's length; a pytree.

  keys, values: per layer `[B, Hkv, S, hd]` (S = capacity). lengths: `[B]` int32, the tokens row b holds: its
  slots [0, lengths[b]) are real and in order, so a token's slot is also its RoPE position and rows of
  different lengths leave no holes (a row attends only to its own slots). The capacity is fixed when the cache
  is made; attention reads only the blocks of slots that the longest row uses (`cached_attention`), so a large
  capacity costs memory, not time.
  """

  keys: tuple[jax.Array, ...]
  values: tuple[jax.Array, ...]
  lengths: jax.Array

  @property
  def capacity(self) -> int:
    return self.keys[0].shape[2]

  @property
  def batch_size(self) -> int:
    return self.keys[0].shape[0]


def init_cache(config: ModelConfig, batch_size: int, capacity: int, dtype=None) -> KVCache:
  """An empty cache of `capacity` slots per row."""
  dtype = resolve_dtype(config.dtype) if dtype is None else dtype
  shape = (batch_size, config.num_kv_heads, capacity, config.resolved_head_dim)
  zeros = tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
  return KVCache(keys=zeros, values=tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers)),
                 lengths=jnp.zeros((batch_size,), jnp.int32))


def _param(rngs: nnx.Rngs, shape, axes, dtype, scale: float | None = None, init: str = "normal") -> nnx.Param:
  if init == "ones":
    value = jnp.ones(shape, dtype)
  elif init == "zeros":
    value = jnp.zeros(shape, dtype)
  else:
    std = scale if scale is not None else 0.02
    value = (std * jax.random.normal(rngs.params(), shape, jnp.float32)).astype(dtype)
  return nnx.Param(value, logical_axes=tuple(axes))


class RMSNorm(nnx.Module):

  def __init__(self, dim: int, eps: float, param_dtype, *, rngs: nnx.Rngs):
    self.scale = _param(rngs, (dim,), ("norm",), param_dtype, init="ones")
    self.eps = eps

  def __call__(self, x: jax.Array) -> jax.Array:
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    return self.scale.get_value().astype(x.dtype) * normed.astype(x.dtype)


def rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding, rotate-half convention (as transformers). x `[B, T, H, hd]`, positions `[B, T]` int."""
  hd = x.shape[-1]
  inv_freq = 1.0 / (theta ** (jnp.arange(0, hd, 2, dtype=jnp.float32) / hd))
  angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, hd/2]
  cos = jnp.cos(angles)[:, :, None, :].astype(x.dtype)
  sin = jnp.sin(angles)[:, :, None, :].astype(x.dtype)
  x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def grouped_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """GQA as plain batched matmuls over (batch, kv head).

  q `[B, T, H, hd]`; k, v `[B, Hkv, S, hd]`; mask `[B, T, S]` bool (True = attend). Returns `[B, T, H, hd]`.
  Scores and softmax are float32.
  """
  b, t, h, hd = q.shape
  hkv = k.shape[1]
  g = h // hkv
  if t == 1:
    return _single_query_attention(q, k, v, mask)
  # [B, T, Hkv, G, hd] -> [B, Hkv, G*T, hd]: query rows of one KV head form one matmul.
  qg = q.reshape(b, t, hkv, g, hd).transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * t, hd)
  scores = jnp.einsum("bkmd,bksd->bkms", qg, k, preferred_element_type=jnp.float32) / math.sqrt(hd)
  scores = scores.reshape(b, hkv, g, t, -1)
  scores = jnp.where(mask[:, None, None, :, :], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype).reshape(b, hkv, g * t, -1)
  out = jnp.einsum("bkms,bksd->bkmd", probs, v, preferred_element_type=jnp.float32).astype(q.dtype)
  return out.reshape(b, hkv, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd)


def causal_block_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, block: int) -> jax.Array:
  """`grouped_attention` for a causal mask (mask[b, t, s] is False for s > t, as self-attention without a cache
  has), one query block of `block` tokens at a time: block [i, i + block) attends to keys [0, i + block) only.
  The skipped scores are all masked, so real queries get the same result; at T = 1536 and block 256 the score
  FLOPs and memory are 58% of the full square. Padding queries (no real key at or before them) attend
  uniformly over a shorter range than in the full square; their outputs are never read.
  Shapes as `grouped_attention` with S = T."""
  t = q.shape[1]
  if not block or t <= block:
    return grouped_attention(q, k, v, mask)
  outs = []
  for start in range(0, t, block):
    end = min(start + block, t)
    outs.append(grouped_attention(q[:, start:end], k[:, :, :end], v[:, :, :end], mask[:, start:end, :end]))
  return jnp.concatenate(outs, axis=1)


def _single_query_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
  """`grouped_attention` for one query per row (a decode step): the same math as multiply-and-reduce
  loops, which read the cache once per step at memory speed; XLA:CPU's batched dot with G query rows ran
  1.6x slower at 48 rows x 704 slots. q `[B, 1, H, hd]`; k, v `[B, Hkv, S, hd]`; mask `[B, 1, S]`."""
  b, _, h, hd = q.shape
  hkv = k.shape[1]
  qg = q.reshape(b, hkv, h // hkv, 1, hd).astype(jnp.float32)
  scores = jnp.sum(qg * k[:, :, None].astype(jnp.float32), axis=-1) / math.sqrt(hd)  # [B, Hkv, G, S]
  scores = jnp.where(mask[:, None, :, :], scores, _MASK_VALUE)
  probs = jax.nn.softmax(scores, axis=-1)
  out = jnp.sum(probs[..., None] * v[:, :, None].astype(jnp.float32), axis=3)  # [B, Hkv, G, hd]
  return out.astype(q.dtype).reshape(b, 1, h, hd)


class CacheAccess(NamedTuple):
  """Where a chunk's tokens go in a KV cache and what its queries read (`Decoder.forward_chunk`).

  rows `[R]` int32: the cache row of each chunk row (R may be fewer than the cache's B rows; entries >= B are
  padding: they write nothing and read row B - 1, unused), or None: chunk row b is cache row b.
  write_slots `[R, C]` int32: each new token's slot (>= capacity for padding: dropped). query_slots `[R, C]`
  int32: the last slot each query attends to (its own; padding queries' are unused). num_slots `[]` int32: the
  slots in use after the write (the longest of these rows): attention reads the blocks that cover them and skips
  the rest. block: slots per block (static; the capacity is a multiple of it)."""

  rows: jax.Array | None
  write_slots: jax.Array
  query_slots: jax.Array
  num_slots: jax.Array
  block: int


def cached_attention(q: jax.Array, k: jax.Array, v: jax.Array, query_slots: jax.Array, num_slots: jax.Array,
                     block: int, rows: jax.Array | None = None) -> jax.Array:
  """GQA of new queries over a KV cache, reading only the slots in use, `block` slots at a time (online softmax).

  q `[B, T, H, hd]`; k, v `[B, Hkv, S, hd]`, S a multiple of `block`; query_slots `[B, T]` int32: query t of row
  b attends to slots 0..query_slots[b, t] (a row's slots hold its tokens in order); num_slots `[]` int32: the
  loop covers slots [0, num_slots) rounded up to whole blocks, so a step's cost follows the longest row, not the
  capacity, and one program serves every length. Returns `[B, T, H, hd]`; scores and softmax in float32.
  A decode step (T = 1) multiplies and reduces, as `_single_query_attention` does; a chunk uses batched matmuls
  over (batch, KV head). With `rows` `[B']` int32 (q's rows are these rows of k and v; entries past k's rows read
  its last row), each block is sliced from every cache row and then taken for `rows`: a few rows of a large batch
  read only their blocks, never a copy of their whole cache."""
  b, t, h, hd = q.shape
  hkv, capacity = k.shape[1], k.shape[2]
  g = h // hkv
  take = None if rows is None else jnp.minimum(rows, k.shape[0] - 1)
  if capacity % block:
    raise ValueError(f"the cache's capacity {capacity} must be a multiple of the attention block {block}")
  # [B, T, Hkv, G, hd] -> [B, Hkv, G*T, hd]: the query rows of one KV head; row m = group * T + position.
  qg = q.reshape(b, t, hkv, g, hd).transpose(0, 2, 3, 1, 4).reshape(b, hkv, g * t, hd).astype(jnp.float32)
  qg = qg / math.sqrt(hd)
  last_slot = jnp.broadcast_to(query_slots[:, None, :], (b, g, t)).reshape(b, 1, g * t, 1)

  def read_block(i, carry):
    top, total, acc = carry  # running max [B, Hkv, M], normaliser [B, Hkv, M], output [B, Hkv, M, hd]
    start = i * block
    kb = jax.lax.dynamic_slice_in_dim(k, start, block, axis=2)
    vb = jax.lax.dynamic_slice_in_dim(v, start, block, axis=2)
    if take is not None:
      kb, vb = kb[take], vb[take]
    kb, vb = kb.astype(jnp.float32), vb.astype(jnp.float32)
    if t == 1:
      scores = jnp.sum(qg[:, :, :, None, :] * kb[:, :, None], axis=-1)  # [B, Hkv, G, block]
    else:
      scores = jnp.einsum("bkmd,bksd->bkms", qg, kb, preferred_element_type=jnp.float32)
    slots = start + jax.lax.broadcasted_iota(jnp.int32, (1, 1, 1, block), 3)
    scores = jnp.where(slots <= last_slot, scores, _MASK_VALUE)
    new_top = jnp.maximum(top, jnp.max(scores, axis=-1))
    probs = jnp.exp(scores - new_top[..., None])
    rescale = jnp.exp(top - new_top)
    if t == 1:
      part = jnp.sum(probs[..., None] * vb[:, :, None], axis=3)  # [B, Hkv, G, hd]
    else:
      part = jnp.einsum("bkms,bksd->bkmd", probs, vb, preferred_element_type=jnp.float32)
    return new_top, total * rescale + jnp.sum(probs, axis=-1), acc * rescale[..., None] + part

  num_blocks = jnp.clip((num_slots + block - 1) // block, 1, capacity // block)
  init = (jnp.full((b, hkv, g * t), _MASK_VALUE, jnp.float32), jnp.zeros((b, hkv, g * t), jnp.float32),
          jnp.zeros((b, hkv, g * t, hd), jnp.float32))
  _, total, acc = jax.lax.fori_loop(0, num_blocks, read_block, init)
  out = (acc / total[..., None]).astype(q.dtype)
  return out.reshape(b, hkv, g, t, hd).transpose(0, 3, 1, 2, 4).reshape(b, t, h, hd)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, *, valid: jax.Array | None = None,
              access: CacheAccess | None = None, impl: str = "auto", causal_block: int = 0) -> jax.Array:
  """The decoder's attention: one entry point that picks the implementation by case and platform.

  Attention over a KV cache (`access` given: decode steps and prefill chunks) is `cached_attention` on every
  platform. Causal self-attention of a chunk without a cache (training, scoring) runs as `impl` says, resolved
  by `attention_impl_for`: 'einsum' (`causal_block_attention`, the CPU path), 'xla' or 'cudnn'
  (`jax.nn.dot_product_attention` with that implementation) or 'splash' (the Pallas TPU splash kernel;
  interpreted off TPU). All give the same outputs for real queries (within float rounding: ~1e-6 in float32).

  Args:
    q: `[B, T, H, hd]` queries, RoPE applied.
    k, v: `[B, Hkv, S, hd]`: with `access`, the cache after this chunk's writes (S = capacity); without, the
      chunk's own keys and values (S = T).
    valid: `[B, T]` bool, the real tokens of a chunk without a cache (None: all). A query attends to the real keys
      at or before it; a query with none (leading padding) gets a finite output that no real token reads.
    access: where the queries read the cache (`CacheAccess`), or None.
    impl: one of `ATTENTION_IMPLS` (`ModelConfig.attention_impl`).
    causal_block: the query block of the 'einsum' path (`ModelConfig.causal_block`).

  Returns:
    `[B, T, H, hd]` in q's dtype.
  """
  if access is not None:
    return cached_attention(q, k, v, access.query_slots, access.num_slots, access.block, access.rows)
  impl = attention_impl_for(impl, q.dtype, q.shape[1], q.shape[3])
  if impl == "einsum":
    b, t = q.shape[:2]
    keep = jnp.ones((b, t), bool) if valid is None else valid.astype(bool)
    mask = jnp.tril(jnp.ones((t, t), bool))[None] & keep[:, None, :]
    return causal_block_attention(q, k, v, mask, causal_block)
  if impl == "splash":
    return _splash_attention(q, k, v, valid)
  return _fused_attention(q, k, v, valid, impl)


def attention_impl_for(impl: str, dtype, seq_len: int, head_dim: int, platform: str | None = None) -> str:
  """The implementation `attention` runs for a chunk without a cache: `impl` unless it is 'auto', which picks on
  CPU 'einsum' (the blocked path, which skips the masked upper triangle); on CUDA GPUs 'cudnn' (flash attention)
  for bfloat16/float16, head_dim a multiple of 8 up to 128 and an even length, else 'xla'; on TPU 'splash' when
  the length is a multiple of 128 and head_dim of 128 (the shapes its kernels are known to take), else 'xla'.
  `platform` defaults to JAX's default backend."""
  if impl not in ATTENTION_IMPLS:
    raise ValueError(f"attention impl must be one of {ATTENTION_IMPLS}, got {impl!r}")
  if impl != "auto":
    return impl
  platform = platform or jax.default_backend()
  if platform == "gpu":
    half = jnp.dtype(dtype) in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
    fits = half and head_dim % 8 == 0 and head_dim <= 128 and seq_len % 2 == 0
    return "cudnn" if fits and _is_cuda() else "xla"
  if platform == "tpu":
    return "splash" if seq_len % 128 == 0 and head_dim % 128 == 0 else "xla"
  return "einsum"


def _is_cuda() -> bool:
  import jax.extend.backend
  return "cuda" in jax.extend.backend.get_backend().platform_version.lower()


def _fused_attention(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array | None, impl: str) -> jax.Array:
  """`jax.nn.dot_product_attention` ('xla' or 'cudnn'). q `[B, T, H, hd]`; k, v `[B, Hkv, T, hd]`. Without
  padding the mask is the kernel's own causal one; with padding a dense `[B, 1, T, T]` mask."""
  k, v = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)  # [B, T, Hkv, hd], the layout it takes
  if valid is None:
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=impl)
  t = q.shape[1]
  mask = jnp.tril(jnp.ones((t, t), bool))[None, None] & valid.astype(bool)[:, None, None, :]
  return jax.nn.dot_product_attention(q, k, v, mask=mask, implementation=impl)


def _splash_block(seq_len: int) -> int:
  for block in (512, 256, 128):
    if seq_len % block == 0:
      return block
  raise ValueError(f"splash attention needs a length that is a multiple of 128, got {seq_len}")


@functools.lru_cache(maxsize=32)
def _splash_kernel(num_heads: int, seq_len: int, interpret: bool):
  """A causal GQA splash kernel for one row: q `[H, T, hd]`, k, v `[Hkv, T, hd]`, segment ids `[T]`."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash
  block = _splash_block(seq_len)
  sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                            block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  mask = splash.MultiHeadMask([splash.CausalMask((seq_len, seq_len)) for _ in range(num_heads)])
  with jax.ensure_compile_time_eval():  # its mask tables are concrete arrays, shared by every trace
    return splash.make_splash_mha(mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret)


def _splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, valid: jax.Array | None) -> jax.Array:
  """The Pallas splash kernel (`jax.experimental.pallas.ops.tpu.splash_attention`), interpreted off TPU. q
  `[B, T, H, hd]`; k, v `[B, Hkv, T, hd]`. Padding is a segment of its own (real tokens 1, padding 0): real
  queries read real keys only, and every query reads at least itself, so no row of the kernel's mask is empty.
  Under an active mesh the kernel runs per shard (`jax.shard_map`): rows over the batch axes, heads over the
  tensor axis when both the query and the KV heads divide it."""
  from jax.experimental.pallas.ops.tpu import splash_attention as splash
  b, t, h, hd = q.shape
  hkv = k.shape[1]
  qh = (q * jnp.asarray(1.0 / math.sqrt(hd), q.dtype)).transpose(0, 2, 1, 3)  # [B, H, T, hd]; the kernel does not scale
  segments = jnp.ones((b, t), jnp.int32) if valid is None else valid.astype(jnp.int32)
  interpret = jax.default_backend() != "tpu"
  mesh, rules = sharding_lib.active()

  def per_shard(qs, ks, vs, seg):
    kernel = _splash_kernel(qs.shape[1], t, interpret)
    return jax.vmap(kernel)(qs, ks, vs, jax.vmap(lambda s: splash.SegmentIds(q=s, kv=s))(seg))

  if mesh is None or mesh.size == 1:
    out = per_shard(qh, k, v, segments)
  else:
    batch = sharding_lib.named_sharding(mesh, ("batch",), (b,), rules).spec[0]
    heads = sharding_lib.named_sharding(mesh, ("act_heads",), (h,), rules).spec[0]
    kv_heads = sharding_lib.named_sharding(mesh, ("act_kv_heads",), (hkv,), rules).spec[0]
    if heads != kv_heads:  # a head axis that one of them does not divide: no head split
      heads = None
    q_spec = jax.sharding.PartitionSpec(batch, heads, None, None)
    out = jax.shard_map(per_shard, mesh=mesh, in_specs=(q_spec, q_spec, q_spec, jax.sharding.PartitionSpec(batch)),
                        out_specs=q_spec, check_vma=False)(qh, k, v, segments)
  return out.transpose(0, 2, 1, 3)


def _matmul(x: jax.Array, kernel: jax.Array) -> jax.Array:
  """x `[..., K]` @ kernel `[K, ...]` as one 2-D matmul (XLA:CPU runs 2-D dots on its fastest path; an einsum
  with several free dims on one side was measured 1.6x slower at batch 1). Under an active mesh the kernel keeps
  its axes: merging a split axis with a leading one (the MLP's `[D, 2, F]`, F over tensor) would gather the
  kernel at every call."""
  mesh, _ = sharding_lib.active()
  if mesh is not None and mesh.size > 1:
    return jax.lax.dot_general(x, kernel.astype(x.dtype), (((x.ndim - 1,), (0,)), ((), ())))
  lead, k = x.shape[:-1], x.shape[-1]
  out = x.reshape(-1, k) @ kernel.reshape(k, -1).astype(x.dtype)
  return out.reshape(*lead, *kernel.shape[1:])


class Attention(nnx.Module):
  """GQA attention. The query, key and value projections are one kernel `[D, Hkv, G + 2, hd]`: for each KV
  head, its G query heads, then its key and its value. One matmul, and sharding by KV head keeps each
  group (and its cache) on one shard."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d, h, hkv, hd = config.hidden_size, config.num_heads, config.num_kv_heads, config.resolved_head_dim
    g = config.num_groups
    pdt = resolve_dtype(config.param_dtype)
    self.config = config
    self.qkv = _param(rngs, (d, hkv, g + 2, hd), ("embed", "kv_heads", None, "head_dim"), pdt)
    self.o = _param(rngs, (h, hd, d), ("q_heads", "head_dim", "embed"), pdt)
    if config.qkv_bias:
      self.qkv_bias = _param(rngs, (hkv, g + 2, hd), ("kv_heads", None, "head_dim"), pdt, init="zeros")
    if config.o_bias:
      self.o_bias = _param(rngs, (d,), ("embed",), pdt, init="zeros")

  def __call__(self, x, positions, valid=None, kv_cache=None, access: CacheAccess | None = None):
    """x `[B, T, D]`; positions `[B, T]`. Without a cache, causal self-attention over the chunk, `valid` `[B, T]`
    bool marking its real tokens (None: all). With `kv_cache=(k, v)` `[B, Hkv, S, hd]`, each token's key/value is
    first written to its row's slot (`access.write_slots`; padding is dropped), then the queries read the cache as
    `access` says; `valid` is unused. Both through `attention`. Returns (out `[B, T, D]`, (k, v) or None)."""
    b, t, _ = x.shape
    cfg = self.config
    g = cfg.num_groups
    qkv = _matmul(x, self.qkv.get_value())  # [B, T, Hkv, G + 2, hd]
    if cfg.qkv_bias:
      qkv = qkv + self.qkv_bias.get_value().astype(x.dtype)
    qkv = constrain(qkv, ("batch", "length", "act_kv_heads", None, "head_dim"))
    q = rope(qkv[:, :, :, :g].reshape(b, t, cfg.num_heads, -1), positions, cfg.rope_theta)
    k = rope(qkv[:, :, :, g], positions, cfg.rope_theta)
    v = qkv[:, :, :, g + 1]
    if kv_cache is not None:
      k_cache, v_cache = kv_cache
      rows = (jnp.arange(b, dtype=jnp.int32) if access.rows is None else access.rows)[:, None]
      # Advanced indices on the batch and slot axes: the update is laid out [B, T, Hkv, hd], as k and v are.
      k = k_cache.at[rows, :, access.write_slots].set(k.astype(k_cache.dtype), mode="drop")
      v = v_cache.at[rows, :, access.write_slots].set(v.astype(v_cache.dtype), mode="drop")
      k = constrain(k, CACHE_AXES)
      v = constrain(v, CACHE_AXES)
      attn = attention(q, k, v, access=access)
      new_cache = (k, v)
    else:
      k = constrain(k.transpose(0, 2, 1, 3), ("batch", "act_kv_heads", "cache_length", "head_dim"))  # [B, Hkv, T, hd]
      v = constrain(v.transpose(0, 2, 1, 3), ("batch", "act_kv_heads", "cache_length", "head_dim"))
      attn = attention(q, k.astype(x.dtype), v.astype(x.dtype), valid=valid, impl=cfg.attention_impl,
                       causal_block=cfg.causal_block)
      new_cache = None
    out = _matmul(attn.reshape(b, t, -1), self.o.get_value().reshape(-1, cfg.hidden_size))
    if cfg.o_bias:
      out = out + self.o_bias.get_value().astype(x.dtype)
    return out, new_cache


class MLP(nnx.Module):
  """SwiGLU; gate and up are one kernel `[D, 2, F]`."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    d, f = config.hidden_size, config.intermediate_size
    pdt = resolve_dtype(config.param_dtype)
    self.config = config
    self.gate_up = _param(rngs, (d, 2, f), ("embed", None, "mlp"), pdt)
    self.down = _param(rngs, (f, d), ("mlp", "embed"), pdt)
    if config.mlp_bias:
      self.gate_up_bias = _param(rngs, (2, f), (None, "mlp"), pdt, init="zeros")
      self.down_bias = _param(rngs, (d,), ("embed",), pdt, init="zeros")

  def __call__(self, x):
    gu = _matmul(x, self.gate_up.get_value())  # [B, T, 2, F]
    if self.config.mlp_bias:
      gu = gu + self.gate_up_bias.get_value().astype(x.dtype)
    gu = constrain(gu, ("batch", "length", None, "act_mlp"))
    hidden = jax.nn.silu(gu[:, :, 0]) * gu[:, :, 1]
    out = _matmul(hidden, self.down.get_value())
    if self.config.mlp_bias:
      out = out + self.down_bias.get_value().astype(x.dtype)
    return out


class Block(nnx.Module):

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    pdt = resolve_dtype(config.param_dtype)
    self.attn_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, pdt, rngs=rngs)
    self.attn = Attention(config, rngs=rngs)
    self.mlp_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, pdt, rngs=rngs)
    self.mlp = MLP(config, rngs=rngs)

  def __call__(self, x, positions, valid=None, kv_cache=None, access: CacheAccess | None = None):
    attn_out, new_cache = self.attn(self.attn_norm(x), positions, valid, kv_cache, access)
    x = constrain(x + attn_out, ("batch", "length", "act_embed"))
    x = constrain(x + self.mlp(self.mlp_norm(x)), ("batch", "length", "act_embed"))
    return x, new_cache


def _remat_policy(name: str):
  return {"full": None, "dots_saveable": jax.checkpoint_policies.dots_with_no_batch_dims_saveable}[name]


class Decoder(nnx.Module):
  """The policy: token ids in, float32 logits out."""

  def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs):
    pdt = resolve_dtype(config.param_dtype)
    self.config = config
    self.embed = _param(rngs, (config.vocab_size, config.hidden_size), ("vocab", "embed"), pdt)
    self.layers = nnx.List([Block(config, rngs=rngs) for _ in range(config.num_layers)])
    self.final_norm = RMSNorm(config.hidden_size, config.rms_norm_eps, pdt, rngs=rngs)
    if not config.tie_embeddings:
      self.lm_head = _param(rngs, (config.hidden_size, config.vocab_size), ("embed", "vocab"), pdt)

  # -- pieces -------------------------------------------------------------------------------------------

  def embed_tokens(self, tokens: jax.Array) -> jax.Array:
    dtype = resolve_dtype(self.config.dtype)
    x = jnp.take(self.embed.get_value(), tokens, axis=0).astype(dtype)
    return constrain(x, ("batch", "length", "act_embed"))

  def logits(self, hidden: jax.Array) -> jax.Array:
    """Final norm and LM head. hidden `[B, T, D]` -> logits `[B, T, V]` float32."""
    h = self.final_norm(hidden)
    b, t, d = h.shape
    h2 = h.reshape(b * t, d)
    if self.config.tie_embeddings:
      out = jax.lax.dot_general(h2, self.embed.get_value().astype(h.dtype), (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32)
    else:
      out = jnp.dot(h2, self.lm_head.get_value().astype(h.dtype), preferred_element_type=jnp.float32)
    return constrain(out.reshape(b, t, -1), ("batch", "length", "act_vocab"))

  def _run_layers(self, x, positions, valid, cache: KVCache | None, access: CacheAccess | None = None):
    new_keys, new_values = [], []
    for i, layer in enumerate(self.layers):
      kv = None if cache is None else (cache.keys[i], cache.values[i])
      if self.config.remat != "none" and cache is None:
        x, _ = nnx.remat(lambda blk, *a: blk(*a), policy=_remat_policy(self.config.remat))(layer, x, positions, valid)
      else:
        x, kv = layer(x, positions, valid, kv, access)
      if kv is not None:
        new_keys.append(kv[0])
        new_values.append(kv[1])
    return x, new_keys, new_values

  # -- entry points -------------------------------------------------------------------------------------

  def hidden_states(self, input_ids: jax.Array, *, valid: jax.Array | None = None) -> jax.Array:
    """Final-layer hidden states `[B, T, D]` before the final norm. `valid` `[B, T]` marks real tokens
    (default all); padding may sit anywhere, positions count real tokens only."""
    b, t = input_ids.shape
    if valid is None:
      positions = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    else:
      valid = valid.astype(bool)
      positions = jnp.maximum(jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1, 0)
    x, _, _ = self._run_layers(self.embed_tokens(input_ids), positions, valid, None)
    return x

  def __call__(self, input_ids: jax.Array, *, valid: jax.Array | None = None) -> jax.Array:
    """input_ids `[B, T]` int -> logits `[B, T, V]` float32."""
    check_token_ids(input_ids, self.config.vocab_size)
    return self.logits(self.hidden_states(input_ids, valid=valid))

  def chunked_target_logprobs(self, input_ids: jax.Array, *, chunk_rows: int = 1024) -> jax.Array:
    """log p(input_ids[:, t] | input_ids[:, :t]) `[B, T]` float32 (column 0 is 0) without the `[B, T, V]`
    logits: the head and log-softmax run `chunk_rows` tokens at a time, forward and backward
    (`fused_head_logprobs`). A third more head FLOPs (the backward recomputes the logits) for `[chunk, V]`
    instead of `[B, T, V]` memory: what large vocabularies on accelerators need. On CPU at 32k vocab the full
    logits were measured faster."""
    check_token_ids(input_ids, self.config.vocab_size)
    b, t = input_ids.shape
    h = self.final_norm(self.hidden_states(input_ids))
    if self.config.tie_embeddings:
      head_t = self.embed.get_value().astype(h.dtype).T
    else:
      head_t = self.lm_head.get_value().astype(h.dtype)
    next_ids = jnp.pad(input_ids[:, 1:], ((0, 0), (0, 1)))
    rows = min(chunk_rows, b * t)
    logp_next = fused_head_logprobs(h.reshape(b * t, -1), head_t, next_ids.reshape(-1), rows).reshape(b, t)
    return jnp.pad(logp_next[:, :-1], ((0, 0), (1, 0)))

  def forward_chunk(self, tokens: jax.Array, valid: jax.Array, cache: KVCache, *, last_only: bool = True,
                    block: int = 128, rows: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
    """Runs new tokens against the cache and appends them to it.

    tokens, valid: `[B, C]`, left-padded (a row's real tokens end at the chunk's last column; a row may have
    none). Row b's real tokens go to its slots [lengths[b], lengths[b] + n_b), which the caller keeps within
    the capacity (slots past it are dropped). Attention reads the cache `block` slots at a time, only as far as
    the longest row reaches (`cached_attention`; the capacity must be a multiple of `block`, or `block` is the
    whole capacity when it is smaller). With `rows` `[R]` int32, the chunk `[R, C]` belongs to those rows of the
    cache (entries >= the cache's batch are padding: nothing written); the other rows are untouched, and no row's
    cache is copied. Returns logits `[B or R, V]` at the last column (or `[B or R, C, V]` with last_only=False),
    float32, and the updated cache.
    """
    valid = valid.astype(bool)
    if rows is None:
      lengths = cache.lengths
    else:
      lengths = jnp.where(rows < cache.batch_size, cache.lengths[jnp.minimum(rows, cache.batch_size - 1)], 0)
    slot = lengths[:, None] + jnp.cumsum(valid, axis=1, dtype=jnp.int32) - 1  # each token's slot
    added = jnp.sum(valid, axis=1, dtype=jnp.int32)
    if rows is None:
      new_lengths = cache.lengths + added
    else:
      new_lengths = cache.lengths.at[rows].add(added, mode="drop")
    access = CacheAccess(rows=rows, write_slots=jnp.where(valid, slot, cache.capacity),  # padding: dropped
                         query_slots=slot, num_slots=jnp.max(lengths + added), block=min(block, cache.capacity))
    x, keys, values = self._run_layers(self.embed_tokens(tokens), jnp.maximum(slot, 0), None, cache, access)
    if last_only:
      x = x[:, -1:]
    logits = self.logits(x)
    if last_only:
      logits = logits[:, 0]
    return logits, KVCache(keys=tuple(keys), values=tuple(values), lengths=new_lengths)


def check_token_ids(input_ids, vocab_size: int) -> None:
  """Raises a clear error for ids outside [0, vocab_size) when the ids are concrete (not traced)."""
  if isinstance(input_ids, jax.core.Tracer):
    return
  ids = np.asarray(input_ids)
  if not np.issubdtype(ids.dtype, np.integer):
    raise TypeError(f"token ids must be integers, got dtype {ids.dtype}")
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    bad = ids[(ids < 0) | (ids >= vocab_size)]
    raise ValueError(f"token ids out of the vocabulary [0, {vocab_size}): {sorted(set(bad.tolist()))[:10]}")


def make_model(config: ModelConfig, seed: int = 0) -> Decoder:
  return Decoder(config, rngs=nnx.Rngs(params=seed))


def _chunked(x: jax.Array, chunk: int) -> jax.Array:
  n = x.shape[0]
  pad = (-n) % chunk
  x = jnp.pad(x, ((0, pad),) + ((0, 0),) * (x.ndim - 1))
  return x.reshape(-1, chunk, *x.shape[1:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def fused_head_logprobs(h: jax.Array, head_t: jax.Array, targets: jax.Array, chunk: int) -> jax.Array:
  """log softmax(h @ head_t)[targets] without materialising the `[N, V]` logits.

  h `[N, D]`, head_t `[D, V]` (the LM head as `[in, out]`), targets `[N]` int -> `[N]` float32. Rows are
  processed `chunk` at a time, forward and backward (the backward recomputes each chunk's logits), so peak
  memory is `[chunk, V]` and every matmul is a plain row-major GEMM.
  """
  return _fused_head_forward(h, head_t, targets, chunk)[0]


def _fused_head_forward(h, head_t, targets, chunk):
  n = h.shape[0]
  hc, tc = _chunked(h, chunk), _chunked(targets, chunk)

  def one(carry, xs):
    h_i, t_i = xs
    logits = jnp.dot(h_i, head_t, preferred_element_type=jnp.float32)
    picked = jnp.take_along_axis(logits, t_i[:, None], axis=-1)[:, 0]
    return carry, picked - jax.nn.logsumexp(logits, axis=-1)

  _, logp = jax.lax.scan(one, None, (hc, tc))
  return logp.reshape(-1)[:n], (h, head_t, targets)


def _fused_head_backward(chunk, residuals, g):
  h, head_t, targets = residuals
  n, vocab = h.shape[0], head_t.shape[1]
  hc, tc, gc = _chunked(h, chunk), _chunked(targets, chunk), _chunked(g.astype(jnp.float32), chunk)

  def one(d_head_t, xs):
    h_i, t_i, g_i = xs
    logits = jnp.dot(h_i, head_t, preferred_element_type=jnp.float32)
    probs = jax.nn.softmax(logits, axis=-1)
    # d logp[t] / d logits = onehot(t) - softmax
    d_logits = g_i[:, None] * (jax.nn.one_hot(t_i, vocab, dtype=jnp.float32) - probs)
    d_h = jnp.dot(d_logits.astype(h_i.dtype), head_t.T, preferred_element_type=jnp.float32).astype(h_i.dtype)
    d_head_t = d_head_t + jnp.dot(h_i.T, d_logits.astype(h_i.dtype), preferred_element_type=jnp.float32)
    return d_head_t, d_h

  d_head_t, d_h = jax.lax.scan(one, jnp.zeros(head_t.shape, jnp.float32), (hc, tc, gc))
  return d_h.reshape(-1, h.shape[1])[:n], d_head_t.astype(head_t.dtype), None


fused_head_logprobs.defvjp(_fused_head_forward, _fused_head_backward)
