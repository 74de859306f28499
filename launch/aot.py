"""Ahead-of-time memory: compiles a run config's programs for a named topology, without weights or the hardware,
and prints what each needs per device, so a config is known to fit before the slice is paid for.

  python -m launch.aot --gin_file=gin_configs/real/qwen2_5_7b_grpo_exp_v5p64.gin --topology=v5p-64
  python -m launch.aot --gin_file=gin_configs/real/qwen2_5_7b_grpo_exp_8gpu.gin --topology=8xH100
  python -m launch.aot --gin_file=gin_configs/models/tiny.gin --topology=cpu:8

The model's shapes are gin's `ModelConfig`, or the `config.json` of the run's `hf_checkpoint` when that directory
exists (weights are never read). Parameters, optimizer state and caches are `jax.eval_shape` values placed by the
run's mesh (`TrainerConfig.mesh_*`, sharding rules of `evolver.models.sharding`); what is compiled:
- train_step: the jitted, sharded, donating update of `evolver.train.step.TrainStepPrograms` (the same code path
  as `Trainer.precompile_step`), for GRPO with the HET-PPO loss at the run's update rows x its largest bucket,
  else the SFT loss at --rows x --length;
- score (GRPO): the behaviour log-probability forward of `evolver.train.rl` on the same batch;
- sampler_prefill, sampler_decode: the continuous-batching programs of `evolver.models.sampler.Sampler` (begin a
  turn on every row with a full prefill piece; decode) for the rollout batch, with the sampler's whole KV cache.
  With one process they run over the mesh, placed by the sampler's own rules; on a multi-host topology each host
  samples its share of the task groups on its first device with a whole copy of the weights
  (`evolver.distributed.local_copy`).

Per program: XLA's argument, output, alias, temp and generated-code bytes per device (`memory_analysis()`), and
peak = argument + output - alias + temp + code. Per device: the train state (float32 master weights and
optimizer), the frozen reference and the sampler's weights, and the busiest device's total in each phase of an RL
step (rollout, scoring, update) against its memory. The last stdout line is one JSON object.

Topologies: v5p-N (N TensorCores, two a chip; 8 to 1024), v5e-N and v6e-N (N chips; 1 to 256); NxH100 and NxH200
(N = 1 to 8 GPUs of one node); cpu:N (N fake host devices: XLA:CPU's buffer assignment, an approximation of an
accelerator's). Compiling for TPU needs libtpu (`pip install -e .[tpu]`), for NVIDIA GPUs JAX's CUDA plugin
(`pip install -e .[cuda]`, or only the plugin: `pip install 'jax[cuda12-local]'`); neither needs the device: both
compile on a CPU-only host. A 7B GRPO step takes minutes to compile on a few CPU cores.
"""

import dataclasses
import functools
import inspect
import json
import math
import os
import re
import sys
import time
from collections.abc import Mapping
from typing import Any

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "gin config files (repeatable), as for launch.train")
flags.DEFINE_multi_string("gin_bindings", [], "gin bindings (repeatable), as for launch.train")
flags.DEFINE_multi_string("gin_search_paths", [], "extra directories to look up gin files and includes in")
flags.DEFINE_string("topology", None, "v5p-N | v5e-N | v6e-N | NxH100 | NxH200 | cpu:N")
flags.DEFINE_integer("rows", None, "train-step rows (default: GRPO's update rows; else one per data-parallel device)")
flags.DEFINE_integer("length", None, "train-step tokens per row (default: GRPO's largest bucket; else 512)")
flags.DEFINE_integer("sampler_rows", None, "rollout rows (default: GRPO's tasks_per_step x group_size; else 64)")
flags.DEFINE_integer("max_new_tokens", None, "tokens per sampled turn (default: GRPO's max_new_tokens; else 128)")
flags.DEFINE_list("programs", ["train_step", "score", "sampler_prefill", "sampler_decode"],
                  "which programs to compile (comma-separated)")

GIB = 1 << 30
PROGRAMS = ("train_step", "score", "sampler_prefill", "sampler_decode")

# --- topologies ------------------------------------------------------------------------------------------------

# Chips of a TPU slice -> its torus shape (the shapes Cloud TPU creates).
_V5P_SHAPES = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
               512: "8x8x8"}
_LITE_SHAPES = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_TPU_HBM = {"v5p": 95 * GIB, "v5e": 16 * GIB, "v6e": 32 * GIB}  # per chip

# What XLA needs to compile for an NVIDIA GPU it cannot see (a GpuTargetConfig, as text).
_GPU_TARGET = """gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth}
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: {memory}
  shared_memory_per_block_optin: 232448
  cuda_compute_capability {{
    major: 9
  }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{
  major: 9
  minor: 7
}}
runtime_version {{
  major: 12
  minor: 8
}}
device_description_str: "{name}"
"""
_GPUS = {"H100": {"name": "NVIDIA H100 80GB HBM3", "memory": 84_929_347_584, "bandwidth": 3_352_320_000_000},
         "H200": {"name": "NVIDIA H200", "memory": 150_754_820_096, "bandwidth": 4_800_000_000_000}}


class TopologyError(ValueError):
  """A topology that cannot be named or compiled for here; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class Topology:
  """A named target: its platform ("tpu" | "cuda" | "cpu"), devices, the memory of one device in bytes (None: host
  memory), and what `jax.experimental.topologies.get_topology_desc` takes to describe it."""

  name: str
  platform: str
  num_devices: int
  hbm_bytes: int | None
  topology_name: str = ""
  options: tuple[tuple[str, Any], ...] = ()


def parse_topology(name: str) -> Topology:
  """Parses a --topology value; raises TopologyError naming the accepted forms."""
  known = ("v5p-N (N TensorCores: 8, 16, ..., 1024), v5e-N or v6e-N (N chips: 1, 4, 8, ..., 256), NxH100 or NxH200 "
           "(N = 1..8), cpu:N")
  if not name:
    raise TopologyError(f"give --topology: {known}")
  if m := re.fullmatch(r"cpu:(\d+)", name):
    n = int(m.group(1))
    if n < 1:
      raise TopologyError(f"cpu:N needs N >= 1, got {name!r}")
    return Topology(name, "cpu", n, None)
  if m := re.fullmatch(r"v5p-(\d+)", name):
    cores = int(m.group(1))
    if cores % 2 or cores // 2 not in _V5P_SHAPES:
      raise TopologyError(f"unknown TPU slice {name!r}: v5p-N takes N in {sorted(2 * c for c in _V5P_SHAPES)}")
    chips = cores // 2
    return Topology(name, "tpu", chips, _TPU_HBM["v5p"], f"v5p:{_V5P_SHAPES[chips]}")
  if m := re.fullmatch(r"(v5e|v6e)-(\d+)", name):
    kind, chips = m.group(1), int(m.group(2))
    if chips not in _LITE_SHAPES:
      raise TopologyError(f"unknown TPU slice {name!r}: {kind}-N takes N in {sorted(_LITE_SHAPES)}")
    hosts = (2, 4, 1) if chips == 8 else (min(2, chips), min(2, chips), 1)  # 8 chips: one host; else 4 a host
    return Topology(name, "tpu", chips, _TPU_HBM[kind], f"{kind}:{_LITE_SHAPES[chips]}",
                    (("chips_per_host_bounds", hosts),))
  if m := re.fullmatch(r"(\d+)x(H100|H200)", name, flags=re.IGNORECASE):
    n, kind = int(m.group(1)), m.group(2).upper()
    if not 1 <= n <= 8:
      raise TopologyError(f"{name!r}: one node of 1 to 8 GPUs ({kind}); a multi-node run compiles per node the same")
    return Topology(name, "cuda", n, _GPUS[kind]["memory"], "",
                    (("topology", f"1x1x{n}"), ("target_config", _GPU_TARGET.format(**_GPUS[kind]))))
  raise TopologyError(f"unknown topology {name!r}; give one of: {known}")


def configure_platform(topology: Topology) -> None:
  """Sets JAX up for `topology` before any backend starts: the CPU backend runs nothing but tracing, with N
  devices for cpu:N; the persistent compilation cache stays off (nothing here is compiled twice)."""
  import jax
  jax.config.update("jax_platforms", "cpu")
  jax.config.update("jax_enable_compilation_cache", False)
  if topology.platform == "cpu":
    jax.config.update("jax_num_cpu_devices", topology.num_devices)
  if topology.platform == "tpu":
    # Off a TPU VM, libtpu would ask the metadata server which slice it is on; a compile needs no answer.
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def topology_devices(topology: Topology) -> list:
  """The compile-only devices of `topology` (fake CPU devices for cpu:N). Raises TopologyError when what compiles
  for it is not installed."""
  import jax
  if topology.platform == "cpu":
    devices = jax.devices("cpu")
    if len(devices) != topology.num_devices:
      raise TopologyError(f"{topology.name}: the CPU backend has {len(devices)} devices (started before "
                          "launch.aot could set it up)")
    return devices
  from jax.experimental import topologies
  fake = f"or estimate on fake devices with --topology=cpu:{topology.num_devices}"
  try:
    desc = topologies.get_topology_desc(topology.topology_name, topology.platform, **dict(topology.options))
  except NotImplementedError as e:  # no plugin registered a topology for this platform
    if topology.platform == "cuda":
      raise TopologyError(f"compiling for {topology.name} needs JAX's CUDA plugin (no GPU needed): pip install "
                          f"'jax[cuda12-local]' (the plugin alone; or pip install -e .[cuda], with CUDA); "
                          f"{fake}") from e
    raise TopologyError(f"JAX cannot describe {topology.name}: {e}") from e
  except RuntimeError as e:
    if "TPU support not installed" in str(e):
      raise TopologyError(f"compiling for {topology.name} needs libtpu, the TPU compiler (no TPU needed): pip install "
                          f"-e .[tpu]  (or: pip install 'jax[tpu]'); {fake}") from e
    raise TopologyError(f"JAX cannot describe {topology.name}: {e}") from e
  devices = list(desc.devices)
  if len(devices) != topology.num_devices:
    raise TopologyError(f"{topology.name}: expected {topology.num_devices} devices, the compiler describes "
                        f"{len(devices)}")
  return devices


# --- what the run config asks for --------------------------------------------------------------------------------

def _resolve(value: Any) -> Any:
  """A gin binding's value with macros (`%NAME`) resolved; other references are left as they are."""
  import gin
  while isinstance(value, gin.config.ConfigurableReference) and value.selector == "gin.macro":
    value = gin.query_parameter(f"%{value.scoped_selector.rsplit('/', 1)[0]}")
  return value


def _binding(bindings: Mapping[str, Any], name: str, default: Any) -> Any:
  return _resolve(bindings[name]) if name in bindings else default


@dataclasses.dataclass
class Plan:
  """What to compile, from the run config and the flags."""

  model: Any                  # ModelConfig
  model_source: str
  trainer: Any                # TrainerConfig
  grpo: bool
  rows: int
  length: int
  sampler_rows: int           # rows of one sampler (per host on a multi-host topology)
  rollout_rows: int           # the step's episodes, all hosts together
  max_new_tokens: int
  temperature: float
  head_chunk_rows: int | None


def run_mesh(devices: list, topology: Topology):
  """The run's (data, fsdp, tensor) mesh (`TrainerConfig.mesh_*`) over `devices`, as the Trainer makes it; raises
  TopologyError when its sizes do not fit the topology."""
  from evolver.models import sharding
  from evolver.train.trainer import TrainerConfig
  tc = TrainerConfig()
  try:
    return sharding.make_mesh(tc.mesh_data, tc.mesh_fsdp, tc.mesh_tensor, devices)
  except ValueError as e:
    raise TopologyError(f"the run's mesh (TrainerConfig.mesh_data={tc.mesh_data}, mesh_fsdp={tc.mesh_fsdp}, "
                        f"mesh_tensor={tc.mesh_tensor}) does not fit {topology.name} ({len(devices)} devices): "
                        f"{e}") from e


def read_plan(num_processes: int, data_parallel: int) -> Plan:
  """The programs' shapes from the parsed gin config and the flags (module docstring)."""
  import gin
  from evolver.models.config import ModelConfig
  from evolver.models.hf import config_from_hf, read_hf_config
  from evolver.train import rl as rl_lib
  from evolver.train.trainer import TrainerConfig

  model, source = ModelConfig(), "gin ModelConfig"
  trainer = TrainerConfig()
  try:
    loop = gin.query_parameter("run.loop")
  except ValueError:
    loop = None
  grpo = getattr(loop, "selector", None) == "train_grpo"
  bindings = gin.get_bindings("train_grpo", resolve_references=False) if grpo else {}
  hf_checkpoint = _binding(bindings, "hf_checkpoint", None)
  if isinstance(hf_checkpoint, str) and os.path.isfile(os.path.join(hf_checkpoint, "config.json")):
    shapes = config_from_hf(read_hf_config(hf_checkpoint), param_dtype=model.param_dtype, dtype=model.dtype)
    model = dataclasses.replace(shapes, remat=model.remat, causal_block=model.causal_block)
    source = f"{hf_checkpoint}/config.json"
  multiple = math.lcm(data_parallel, trainer.num_microbatches)
  if grpo:
    defaults = {k: p.default for k, p in inspect.signature(rl_lib.train_grpo).parameters.items()}
    setting = lambda name: _binding(bindings, name, defaults[name])  # noqa: E731
    tasks, group = setting("tasks_per_step"), setting("group_size")
    rows = FLAGS.rows or rl_lib.update_rows(tasks * group, setting("num_minibatches"), multiple)
    length = FLAGS.length or max(setting("buckets"))
    rollout_rows = FLAGS.sampler_rows or tasks * group
    sampler_rows = rollout_rows if num_processes == 1 else -(-tasks // num_processes) * group
    max_new = FLAGS.max_new_tokens or setting("max_new_tokens")
    temperature, head_chunk_rows = setting("temperature"), setting("head_chunk_rows")
  else:
    rows, length = FLAGS.rows or multiple, FLAGS.length or 512
    rollout_rows = FLAGS.sampler_rows or 64
    sampler_rows = rollout_rows if num_processes == 1 else -(-rollout_rows // num_processes)
    max_new, temperature, head_chunk_rows = FLAGS.max_new_tokens or 128, 1.0, None
  if rows % multiple:
    raise ValueError(f"--rows={rows} must be a multiple of {multiple} (data x fsdp devices and microbatches)")
  return Plan(model=model, model_source=source, trainer=trainer, grpo=grpo, rows=rows, length=length,
              sampler_rows=sampler_rows, rollout_rows=rollout_rows, max_new_tokens=max_new,
              temperature=temperature, head_chunk_rows=head_chunk_rows)


# --- compiling -----------------------------------------------------------------------------------------------------

def _per_device_bytes(tree: Any, shardings: Any) -> int:
  """Bytes one device holds of `tree` (arrays or ShapeDtypeStructs) placed by `shardings` (one per leaf, in leaf
  order)."""
  import jax
  total = 0
  for leaf, sharding in zip(jax.tree.leaves(tree), jax.tree.leaves(shardings)):
    total += math.prod(sharding.shard_shape(tuple(leaf.shape))) * leaf.dtype.itemsize
  return total


def _abstract(tree: Any, shardings: Any = None, dtype: Any = None) -> Any:
  """ShapeDtypeStructs of `tree`'s leaves, floating ones as `dtype` when given, placed by `shardings` (one sharding
  per leaf, in leaf order: the trees of `state_shardings` hold a sharding where `tree` holds a Variable)."""
  import jax
  import jax.numpy as jnp

  leaves, treedef = jax.tree.flatten(tree)
  placed = [None] * len(leaves) if shardings is None else jax.tree.leaves(shardings)
  if len(placed) != len(leaves):
    raise ValueError(f"{len(placed)} shardings for {len(leaves)} arrays")

  def one(x, sharding):
    leaf_dtype = dtype if dtype is not None and jnp.issubdtype(x.dtype, jnp.floating) else x.dtype
    return jax.ShapeDtypeStruct(x.shape, leaf_dtype, sharding=sharding)

  return jax.tree.unflatten(treedef, [one(x, s) for x, s in zip(leaves, placed)])


def _all_on(tree: Any, sharding: Any) -> Any:
  """`tree` as ShapeDtypeStructs, every leaf placed by `sharding`."""
  import jax
  return _abstract(tree, [sharding] * len(jax.tree.leaves(tree)))


def _shardings_of(tree: Any) -> list:
  import jax
  return [x.sharding for x in jax.tree.leaves(tree)]


def abstract_sampler(graphdef: Any, params: Any, mesh: Any, device: Any) -> tuple[Any, Any, Any]:
  """A `Sampler` over abstract weights (`params`: ShapeDtypeStructs), placed as a run places its real one: on
  `mesh` by the sampler's own rules (one process: the sampler takes the trainer's mesh), else whole on `device`
  (each host samples on its first device, `distributed.local_copy`).

  Returns:
    (the sampler; `empty_slots(batch, width)`, its empty continuous-batching state as placed ShapeDtypeStructs;
    the sharding of a host argument: whole on every device).
  """
  import jax
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec, SingleDeviceSharding

  from evolver.models import sampler as sampler_lib
  from evolver.models import sharding

  bare = _abstract(params)
  sampler = sampler_lib.Sampler(nnx.merge(graphdef, bare))  # unplaced weights: no mesh yet, nothing moved

  def shapes(batch: int, width: int):
    return jax.eval_shape(functools.partial(sampler._empty_slots_impl, batch, width))

  if mesh is None:
    one = SingleDeviceSharding(device)
    sampler.params = _all_on(bare, one)
    return sampler, lambda batch, width: _all_on(shapes(batch, width), one), one
  # What `Sampler(model, mesh=mesh)` does with real weights (its placement moves arrays; these have none to move).
  sampler.mesh = mesh
  sampler._build_programs()
  sampler.params = _abstract(bare, sharding.state_shardings(bare, mesh, sampler.rules))

  def empty_slots(batch: int, width: int):
    # Placed as the outputs of the sampler's own program that makes them (`Sampler.open_slots`).
    placed = sampler._empty_slots.lower(batch, width).compile().output_shardings
    return _abstract(shapes(batch, width), placed)

  return sampler, empty_slots, NamedSharding(mesh, PartitionSpec())


def memory_of(compiled: Any) -> dict[str, int]:
  """Per-device bytes of a compiled program (`memory_analysis()`), with peak = argument + output - alias + temp +
  generated code."""
  stats = compiled.memory_analysis()
  if stats is None:
    raise RuntimeError("this backend's compiler reports no memory analysis")
  out = {"argument_bytes": int(stats.argument_size_in_bytes), "output_bytes": int(stats.output_size_in_bytes),
         "alias_bytes": int(stats.alias_size_in_bytes), "temp_bytes": int(stats.temp_size_in_bytes),
         "generated_code_bytes": int(stats.generated_code_size_in_bytes)}
  out["peak_bytes"] = (out["argument_bytes"] + out["output_bytes"] - out["alias_bytes"] + out["temp_bytes"]
                       + out["generated_code_bytes"])
  return out


def _compile(name: str, lower, results: dict, shape: str) -> None:
  started = time.perf_counter()
  compiled = lower().compile()
  results[name] = dict(memory_of(compiled), shape=shape, compile_s=round(time.perf_counter() - started, 1))
  print(f"[aot] {name}: compiled in {results[name]['compile_s']} s", file=sys.stderr, flush=True)


def analyze(plan: Plan, topology: Topology, mesh, programs: tuple[str, ...]) -> dict[str, Any]:
  """Compiles `programs` of `plan` over `mesh` (the topology's devices) and returns the report (module
  docstring)."""
  import jax
  import jax.numpy as jnp
  from flax import nnx
  from jax.sharding import NamedSharding, PartitionSpec

  from evolver.data import batching
  from evolver.models import sampler as sampler_lib
  from evolver.models.config import resolve_dtype
  from evolver.models.decoder import make_model
  from evolver.train import optimizer as optimizer_lib
  from evolver.train import rl as rl_lib
  from evolver.train import state as state_lib
  from evolver.train import step as step_lib

  cfg, tc = plan.model, plan.trainer
  devices = list(mesh.devices.flat)
  processes = len({d.process_index for d in devices})
  graphdef, params = nnx.split(nnx.eval_shape(lambda: make_model(cfg)))
  # The trainer's state: float32 master weights and optimizer (`Trainer`), placed by `state_shardings`.
  optimizer = optimizer_lib.make_optimizer(1000)  # the schedule's length changes no shape
  master = _abstract(params, dtype=jnp.float32)
  state = jax.eval_shape(lambda p: state_lib.create_train_state(p, optimizer, 0), master)
  state_sharding = step_lib.state_shardings(state, mesh)
  param_dtype = resolve_dtype(cfg.param_dtype)
  resident = {"params": _per_device_bytes(state.params, state_sharding.params),
              "optimizer": _per_device_bytes(state.opt_state, state_sharding.opt_state)}
  resident["train_state"] = resident["params"] + resident["optimizer"]
  copy = _abstract(params, state_sharding.params, dtype=param_dtype)  # `Trainer.policy_params`
  resident["reference"] = _per_device_bytes(copy, state_sharding.params)
  sampler, empty_slots, whole = abstract_sampler(graphdef, copy, mesh if processes == 1 else None, devices[0])
  resident["sampler_weights"] = _per_device_bytes(sampler.params, _shardings_of(sampler.params))

  results: dict[str, dict] = {}
  if "train_step" in programs or "score" in programs:
    if plan.grpo:
      empty = batching.make_batch([], 1, 0, 1)  # the dtypes of the RL batch (as `rl.precompile_updates`)
      keys = {k: empty.get(k, empty["loss_mask"]).dtype for k in rl_lib.RL_KEYS}
      loss_fn = functools.partial(rl_lib.het_ppo_loss_fn, head_chunk_rows=plan.head_chunk_rows)
    else:
      keys = {"input_ids": jnp.int32, "loss_mask": jnp.float32}
      loss_fn = step_lib.sft_loss_fn
    batch = {k: jax.ShapeDtypeStruct((plan.rows, plan.length), d) for k, d in keys.items()}
    shape = f"{plan.rows} x {plan.length} tokens"
    if "train_step" in programs:
      train = step_lib.TrainStepPrograms(graphdef, loss_fn, optimizer, mesh, state_sharding,
                                         num_microbatches=tc.num_microbatches)
      _compile("train_step", lambda: train.lower(state, batch), results,
               f"{shape}, {tc.num_microbatches} microbatches")
    if "score" in programs:
      # (host numpy ids, as `rl.behaviour_logprobs` passes them: the same on every device, then split by rows)
      ids = jax.ShapeDtypeStruct((plan.rows, plan.length), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec()))
      master_placed = _abstract(state.params, state_sharding.params)
      _compile("score", lambda: rl_lib._logprobs.lower(graphdef, master_placed, ids, plan.head_chunk_rows, mesh),
               results, shape)

  if "sampler_prefill" in programs or "sampler_decode" in programs:
    # The programs `Sampler.precompile_slots` compiles for the rollout batch: `_begin` (a turn's prefill piece on
    # every row) and `_decode_slots`, on empty slots placed as the sampler's programs place them.
    batch_rows = sampler_lib._batch_bucket(plan.sampler_rows)
    sampling = sampler_lib.SamplingParams(max_new_tokens=plan.max_new_tokens, temperature=plan.temperature,
                                          stop_ids=(0,))
    static, knobs = sampler_lib._split_params(sampling)
    slots = empty_slots(batch_rows, static.buffer_len)
    resident["sampler_slots"] = _per_device_bytes(slots, _shardings_of(slots))

    def host(shape, dtype):
      return jax.ShapeDtypeStruct(shape, dtype, sharding=whole)

    knobs = _all_on(knobs, whole)
    key_shape = sampler_lib.raw_key_shape()
    piece = sampler.prefill_piece
    if "sampler_prefill" in programs:
      _compile("sampler_prefill",
               lambda: sampler._begin.lower(sampler.params, slots, host((batch_rows,), jnp.int32),
                                            host((batch_rows, piece), jnp.int32), host((batch_rows, piece), bool),
                                            host((batch_rows, *key_shape), jnp.uint32), knobs, static=static),
               results, f"{batch_rows} rows x {piece} new tokens, cache {sampler.capacity}")
    if "sampler_decode" in programs:
      _compile("sampler_decode",
               lambda: sampler._decode_slots.lower(sampler.params, slots, host((batch_rows,), bool),
                                                   host((), jnp.int32), knobs, static=static),
               results, f"{batch_rows} rows, cache {sampler.capacity}, turns of {plan.max_new_tokens}")

  phases = {}
  others = resident["reference"] + resident["sampler_weights"]
  if "sampler_decode" in results:
    phases["rollout"] = results["sampler_decode"]["peak_bytes"] + resident["train_state"] + resident["reference"]
  if "score" in results:
    phases["score"] = results["score"]["peak_bytes"] + resident["optimizer"] + others
  if "train_step" in results:
    phases["update"] = results["train_step"]["peak_bytes"] + others
  peak = max(phases.values(), default=None)
  fits = None if topology.hbm_bytes is None or peak is None else peak <= topology.hbm_bytes
  report = {
      "topology": topology.name, "platform": topology.platform, "device_kind": devices[0].device_kind,
      "devices": len(devices), "processes": processes, "hbm_bytes_per_device": topology.hbm_bytes,
      "mesh": {k: int(v) for k, v in mesh.shape.items()},
      "model": {"params": cfg.num_params(), "shapes_from": plan.model_source, "param_dtype": cfg.param_dtype,
                "dtype": cfg.dtype, "remat": cfg.remat},
      "loss": "het_ppo (GRPO)" if plan.grpo else "sft",
      "sampler": {"rows": plan.sampler_rows, "rollout_rows": plan.rollout_rows,
                  "placement": "mesh" if processes == 1 else "first device of each host",
                  "max_new_tokens": plan.max_new_tokens},
      "programs": results, "resident_bytes_per_device": resident, "phase_peak_bytes": phases,
      "peak_bytes": peak, "fits": fits,
  }
  if topology.platform == "cpu":
    report["note"] = ("compiled for fake CPU devices: XLA:CPU's buffer assignment and fusion, an approximation of "
                      "an accelerator's; the resident bytes are exact")
  return report


# --- output --------------------------------------------------------------------------------------------------------

def _gib(n: int | None) -> str:
  return "-" if n is None else f"{n / GIB:.2f}"


def print_report(report: dict[str, Any]) -> None:
  hbm = report["hbm_bytes_per_device"]
  print(f"{report['topology']}: {report['devices']} x {report['device_kind']} in {report['processes']} "
        f"process(es), {_gib(hbm)} GiB each; mesh {report['mesh']}")
  model = report["model"]
  print(f"model: {model['params'] / 1e9:.3f}B parameters (shapes: {model['shapes_from']}), loss {report['loss']}")
  print(f"{'program (GiB per device)':<26}{'argument':>10}{'output':>10}{'alias':>10}{'temp':>10}{'code':>10}"
        f"{'peak':>10}  shape")
  for name, m in report["programs"].items():
    print(f"{name:<26}{_gib(m['argument_bytes']):>10}{_gib(m['output_bytes']):>10}{_gib(m['alias_bytes']):>10}"
          f"{_gib(m['temp_bytes']):>10}{_gib(m['generated_code_bytes']):>10}{_gib(m['peak_bytes']):>10}  "
          f"{m['shape']}")
  resident = ", ".join(f"{k} {_gib(v)}" for k, v in report["resident_bytes_per_device"].items())
  print(f"resident per device (GiB): {resident}")
  phases = ", ".join(f"{k} {_gib(v)}" for k, v in report["phase_peak_bytes"].items())
  verdict = {None: "", True: " -> fits", False: " -> does NOT fit"}[report["fits"]]
  print(f"busiest device per phase (GiB): {phases}; peak {_gib(report['peak_bytes'])} of {_gib(hbm)}{verdict}")
  if "note" in report:
    print(f"note: {report['note']}")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  try:
    topology = parse_topology(FLAGS.topology or "")
  except TopologyError as e:
    sys.exit(f"error: {e}")
  unknown = sorted(set(FLAGS.programs) - set(PROGRAMS))
  if unknown:
    sys.exit(f"error: unknown --programs {unknown}; choose from {list(PROGRAMS)}")
  if not FLAGS.gin_file:
    sys.exit("error: give at least one --gin_file, e.g. --gin_file=gin_configs/models/tiny.gin")
  configure_platform(topology)
  from evolver.train import gin_config
  try:
    gin_config.parse(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
  except gin_config.ConfigError as e:
    sys.exit(f"error: {e}")
  try:
    devices = topology_devices(topology)
    mesh = run_mesh(devices, topology)
    plan = read_plan(len({d.process_index for d in devices}), mesh.shape["data"] * mesh.shape["fsdp"])
  except (TopologyError, ValueError) as e:
    sys.exit(f"error: {e}")
  report = analyze(plan, topology, mesh, tuple(p for p in PROGRAMS if p in FLAGS.programs))
  print_report(report)
  sys.stdout.flush()
  print(json.dumps(report))


if __name__ == "__main__":
  app.run(main)
