"""Multi-host runs: one program on every host of a pod, each host one JAX process.

  python -m launch.train --distributed ...                      # TPU VMs, SLURM: everything auto-detected
  python -m launch.train --coordinator_address=10.0.0.2:1234 --num_processes=2 --process_id=0 ...

Every process runs the same Python program in lockstep. What differs per process:
- rollouts: a run's tasks are split by group (a task's samples stay on one host, so GRPO's baselines are whole)
  over the processes (`own_groups`); each host steps its own envs with its own copy of the policy on its own
  devices (`local_copy`), and the trajectories are gathered (`allgather_objects`) so that every host holds the
  same list, in the same order, as a single process would. An episode's randomness derives from (seed, task, occurrence,
  sample) only, so the rollouts do not depend on the number of hosts.
- arrays: the train state lives on the global mesh; host numpy batches (the same on every host, computed from the
  same gathered rollouts) become global arrays with `put_global`, and results come back with `to_host`.
- writes: process 0 (`is_primary`) writes metrics, configs and the experience pool (a service every host retrieves
  from, `evolver.train.experience`); orbax coordinates the checkpoints itself.

With one process every function here is the identity or its single-process equivalent, and nothing changes.
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

_initialized = False


def initialize(*, auto: bool = False, coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> bool:
  """Joins this process to a multi-process JAX run (`jax.distributed.initialize`), before anything else touches
  JAX's backends.

  Args:
    auto: let JAX detect the cluster (TPU VM slices, SLURM, Open MPI); the other arguments then may stay None.
    coordinator_address, num_processes, process_id: the cluster, given explicitly ("host:port" of process 0; all
      three, or none with `auto`).

  Returns:
    True when this call initialized (False: nothing asked for, or initialized before).
  """
  global _initialized
  explicit = (coordinator_address, num_processes, process_id)
  if any(v is not None for v in explicit) and any(v is None for v in explicit):
    raise ValueError("a multi-process run needs --coordinator_address, --num_processes and --process_id together "
                     f"(got {coordinator_address!r}, {num_processes!r}, {process_id!r}); or --distributed to detect "
                     "them")
  if not auto and coordinator_address is None:
    return False
  if _initialized:
    return False
  if num_processes is not None and not 0 <= process_id < num_processes:
    raise ValueError(f"process_id {process_id} is not in [0, num_processes={num_processes})")
  # Collectives of the CPU backend across processes (the whole run on CPU hosts; on TPU and GPU hosts the CPU
  # backend is there too, unused by the run's programs): gloo ships with jaxlib.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator_address=coordinator_address, num_processes=num_processes,
                             process_id=process_id)
  _initialized = True
  return True


def process_count() -> int:
  return jax.process_count()


def is_primary() -> bool:
  """True on the process that writes the run's files (process 0; the only one in a single-process run)."""
  return jax.process_index() == 0


def barrier(name: str) -> None:
  """Waits until every process has reached the barrier `name` (no-op with one process)."""
  if jax.process_count() > 1:
    from jax.experimental import multihost_utils
    multihost_utils.sync_global_devices(name)


def own_groups(num_groups: int, *, index: int | None = None, count: int | None = None) -> list[int]:
  """The groups (positions in a run's task list) this process rolls out: every `count`-th from its index, so each
  host gets an even share of the tasks and a group never spans hosts."""
  index = jax.process_index() if index is None else index
  count = jax.process_count() if count is None else count
  return list(range(index, num_groups, count))


def allgather_objects(obj: Any) -> list[Any]:
  """Every process's `obj`, in process order (a collective: every process must call it). Objects travel pickled,
  between the processes of one run only.

  With one process: `[obj]`."""
  if jax.process_count() == 1:
    return [obj]
  from jax.experimental import multihost_utils
  data = np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), np.uint8)
  sizes = np.asarray(multihost_utils.process_allgather(np.array([data.size], np.int64)), np.int64).reshape(-1)
  padded = np.zeros(int(sizes.max()), np.uint8)
  padded[:data.size] = data
  gathered = np.asarray(multihost_utils.process_allgather(padded))  # [processes, max size]
  return [pickle.loads(gathered[i, :sizes[i]].tobytes()) for i in range(len(sizes))]


def put_global(tree: Any, shardings: Any) -> Any:
  """Host values (numpy, or arrays on one device; the same on every process) placed by `shardings` (a matching
  tree of `jax.sharding.Sharding`s, or one for every leaf): global arrays when the shardings span processes."""
  if jax.process_count() > 1:  # (only host values may become global arrays: each process puts its own pieces)
    tree = jax.tree.map(lambda x: np.asarray(x) if isinstance(x, jax.Array) and x.is_fully_addressable else x, tree)
  if isinstance(shardings, jax.sharding.Sharding):
    return jax.tree.map(lambda x: jax.device_put(x, shardings), tree)
  return jax.device_put(tree, shardings)


def to_host(x: jax.Array | np.ndarray) -> np.ndarray:
  """The whole value of a (possibly global) array as numpy, on every process (a collective when the array spans
  processes)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(x.addressable_data(0))
  return np.asarray(x)


def local_copy(tree: Any, mesh: jax.sharding.Mesh) -> Any:
  """A whole copy of a tree of global arrays on this process's own devices (gathering the pieces other hosts
  hold), replicated over `mesh` (a mesh of this process's devices, `models.sharding.local_mesh()`): what a host's
  own sampler runs with (`Sampler` samples on the mesh its
  weights are on, re-placing them by its rules: rows split over the host's devices, nothing gathered per step).
  With one process (or arrays this process holds whole) the tree is returned as is."""
  leaves = jax.tree.leaves(tree)
  if jax.process_count() == 1 or all(not isinstance(x, jax.Array) or x.is_fully_addressable for x in leaves):
    return tree
  here = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

  def replicate(x):
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return x
    if not x.is_fully_replicated:
      x = jax.jit(lambda v: v, out_shardings=jax.sharding.NamedSharding(x.sharding.mesh,
                                                                       jax.sharding.PartitionSpec()))(x)
    return jax.device_put(x.addressable_data(0), here)

  return jax.tree.map(replicate, tree)


def sort_by_group(items: Sequence[Any]) -> list[Any]:
  """Items with `group` and `sample` attributes (rollouts), in (group, sample) order: the order one process
  would have produced them in."""
  return sorted(items, key=lambda r: (r.group, r.sample))
