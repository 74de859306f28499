"""Orbax checkpoints of a run: parameters, optimizer state, and JSON extras (data-iterator position, RNG
seeds, model config, loop bookkeeping), saved asynchronously, last N kept, resumed from the latest complete one.

Layout: `MODEL_DIR/checkpoints/<step>/{params,train,extra}`. `params` is its own item so evaluation and
later runs (`INIT_CHECKPOINT`) restore the policy without knowing the optimizer. Orbax writes each step to a
temporary directory and renames it when complete, so a process killed mid-save leaves the previous
checkpoint as the latest.
"""

import dataclasses
import json
import os
from typing import Any

import jax
import orbax.checkpoint as ocp
from flax import nnx

from evolver.models.config import ModelConfig
from evolver.models.decoder import Decoder

CHECKPOINT_SUBDIR = "checkpoints"
BEST_SUBDIR = "best"  # the policy selected on `val`: params and extra only


def checkpoint_dir(model_dir: str, subdir: str = CHECKPOINT_SUBDIR) -> str:
  return os.path.join(os.path.abspath(model_dir), subdir)


class Checkpointer:
  """A thin wrapper over orbax's CheckpointManager for TrainState-like pytrees (`max_to_keep` None: all)."""

  def __init__(self, model_dir: str, *, max_to_keep: int | None = 3, async_save: bool = True,
               subdir: str = CHECKPOINT_SUBDIR):
    self.directory = checkpoint_dir(model_dir, subdir)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save,
                                           create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=("params", "train", "extra"))

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, params: nnx.State, train: Any | None, extra: dict[str, Any], *,
           force: bool = False) -> bool:
    """Starts saving (async); `train` is the rest of the state (optimizer state, step, rng), or None to save
    the policy only."""
    items = dict(params=ocp.args.StandardSave(params), extra=ocp.args.JsonSave(extra))
    if train is not None:
      items["train"] = ocp.args.StandardSave(train)
    return self.manager.save(step, args=ocp.args.Composite(**items), force=force)

  def restore(self, step: int, abstract_params: nnx.State, abstract_train: Any) -> tuple[nnx.State, Any, dict]:
    """Restores into the shardings/dtypes of the abstract targets (`jax.ShapeDtypeStruct` leaves with shardings)."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params), train=ocp.args.StandardRestore(abstract_train),
        extra=ocp.args.JsonRestore()))
    return restored.params, restored.train, dict(restored.extra)

  def restore_extra(self, step: int) -> dict:
    return dict(self.manager.restore(step, args=ocp.args.Composite(extra=ocp.args.JsonRestore())).extra)

  def restore_params(self, step: int, abstract_params: nnx.State) -> nnx.State:
    return self.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params))).params

  def wait(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()


def abstract_of(tree: Any) -> Any:
  """ShapeDtypeStructs (with shardings) of a pytree of arrays: the restore target for orbax."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), tree)


def model_config_to_json(config: ModelConfig) -> dict[str, Any]:
  return dataclasses.asdict(config)


def model_config_from_json(data: dict[str, Any]) -> ModelConfig:
  return ModelConfig(**data)


def restore_model(model_dir: str, step: int | None = None, *, best: bool = False) -> tuple[Decoder, int]:
  """The policy saved by a run (`MODEL_DIR`, or its `checkpoints/` directory), at `step` or the latest; with
  `best`, the one selected on `val`."""
  model_dir = os.path.abspath(model_dir).rstrip("/")
  if os.path.basename(model_dir) in (CHECKPOINT_SUBDIR, BEST_SUBDIR):
    best = os.path.basename(model_dir) == BEST_SUBDIR
    model_dir = os.path.dirname(model_dir)
  subdir = BEST_SUBDIR if best else CHECKPOINT_SUBDIR
  if not os.path.isdir(checkpoint_dir(model_dir, subdir)):
    raise FileNotFoundError(f"no checkpoints in {model_dir!r} (expected {checkpoint_dir(model_dir, subdir)!r})")
  checkpointer = Checkpointer(model_dir, async_save=False, subdir=subdir)
  try:
    steps = checkpointer.all_steps()
    if not steps:
      raise FileNotFoundError(f"{checkpoint_dir(model_dir, subdir)!r} holds no complete checkpoint")
    if step is None:
      step = max(steps)
    elif step not in steps:
      raise ValueError(f"no checkpoint at step {step} in {model_dir!r}; available: {sorted(steps)}")
    extra = checkpointer.restore_extra(step)
    if "model_config" not in extra:
      raise ValueError(f"checkpoint {step} in {model_dir!r} does not record its model config")
    config = model_config_from_json(extra["model_config"])
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    graphdef, abstract_params = nnx.split(abstract)
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), abstract_params)
    params = checkpointer.restore_params(step, target)
  finally:
    checkpointer.close()
  return nnx.merge(graphdef, params), step


def write_json_atomic(path: str, data: Any) -> None:
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(data, f, indent=2, sort_keys=True)
  os.replace(tmp, path)
