"""Orbax checkpoints of a run: parameters, optimizer state, JSON extras (data-iterator position, RNG seeds,
model config, loop bookkeeping) and state files (what extensions keep beside the train state: an experience
workspace, a set of synthetic tasks), saved asynchronously, last N kept, resumed from the latest complete one.

Layout: `MODEL_DIR/checkpoints/<step>/{params,train,extra,state_files}`, and `MODEL_DIR/tokenizer/`, the policy's
tokenizer as the run started with it (`save_run_tokenizer`; `load_run_tokenizer` reads it back for evaluation and
export, so that a run from a real checkpoint is never read through the tiny default's vocabulary). `params` is its own item so evaluation
and later runs (`INIT_CHECKPOINT`) restore the policy without knowing the optimizer. Orbax writes each step to a
temporary directory and renames it when complete, so a process killed mid-save leaves the previous checkpoint as
the latest, and the state files of a checkpoint are always those of its train state (one atomic rename).

`MODEL_DIR` goes through the path layer (`evolver.paths`): a local directory or an object store (`gs://`), which
orbax writes through etils.epath and tensorstore.
"""

import dataclasses
import os
import re
import tempfile
from collections.abc import Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

from evolver import distributed
from evolver import paths
from evolver.models.config import ModelConfig
from evolver.models.decoder import Decoder

CHECKPOINT_SUBDIR = "checkpoints"
BEST_SUBDIR = "best"  # the policy selected on `val`: params and extra only
TOKENIZER_SUBDIR = "tokenizer"
_TOKENIZER_WRITTEN_LAST = "tokenizer_config.json"  # its presence marks a complete `MODEL_DIR/tokenizer/`
STATE_FILES_ITEM = "state_files"
ITEMS = ("params", "train", "extra", STATE_FILES_ITEM)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")

StateFiles = Mapping[str, Mapping[str, bytes]]  # owner name -> {file name: contents}


@dataclasses.dataclass
class StateFilesSave(ocp.args.CheckpointArgs):
  """Files to keep in a checkpoint: {owner: {file name: bytes}}, a snapshot taken when the save starts."""
  files: StateFiles


@dataclasses.dataclass
class StateFilesRestore(ocp.args.CheckpointArgs):
  pass


class StateFilesHandler(ocp.handlers.CheckpointHandler):
  """Writes each owner's files under `<item>/<owner>/<file>` and reads them all back. Synchronous (the bytes are
  already in memory); orbax's temporary directory and rename make them part of the checkpoint atomically. In a
  multi-host run process 0 writes them (every process holds the same files), as orbax's own JSON items do."""

  def save(self, directory, args: StateFilesSave) -> None:
    if not distributed.is_primary():
      return
    for owner, files in args.files.items():
      check_state_file_name(owner, "owner")
      folder = directory / owner
      folder.mkdir(parents=True, exist_ok=True)
      for name, data in files.items():
        check_state_file_name(name, "file")
        (folder / name).write_bytes(bytes(data))

  def restore(self, directory, args: StateFilesRestore | None = None) -> dict[str, dict[str, bytes]]:
    del args
    out: dict[str, dict[str, bytes]] = {}
    for folder in sorted(directory.iterdir()):
      if folder.is_dir():
        out[folder.name] = {f.name: f.read_bytes() for f in sorted(folder.iterdir()) if f.is_file()}
    return out


ocp.args.register_with_handler(StateFilesHandler, for_save=True)(StateFilesSave)
ocp.args.register_with_handler(StateFilesHandler, for_restore=True)(StateFilesRestore)


def check_state_file_name(name: str, what: str) -> None:
  """Owner and file names of state files are plain names: no separators, no dot-dot, no hidden files."""
  if not isinstance(name, str) or not _NAME.match(name) or ".." in name:
    raise ValueError(f"state {what} name {name!r} must be 1-128 letters, digits, '_', '-' or '.', not starting "
                     "with '.' and without '..'")


def checkpoint_dir(model_dir: paths.PathLike, subdir: str = CHECKPOINT_SUBDIR) -> epath.Path:
  """`MODEL_DIR/subdir` through the path layer (a URI as it is, a local path made absolute)."""
  return paths.as_path(model_dir) / subdir


class Checkpointer:
  """A thin wrapper over orbax's CheckpointManager for TrainState-like pytrees (`max_to_keep` None: all)."""

  def __init__(self, model_dir: paths.PathLike, *, max_to_keep: int | None = 3, async_save: bool = True,
               subdir: str = CHECKPOINT_SUBDIR):
    self.directory = checkpoint_dir(model_dir, subdir)
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, enable_async_checkpointing=async_save,
                                           create=True)
    self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

  def latest_step(self) -> int | None:
    return self.manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self.manager.all_steps())

  def save(self, step: int, params: nnx.State, train: Any | None, extra: dict[str, Any], *,
           state_files: StateFiles | None = None, force: bool = False) -> bool:
    """Starts saving (async); `train` is the rest of the state (optimizer state, step, rng), or None to save
    the policy only; `state_files` are kept with it (see `StateFilesHandler`)."""
    items = dict(params=ocp.args.StandardSave(params), extra=ocp.args.JsonSave(extra))
    if train is not None:
      items["train"] = ocp.args.StandardSave(train)
    if state_files:
      items[STATE_FILES_ITEM] = StateFilesSave({owner: dict(files) for owner, files in state_files.items()})
    return self.manager.save(step, args=ocp.args.Composite(**items), force=force)

  def restore(self, step: int, abstract_params: nnx.State, abstract_train: Any) -> tuple[nnx.State, Any, dict]:
    """Restores into the shardings/dtypes of the abstract targets (`jax.ShapeDtypeStruct` leaves with shardings)."""
    restored = self.manager.restore(step, args=ocp.args.Composite(
        params=ocp.args.StandardRestore(abstract_params), train=ocp.args.StandardRestore(abstract_train),
        extra=ocp.args.JsonRestore()))
    return restored.params, restored.train, dict(restored.extra)

  def restore_state_files(self, step: int) -> dict[str, dict[str, bytes]]:
    """The state files kept with checkpoint `step` ({} when it kept none)."""
    if not (self.directory / str(step) / STATE_FILES_ITEM).is_dir():
      return {}
    return self.manager.restore(step, args=ocp.args.Composite(
        **{STATE_FILES_ITEM: StateFilesRestore()}))[STATE_FILES_ITEM]

  def delete_after(self, step: int) -> list[int]:
    """Deletes the checkpoints past `step` (a resumed run recomputes those steps); returns their steps."""
    later = [s for s in self.all_steps() if s > step]
    for s in later:
      self.manager.delete(s)
    return later

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


def restore_model(model_dir: paths.PathLike, step: int | None = None, *,
                  best: bool = False) -> tuple[Decoder, int]:
  """The policy saved by a run (`MODEL_DIR`, or its `checkpoints/` directory; local or a URI), at `step` or the
  latest; with `best`, the one selected on `val`."""
  model_dir = paths.as_path(model_dir)
  if model_dir.name in (CHECKPOINT_SUBDIR, BEST_SUBDIR):
    best = model_dir.name == BEST_SUBDIR
    model_dir = model_dir.parent
  subdir = BEST_SUBDIR if best else CHECKPOINT_SUBDIR
  if not checkpoint_dir(model_dir, subdir).is_dir():
    raise FileNotFoundError(f"no checkpoints in {str(model_dir)!r} (expected "
                            f"{str(checkpoint_dir(model_dir, subdir))!r})")
  checkpointer = Checkpointer(model_dir, async_save=False, subdir=subdir)
  try:
    steps = checkpointer.all_steps()
    if not steps:
      raise FileNotFoundError(f"{str(checkpoint_dir(model_dir, subdir))!r} holds no complete checkpoint")
    if step is None:
      step = max(steps)
    elif step not in steps:
      raise ValueError(f"no checkpoint at step {step} in {str(model_dir)!r}; available: {sorted(steps)}")
    extra = checkpointer.restore_extra(step)
    if "model_config" not in extra:
      raise ValueError(f"checkpoint {step} in {str(model_dir)!r} does not record its model config")
    config = model_config_from_json(extra["model_config"])
    abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
    graphdef, abstract_params = nnx.split(abstract)
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # (this process's: every host restores)
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=one), abstract_params)
    params = checkpointer.restore_params(step, target)
  finally:
    checkpointer.close()
  return nnx.merge(graphdef, params), step



def save_run_tokenizer(model_dir: paths.PathLike, tokenizer: Any) -> None:
  """Keeps the policy's tokenizer (its files, chat template included, and `generation_config.json` with the ids a
  turn ends on) in `MODEL_DIR/tokenizer/`, once; on the primary process only. `tokenizer_config.json` is written
  last, so a run killed mid-write writes them again when it resumes.

  Raises:
    ValueError: the run already keeps a tokenizer with another vocabulary or chat template (a resumed run given a
      different tokenizer from the one it trained with).
  """
  from evolver.models.hf import save_generation_config  # pylint: disable=import-outside-toplevel
  target = paths.as_path(model_dir) / TOKENIZER_SUBDIR
  if keeps_tokenizer(model_dir):
    check_same_tokenizer(model_dir, tokenizer)
    return
  with tempfile.TemporaryDirectory() as staging:
    tokenizer.save_pretrained(staging)
    save_generation_config(staging, tokenizer)
    names = sorted(os.listdir(staging), key=lambda name: (name == _TOKENIZER_WRITTEN_LAST, name))
    for name in names:
      with open(os.path.join(staging, name), "rb") as f:
        paths.write_bytes(target / name, f.read())


def _run_dir(model_dir: paths.PathLike) -> epath.Path:
  """MODEL_DIR from MODEL_DIR itself or its checkpoints/ or best/ directory."""
  path = paths.as_path(model_dir)
  return path.parent if path.name in (CHECKPOINT_SUBDIR, BEST_SUBDIR) else path


def keeps_tokenizer(model_dir: paths.PathLike) -> bool:
  """Whether the run keeps a complete tokenizer (`save_run_tokenizer`)."""
  return (_run_dir(model_dir) / TOKENIZER_SUBDIR / _TOKENIZER_WRITTEN_LAST).exists()


def check_same_tokenizer(model_dir: paths.PathLike, tokenizer: Any) -> None:
  """Refuses `tokenizer` for the run in `model_dir` (resumed, or started from) when the run keeps another one
  (vocabulary or chat template); a run that keeps none is not checked.

  Raises:
    ValueError: naming both and how to give the run's own.
  """
  if not keeps_tokenizer(model_dir):
    return
  saved = load_run_tokenizer(model_dir)
  if saved.get_vocab() != tokenizer.get_vocab() or saved.chat_template != tokenizer.chat_template:
    kept = _run_dir(model_dir) / TOKENIZER_SUBDIR
    raise ValueError(f"{str(model_dir)!r} was trained with the tokenizer in {str(kept)!r} ({len(saved)} ids); "
                     f"the one given now differs ({len(tokenizer)} ids, or another chat template): give the run's "
                     f"own (e.g. --gin_bindings=\"TOKENIZER_PATH='{kept}'\") or, to resume, a new MODEL_DIR")


def load_run_tokenizer(model_dir: paths.PathLike, vocab_size: int | None = None) -> Any:
  """The tokenizer a run keeps (`save_run_tokenizer`). A run that keeps none (made before runs kept theirs) is read
  with the shipped tiny tokenizer, and only when the model's `vocab_size` fits it.

  Raises:
    ValueError: no tokenizer is kept and `vocab_size` is not the tiny tokenizer's (padded by fewer than 256 ids).
  """
  from evolver.models import tokenizer as tokenizer_lib  # pylint: disable=import-outside-toplevel
  source = _run_dir(model_dir) / TOKENIZER_SUBDIR
  if keeps_tokenizer(model_dir):
    if paths.is_local(source):
      return tokenizer_lib.load_tokenizer(str(source))
    local = tempfile.mkdtemp(prefix="evolver-tokenizer-")  # kept: the tokenizer reads its directory's files later
    for file in source.iterdir():
      with open(os.path.join(local, file.name), "wb") as f:
        f.write(file.read_bytes())
    return tokenizer_lib.load_tokenizer(local)
  tiny = tokenizer_lib.load_tokenizer()
  if vocab_size is not None and not len(tiny) <= vocab_size < len(tiny) + 256:
    raise ValueError(f"{str(model_dir)!r} keeps no tokenizer (no {str(source)!r}) and its model's vocabulary of "
                     f"{vocab_size} ids is not the shipped tiny tokenizer's ({len(tiny)}): give the tokenizer it "
                     f"was trained with (--tokenizer DIR)")
  return tiny
