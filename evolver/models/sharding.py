"""Logical-axis sharding: model code names logical axes, one rule table maps them onto the mesh.

The mesh has three axes: `data` (pure data parallelism), `fsdp` (data parallelism with parameters and
optimizer state sharded) and `tensor` (tensor/model parallelism). Parameters carry `logical_axes` metadata;
activations are constrained with `constrain(x, logical_axes)` inside jitted code, which is a no-op unless a
mesh is active (`with activate(mesh):`), so the same model code runs on one device and on a pod.

Two tables: `DEFAULT_RULES` for training (parameters sharded over `fsdp` and `tensor`) and `SAMPLING_RULES` for
decoding, where the weights are sharded over `tensor` only: a decode step reads every weight once, and weights
sharded over `fsdp` would be gathered at every step.
"""

import contextlib
import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import Any

import gin
import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# Logical axis -> mesh axis (or tuple of mesh axes, or None = replicated). The one table.
DEFAULT_RULES: tuple[tuple[str, Any], ...] = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("mlp", "tensor"),
    ("q_heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("norm", None),
    ("act_embed", None),
    ("act_mlp", "tensor"),
    ("act_heads", "tensor"),
    ("act_kv_heads", "tensor"),
    ("act_vocab", "tensor"),
    ("cache_batch", ("data", "fsdp")),
    ("cache_kv_heads", "tensor"),
    ("cache_length", None),
)

# Decoding: the same table with the weights replicated over (data, fsdp), tensor-parallel only. Activations and
# the KV cache `[B, Hkv, S, hd]` are sharded as in training: rows over (data, fsdp), KV heads over tensor (where
# they divide it; else replicated over tensor).
SAMPLING_RULES: tuple[tuple[str, Any], ...] = tuple((name, None if name == "embed" else target)
                                                    for name, target in DEFAULT_RULES)


@dataclasses.dataclass
class _Active:
  mesh: Mesh | None = None
  rules: tuple[tuple[str, Any], ...] = DEFAULT_RULES


_ACTIVE = _Active()


@gin.configurable
def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A (data, fsdp, tensor) mesh over `devices` (default: all). One size may be -1: the rest."""
  devices = list(jax.devices() if devices is None else devices)
  sizes = [data, fsdp, tensor]
  if sizes.count(-1) > 1:
    raise ValueError(f"at most one mesh axis may be -1, got data={data} fsdp={fsdp} tensor={tensor}")
  known = math.prod(s for s in sizes if s != -1)
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh sizes must be positive or -1, got data={data} fsdp={fsdp} tensor={tensor}")
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"{len(devices)} devices do not split into data={data} fsdp={fsdp} tensor={tensor}")
    sizes[sizes.index(-1)] = len(devices) // known
  if math.prod(sizes) != len(devices):
    raise ValueError(f"mesh data={sizes[0]} x fsdp={sizes[1]} x tensor={sizes[2]} needs {math.prod(sizes)} "
                     f"devices, have {len(devices)}")
  return Mesh(np.asarray(devices).reshape(sizes), MESH_AXES)


def local_mesh() -> Mesh:
  """This process's devices as a (data, fsdp, tensor) mesh, all on `data`: a host's own sampling mesh."""
  return make_mesh(data=-1, fsdp=1, tensor=1, devices=jax.local_devices())


def logical_to_spec(logical_axes: Sequence[str | None], rules=None, mesh: Mesh | None = None) -> PartitionSpec:
  """Maps logical axis names to a PartitionSpec; a mesh axis is used at most once, size-1 axes are dropped."""
  table = dict(rules if rules is not None else _ACTIVE.rules)
  used: set[str] = set()
  out = []
  for name in logical_axes:
    if name is None:
      out.append(None)
      continue
    if name not in table:
      raise KeyError(f"logical axis {name!r} has no sharding rule; known: {sorted(table)}")
    target = table[name]
    targets = () if target is None else (target,) if isinstance(target, str) else tuple(target)
    targets = tuple(t for t in targets if t not in used and (mesh is None or mesh.shape[t] > 1))
    used.update(targets)
    out.append(None if not targets else targets[0] if len(targets) == 1 else targets)
  return PartitionSpec(*out)


def _fits(shape: Sequence[int], spec: PartitionSpec, mesh: Mesh) -> PartitionSpec:
  """Drops mesh axes that do not divide their dimension (e.g. 2 KV heads over tensor=4): replicate instead."""
  out = []
  for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
    axes = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
    size = math.prod(mesh.shape[a] for a in axes)
    out.append(entry if size and dim % size == 0 else None)
  return PartitionSpec(*out)


def named_sharding(mesh: Mesh, logical_axes: Sequence[str | None], shape: Sequence[int] | None = None,
                   rules=None) -> NamedSharding:
  spec = logical_to_spec(logical_axes, rules, mesh)
  if shape is not None:
    spec = _fits(shape, spec, mesh)
  return NamedSharding(mesh, spec)


def state_shardings(state: nnx.State, mesh: Mesh, rules=None) -> nnx.State:
  """NamedShardings for every variable of an nnx.State, from its `logical_axes` metadata (replicated if none)."""

  def one(variable):
    axes = variable.get_metadata().get("logical_axes")
    shape = np.shape(variable.get_value())
    if axes is None:
      return NamedSharding(mesh, PartitionSpec())
    return named_sharding(mesh, axes, shape, rules)

  return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


@contextlib.contextmanager
def activate(mesh: Mesh | None, rules=None) -> Iterator[None]:
  """Makes `constrain` shard activations over `mesh` while tracing inside this block."""
  previous = (_ACTIVE.mesh, _ACTIVE.rules)
  _ACTIVE.mesh, _ACTIVE.rules = mesh, tuple(rules) if rules is not None else DEFAULT_RULES
  try:
    yield
  finally:
    _ACTIVE.mesh, _ACTIVE.rules = previous


def active() -> tuple[Mesh | None, tuple[tuple[str, Any], ...]]:
  """The mesh and rules that `activate` set (None and the default rules outside any `activate` block)."""
  return _ACTIVE.mesh, _ACTIVE.rules


def constrain(x: jax.Array, logical_axes: Sequence[str | None]) -> jax.Array:
  """Sharding constraint on an activation by logical axes; a no-op without an active mesh."""
  mesh = _ACTIVE.mesh
  if mesh is None or mesh.size == 1:
    return x
  return jax.lax.with_sharding_constraint(x, named_sharding(mesh, logical_axes, x.shape, _ACTIVE.rules))


def place(state: nnx.State, mesh: Mesh, rules=None) -> tuple[nnx.State, nnx.State]:
  """Puts every variable of `state` on `mesh` by its logical axes. Returns (placed state, shardings)."""
  shardings = state_shardings(state, mesh, rules)
  return jax.device_put(state, shardings), shardings


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Batch-major arrays `[B, ...]`: B over (data, fsdp), the rest replicated."""
  return named_sharding(mesh, ("batch",) + (None,) * (ndim - 1))
