"""The jitted, sharded train step: microbatched gradient accumulation, optax update, state donated.

A `LossFn` maps (model, batch, normalizers) to (loss, metrics). `normalizers` holds the *whole* batch's counts
(`batch_normalizers`: "tokens" of the loss mask, "sequences" with at least one such token, and "pairs" of a DPO
batch); `loss` must be a sum over the microbatch divided by one of them, so that summed microbatch gradients equal
the full-batch gradient exactly under gradient accumulation, whatever the aggregation.
"""

import functools
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from evolver import distributed
from evolver.models import sharding
from evolver.models.decoder import Decoder
from evolver.rl import losses
from evolver.train.state import TrainState

Batch = Mapping[str, jax.Array]
# Loss-function metrics divided by a whole-batch normalizer: summed over microbatches, not averaged.
ADDITIVE_METRICS = frozenset({"nll", "pg_loss", "kl_ref", "entropy"})
Normalizers = Mapping[str, jax.Array]
LossFn = Callable[[Decoder, Batch, Normalizers], tuple[jax.Array, dict[str, jax.Array]]]


def batch_normalizers(batch: Batch) -> dict[str, jax.Array]:
  """The whole batch's counts a loss divides by (each at least 1): "tokens" (sum of `loss_mask`), "sequences"
  (rows with a loss token) and, for pair batches, "pairs" (sum of `pair_mask`)."""
  mask = batch["loss_mask"].astype(jnp.float32)
  out = {"tokens": jnp.maximum(jnp.sum(mask), 1.0),
         "sequences": jnp.maximum(jnp.sum(jnp.any(mask > 0, axis=-1).astype(jnp.float32)), 1.0)}
  if "pair_mask" in batch:
    out["pairs"] = jnp.maximum(jnp.sum(batch["pair_mask"].astype(jnp.float32)), 1.0)
  return out


def policy_logprobs(model: Decoder, input_ids: jax.Array, head_chunk_rows: int | None = None) -> jax.Array:
  """`[B, T]` log-probabilities of each token given the ones before it (column 0 is 0): through the full
  logits, or chunked through the LM head when `head_chunk_rows` is set (large vocabularies)."""
  if head_chunk_rows:
    return model.chunked_target_logprobs(input_ids, chunk_rows=head_chunk_rows)
  return losses.target_logprobs(model(input_ids), input_ids)


def sft_loss_fn(model: Decoder, batch: Batch, normalizers: Normalizers) -> tuple[jax.Array, dict]:
  """Token-mean NLL on `loss_mask`, reward-weighted by `weights` `[B]` when the batch has them."""
  logp = policy_logprobs(model, batch["input_ids"])
  if "weights" in batch:
    return losses.weighted_sft_loss(logp, batch["loss_mask"], batch["weights"], normalizer=normalizers["tokens"])
  return losses.sft_loss(logp, batch["loss_mask"], normalizer=normalizers["tokens"])


def _split_microbatches(batch: Batch, num_microbatches: int) -> Batch:
  def split(x):
    if x.shape[0] % num_microbatches:
      raise ValueError(f"batch size {x.shape[0]} is not divisible by num_microbatches={num_microbatches}")
    return x.reshape(num_microbatches, x.shape[0] // num_microbatches, *x.shape[1:])
  return jax.tree.map(split, dict(batch))


def train_step(state: TrainState, batch: Batch, *, graphdef: nnx.GraphDef, loss_fn: LossFn,
               optimizer: optax.GradientTransformation, num_microbatches: int = 1
               ) -> tuple[TrainState, dict[str, jax.Array]]:
  """One update. batch: dict of `[B, ...]` arrays; the loss sees `batch_normalizers` of the whole batch."""
  normalizers = batch_normalizers(batch)

  def micro_loss(params, micro):
    return loss_fn(nnx.merge(graphdef, params), micro, normalizers)

  grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
  if num_microbatches == 1:
    (loss, metrics), grads = grad_fn(state.params, batch)
  else:
    micro = _split_microbatches(batch, num_microbatches)

    def accumulate(carry, mb):
      (loss_i, metrics_i), grads_i = grad_fn(state.params, mb)
      grads_acc, loss_acc, metrics_acc = carry
      return (jax.tree.map(jnp.add, grads_acc, grads_i), loss_acc + loss_i,
              jax.tree.map(jnp.add, metrics_acc, metrics_i)), None

    zero_grads = jax.tree.map(jnp.zeros_like, state.params)
    first = jax.tree.map(lambda x: x[0], micro)
    _, metric_shapes = jax.eval_shape(micro_loss, state.params, first)
    zero_metrics = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), metric_shapes)
    (grads, loss, metrics), _ = jax.lax.scan(accumulate, (zero_grads, jnp.zeros((), jnp.float32), zero_metrics),
                                             micro)
    # Metrics normalised by the global `normalizer` (and counts) add up across microbatches; the rest are
    # per-microbatch means (e.g. clip fractions) and are averaged.
    metrics = {k: (v if k.startswith("num_") or k in ADDITIVE_METRICS else v / num_microbatches)
               for k, v in metrics.items()}
  updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = dict(metrics, loss=loss, grad_norm=optax.tree.norm(grads), param_norm=optax.tree.norm(params))
  new_state = state.replace(step=state.step + 1, params=params, opt_state=opt_state,
                            rng=jax.random.fold_in(state.rng, state.step))
  return new_state, metrics


def state_shardings(state: TrainState, mesh: Mesh) -> TrainState:
  """Shardings for a TrainState: parameters by their logical axes; each optimizer leaf whose tree path ends
  with a parameter's path and has its shape (Adam's moments) shards like that parameter; the rest replicate."""
  param_shardings = sharding.state_shardings(state.params, mesh)
  replicated = NamedSharding(mesh, PartitionSpec())
  by_path = {}
  for sh, (path, value) in zip(jax.tree.leaves(param_shardings), jax.tree_util.tree_leaves_with_path(state.params)):
    by_path[tuple(str(k) for k in path)] = (sh, tuple(value.shape))

  def for_leaf(path, leaf):
    keys = tuple(str(k) for k in path)
    for start in range(len(keys)):
      match = by_path.get(keys[start:])
      if match is not None and match[1] == tuple(getattr(leaf, "shape", ())):
        return match[0]
    return replicated

  opt = jax.tree_util.tree_map_with_path(for_leaf, state.opt_state)
  return TrainState(step=replicated, params=param_shardings, opt_state=opt, rng=replicated)


class TrainStepPrograms:
  """`train_step` jitted with explicit in/out shardings over a mesh and the state donated: one program per batch
  shape, compiled on its first call or ahead of time (`precompile`), so a loop that knows its shapes compiles
  nothing after its first step. Call as `programs(state, batch) -> (new state, metrics)`."""

  def __init__(self, graphdef: nnx.GraphDef, loss_fn: LossFn, optimizer: optax.GradientTransformation,
               mesh: Mesh, state_sharding: TrainState, *, num_microbatches: int = 1):
    self._step = functools.partial(train_step, graphdef=graphdef, loss_fn=loss_fn, optimizer=optimizer,
                                   num_microbatches=num_microbatches)
    self._mesh, self._state_sharding = mesh, state_sharding
    self._programs: dict[tuple, Any] = {}  # batch shapes -> a jitted function or an ahead-of-time executable

  @staticmethod
  def _key(batch: Batch) -> tuple:
    # (dtypes too: an ahead-of-time executable refuses any other input type than its own)
    return tuple(sorted((k, tuple(v.shape), str(v.dtype)) for k, v in batch.items()))

  def _batch_shardings(self, batch: Batch) -> dict[str, NamedSharding]:
    return {k: sharding.batch_sharding(self._mesh, len(v.shape)) for k, v in batch.items()}

  def _jitted(self, batch: Batch):
    mesh, step = self._mesh, self._step

    def traced(s, b):
      with sharding.activate(mesh):
        return step(s, b)

    return jax.jit(traced, in_shardings=(self._state_sharding, self._batch_shardings(batch)),
                   out_shardings=(self._state_sharding, NamedSharding(mesh, PartitionSpec())), donate_argnums=0)

  def __call__(self, state: TrainState, batch: Batch) -> tuple[TrainState, dict]:
    """One step on a host batch (numpy; in a multi-process run the same global batch on every process)."""
    key = self._key(batch)
    if key not in self._programs:
      self._programs[key] = self._jitted(batch)
    return self._programs[key](state, distributed.put_global(batch, self._batch_shardings(batch)))

  def precompile(self, state: TrainState, batch_spec: dict[str, jax.ShapeDtypeStruct]) -> bool:
    """Compiles the step for batches of `batch_spec`'s shapes and dtypes now (nothing runs: the state, which a
    step donates, is only read for its shapes). Returns False when that shape had its program already."""
    key = self._key(batch_spec)
    if key in self._programs:
      return False
    self._programs[key] = self.lower(state, batch_spec).compile()
    return True

  def lower(self, state: TrainState, batch_spec: dict[str, jax.ShapeDtypeStruct]) -> jax.stages.Lowered:
    """The step for batches of `batch_spec`'s shapes, lowered with its shardings and donation (what `precompile`
    compiles). `state` may be abstract (`jax.ShapeDtypeStruct` leaves): `launch.aot` compiles it for a topology
    without weights and reads its memory."""
    return self._jitted(batch_spec).lower(state, batch_spec)

  @property
  def num_programs(self) -> int:
    return len(self._programs)
