"""TFDS builders for trajectory datasets: `expert_trajectories` and `agent_traj_json` (array_record, no TF).

Both store one example per trajectory with the features of `trajectory_features()` (the conversation as
AgentTraj JSON text) and are read by random access through `builder.as_data_source()`; TensorFlow is never
imported (array_record needs none; tfds then needs `importlib_resources`).

`expert_trajectories` runs each env's scripted expert (`evolver.data.expert`) on a contiguous slice of the
env's `train` split. Its config names say which: `<envs>_<count>` is train indices [0, count),
`<envs>_<start>-<stop>` is [start, stop); `<envs>` is `all` (every built-in env) or env names joined by `+`
(`maze_512`, `all_256`, `maze+wordle_1000-1256`), benchmark envs included (`bfcl_400`; `all` leaves them out). Any such name works, not only the listed configs, so a run
config can set aside disjoint slices for BC, `val` and exploration. Each env's generator version is in the
config's description and metadata and in every example; reading a cache made by another generator version
raises an error (see `check_env_versions`).

`agent_traj_json` wraps AgentTraj JSON files a user already has (AgentGym's AgentTraj-L): the `manual` config
reads every `*.json` in tfds' manual dir (`--manual_dir`); `agent_traj_config(name, paths)` makes a config
for given files or directories. An item whose `conversations` is null or empty stops the build with an error
naming the file and the item, unless the config skips such items (with a warning naming each): the
`manual_skip_empty` config (the manual dir's files, skipping), or `agent_traj_config(..., skip_empty=True)`.

Generation is cached by tfds under `data_dir`: a second `download_and_prepare()` reads what is there. The
default `data_dir` is `$EVOLVER_CACHE_DIR/tensorflow_datasets`, else `~/.cache/evolver/tensorflow_datasets`.
Processes that share a local `data_dir` (the jobs of a sweep, parallel test workers) take turns building one
config under a file lock, so the second reads what the first built instead of racing it to the final rename.

From the command line, tfds' `build` command (through `evolver.data.tfds_cli`, because the `tfds` executable
of tensorflow-datasets 4.9 needs TensorFlow to start; with TensorFlow installed, `tfds build
--imports=evolver.data.tfds_builders ...` takes the same arguments):

  python -m evolver.data.tfds_cli build expert_trajectories/maze_512 --file_format=array_record \
      --data_dir="${EVOLVER_CACHE_DIR:-$HOME/.cache/evolver}/tensorflow_datasets"
  python -m evolver.data.tfds_cli build agent_traj_json/manual --manual_dir=path/to/AgentTraj-L \
      --file_format=array_record --data_dir="${EVOLVER_CACHE_DIR:-$HOME/.cache/evolver}/tensorflow_datasets"
  python -m evolver.data.tfds_cli build agent_traj_json/manual_skip_empty --manual_dir=path/to/AgentTraj-L ...

From Python:

  source = load_expert_source(["maze", "wordle"], start=0, count=512)   # builds on first use
  trajectory = source[3]                                                 # an evolver Trajectory
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import functools
import glob
import hashlib
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import tensorflow_datasets as tfds
import tqdm

import evolver.envs as envs_lib
from evolver import paths as paths_lib
from evolver.data import agenttraj
from evolver.data import expert as expert_lib
from evolver.data.trajectory import Trajectory

CACHE_DIR_ENV = "EVOLVER_CACHE_DIR"
ALL_ENVS = "all"
EXPERT_SIZES = (64, 256, 512)  # babyai has 600 train tasks; the listed configs; any other count also works by name
_CONFIG_NAME = re.compile(r"^(?P<envs>[a-z0-9]+(\+[a-z0-9]+)*)_((?P<start>\d+)-(?P<stop>\d+)|(?P<count>\d+))$")


def default_data_dir() -> str:
  """Where datasets are built and read: `$EVOLVER_CACHE_DIR/tensorflow_datasets` or the user's cache."""
  root = os.environ.get(CACHE_DIR_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "evolver")
  return os.path.join(root, "tensorflow_datasets")


# ----------------------------------------------------------------------------------------------------------
# Examples: one per trajectory.
# ----------------------------------------------------------------------------------------------------------


def trajectory_features() -> tfds.features.FeaturesDict:
  """The features of both builders; `conversation` and `experience` are JSON text."""
  text = tfds.features.Text
  return tfds.features.FeaturesDict({
      "item_id": text(),
      "env": text(),
      "task_index": tfds.features.Scalar(np.int64),
      "split": text(),
      "env_version": text(),
      # float32: tf.train.Example, which array_record records hold, has no float64 (BabyAI's 0.8714285714285714
      # comes back as 0.8714285492897034; training weights do not care).
      "reward": tfds.features.Scalar(np.float32),
      "success": tfds.features.Scalar(np.bool_),
      # AgentTraj `conversations` ([{"from", "loss", "value"}]) as JSON.
      "conversation": text(),
      "experience": text(),
  })


def encode_trajectory(trajectory: Trajectory) -> dict[str, Any]:
  """A Trajectory as a TFDS example (token arrays are not stored)."""
  return {
      "item_id": trajectory.item_id,
      "env": trajectory.env,
      "task_index": trajectory.task_index,
      "split": trajectory.split,
      "env_version": trajectory.env_version,
      "reward": trajectory.reward,
      "success": trajectory.success,
      "conversation": json.dumps(agenttraj.conversation_of(trajectory.messages), ensure_ascii=False),
      "experience": json.dumps(trajectory.experience, ensure_ascii=False, sort_keys=True),
  }


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def decode_example(example: Mapping[str, Any]) -> Trajectory:
  """A Trajectory from an example of `as_data_source()` (text arrives as bytes, scalars as numpy)."""
  return Trajectory(
      item_id=_text(example["item_id"]),
      messages=agenttraj.messages_from_conversation(json.loads(_text(example["conversation"]))),
      env=_text(example["env"]),
      task_index=int(example["task_index"]),
      split=_text(example["split"]),
      env_version=_text(example["env_version"]),
      reward=float(example["reward"]),
      success=bool(example["success"]),
      experience=json.loads(_text(example["experience"])),
  )


class TrajectorySource(Sequence):
  """Random access to a TFDS data source (or any sequence of examples) as Trajectories."""

  def __init__(self, examples: Sequence[Mapping[str, Any]]):
    self.examples = examples

  def __len__(self) -> int:
    return len(self.examples)

  def __getitem__(self, index: int) -> Trajectory:  # type: ignore[override]
    if not -len(self) <= index < len(self):
      raise IndexError(f"index {index} out of range for {len(self)} trajectories")
    return decode_example(self.examples[index % len(self)])

  def __repr__(self) -> str:
    return f"TrajectorySource({self.examples!r})"


class _ArrayRecordBuilder(tfds.core.GeneratorBasedBuilder):
  """array_record by default (tfrecord needs TensorFlow) and evolver's default data_dir."""

  def __init__(self, *, data_dir: str | None = None, file_format: str | None = None, **kwargs: Any):
    super().__init__(data_dir=data_dir or default_data_dir(), file_format=file_format or "array_record",
                     **kwargs)

  def dataset_info_from_configs(self, **kwargs: Any) -> tfds.core.DatasetInfo:
    info = super().dataset_info_from_configs(**kwargs)
    # Before the data is prepared, tfds looks for precomputed info in its public bucket (off by default, yet each
    # look leaves an empty temporary directory behind). These datasets are generated here: nothing to look up.
    info.initialize_from_bucket = lambda: None
    return info


# ----------------------------------------------------------------------------------------------------------
# expert_trajectories
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class ExpertConfig(tfds.core.BuilderConfig):
  """Expert trajectories of `env_names` on train task indices [start, start + count).

  Make one with `expert_config(...)` or by name (`ExpertTrajectories(config="maze_512")`), not directly:
  tfds identifies configs by name, and the name is derived from the fields.
  """

  env_names: tuple[str, ...] = ()
  start: int = 0
  count: int = 0
  # Each env's generator version when this config was made (i.e. by the code that generates).
  env_versions: dict[str, str] = dataclasses.field(default_factory=dict)

  @property
  def indices(self) -> range:
    return range(self.start, self.start + self.count)


def _env_set(env_names: str | Sequence[str]) -> tuple[str, ...]:
  if isinstance(env_names, str):
    env_names = envs_lib.names() if env_names == ALL_ENVS else env_names.split("+")
  names = tuple(sorted(set(env_names)))
  if not names:
    raise ValueError("an expert dataset needs at least one env")
  known = envs_lib.names() + envs_lib.benchmark_names()
  unknown = [name for name in names if name not in known]
  if unknown:
    raise ValueError(f"unknown env(s) {unknown}; choose from {known} or {ALL_ENVS!r}")
  return names


def expert_config_name(env_names: str | Sequence[str], start: int, count: int) -> str:
  names = _env_set(env_names)
  envs = ALL_ENVS if list(names) == envs_lib.names() else "+".join(names)
  return f"{envs}_{count}" if start == 0 else f"{envs}_{start}-{start + count}"


@functools.cache
def _num_train_tasks(env_name: str) -> int:
  return envs_lib.make(env_name).num_tasks("train")


@functools.cache
def _expert_config(env_names: tuple[str, ...], start: int, count: int) -> ExpertConfig:
  # Cached so that one name always maps to one object: tfds refuses two different configs of the same name.
  if isinstance(start, bool) or isinstance(count, bool) or start < 0 or count <= 0:
    raise ValueError(f"an expert slice needs start >= 0 and count > 0, got start={start}, count={count}")
  versions = {name: envs_lib.env_class(name).version for name in env_names}
  for name in env_names:
    available = _num_train_tasks(name)
    if start + count > available:
      raise ValueError(f"{name} has {available} train tasks; the slice [{start}, {start + count}) does not fit")
  version_text = ", ".join(f"{name} {version}" for name, version in versions.items())
  return ExpertConfig(
      name=expert_config_name(env_names, start, count),
      description=(f"Scripted-expert trajectories of {', '.join(env_names)} on train task indices "
                   f"[{start}, {start + count}); generators: {version_text}."),
      env_names=env_names, start=start, count=count, env_versions=versions)


def expert_config(env_names: str | Sequence[str], start: int, count: int) -> ExpertConfig:
  """The config of `env_names` (a list, "all", or names joined by "+") on train indices [start, start+count)."""
  return _expert_config(_env_set(env_names), int(start), int(count))


def parse_expert_config_name(name: str) -> ExpertConfig | None:
  """The config a name stands for (`maze_512`, `all_1000-1512`), or None when it is not such a name."""
  match = _CONFIG_NAME.match(name)
  if match is None:
    return None
  if match["count"] is not None:
    start, count = 0, int(match["count"])
  else:
    start, count = int(match["start"]), int(match["stop"]) - int(match["start"])
  config = expert_config(match["envs"], start, count)
  if config.name != name:
    raise ValueError(f"expert config {name!r} is spelled {config.name!r} (envs sorted, 'all' for every env)")
  return config


class ExpertTrajectories(_ArrayRecordBuilder):
  """Scripted-expert ReAct trajectories of the built-in envs (see the module docstring for config names)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [expert_config(envs, 0, size)
                     for envs in [ALL_ENVS, *envs_lib.names()] for size in EXPERT_SIZES]
  DEFAULT_BUILDER_CONFIG_NAME = "all_512"

  @classmethod
  def get_builder_config(cls, name: str, version: str | None = None) -> ExpertConfig | None:
    # Beyond the listed configs, any well-formed name is a config: slices are chosen by run configs.
    return super().get_builder_config(name, version) or parse_expert_config_name(name)

  def _info(self) -> tfds.core.DatasetInfo:
    config = self.builder_config
    return self.dataset_info_from_configs(
        description="Expert trajectories from evolver's built-in envs (AgentGym-style ReAct conversations).",
        features=trajectory_features(),
        disable_shuffling=True,  # see _generate_examples
        metadata=tfds.core.MetadataDict(env_versions=dict(config.env_versions), start=config.start,
                                        count=config.count),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    del dl_manager  # everything is generated locally
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    # Integer keys in generation order: with shuffling disabled tfds stores examples sorted by key, so index i
    # of a source is predictable (env by env, task by task); iterators shuffle per epoch.
    config = self.builder_config
    key = 0
    for env_name in config.env_names:
      indices = tqdm.tqdm(config.indices, desc=f"expert {env_name}", unit="task", leave=False)
      for trajectory in expert_lib.expert_trajectories(env_name, indices):
        if trajectory.env_version != config.env_versions[env_name]:
          raise RuntimeError(f"{env_name} generator is {trajectory.env_version}, the config says "
                             f"{config.env_versions[env_name]}")
        yield key, encode_trajectory(trajectory)
        key += 1


def check_env_versions(builder: ExpertTrajectories) -> None:
  """Raises when the prepared dataset was generated by other env versions than the current code's."""
  stored = dict(builder.info.metadata or {}).get("env_versions")
  expected = builder.builder_config.env_versions
  if stored is not None and dict(stored) != expected:
    raise ValueError(
        f"{builder.data_dir} holds expert trajectories from generators {dict(stored)}, but the code now has "
        f"{expected}; delete that directory (or use another data_dir) to regenerate")


# ----------------------------------------------------------------------------------------------------------
# agent_traj_json
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(eq=False)
class AgentTrajConfig(tfds.core.BuilderConfig):
  """AgentTraj JSON `paths` (files, or directories whose `*.json` are read); empty: tfds' manual dir.

  `skip_empty`: leave out items whose `conversations` is null or empty (a warning names them), instead of
  stopping with an error.
  """

  paths: tuple[str, ...] = ()
  skip_empty: bool = False


MANUAL_SKIP_EMPTY = AgentTrajConfig(
    name="manual_skip_empty", skip_empty=True,
    description="Every *.json AgentTraj file in --manual_dir; items with null or empty conversations left out.")


def agent_traj_config(name: str, paths: Sequence[str], *, skip_empty: bool = False) -> AgentTrajConfig:
  """A config for AgentTraj files or directories. The cache is keyed by `name`, so give each file set its own."""
  if isinstance(paths, str):
    paths = [paths]
  if not paths:
    raise ValueError("agent_traj_config needs at least one path")
  if AgentTrajJson.get_builder_config(name) is not None:
    raise ValueError(f"{name!r} is a listed agent_traj_json config; give these files another name")
  return AgentTrajConfig(name=name, description=f"AgentTraj JSON from {', '.join(paths)}",
                         paths=tuple(os.path.abspath(os.path.expanduser(p)) for p in paths),
                         skip_empty=skip_empty)


def agent_traj_files(paths: Sequence[str]) -> list[str]:
  """The JSON files named by `paths` (a directory stands for its `*.json`, sorted)."""
  files = []
  for path in paths:
    path = os.fspath(path)
    if os.path.isdir(path):
      found = sorted(glob.glob(os.path.join(path, "*.json")))
      if not found:
        raise FileNotFoundError(f"no *.json AgentTraj files in {path}")
      files.extend(found)
    elif os.path.isfile(path):
      files.append(path)
    else:
      raise FileNotFoundError(f"AgentTraj path {path} does not exist")
  return files


def file_fingerprints(files: Sequence[str]) -> dict[str, str]:
  """basename -> sha256 of each file: what a cached build was made from."""
  fingerprints = {}
  for path in files:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
    fingerprints[os.path.basename(path)] = digest.hexdigest()
  return fingerprints


class AgentTrajJson(_ArrayRecordBuilder):
  """AgentTraj JSON files a user already has (e.g. AgentGym's AgentTraj-L)."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  BUILDER_CONFIGS = [AgentTrajConfig(name="manual", description="Every *.json AgentTraj file in --manual_dir.")]
  MANUAL_DOWNLOAD_INSTRUCTIONS = ("Put AgentTraj JSON files (e.g. AgentGym's AgentTraj-L) in a directory and "
                                  "pass it as --manual_dir (Python: DownloadConfig(manual_dir=...)).")

  @classmethod
  def get_builder_config(cls, name: str, version: str | None = None) -> AgentTrajConfig | None:
    # `manual_skip_empty` works by name but is not listed, so that building agent_traj_json without a config
    # builds `manual` alone (tfds builds every listed config then).
    found = super().get_builder_config(name, version)
    if found is None and name == MANUAL_SKIP_EMPTY.name:
      return MANUAL_SKIP_EMPTY
    return found

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        description="Agent trajectories from AgentTraj JSON files (AgentGym's format).",
        features=trajectory_features(),
        disable_shuffling=True,  # see _generate_examples
        # Filled in by _split_generators with the files read, so a reader can tell a stale cache.
        metadata=tfds.core.MetadataDict(),
    )

  def _split_generators(self, dl_manager: tfds.download.DownloadManager):
    paths = self.builder_config.paths or (os.fspath(dl_manager.manual_dir),)
    files = agent_traj_files(paths)
    self.info.metadata["files"] = file_fingerprints(files)
    return {"train": self._generate_examples(files)}

  def _generate_examples(self, files: Sequence[str]):
    key = 0  # as in ExpertTrajectories: file by file, item by item (item ids need not be unique)
    for path in files:
      trajectories = agenttraj.read_agenttraj(path, skip_empty=self.builder_config.skip_empty)
      for trajectory in tqdm.tqdm(trajectories, desc=os.path.basename(path), unit="item", leave=False):
        yield key, encode_trajectory(trajectory)
        key += 1


def check_agent_traj_files(builder: AgentTrajJson) -> None:
  """Raises when the config's files changed since the cached build."""
  stored = dict(builder.info.metadata or {}).get("files")
  paths = builder.builder_config.paths
  if stored is None or not paths:
    return
  current = file_fingerprints(agent_traj_files(paths))
  if dict(stored) != current:
    raise ValueError(f"the AgentTraj files of config {builder.builder_config.name!r} changed since "
                     f"{builder.data_dir} was built; delete it (or use another name or data_dir) to rebuild")


# ----------------------------------------------------------------------------------------------------------
# Loading.
# ----------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def _build_lock(data_dir: str):
  """Holds an exclusive lock on `<data_dir>.lock` (a builder's config directory) when it is local; object stores
  have only tfds' own temporary directories."""
  if not paths_lib.is_local(data_dir):
    yield
    return
  os.makedirs(os.path.dirname(data_dir), exist_ok=True)
  with open(data_dir + ".lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def prepared(make_builder: Callable[[], tfds.core.DatasetBuilder]) -> tfds.core.DatasetBuilder:
  """A builder whose data is on disk: built here unless another process built it (one process at a time per
  config, see the module docstring). The builder is made again once the lock is held: one made before another
  process finished building reads the dataset's info as it was then (no splits)."""
  with _build_lock(os.fspath(make_builder().data_dir)):
    builder = make_builder()
    builder.download_and_prepare()
  return builder


def expert_builder(env_names: str | Sequence[str], start: int, count: int,
                   data_dir: str | None = None) -> ExpertTrajectories:
  return ExpertTrajectories(config=expert_config(env_names, start, count), data_dir=data_dir)


def load_expert_source(env_names: str | Sequence[str], start: int, count: int,
                       data_dir: str | None = None) -> TrajectorySource:
  """Expert trajectories of `env_names` on train indices [start, start + count), built on first use.

  Returns:
    A random-access sequence of `len(env_names) * count` Trajectories, env by env (sorted names) and by
    task index within an env.
  """
  builder = prepared(lambda: expert_builder(env_names, start, count, data_dir))
  check_env_versions(builder)
  return TrajectorySource(builder.as_data_source(split="train"))


def load_agent_traj_source(name: str, paths: Sequence[str], data_dir: str | None = None, *,
                           skip_empty: bool = False) -> TrajectorySource:
  """The trajectories of AgentTraj JSON `paths`, imported into TFDS under config `name` on first use."""
  config = agent_traj_config(name, paths, skip_empty=skip_empty)
  builder = prepared(lambda: AgentTrajJson(config=config, data_dir=data_dir))
  check_agent_traj_files(builder)
  return TrajectorySource(builder.as_data_source(split="train"))
