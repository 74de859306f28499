"""Batched, jitted KV-cache generation: prefill, then a `lax.while_loop` of single-token decode steps.

Design, for speed on every backend:
- Each row's tokens sit in its own slots 0..length-1 (a scatter writes each new token at its row's length):
  chunks are left-padded to one width, but padding is never stored, so rows of different lengths leave no
  holes and a token's slot is its RoPE position.
- A session's cache holds `max_length` slots per row from the start; attention reads it in blocks of
  `attention_block` slots, only as far as the longest row reaches (`evolver.models.decoder.cached_attention`), so
  a step costs what the rows hold, not the capacity, and the cache never grows or shrinks. The compiled programs
  therefore depend on the batch bucket (and a prefill's chunk width) only, never on the length of the
  conversations: once a run has met its batch sizes, nothing compiles again.
- A `Session` keeps the cache between calls. Every row's last sampled token is *pending* (sampled, not yet in
  the cache); the next call prepends it to that row's new tokens, so a second turn costs only its new tokens.
- Log-probabilities are those of the sampled token under the model's raw distribution (temperature 1, no
  top-k/top-p), which is what training recomputes.
- Randomness is per row: every row carries its own key, and the token a row samples at position t of a call
  (t = 0 for the first) uses `fold_in(row_key, t)`, drawn for that row alone. A row's tokens therefore depend on
  its key and its context only, never on its position in the batch or on the other rows, so callers (the rollout
  engine) can give each episode a key of its own and get the same episode however the work is batched. Greedy
  decoding draws nothing.
- On a mesh (`Sampler(model, mesh=...)`, or weights that arrive placed on one, as a `Trainer`'s are) the weights
  are placed by `sharding.SAMPLING_RULES`: tensor-parallel, replicated over (data, fsdp), so no decode step gathers
  them. The KV cache `[B, Hkv, S, hd]` is sharded by rows over (data, fsdp) and by KV heads over tensor (where
  they divide), the other per-row state by rows; every program is traced with the mesh active (activations
  constrained) and pins its outputs to those shardings, so each program's outputs are the next one's inputs as
  they are: nothing is resharded between calls and nothing compiles twice. Without a mesh nothing of this runs.
"""

import dataclasses
import functools
import math
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from evolver import runtime
from evolver.models import sharding
from evolver.models.decoder import CACHE_AXES, Decoder, KVCache, check_token_ids, init_cache


@dataclasses.dataclass(frozen=True)
class SamplingParams:
  """temperature 0 = greedy. top_k 0 and top_p 1.0 disable those filters. stop_ids end a row (the stop token
  is kept in the output); `max_new_tokens` bounds every row."""

  max_new_tokens: int = 128
  temperature: float = 1.0
  top_k: int = 0
  top_p: float = 1.0
  stop_ids: tuple[int, ...] = ()

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
    if self.temperature < 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature}")
    if self.top_k < 0:
      raise ValueError(f"top_k must be >= 0, got {self.top_k}")
    if not 0.0 < self.top_p <= 1.0:
      raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")




@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _LoopState:
  cache: KVCache
  last_token: jax.Array   # [B] int32: each row's pending token
  done: jax.Array         # [B] bool
  tokens: jax.Array       # [B, N] int32, -1 after a row stops
  logprobs: jax.Array     # [B, N] float32, 0 after a row stops
  step: jax.Array         # [] int32: columns filled
  row_keys: jax.Array     # [B, K] uint32: each row's raw PRNG key (K = 2 for threefry)


@dataclasses.dataclass
class Session:
  """A batch of conversations held in the cache. Rows past `num_rows` are batch padding."""

  cache: KVCache
  pending: jax.Array  # [B_padded] int32
  num_rows: int

  @property
  def lengths(self) -> np.ndarray:
    """[num_rows] int: the tokens each real row holds in the cache (its pending token not included)."""
    return np.asarray(self.cache.lengths)[:self.num_rows]


@dataclasses.dataclass
class Generation:
  """Per-row outputs of one `generate` call (real rows only)."""

  tokens: list[list[int]]        # sampled ids, stop token included
  logprobs: list[np.ndarray]     # float32, one per sampled token
  stopped: np.ndarray            # [num_rows] bool: ended on a stop id (else hit max_new_tokens)
  session: Session


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _SlotState:
  """Rows decoding independently of each other (continuous batching): each row is at its own position of its own
  turn. Scalars count the decode loop's work."""

  cache: KVCache
  last_token: jax.Array       # [B] int32: each row's pending token (sampled, not yet in the cache)
  active: jax.Array           # [B] bool: the row is sampling (its turn has not finished)
  tokens: jax.Array           # [B, N] int32: the current turn's sampled tokens, -1 past `pos`
  logprobs: jax.Array         # [B, N] float32, 0 past `pos`
  pos: jax.Array              # [B] int32: tokens sampled in the current turn
  row_keys: jax.Array         # [B, K] uint32: the current turn's key of each row
  steps: jax.Array            # [] int32: decode steps run
  live_row_steps: jax.Array   # [] int32: row-steps that sampled a token


@dataclasses.dataclass
class Slots:
  """A batch of rows for continuous batching (`Sampler.open_slots`): a row starts a turn (`begin_turns`), decodes
  it while other rows are at other points of theirs (`decode_slots`), and is collected when its turn finishes.
  `open` (host side) marks the rows whose turn was begun and not yet collected."""

  state: _SlotState
  sampling: SamplingParams
  open: np.ndarray            # [B] bool


@dataclasses.dataclass
class FinishedTurn:
  """One row's finished turn (`Sampler.decode_slots`)."""

  row: int
  tokens: list[int]           # sampled ids, the stop token included
  logprobs: np.ndarray        # float32, one per sampled token
  stopped: bool               # ended on a stop id (else max_new_tokens, or the row's context is full)


MAX_STOP_IDS = 8


@dataclasses.dataclass
class SamplerStats:
  """Where a sampler's time went, summed over calls (seconds of wall time, each piece waited for).

  Compilation is counted apart (`compile_s`, from `evolver.runtime.CompileLog`): the other times are running
  compiled programs and the host work around them. prefill: the new tokens of every call (all pieces of a long
  chunk, and sampling each row's first token); decode: the single-token steps; select: dropping rows, and
  moving rows between decode batches (`compact_decode`). `decode_row_steps` counts every
  row of the padded batch at every decode step, `decode_live_row_steps` those that sampled a token: the rest is
  idle rows, waiting for the longest row of their call (or batch padding)."""

  generate_calls: int = 0
  compile_s: float = 0.0           # tracing and compiling new programs inside the timed pieces (not in the others)
  compiles: int = 0
  prefill_s: float = 0.0
  prefill_slots: int = 0           # rows x padded chunk width, summed over prefill pieces
  decode_s: float = 0.0
  decode_calls: int = 0            # while-loop launches (a call compacting its batch launches again)
  decode_steps: int = 0
  decode_row_steps: int = 0
  decode_live_row_steps: int = 0
  select_s: float = 0.0

  def add_time(self, piece: str, started: float, mark: int) -> None:
    """Adds the seconds since `started` to `<piece>_s`, less what XLA compiled since the log's `mark`."""
    events = runtime.compile_log().since(mark)
    compiling = sum(e.seconds + e.trace_s for e in events)
    self.compile_s += compiling
    self.compiles += len(events)
    setattr(self, f"{piece}_s", getattr(self, f"{piece}_s") + max(time.perf_counter() - started - compiling, 0.0))

  def minus(self, before: "SamplerStats") -> "SamplerStats":
    """The work done since `before` (a copy taken earlier)."""
    return SamplerStats(**{f.name: getattr(self, f.name) - getattr(before, f.name)
                           for f in dataclasses.fields(self)})

  @property
  def idle_row_fraction(self) -> float:
    """The share of decode row-steps whose row sampled nothing (0 when nothing was decoded)."""
    return 1.0 - self.decode_live_row_steps / self.decode_row_steps if self.decode_row_steps else 0.0

  @property
  def decode_step_s(self) -> float:
    """Mean seconds per decode step (0 when nothing was decoded)."""
    return self.decode_s / self.decode_steps if self.decode_steps else 0.0


def filter_logits(logits: jax.Array, temperature, top_k: int, top_p) -> jax.Array:
  """Temperature, then top-k, then nucleus filtering. logits `[B, V]` float32. `top_k` is static (0 = off);
  temperature and top_p may be traced (top_p >= 1 keeps everything)."""
  logits = logits / temperature
  if top_k:
    kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
    logits = jnp.where(logits < kth, -jnp.inf, logits)
  if top_p is not None:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each candidate
    keep = before < top_p
    threshold = jnp.min(jnp.where(keep, sorted_logits, jnp.inf), axis=-1, keepdims=True)
    logits = jnp.where(logits < threshold, -jnp.inf, logits)
  return logits


@dataclasses.dataclass(frozen=True)
class _Static:
  """What changes the compiled program; everything else in SamplingParams is a traced value."""

  greedy: bool
  top_k: int
  nucleus: bool
  buffer_len: int  # output columns, max_new_tokens rounded up so nearby lengths share a program


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class _Knobs:
  temperature: jax.Array  # [] float32
  top_p: jax.Array        # [] float32
  stop_ids: jax.Array     # [MAX_STOP_IDS] int32, -1 = unused
  max_new: jax.Array      # [] int32


def _split_params(params: SamplingParams) -> tuple[_Static, _Knobs]:
  if len(params.stop_ids) > MAX_STOP_IDS:
    raise ValueError(f"at most {MAX_STOP_IDS} stop ids, got {len(params.stop_ids)}")
  stops = np.full((MAX_STOP_IDS,), -1, np.int32)
  stops[:len(params.stop_ids)] = params.stop_ids
  static = _Static(greedy=params.temperature == 0.0, top_k=params.top_k, nucleus=params.top_p < 1.0,
                   buffer_len=_round_up(params.max_new_tokens, 32))
  knobs = _Knobs(temperature=jnp.float32(max(params.temperature, 1e-6)), top_p=jnp.float32(params.top_p),
                 stop_ids=jnp.asarray(stops), max_new=jnp.int32(params.max_new_tokens))
  return static, knobs


def sample_tokens(logits: jax.Array, row_keys: jax.Array, position: jax.Array, static: _Static,
                  knobs: _Knobs) -> tuple[jax.Array, jax.Array]:
  """Draws one token per row.

  Args:
    logits: [B, V] the next-token logits of each row.
    row_keys: [B, K] uint32 raw PRNG keys, one per row (unused when greedy).
    position: [] or [B] int32, the output column being sampled (one for all rows, or each row's own): row b
      draws with `fold_in(row_keys[b], position[b])`.

  Returns:
    (tokens [B] int32, logprobs [B] float32 under the raw distribution).
  """
  logits = logits.astype(jnp.float32)
  top = jnp.max(logits, axis=-1, keepdims=True)
  if static.greedy:
    # First index of the maximum, as argmax; two plain reductions run faster on CPU than argmax's
    # variadic (value, index) reduce.
    iota = jax.lax.broadcasted_iota(jnp.int32, logits.shape, 1)
    tokens = jnp.min(jnp.where(logits == top, iota, logits.shape[-1]), axis=-1)
  else:
    filtered = filter_logits(logits, knobs.temperature, static.top_k, knobs.top_p if static.nucleus else None)
    keys = jax.vmap(jax.random.fold_in, in_axes=(0, 0 if jnp.ndim(position) else None))(row_keys, position)
    tokens = jax.vmap(jax.random.categorical)(keys, filtered).astype(jnp.int32)
  log_normalizer = top[:, 0] + jnp.log(jnp.sum(jnp.exp(logits - top), axis=-1))
  logprobs = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0] - log_normalizer
  return tokens, logprobs


@jax.jit
def _fold_in_rows(keys: jax.Array, data: jax.Array) -> jax.Array:
  return jax.vmap(jax.random.fold_in)(keys, data)


def fold_in_rows(keys: np.ndarray | jax.Array, data: Sequence[int] | np.ndarray) -> np.ndarray:
  """`jax.random.fold_in(keys[i], data[i])` for every row, in one call.

  Args:
    keys: [N, K] uint32 raw PRNG keys (K = 2 for threefry).
    data: [N] integers in [0, 2**32).

  Returns:
    [N, K] uint32 raw keys (numpy). Rows are padded to a batch bucket, so few programs compile.
  """
  keys = np.asarray(keys, np.uint32)
  data = np.asarray(data, np.int64)
  if keys.ndim != 2 or data.shape != (keys.shape[0],):
    raise ValueError(f"fold_in_rows needs keys [N, K] and data [N], got {keys.shape} and {data.shape}")
  if data.size and (data.min() < 0 or data.max() >= 2**32):
    raise ValueError(f"fold_in data must be in [0, 2**32), got values in [{data.min()}, {data.max()}]")
  n = keys.shape[0]
  if n == 0:
    return keys
  bucket = _batch_bucket(n)
  padded_keys = np.zeros((bucket, keys.shape[1]), np.uint32)
  padded_keys[:n] = keys
  padded_data = np.zeros(bucket, np.uint32)
  padded_data[:n] = data
  return np.asarray(_fold_in_rows(padded_keys, padded_data))[:n]


@functools.cache
def raw_key_shape() -> tuple[int, ...]:
  """The shape of one raw key of JAX's default PRNG implementation ((2,) for threefry)."""
  return tuple(jax.eval_shape(lambda: jax.random.PRNGKey(0)).shape)


def row_key_data(seed: int | jax.Array | np.ndarray, rows: int) -> np.ndarray:
  """Per-row raw keys `[rows, K]` uint32 from what `Sampler.generate` accepts as `seed`.

  An int or a single key (raw `[K]` uint32, or a typed scalar key) gives row r the key `fold_in(key, r)`; per-row
  keys (raw `[rows, K]` uint32, or typed `[rows]`) are used as they are.
  """
  key_shape = raw_key_shape()
  if isinstance(seed, (bool, np.bool_)):
    raise TypeError("seed must be an int or a PRNG key array, got a bool")
  if isinstance(seed, (int, np.integer)):
    single = np.asarray(jax.random.key_data(jax.random.PRNGKey(int(seed))), np.uint32)
    return fold_in_rows(np.broadcast_to(single, (rows, *key_shape)), np.arange(rows))
  if not hasattr(seed, "dtype") or not hasattr(seed, "shape"):
    raise TypeError(f"seed must be an int or a PRNG key array, got {type(seed).__name__}")
  if jax.dtypes.issubdtype(seed.dtype, jax.dtypes.prng_key):
    typed_shape = tuple(seed.shape)
    data = np.asarray(jax.random.key_data(seed))
    if data.shape[len(typed_shape):] != key_shape:
      raise ValueError(f"seed keys hold {data.shape[len(typed_shape):]} words each, but the sampler uses JAX's "
                       f"default PRNG implementation ({key_shape} words); make the keys with jax.random.key")
  else:
    data = np.asarray(seed)
    if data.dtype != np.uint32:
      raise TypeError(f"a raw PRNG key array must be uint32, got {data.dtype}")
  data = data.astype(np.uint32)
  if data.shape == key_shape:
    return fold_in_rows(np.broadcast_to(data, (rows, *key_shape)), np.arange(rows))
  if data.shape == (rows, *key_shape):
    return data
  raise ValueError(f"seed must be an int, one key ({key_shape} uint32 or a typed scalar key) or one key per row "
                   f"({(rows, *key_shape)} uint32 or typed [{rows}]); got shape {data.shape} for {rows} rows")


def _round_up(n: int, multiple: int) -> int:
  return max(multiple, -(-n // multiple) * multiple)


def _batch_bucket(n: int) -> int:
  """The padded batch for n rows: the next power of two. Every distinct batch is a new program (for each chunk
  width), and a real RL step meets most of them: with 1.5x sizes as well (1, 2, 3, 4, 6, 8, 12,
  ...) and capacities in steps of 64, the second GRPO step of the CPU recipe (maze) compiled 97 programs, most of
  them the sampler's (`launch.benchmark --suite rl_step`); powers of two halve the set for at most half the rows
  as padding."""
  return 1 << max(0, math.ceil(math.log2(max(n, 1))))


# A session's cache holds this many slots per row unless the Sampler is given `max_length` (or the model has fewer
# positions): e.g. Qwen2.5-0.5B's 32,768 positions would be ~0.4 GB of bfloat16 cache per row.
DEFAULT_MAX_LENGTH = 4096

# Decode batches are not compacted below this many rows: a smaller batch saves little per step, and every batch
# size is programs to compile (decode, and the gather and scatter from and to each larger batch).
_MIN_COMPACT_ROWS = 8

# Turns begun together (`begin_turns`) run in a sub-batch of at least this many rows (fewer when the slots have
# fewer): every sub-batch size is programs to compile at each chunk width, and the continuous schedule begins a
# few rows at a time (an eighth of those in play), so padding a lone row to 4 costs little.
_MIN_BEGIN_ROWS = 4


def _begin_rows(n: int, batch: int) -> int:
  """The sub-batch that begins turns on `n` of `batch` slots (`batch` a power of two)."""
  return min(max(_batch_bucket(n), _MIN_BEGIN_ROWS), batch)


def _gather_rows(state: _LoopState, rows: jax.Array, live: jax.Array) -> _LoopState:
  """The decode state of rows `rows` `[R]` int32 of `state` (a smaller batch); entries with `live` False are
  padding, marked done."""
  sub = jax.tree.map(lambda x: x if x.ndim == 0 else x[rows], state)
  return dataclasses.replace(sub, done=sub.done | ~live)


def _scatter_rows(full: _LoopState, sub: _LoopState, rows: jax.Array) -> _LoopState:
  """`full` with its rows `rows` `[R]` int32 replaced by `sub`'s (entries >= full's batch are padding: dropped)
  and `sub`'s step."""
  merged = jax.tree.map(lambda f, p: f if f.ndim == 0 else f.at[rows].set(p, mode="drop"), full, sub)
  return dataclasses.replace(merged, step=sub.step)


def _repack_rows(state: "_SlotState", index: jax.Array, live: jax.Array) -> "_SlotState":
  """Rows `index` `[R]` int32 of `state`; rows where `live` `[R]` is False are padding copies, never active."""
  picked = jax.tree.map(lambda x: x if x.ndim == 0 else x[index], state)
  return dataclasses.replace(picked, active=picked.active & live)


def _select_rows(tree, rows: jax.Array):
  """Rows `rows` `[R]` int32 of every array of `tree` with a row axis (scalars as they are)."""
  return jax.tree.map(lambda x: x if x.ndim == 0 else x[rows], tree)


def _reset_rows(cache: KVCache, rows: jax.Array) -> KVCache:
  """`cache` with rows `rows` `[R]` int32 emptied (length 0; entries >= B are padding)."""
  return cache._replace(lengths=cache.lengths.at[rows].set(0, mode="drop"))


def weights_mesh(params: nnx.State) -> jax.sharding.Mesh | None:
  """The mesh the weights are placed on (their first leaf's `NamedSharding`), or None."""
  placement = getattr(jax.tree.leaves(params)[0], "sharding", None)
  return placement.mesh if isinstance(placement, jax.sharding.NamedSharding) else None


def sampler_state_shardings(tree, mesh: jax.sharding.Mesh, rules=None):
  """NamedShardings for a tree of sampler state on `mesh` (arrays or their shapes): each KV cache's buffers
  `[B, Hkv, S, hd]` by `CACHE_AXES` and its lengths `[B]` by rows, every other array with a leading row axis by
  rows ('batch'), scalars replicated. An axis that its mesh axes do not divide is replicated."""

  def rows(x):
    if not x.ndim:
      return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return sharding.named_sharding(mesh, ("batch",) + (None,) * (x.ndim - 1), x.shape, rules)

  def one(x):
    if not isinstance(x, KVCache):
      return rows(x)
    buffers = lambda xs: tuple(sharding.named_sharding(mesh, CACHE_AXES, b.shape, rules) for b in xs)
    return KVCache(keys=buffers(x.keys), values=buffers(x.values),
                   lengths=sharding.named_sharding(mesh, ("cache_batch",), x.lengths.shape, rules))

  return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, KVCache))


class Sampler:
  """Generation with a KV cache kept across calls.

  sampler = Sampler(model)
  out = sampler.generate([[1, 2, 3], [4, 5]], SamplingParams(max_new_tokens=16, temperature=0.0))
  out2 = sampler.generate([[6, 7], [8]], params, session=out.session)   # next turn, only new tokens prefilled
  """

  def __init__(self, model: Decoder, *, attention_block: int = 256, chunk_bucket: int = 16,
               max_length: int | None = None, prefill_piece: int = 64, compact_decode: bool = True,
               mesh: jax.sharding.Mesh | None = None, rules=None):
    """
    Args:
      attention_block: attention reads the cache this many slots at a time, as far as the longest row reaches
        (a step costs at most a block more than the rows hold). One layer's decode attention, 16 rows, tiny
        default's heads, CPU: 1.31 / 1.24 / 1.89 ms at 600 slots and 4.6 / 3.8 / 4.9 ms at 2,500 slots for blocks
        of 128 / 256 / 512.
      chunk_bucket: new-token chunks are padded to a multiple of this (few prefill programs).
      max_length: the most tokens a row may hold (default: the model's max positions, at most
        DEFAULT_MAX_LENGTH). Every session's cache has this many slots (rounded up to a whole block) per row
        from its first call: memory, not time (attention skips the unused blocks).
      prefill_piece: chunks longer than this are prefilled this many tokens at a time, each piece for the rows
        that have tokens in it (left padding: short rows skip the leading pieces), so rows of very different
        lengths waste little compute on padding. 64 measured fastest of 256/128/64 on the
        rollout benchmark (prefill 2.5 s -> 1.8 s for 48 episodes on CPU); smaller pieces compile more programs.
      compact_decode: within a call, once half the rows have stopped, decode the live ones in a smaller batch (a
        power of two, at least 8 rows; rows gathered, and scattered back when the call ends): decode steps cost
        closer to what the live rows need than the turn's longest row times the whole batch. Same tokens either way.
      mesh: sample on this mesh (see the module's docstring). Default: the mesh the model's weights are placed on,
        if any (else one device, as the weights are).
      rules: the logical-axis rules on the mesh (default `sharding.SAMPLING_RULES`).
    """
    self.compact_decode = compact_decode
    if prefill_piece % chunk_bucket:
      raise ValueError(f"prefill_piece ({prefill_piece}) must be a multiple of chunk_bucket ({chunk_bucket})")
    self.prefill_piece = prefill_piece
    self.graphdef, params = nnx.split(model)
    self.rules = tuple(rules) if rules is not None else sharding.SAMPLING_RULES
    self.mesh = mesh if mesh is not None else weights_mesh(params)
    self.params = self._place(params)
    self.config = model.config
    if attention_block < 1:
      raise ValueError(f"attention_block must be >= 1, got {attention_block}")
    self.attention_block = attention_block
    self.chunk_bucket = chunk_bucket
    self.max_length = max_length or min(model.config.max_position_embeddings, DEFAULT_MAX_LENGTH)
    if self.max_length > model.config.max_position_embeddings:
      raise ValueError(f"max_length {self.max_length} exceeds the model's {model.config.max_position_embeddings} "
                       "positions")
    # Every session's cache: max_length slots, rounded up to whole attention blocks.
    self.capacity = _round_up(self.max_length, min(attention_block, self.max_length))
    self._block = min(attention_block, self.capacity)
    self._key_shape = raw_key_shape()
    self._build_programs()
    self.stats = SamplerStats()  # cumulative; `stats.minus(copy)` gives one stretch of work
    self._compiles = runtime.compile_log()

  def _build_programs(self) -> None:
    """The jitted programs (traced on first use, on the sampler's mesh if it has one)."""
    program = self._program
    self._prefill = program(self._prefill_impl, static_argnames=("static",), donate_argnums=(1,))
    self._decode = program(self._decode_impl, static_argnames=("static",), donate_argnums=(1,))
    self._extend = program(self._extend_impl, donate_argnums=(1,))
    self._extend_rows = program(self._extend_rows_impl, donate_argnums=(1,))
    self._select = program(_select_rows)
    self._gather_rows = program(_gather_rows)
    self._begin = program(self._begin_impl, static_argnames=("static",), donate_argnums=(1,))
    self._decode_slots = program(self._decode_slots_impl, static_argnames=("static",), donate_argnums=(1,))
    self._reset_rows = program(_reset_rows, donate_argnums=(0,))
    self._empty_slots = program(self._empty_slots_impl, static_argnums=(0, 1))
    self._empty_cache = program(self._empty_cache_impl, static_argnums=(0,))
    self._repack = program(_repack_rows)
    self._scatter_rows = program(_scatter_rows, donate_argnums=(0,))

  def _program(self, fn, **jit_kwargs):
    """`jax.jit(fn)`; on a mesh, traced with the mesh active and its outputs pinned (`_pin`)."""
    if self.mesh is None:
      return jax.jit(fn, **jit_kwargs)
    mesh, rules, pin = self.mesh, self.rules, self._pin

    @functools.wraps(fn)
    def on_mesh(*args, **kwargs):
      with sharding.activate(mesh, rules):
        return pin(fn(*args, **kwargs))

    return jax.jit(on_mesh, **jit_kwargs)

  def _pin(self, tree):
    """On a mesh, constrains sampler state (traced) to `sampler_state_shardings`; without one, `tree` as it is."""
    if self.mesh is None:
      return tree
    return jax.lax.with_sharding_constraint(tree, sampler_state_shardings(tree, self.mesh, self.rules))

  def _place(self, params: nnx.State) -> nnx.State:
    """The weights on the sampler's mesh by its rules (moved only where they are placed otherwise)."""
    if self.mesh is None:
      return params
    return jax.device_put(params, sharding.state_shardings(params, self.mesh, self.rules))

  def update_params(self, params: nnx.State) -> None:
    """Swaps in new weights (same structure), e.g. after a train step. On a mesh they are placed by the sampler's
    rules: a Trainer's FSDP-sharded weights are gathered over fsdp here, once, not at every decode step. Weights
    placed on a mesh given to a sampler without one bring it their mesh (its programs then trace again)."""
    if self.mesh is None and weights_mesh(params) is not None:
      self.mesh = weights_mesh(params)
      self._build_programs()
    self.params = self._place(params)

  # -- jitted pieces ------------------------------------------------------------------------------------

  def _prefill_impl(self, params, cache, chunk, chunk_valid, row_live, pending, row_keys, knobs: _Knobs,
                    static: _Static):
    """Feeds the chunk and samples each live row's first token; rows not live keep their `pending` token."""
    model = nnx.merge(self.graphdef, params)
    logits, cache = model.forward_chunk(chunk, chunk_valid, cache, block=self._block)
    token, logprob = sample_tokens(logits, row_keys, jnp.zeros((), jnp.int32), static, knobs)
    b = chunk.shape[0]
    done = ~row_live
    tokens = jnp.full((b, static.buffer_len), -1, jnp.int32).at[:, 0].set(jnp.where(done, -1, token))
    logprobs = jnp.zeros((b, static.buffer_len), jnp.float32).at[:, 0].set(jnp.where(done, 0.0, logprob))
    last_token = jnp.where(done, pending, token)
    done = done | jnp.isin(token, knobs.stop_ids)
    return _LoopState(cache=cache, last_token=last_token, done=done, tokens=tokens, logprobs=logprobs,
                      step=jnp.ones((), jnp.int32), row_keys=row_keys)

  def _extend_impl(self, params, cache, chunk, chunk_valid):
    """Appends a chunk to the cache without sampling (the leading pieces of a long prefill)."""
    _, cache = nnx.merge(self.graphdef, params).forward_chunk(chunk, chunk_valid, cache, block=self._block)
    return cache

  def _extend_rows_impl(self, params, cache, rows, chunk, chunk_valid):
    """`_extend` on some rows only: rows `[R]` int32 (entries >= B are padding, which writes nothing); chunk,
    chunk_valid `[R, C]`. The rows read and write their own slots of the whole cache (nothing is copied)."""
    _, cache = nnx.merge(self.graphdef, params).forward_chunk(chunk, chunk_valid, cache, block=self._block,
                                                              rows=rows)
    return cache

  def _decode_impl(self, params, state: _LoopState, knobs: _Knobs, min_live: jax.Array, static: _Static):
    """Decode steps until every row is done, `max_new` columns are filled, a live row has no free slot (the context
    is full), or no more than `min_live` rows are live (`[]` int32; 0: never), whichever comes first."""
    model = nnx.merge(self.graphdef, params)
    max_length = self.max_length

    def cond(s: _LoopState):
      # Every live row needs a free slot for its pending token: a row holds at most max_length tokens.
      longest_live = jnp.max(jnp.where(s.done, 0, s.cache.lengths))
      live_rows = jnp.sum(~s.done)
      return (s.step < knobs.max_new) & (live_rows > jnp.maximum(min_live, 0)) & (longest_live < max_length)

    def body(s: _LoopState):
      live = ~s.done
      logits, cache = model.forward_chunk(s.last_token[:, None], live[:, None], s.cache, block=self._block)
      token, logprob = sample_tokens(logits, s.row_keys, s.step, static, knobs)
      tokens = jax.lax.dynamic_update_slice(s.tokens, jnp.where(live, token, -1)[:, None], (0, s.step))
      logprobs = jax.lax.dynamic_update_slice(s.logprobs, jnp.where(live, logprob, 0.0)[:, None], (0, s.step))
      done = s.done | (live & jnp.isin(token, knobs.stop_ids))
      return self._pin(_LoopState(cache=cache, last_token=jnp.where(live, token, s.last_token), done=done,
                                  tokens=tokens, logprobs=logprobs, step=s.step + 1, row_keys=s.row_keys))

    return jax.lax.while_loop(cond, body, state)

  def _begin_impl(self, params, state: _SlotState, rows, chunk, chunk_valid, row_keys, knobs: _Knobs,
                  static: _Static):
    """Feeds `chunk` `[R, C]` to rows `rows` `[R]` int32 (entries >= B are padding: nothing written) and samples
    each one's first token of a new turn with its key `row_keys` `[R, K]` (position 0)."""
    b = state.cache.batch_size
    logits, cache = nnx.merge(self.graphdef, params).forward_chunk(chunk, chunk_valid, state.cache,
                                                                   block=self._block, rows=rows)
    token, logprob = sample_tokens(logits, row_keys, jnp.zeros((), jnp.int32), static, knobs)
    lengths = cache.lengths[jnp.minimum(rows, b - 1)]
    active = ~jnp.isin(token, knobs.stop_ids) & (knobs.max_new > 1) & (lengths < self.max_length)
    put = lambda full, part: full.at[rows].set(part, mode="drop")
    width = state.tokens.shape[1]
    return dataclasses.replace(
        state, cache=cache, last_token=put(state.last_token, token), active=put(state.active, active),
        tokens=put(state.tokens, jnp.full((rows.shape[0], width), -1, jnp.int32).at[:, 0].set(token)),
        logprobs=put(state.logprobs, jnp.zeros((rows.shape[0], width), jnp.float32).at[:, 0].set(logprob)),
        pos=put(state.pos, jnp.ones_like(rows)), row_keys=put(state.row_keys, row_keys))

  def _decode_slots_impl(self, params, state: _SlotState, open_rows, until, knobs: _Knobs, static: _Static):
    """Decode steps of the active rows, each at its own position, until at least `until` `[]` int32 of the open
    rows `open_rows` `[B]` bool have finished their turn or no row is active. A row finishes on a stop id, at
    `max_new` tokens, or when it holds `max_length` tokens (no slot left for its pending token)."""
    model = nnx.merge(self.graphdef, params)
    b, width = state.tokens.shape
    max_length = self.max_length

    def cond(s: _SlotState):
      return jnp.any(s.active) & (jnp.sum(open_rows & ~s.active) < until)

    def body(s: _SlotState):
      live = s.active
      logits, cache = model.forward_chunk(s.last_token[:, None], live[:, None], s.cache, block=self._block)
      token, logprob = sample_tokens(logits, s.row_keys, s.pos, static, knobs)
      column = jnp.where(live, s.pos, width)  # rows that are not live write nothing (dropped)
      rows = jnp.arange(b)
      pos = s.pos + live
      active = live & ~jnp.isin(token, knobs.stop_ids) & (pos < knobs.max_new) & (cache.lengths < max_length)
      return self._pin(dataclasses.replace(
          s, cache=cache, last_token=jnp.where(live, token, s.last_token), active=active,
          tokens=s.tokens.at[rows, column].set(token, mode="drop"),
          logprobs=s.logprobs.at[rows, column].set(logprob, mode="drop"), pos=pos, steps=s.steps + 1,
          live_row_steps=s.live_row_steps + jnp.sum(live, dtype=jnp.int32)))

    return jax.lax.while_loop(cond, body, state)

  # -- host side -----------------------------------------------------------------------------------------

  def generate(self, new_tokens: Sequence[Sequence[int]], sampling: SamplingParams, *,
               seed: int | jax.Array | np.ndarray = 0, session: Session | None = None,
               active: Sequence[bool] | None = None) -> Generation:
    """Appends `new_tokens[i]` to row i (after its pending token, if `session`) and samples a continuation.

    Args:
      new_tokens: one list of ids per row (a fresh prompt, or the next turn's tokens).
      sampling: the knobs; temperature 0 is greedy and ignores `seed`.
      seed: an int or one key (raw `[K]` uint32 or a typed scalar key): row r uses `fold_in(key, r)`; or one key
        per row (raw `[rows, K]` uint32 or typed `[rows]`). The token at position t of row r (t = 0 for the
        first this call samples) is drawn with `fold_in(row_key, t)`, independently of the other rows.
      session: the conversations to continue (from the previous call's `Generation.session`).
      active: with a session, the rows that take part (default all): the others are carried unchanged (no tokens
        fed, none sampled, their pending token kept; their `new_tokens` must be empty), so a batch keeps its shape
        while some of its conversations wait or have ended (`RolloutConfig.compact_rows=False`).

    Returns:
      Per-row tokens and logprobs, and the session to continue from.
    """
    rows = len(new_tokens)
    if rows == 0:
      raise ValueError("generate needs at least one row")
    runtime.release_compiled_programs(min_interval_s=1.0)  # a program per row and cache size: evolver/runtime.py
    if session is not None and rows != session.num_rows:
      raise ValueError(f"got {rows} rows of new tokens for a session of {session.num_rows} rows")
    for i, seq in enumerate(new_tokens):
      check_token_ids(np.asarray(seq, np.int64).reshape(-1), self.config.vocab_size)
      if session is None and len(seq) == 0:
        raise ValueError(f"row {i} has an empty prompt")
    if active is None:
      active = np.ones(rows, bool)
    else:
      active = np.asarray(active, bool)
      if session is None or active.shape != (rows,) or not active.any():
        raise ValueError(f"active must mark {rows} rows of a session, at least one of them True; got "
                         f"{active.shape if session is not None else 'no session'}")
      if any(len(seq) for seq, on in zip(new_tokens, active) if not on):
        raise ValueError("rows that are not active take no new tokens")
    batch = _batch_bucket(rows) if session is None else session.cache.batch_size
    pending = np.zeros(batch, np.int32) if session is None else np.asarray(session.pending)
    chunks = [([int(pending[i])] if session is not None and active[i] else []) + [int(t) for t in seq]
              for i, seq in enumerate(new_tokens)]
    longest = max(len(c) for c in chunks)
    chunk_len = _round_up(longest, self.chunk_bucket)
    if chunk_len > self.prefill_piece:
      chunk_len = _round_up(chunk_len, self.prefill_piece)
    chunk = np.zeros((batch, chunk_len), np.int32)
    chunk_valid = np.zeros((batch, chunk_len), bool)
    for i, c in enumerate(chunks):
      if c:
        chunk[i, chunk_len - len(c):] = c
        chunk_valid[i, chunk_len - len(c):] = True
    row_live = np.zeros(batch, bool)
    row_live[:rows] = active

    lengths = np.zeros(batch, np.int64) if session is None else np.asarray(session.cache.lengths)
    needed = int(np.max(lengths[:rows] + np.array([len(c) for c in chunks]))) + 1
    if needed > self.max_length:
      raise ValueError(f"prompt does not fit the cache: a row would hold {needed - 1} tokens and sample one more, "
                       f"> max_length {self.max_length}; shorten the conversation or raise max_length")
    if session is not None:
      cache = session.cache
    elif self.mesh is None:
      cache = init_cache(self.config, batch, self.capacity)
    else:
      cache = self._empty_cache(batch)

    num_new = sampling.max_new_tokens
    static, knobs = _split_params(sampling)
    row_keys = np.zeros((batch, *self._key_shape), np.uint32)  # greedy draws nothing: no key work at all
    if not static.greedy:
      row_keys[:rows] = row_key_data(seed, rows)
    # Long chunks: all pieces but the last only fill the cache, each for the rows that have tokens in it (chunks
    # are left-padded, so short rows skip the leading pieces); the last piece samples every row's first token.
    stats = self.stats
    stats.generate_calls += 1
    started, mark = time.perf_counter(), self._compiles.mark()
    last = max(0, chunk_len - self.prefill_piece)
    for begin in range(0, last, self.prefill_piece):
      piece = slice(begin, begin + self.prefill_piece)
      has = np.flatnonzero(chunk_valid[:, piece].any(axis=1))
      if not len(has):
        continue
      sub = _batch_bucket(len(has))
      if sub < batch:
        row_ids = np.full(sub, batch, np.int32)
        row_ids[:len(has)] = has
        take = np.minimum(row_ids, batch - 1)
        sub_valid = chunk_valid[take, piece] & (row_ids < batch)[:, None]
        cache = self._extend_rows(self.params, cache, jnp.asarray(row_ids), jnp.asarray(chunk[take, piece]),
                                  jnp.asarray(sub_valid))
        stats.prefill_slots += sub * self.prefill_piece
      else:
        cache = self._extend(self.params, cache, jnp.asarray(chunk[:, piece]), jnp.asarray(chunk_valid[:, piece]))
        stats.prefill_slots += batch * self.prefill_piece
    state = self._prefill(self.params, cache, jnp.asarray(chunk[:, last:]), jnp.asarray(chunk_valid[:, last:]),
                          jnp.asarray(row_live), jnp.asarray(pending), jnp.asarray(row_keys), knobs,
                          static=static)
    stats.prefill_slots += batch * (chunk_len - last)
    step = int(state.step)  # waits for the prefill
    stats.add_time("prefill", started, mark)
    # With `compact_decode`, once no more than half the rows of the batch decoding are live, the live ones move to a
    # smaller batch (a power of two, at least _MIN_COMPACT_ROWS) and go on there; `full` keeps every row,
    # `rows_of_full` says which of its rows the smaller batch holds (padding: past full's end). A row's tokens do
    # not depend on its batch, so the results are the same.
    full, rows_of_full = None, None
    while True:
      width = state.done.shape[0]
      started, mark, before = time.perf_counter(), self._compiles.mark(), step
      min_live = jnp.int32(width // 2 if self.compact_decode and width > _MIN_COMPACT_ROWS else 0)
      state = self._decode(self.params, state, knobs, min_live, static=static)
      done = np.asarray(state.done)
      step, all_done = int(state.step), bool(done.all())
      stats.add_time("decode", started, mark)
      stats.decode_calls += 1
      stats.decode_steps += step - before
      stats.decode_row_steps += (step - before) * width
      if step >= num_new or all_done:
        break
      live_rows = np.flatnonzero(~done)
      if self.compact_decode and width > _MIN_COMPACT_ROWS and len(live_rows) <= width // 2:
        started, mark = time.perf_counter(), self._compiles.mark()
        if full is None:
          full, rows_of_full = state, np.arange(width, dtype=np.int32)
        else:
          full = self._scatter_rows(full, state, jnp.asarray(rows_of_full))
        sub = max(_batch_bucket(len(live_rows)), _MIN_COMPACT_ROWS)
        picked = np.zeros(sub, np.int32)
        picked[:len(live_rows)] = rows_of_full[live_rows]
        state = self._gather_rows(full, jnp.asarray(picked), jnp.asarray(np.arange(sub) < len(live_rows)))
        rows_of_full = np.where(np.arange(sub) < len(live_rows), picked, full.done.shape[0]).astype(np.int32)
        jax.block_until_ready(state.done)
        stats.add_time("select", started, mark)
        continue
      break  # The context is full: live rows end without a stop token.
    if full is not None:
      started, mark = time.perf_counter(), self._compiles.mark()
      state = jax.block_until_ready(self._scatter_rows(full, state, jnp.asarray(rows_of_full)))
      stats.add_time("select", started, mark)

    tokens = np.asarray(state.tokens)[:rows, :num_new]
    logprobs = np.asarray(state.logprobs)[:rows, :num_new]
    lengths = (tokens >= 0).sum(axis=1)
    stats.decode_live_row_steps += int(np.maximum(lengths - 1, 0).sum())  # the first token came with the prefill
    stopped = np.zeros(rows, bool)
    if sampling.stop_ids:
      last = tokens[np.arange(rows), np.maximum(lengths - 1, 0)]
      stopped = (lengths > 0) & np.isin(last, sampling.stop_ids)
    return Generation(tokens=[tokens[i, :lengths[i]].tolist() for i in range(rows)],
                      logprobs=[logprobs[i, :lengths[i]] for i in range(rows)], stopped=stopped,
                      session=Session(cache=state.cache, pending=state.last_token, num_rows=rows))

  def set_pending(self, session: Session, rows: Sequence[int], tokens: Sequence[int]) -> Session:
    """The session with `tokens[i]` as row `rows[i]`'s pending token: what the next call appends first, in place
    of the token the row last sampled (e.g. the template's end-of-turn token for a turn that stopped on another
    stop id, so that the cache holds the rendered history)."""
    if len(rows) != len(tokens):
      raise ValueError(f"got {len(rows)} rows and {len(tokens)} tokens")
    if any(not 0 <= r < session.num_rows for r in rows):
      raise IndexError(f"rows {list(rows)} out of range for a session of {session.num_rows} rows")
    for token in tokens:
      check_token_ids(np.asarray([token], np.int64), self.config.vocab_size)
    pending = session.pending.at[jnp.asarray(rows, jnp.int32)].set(jnp.asarray(tokens, jnp.int32))
    return dataclasses.replace(session, pending=pending)

  def select(self, session: Session, rows: Sequence[int]) -> Session:
    """Keeps only `rows` of a session (e.g. drop finished episodes), re-bucketing the batch (the capacity stays)."""
    rows = list(rows)
    if not rows:
      raise ValueError("select needs at least one row")
    if any(not 0 <= r < session.num_rows for r in rows):
      raise IndexError(f"rows {rows} out of range for a session of {session.num_rows} rows")
    started, mark = time.perf_counter(), self._compiles.mark()
    batch = _batch_bucket(len(rows))
    # Pad with a copy of the first kept row; padding rows are never live.
    index = jnp.asarray(rows + [rows[0]] * (batch - len(rows)), jnp.int32)
    cache, pending = jax.block_until_ready(self._select((session.cache, session.pending), index))
    self.stats.add_time("select", started, mark)
    return Session(cache=cache, pending=pending, num_rows=len(rows))

  # -- continuous batching --------------------------------------------------------------------------------

  def open_slots(self, rows: int, sampling: SamplingParams) -> Slots:
    """`rows` empty rows (padded to a power of two) for continuous batching, all sampling with `sampling`.

      slots = sampler.open_slots(3, params)
      slots = sampler.begin_turns(slots, [0, 1, 2], prompts, keys, new_rows=[0, 1, 2])
      while slots.open.any():
        slots, finished = sampler.decode_slots(slots, until=1)
        ...  # each FinishedTurn's row: begin its next turn (its pending token first), or leave it empty
    """
    if rows < 1:
      raise ValueError(f"open_slots needs at least one row, got {rows}")
    if len(sampling.stop_ids) > MAX_STOP_IDS:
      raise ValueError(f"at most {MAX_STOP_IDS} stop ids, got {len(sampling.stop_ids)}")
    batch = _batch_bucket(rows)
    state = self._new_slot_state(batch, _round_up(sampling.max_new_tokens, 32))
    return Slots(state=state, sampling=sampling, open=np.zeros(batch, bool))

  def _new_slot_state(self, batch: int, width: int) -> "_SlotState":
    """Empty slots, on the sampler's mesh placed as every slot program's outputs are (`_pin`): a state placed
    otherwise would be a different input type to each slot program (compiled again for it: the first turn's
    prefill after `precompile_slots`)."""
    return self._empty_slots(batch, width)

  def _empty_cache_impl(self, batch: int) -> KVCache:
    return init_cache(self.config, batch, self.capacity)

  def _empty_slots_impl(self, batch: int, width: int) -> _SlotState:
    return _SlotState(cache=init_cache(self.config, batch, self.capacity), last_token=jnp.zeros(batch, jnp.int32),
                      active=jnp.zeros(batch, bool), tokens=jnp.full((batch, width), -1, jnp.int32),
                      logprobs=jnp.zeros((batch, width), jnp.float32), pos=jnp.zeros(batch, jnp.int32),
                      row_keys=jnp.zeros((batch, *self._key_shape), jnp.uint32), steps=jnp.zeros((), jnp.int32),
                      live_row_steps=jnp.zeros((), jnp.int32))

  def begin_turns(self, slots: Slots, rows: Sequence[int], new_tokens: Sequence[Sequence[int]],
                  row_keys: np.ndarray | None = None, *, new_rows: Sequence[int] = ()) -> Slots:
    """Starts a turn on each of `rows`: feeds `new_tokens[i]` to row `rows[i]` and samples its first token.

    Args:
      rows: rows that have no open turn.
      new_tokens: what each row reads before sampling. A continuing row has no pending token in the cache: its
        tokens start with the token it last sampled (or whatever stands in its place).
      row_keys: `[len(rows), K]` uint32, each row's key for this turn (position t of the turn draws with
        `fold_in(key, t)`); None when greedy.
      new_rows: those of `rows` that start a new conversation (their cache is emptied first).
    """
    rows = [int(r) for r in rows]
    batch = slots.open.shape[0]
    if not rows or len(rows) != len(new_tokens):
      raise ValueError(f"begin_turns needs one list of new tokens per row, got {len(rows)} rows and "
                       f"{len(new_tokens)} lists")
    if any(not 0 <= r < batch for r in rows) or len(set(rows)) != len(rows) or slots.open[rows].any():
      raise ValueError(f"rows {rows} must be distinct rows of the {batch} slots without an open turn")
    for i, seq in enumerate(new_tokens):
      if not len(seq):
        raise ValueError(f"row {rows[i]} has no new tokens")
      check_token_ids(np.asarray(seq, np.int64).reshape(-1), self.config.vocab_size)
    static, knobs = _split_params(slots.sampling)
    state = slots.state
    started, mark = time.perf_counter(), self._compiles.mark()
    sub = _begin_rows(len(rows), batch)
    row_ids = np.full(sub, batch, np.int32)  # padding entries (>= batch) write nothing
    row_ids[:len(rows)] = rows
    if new_rows:
      reset = np.full(_begin_rows(len(new_rows), batch), batch, np.int32)
      reset[:len(new_rows)] = list(new_rows)
      state = dataclasses.replace(state, cache=self._reset_rows(state.cache, reset))
    lengths = np.asarray(state.cache.lengths)[rows] + np.array([len(c) for c in new_tokens])
    if lengths.max() + 1 > self.max_length:
      raise ValueError(f"a row would hold {int(lengths.max())} tokens and sample one more, > max_length "
                       f"{self.max_length}")
    chunk_len = _round_up(max(len(c) for c in new_tokens), self.chunk_bucket)
    if chunk_len > self.prefill_piece:
      chunk_len = _round_up(chunk_len, self.prefill_piece)
    chunk = np.zeros((sub, chunk_len), np.int32)
    valid = np.zeros((sub, chunk_len), bool)
    for i, c in enumerate(new_tokens):
      chunk[i, chunk_len - len(c):] = c
      valid[i, chunk_len - len(c):] = True
    cache = state.cache
    last = max(0, chunk_len - self.prefill_piece)
    for begin in range(0, last, self.prefill_piece):  # leading pieces fill the cache only (as in `generate`)
      piece = slice(begin, begin + self.prefill_piece)
      has = np.flatnonzero(valid[:, piece].any(axis=1))
      if not len(has):
        continue
      ids = np.full(_begin_rows(len(has), batch), batch, np.int32)
      ids[:len(has)] = row_ids[has]
      take = np.zeros(len(ids), np.int64)
      take[:len(has)] = has
      piece_valid = valid[take, piece] & (ids < batch)[:, None]
      cache = self._extend_rows(self.params, cache, ids, chunk[take, piece], piece_valid)
      self.stats.prefill_slots += len(ids) * self.prefill_piece
    keys = np.zeros((sub, *self._key_shape), np.uint32)
    if row_keys is not None and not static.greedy:
      keys[:len(rows)] = np.asarray(row_keys, np.uint32)
    # (numpy arguments: a jnp.asarray of each new shape would compile a program of its own)
    state = self._begin(self.params, dataclasses.replace(state, cache=cache), row_ids, chunk[:, last:],
                        valid[:, last:], keys, knobs, static=static)
    self.stats.prefill_slots += sub * (chunk_len - last)
    jax.block_until_ready(state.active)
    self.stats.add_time("prefill", started, mark)
    self.stats.generate_calls += 1
    opened = slots.open.copy()
    opened[rows] = True
    return Slots(state=state, sampling=slots.sampling, open=opened)

  def decode_slots(self, slots: Slots, *, until: int = 1) -> tuple[Slots, list[FinishedTurn]]:
    """Decodes the active rows until at least `until` open turns have finished (or none is left running), and
    collects every finished turn (its row's turn is then closed; the row keeps its cache for its next turn)."""
    static, knobs = _split_params(slots.sampling)
    state = slots.state
    batch = slots.open.shape[0]
    started, mark = time.perf_counter(), self._compiles.mark()
    steps_before, live_before = int(state.steps), int(state.live_row_steps)
    if bool(np.asarray(state.active).any()):
      state = self._decode_slots(self.params, state, slots.open, np.int32(max(until, 1)), knobs, static=static)
    active = np.asarray(state.active)
    steps = int(state.steps) - steps_before
    self.stats.add_time("decode", started, mark)
    self.stats.decode_calls += 1
    self.stats.decode_steps += steps
    self.stats.decode_row_steps += steps * batch
    self.stats.decode_live_row_steps += int(state.live_row_steps) - live_before
    done = np.flatnonzero(slots.open & ~active)
    finished = []
    if len(done):
      pos = np.asarray(state.pos)
      tokens, logprobs = np.asarray(state.tokens), np.asarray(state.logprobs)
      stops = np.asarray(slots.sampling.stop_ids, np.int64)
      for r in done:
        turn = tokens[r, :pos[r]]
        finished.append(FinishedTurn(row=int(r), tokens=turn.tolist(), logprobs=logprobs[r, :pos[r]].copy(),
                                     stopped=bool(len(turn) and np.isin(turn[-1], stops))))
    opened = slots.open.copy()
    opened[done] = False
    return Slots(state=state, sampling=slots.sampling, open=opened), finished

  def repack_slots(self, slots: Slots, rows: Sequence[int], *, min_rows: int = _MIN_COMPACT_ROWS) -> Slots:
    """Keeps only `rows` (in this order; row i of the result is `rows[i]`), in a batch of the next power of two,
    at least `min_rows` (fewer batch sizes, fewer programs): decode steps then cost what the rows left need. Rows
    past them are empty padding."""
    rows = [int(r) for r in rows]
    if not rows:
      raise ValueError("repack_slots needs at least one row")
    batch = slots.open.shape[0]
    if any(not 0 <= r < batch for r in rows):
      raise IndexError(f"rows {rows} out of range for {batch} slots")
    started, mark = time.perf_counter(), self._compiles.mark()
    size = max(_batch_bucket(len(rows)), min(min_rows, batch))
    index = np.asarray(rows + [rows[0]] * (size - len(rows)), np.int32)
    state = jax.block_until_ready(self._repack(slots.state, index, np.arange(size) < len(rows)))
    self.stats.add_time("select", started, mark)
    opened = np.zeros(size, bool)
    opened[:len(rows)] = slots.open[rows]
    return Slots(state=state, sampling=slots.sampling, open=opened)

  def slot_batches(self, rows: int, *, min_rows: int = _MIN_COMPACT_ROWS, repack_fraction: int = 4) -> list[int]:
    """The batches continuous batching of `rows` rows can use when a batch larger than `min_rows` is repacked once
    no more than a `repack_fraction`-th of it is in play, to `max(next power of two, min_rows)` rows: the first,
    `min_rows`, and the powers of two between them up to a `repack_fraction`-th of the first."""
    first = _batch_bucket(rows)
    sizes = {first, min_rows} if first > min_rows else {first}
    size = 2 * min_rows
    while size * repack_fraction <= first:
      sizes.add(size)
      size *= 2
    return sorted(sizes, reverse=True)

  def precompile_slots(self, rows: int, sampling: SamplingParams, *, min_rows: int = _MIN_COMPACT_ROWS,
                       repack_fraction: int = 4) -> int:
    """Compiles every program continuous batching of `rows` rows with `sampling` can run, by running each once on
    empty rows (padding: nothing is written): the keys' fold-in for each power of two of rows (when sampling); for
    each of `slot_batches`, its empty state, beginning turns in each sub-batch size (`_begin_rows`) at each chunk
    width (and the leading pieces of long chunks), emptying rows, decoding, and repacking into each smaller
    batch. Afterwards no turn, however long its conversations, compiles anything. Returns the programs run (each compiled unless it had been before)."""
    static, knobs = _split_params(sampling)
    params = self.params
    key_shape = self._key_shape
    widths = range(self.chunk_bucket, self.prefill_piece + 1, self.chunk_bucket)
    width = _round_up(sampling.max_new_tokens, 32)
    sizes = self.slot_batches(rows, min_rows=min_rows, repack_fraction=repack_fraction)
    ran = 0
    if not static.greedy:  # the engine folds each row's turn into its key, a power of two of rows at a time
      for sub in (1 << i for i in range(sizes[0].bit_length())):
        _fold_in_rows(np.zeros((sub, *key_shape), np.uint32), np.zeros(sub, np.uint32))
        ran += 1
    for size in sizes:
      state = self._new_slot_state(size, width)
      ran += 1
      for sub in sorted({_begin_rows(1 << i, size) for i in range(size.bit_length())}):
        ids = np.full(sub, size, np.int32)  # every entry padding
        keys = np.zeros((sub, *key_shape), np.uint32)
        for chunk_width in widths:
          state = self._begin(params, state, ids, np.zeros((sub, chunk_width), np.int32),
                              np.zeros((sub, chunk_width), bool), keys, knobs, static=static)
        piece = np.zeros((sub, self.prefill_piece), np.int32)
        cache = self._extend_rows(params, state.cache, ids, piece, piece.astype(bool))
        state = dataclasses.replace(state, cache=self._reset_rows(cache, ids))
        ran += len(widths) + 2
      state = self._decode_slots(params, state, np.zeros(size, bool), np.int32(1), knobs, static=static)
      ran += 1
      for smaller in (s for s in sizes if s < size):
        self._repack(state, np.zeros(smaller, np.int32), np.zeros(smaller, bool))
        ran += 1
      jax.block_until_ready(state)
    runtime.return_free_memory()  # (what compiling them freed)
    return ran
