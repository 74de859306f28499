"""The policy's initialisation and the `Trainer`: a sharded TrainState on its mesh with its jitted step, its
checkpoints (save with the loop's extras and state files, resume from the latest, keep the `val`-selected policy).
The loop around it (metrics, val, cadence, final evaluation) is `evolver.train.loop`.

Precision (the MaxText / t5x convention): the trainer keeps float32 master parameters and float32 optimizer state
whatever `ModelConfig.param_dtype` says, and the model computes in `ModelConfig.dtype` (it casts weights at use);
`param_dtype` is the dtype of the *copies* that sample and score without training (`policy_params`: the
sampler's weights, the frozen reference). With bf16 master weights a learning rate of 1e-6 would round most
updates away (bf16 keeps 8 bits of mantissa)."""

import dataclasses
import os
import signal
from collections.abc import Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from evolver import distributed
from evolver import paths
from evolver.models import sharding
from evolver.models.config import ModelConfig, resolve_dtype
from evolver.models.decoder import Decoder, make_model
from evolver.models.hf import load_hf
from evolver.train import checkpoints as ckpt_lib
from evolver.train import state as state_lib
from evolver.train import step as step_lib


KILL_DURING_SAVE_ENV = "EVOLVER_FAULT_KILL_DURING_SAVE_AT_STEP"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@gin.configurable
@dataclasses.dataclass(frozen=True)
class TrainerConfig:
  """How a run trains, independent of what it trains on. Mesh sizes: -1 = the rest of the devices."""

  checkpoint_every: int = 100
  keep_checkpoints: int = 3
  log_every: int = 1
  num_microbatches: int = 1
  async_checkpoint: bool = True
  mesh_data: int = 1
  mesh_fsdp: int = -1
  mesh_tensor: int = 1


@gin.configurable
def init_policy(config: ModelConfig | None = None, *, seed: int = 0, init_checkpoint: str | None = None,
                hf_checkpoint: str | None = None, tokenizer: Any = None) -> Decoder:
  """The starting policy: an evolver run's checkpoint (`INIT_CHECKPOINT`: a MODEL_DIR, its best or a step
  directory), a transformers directory (`HF_CHECKPOINT`, computing as `config` says), or fresh weights of
  `config` (the tiny default from gin). With `tokenizer` (the new run's), a run that keeps another tokenizer
  (`MODEL_DIR/tokenizer/`) is refused: its policy would read the new run's token ids as other words."""
  if init_checkpoint and hf_checkpoint:
    raise ValueError("give init_checkpoint or hf_checkpoint, not both")
  if init_checkpoint and tokenizer is not None:
    ckpt_lib.check_same_tokenizer(init_checkpoint, tokenizer)
  if init_checkpoint:
    best = ckpt_lib.checkpoint_dir(init_checkpoint, ckpt_lib.BEST_SUBDIR).is_dir()
    model, _ = ckpt_lib.restore_model(init_checkpoint, best=best)
    return model
  if hf_checkpoint:
    hf_checkpoint = resolve_hf_checkpoint(hf_checkpoint)
    cfg = config or ModelConfig()  # the checkpoint gives the shapes; gin gives how it computes
    return load_hf(hf_checkpoint, param_dtype=cfg.param_dtype, dtype=cfg.dtype, remat=cfg.remat,
                   causal_block=cfg.causal_block)
  return make_model(config or ModelConfig(), seed=seed)


def resolve_hf_checkpoint(hf_checkpoint: str) -> str:
  """The transformers directory `hf_checkpoint` names: as given, or relative to the repository (a checkpoint that
  ships with it). Raises FileNotFoundError, naming the path, when it is neither."""
  if not os.path.isabs(hf_checkpoint) and not os.path.isdir(hf_checkpoint):
    shipped = os.path.join(REPO_ROOT, hf_checkpoint)
    hf_checkpoint = shipped if os.path.isdir(shipped) else hf_checkpoint
  if not os.path.isdir(hf_checkpoint):
    raise FileNotFoundError(f"HF checkpoint {hf_checkpoint!r} is not a directory: give a local transformers "
                            "checkpoint (config.json, *.safetensors, the tokenizer's files)")
  return hf_checkpoint


def check_vocabulary(model: Decoder, tokenizer: Any) -> None:
  """The model must have an embedding for every token id the tokenizer can produce."""
  if model.config.vocab_size < len(tokenizer):
    raise ValueError(f"the model's vocabulary ({model.config.vocab_size}) is smaller than the tokenizer's "
                     f"({len(tokenizer)}): they do not belong together")


def cast_floats(tree: Any, dtype: Any) -> Any:
  """Every floating leaf of `tree` as `dtype` (a new array); other leaves as they are."""
  return jax.tree.map(lambda x: jnp.array(x, dtype=dtype, copy=True) if jnp.issubdtype(x.dtype, jnp.floating) else x,
                      tree)


class Trainer:
  """Owns the TrainState on its mesh (float32 master parameters, module docstring), the jitted step and the
  checkpointers (latest and best). `devices`: the mesh's devices (default: all)."""

  def __init__(self, model_dir: paths.PathLike, model: Decoder, optimizer: optax.GradientTransformation,
               loss_fn: step_lib.LossFn, *, seed: int = 0, config: TrainerConfig | None = None,
               devices: Sequence[jax.Device] | None = None):
    self.model_dir = paths.as_path(model_dir)
    self.config = config or TrainerConfig()
    self.model_config = model.config
    self.graphdef, params = nnx.split(model)
    self.param_dtype = resolve_dtype(model.config.param_dtype)
    self.mesh = sharding.make_mesh(self.config.mesh_data, self.config.mesh_fsdp, self.config.mesh_tensor, devices)
    state = state_lib.create_train_state(cast_floats(params, jnp.float32), optimizer, seed)
    self.shardings = step_lib.state_shardings(state, self.mesh)
    self.state = distributed.put_global(state, self.shardings)
    self._step = step_lib.TrainStepPrograms(self.graphdef, loss_fn, optimizer, self.mesh, self.shardings,
                                            num_microbatches=self.config.num_microbatches)
    self.checkpointer = ckpt_lib.Checkpointer(self.model_dir, max_to_keep=self.config.keep_checkpoints,
                                              async_save=self.config.async_checkpoint)
    self._best: ckpt_lib.Checkpointer | None = None

  @property
  def step(self) -> int:
    return int(self.state.step)

  def train_part(self, state: state_lib.TrainState) -> dict[str, Any]:
    """What a checkpoint keeps of the state besides the parameters."""
    return {"step": state.step, "opt_state": state.opt_state, "rng": state.rng}

  def restore_latest(self) -> tuple[dict[str, Any], dict[str, dict[str, bytes]]] | None:
    """Resumes from the latest complete checkpoint, if any, and drops the `val`-selected policies kept past it (a
    run killed after keeping one recomputes those steps and keeps them again).

    Returns:
      None when there is no checkpoint, else (its extras: the loop's bookkeeping, its state files).
    """
    latest = self.checkpointer.latest_step()
    if latest is None:
      return None
    params, train, extra = self.checkpointer.restore(latest, ckpt_lib.abstract_of(self.state.params),
                                                     ckpt_lib.abstract_of(self.train_part(self.state)))
    self.state = self.state.replace(params=params, step=train["step"], opt_state=train["opt_state"],
                                    rng=train["rng"])
    if int(self.state.step) != latest:
      raise RuntimeError(f"checkpoint {latest} holds state of step {int(self.state.step)}")
    if ckpt_lib.checkpoint_dir(self.model_dir, ckpt_lib.BEST_SUBDIR).is_dir():
      self._best_checkpointer().delete_after(latest)
    return extra, self.checkpointer.restore_state_files(latest)

  def train_step(self, batch: dict[str, np.ndarray]) -> dict[str, float]:
    rows = next(iter(batch.values())).shape[0]
    data_parallel = self.mesh.shape["data"] * self.mesh.shape["fsdp"]
    if rows % data_parallel:
      raise ValueError(f"batch of {rows} rows does not split over data x fsdp = {data_parallel} devices; make the "
                       f"batch size a multiple of {data_parallel} or change TrainerConfig.mesh_*")
    self.state, metrics = self._step(self.state, batch)
    return metrics

  def precompile_step(self, batch_spec: dict[str, jax.ShapeDtypeStruct]) -> bool:
    """Compiles the train step for batches shaped as `batch_spec` ahead of time (the state is untouched). Returns
    False when that shape was compiled already."""
    return self._step.precompile(self.state, batch_spec)

  def save(self, extra: dict[str, Any], *, state_files: ckpt_lib.StateFiles | None = None,
           force: bool = False) -> None:
    """Starts saving the train state with the loop's `extra` (JSON) and `state_files` (see checkpoints.py)."""
    extra = dict(extra, model_config=ckpt_lib.model_config_to_json(self.model_config))
    self.checkpointer.save(self.step, self.state.params, self.train_part(self.state), extra,
                           state_files=state_files, force=force)
    # Fault injection for the crash-resume tests: die by SIGKILL while this (async) save is in flight.
    if os.environ.get(KILL_DURING_SAVE_ENV) == str(self.step):
      os.kill(os.getpid(), signal.SIGKILL)

  def _best_checkpointer(self) -> ckpt_lib.Checkpointer:
    if self._best is None:
      self._best = ckpt_lib.Checkpointer(self.model_dir, max_to_keep=1, async_save=False,
                                         subdir=ckpt_lib.BEST_SUBDIR)
    return self._best

  def save_best(self, score: float, extra: dict[str, Any]) -> None:
    """Keeps the current policy as the one selected on `val` (params only; synchronous). The caller decides that
    `score` is the best so far; a step already kept (a resumed run recomputing it) is kept once."""
    best = self._best_checkpointer()
    if self.step in best.all_steps():
      return
    extra = dict(extra, model_config=ckpt_lib.model_config_to_json(self.model_config), score=score)
    best.save(self.step, self.state.params, None, extra, force=True)

  def best_step(self) -> int | None:
    """The step of the policy kept as the best on `val`, or None."""
    if not ckpt_lib.checkpoint_dir(self.model_dir, ckpt_lib.BEST_SUBDIR).is_dir():
      return None
    return max(self._best_checkpointer().all_steps(), default=None)

  def policy_params(self, params: nnx.State | None = None) -> nnx.State:
    """A copy of the current master parameters (or of `params`) in `ModelConfig.param_dtype`, placed like the
    policy's: what samples and scores without training (the sampler, the frozen reference). A copy, so the next
    train step (which donates the state) leaves it valid."""
    params = self.state.params if params is None else params
    return jax.device_put(cast_floats(params, self.param_dtype), self.shardings.params)

  def policy(self) -> Decoder:
    """The current policy as a model, in `param_dtype` (a copy of the master parameters)."""
    return nnx.merge(self.graphdef, self.policy_params())

  def close(self) -> None:
    self.checkpointer.close()
    if self._best is not None:
      self._best.close()
