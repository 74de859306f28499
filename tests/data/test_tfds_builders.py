"""TFDS builders: array_record without TensorFlow, exact decoding, caching, config names, the build CLI."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest
import tensorflow_datasets as tfds

import evolver.envs as envs
from evolver.data import agenttraj, expert, tfds_builders
from tests.data.conftest import TINY_COUNT, TINY_ENVS


def _expected(env_names, indices):
  return [t for name in sorted(env_names) for t in expert.expert_trajectories(name, indices)]


def _assert_same(decoded, expected):
  """Equal trajectories, up to the float32 storage of rewards."""
  assert len(decoded) == len(expected)
  for got, want in zip(decoded, expected):
    assert got.reward == pytest.approx(want.reward, rel=1e-7)
    assert dataclasses.replace(got, reward=want.reward) == want


def test_expert_source_decodes_to_the_generated_trajectories(expert_data_dir):
  source = tfds_builders.load_expert_source(list(TINY_ENVS), 0, TINY_COUNT, expert_data_dir)
  assert len(source) == len(TINY_ENVS) * TINY_COUNT
  _assert_same(list(source), _expected(TINY_ENVS, range(TINY_COUNT)))
  assert source[-1] == source[len(source) - 1]
  with pytest.raises(IndexError):
    source[len(source)]
  assert "tensorflow" not in sys.modules


def test_config_records_env_versions_everywhere(expert_data_dir):
  builder = tfds_builders.expert_builder(TINY_ENVS, 0, TINY_COUNT, expert_data_dir)
  versions = {name: envs.env_class(name).version for name in TINY_ENVS}
  assert builder.builder_config.name == "babyai+maze+wordle_8"
  assert dict(builder.info.metadata["env_versions"]) == versions  # read back from disk
  assert all(version in builder.info.config_description for version in versions.values())
  examples = builder.as_data_source()["train"]
  assert {(e["env"].decode(), e["env_version"].decode()) for e in examples} == set(versions.items())


def test_second_prepare_reads_the_cache(expert_data_dir, tmp_path, monkeypatch):
  calls = []
  generate = expert.expert_trajectory

  def counting(*args, **kwargs):
    calls.append(args)
    return generate(*args, **kwargs)

  monkeypatch.setattr(expert, "expert_trajectory", counting)
  tfds_builders.expert_builder(TINY_ENVS, 0, TINY_COUNT, expert_data_dir).download_and_prepare()
  assert not calls
  # The same config in an empty data_dir does generate (so the count above means something).
  tfds_builders.expert_builder(["maze"], 0, 3, str(tmp_path)).download_and_prepare()
  assert len(calls) == 3


def test_stale_generator_version_is_refused(tmp_path):
  builder = tfds_builders.expert_builder("maze", 5, 2, str(tmp_path))
  builder.download_and_prepare()
  metadata_path = os.path.join(builder.data_dir, "metadata.json")
  with open(metadata_path) as f:
    metadata = json.load(f)
  metadata["env_versions"] = {"maze": "maze-v0"}
  with open(metadata_path, "w") as f:
    json.dump(metadata, f)
  with pytest.raises(ValueError, match="maze-v0.*regenerate"):
    tfds_builders.load_expert_source("maze", 5, 2, str(tmp_path))


def test_config_names():
  config = tfds_builders.ExpertTrajectories.get_builder_config("maze+wordle_1000-1256")
  assert (config.env_names, config.start, config.count) == (("maze", "wordle"), 1000, 256)
  assert list(config.indices) == list(range(1000, 1256))
  assert tfds_builders.expert_config(["wordle", "maze"], 1000, 256) is config
  assert tfds_builders.expert_config("all", 0, 64).env_names == tuple(envs.names())
  assert tfds_builders.expert_config(envs.names(), 0, 64).name == "all_64"
  assert "all_512" in tfds_builders.ExpertTrajectories.builder_configs
  with pytest.raises(ValueError, match="spelled 'maze\\+wordle_8'"):
    tfds_builders.parse_expert_config_name("wordle+maze_8")
  with pytest.raises(ValueError, match="unknown env"):
    tfds_builders.expert_config("chess", 0, 8)
  with pytest.raises(ValueError, match="does not fit"):
    tfds_builders.expert_config("babyai", 0, 10_000)
  with pytest.raises(ValueError, match="count > 0"):
    tfds_builders.expert_config("maze", 0, 0)
  assert tfds_builders.parse_expert_config_name("not a config") is None


def test_default_data_dir_follows_the_cache_env_var(monkeypatch, tmp_path):
  monkeypatch.setenv(tfds_builders.CACHE_DIR_ENV, str(tmp_path))
  assert tfds_builders.default_data_dir() == os.path.join(str(tmp_path), "tensorflow_datasets")
  assert tfds_builders.expert_builder("maze", 0, 4).data_dir.startswith(str(tmp_path))


def test_a_builder_of_unprepared_data_leaves_no_temporary_directory(monkeypatch, tmp_path):
  import tempfile
  temp = tmp_path / "temp"
  temp.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(temp))
  builder = tfds_builders.expert_builder("maze", 0, 4, data_dir=str(tmp_path / "data"))
  assert builder.info.splits == {} and os.listdir(temp) == []  # (tfds' bucket look-up made one each time)


def _write_agenttraj_files(directory):
  first = _expected(["maze"], range(3))
  first[0].messages[-1].content += " ✓ 経験"
  first[1].experience = {"exp_mask": 1}
  second = _expected(["sql"], range(2))
  agenttraj.write_agenttraj(os.path.join(directory, "a.json"), first)
  agenttraj.write_agenttraj(os.path.join(directory, "b.json"), second)
  return first + second


def test_agent_traj_json_builder(tmp_path):
  files = tmp_path / "files"
  trajectories = _write_agenttraj_files(str(files))
  data_dir = str(tmp_path / "tfds")
  source = tfds_builders.load_agent_traj_source("mine", [str(files)], data_dir)
  _assert_same(list(source), trajectories)
  # tfds' manual dir, the standard place for files a user downloaded.
  builder = tfds_builders.AgentTrajJson(config="manual", data_dir=data_dir)
  builder.download_and_prepare(download_config=tfds.download.DownloadConfig(manual_dir=str(files)))
  _assert_same(list(tfds_builders.TrajectorySource(builder.as_data_source()["train"])), trajectories)
  # A changed file is not read from a stale cache.
  agenttraj.write_agenttraj(str(files / "b.json"), trajectories[:1])
  with pytest.raises(ValueError, match="changed since"):
    tfds_builders.load_agent_traj_source("mine", [str(files)], data_dir)


def test_agent_traj_json_missing_path_is_clear(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    tfds_builders.load_agent_traj_source("nothing", [str(tmp_path / "nope.json")], str(tmp_path))


def test_tfds_build_command(tmp_path):
  """The documented command lines build both datasets (tfds' own build command, no TensorFlow)."""
  files = tmp_path / "files"
  trajectories = _write_agenttraj_files(str(files))
  data_dir = str(tmp_path / "tfds")
  base = [sys.executable, "-m", "evolver.data.tfds_cli", "build", "--file_format=array_record",
          f"--data_dir={data_dir}"]
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  for extra in (["expert_trajectories/maze_4"], ["agent_traj_json/manual", f"--manual_dir={files}"]):
    result = subprocess.run(base + extra, capture_output=True, text=True, cwd=root, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
  expert_source = tfds_builders.TrajectorySource(
      tfds_builders.ExpertTrajectories(config="maze_4", data_dir=data_dir).as_data_source()["train"])
  _assert_same(list(expert_source), _expected(["maze"], range(4)))
  manual = tfds_builders.AgentTrajJson(config="manual", data_dir=data_dir).as_data_source()["train"]
  _assert_same(list(tfds_builders.TrajectorySource(manual)), trajectories)


def _build(arguments, root):
  return subprocess.run([sys.executable, "-m", "evolver.data.tfds_cli", "build", "--file_format=array_record",
                         *arguments], capture_output=True, text=True, cwd=root, timeout=120)


def test_tfds_build_command_on_a_file_with_a_null_conversation(tmp_path):
  """A bad file is one paragraph naming the file, the item and how to skip it; the skip_empty config skips."""
  files = tmp_path / "files"
  files.mkdir()
  bad = files / "bad.json"
  bad.write_text(json.dumps([{"item_id": "maze_1", "conversations": [{"from": "human", "value": "go"}]},
                             {"item_id": "maze_2", "conversations": None}]))
  data_dir = str(tmp_path / "tfds")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  result = _build(["agent_traj_json/manual", f"--manual_dir={files}", f"--data_dir={data_dir}"], root)
  assert result.returncode == 1
  assert "Traceback" not in result.stderr, result.stderr[-3000:]
  error = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
  assert len(error) == 1, result.stderr[-3000:]
  assert str(bad) in error[0] and "item 1 (item_id 'maze_2')" in error[0] and "null" in error[0]
  assert "agent_traj_json/manual_skip_empty" in error[0]

  result = _build(["agent_traj_json/manual_skip_empty", f"--manual_dir={files}", f"--data_dir={data_dir}"], root)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "item 1 (item_id 'maze_2')" in result.stderr  # the warning names what was skipped
  builder = tfds_builders.AgentTrajJson(config="manual_skip_empty", data_dir=data_dir)
  assert [t.item_id for t in tfds_builders.TrajectorySource(builder.as_data_source()["train"])] == ["maze_1"]


def test_tfds_build_command_on_an_unskippable_error_says_to_fix_the_item(tmp_path, capsys):
  from evolver.data import tfds_cli
  files = tmp_path / "files"
  files.mkdir()
  (files / "bad.json").write_text(json.dumps([{"item_id": "a", "conversations": [{"from": "bot", "value": "x"}]}]))
  code = tfds_cli.main(["tfds_cli", "build", "agent_traj_json/manual", f"--manual_dir={files}",
                        "--file_format=array_record", f"--data_dir={tmp_path / 'tfds'}"])
  assert code == 1
  error = capsys.readouterr().err
  assert "error: " in error and "bad.json" in error and "unknown 'from' 'bot'" in error and "fix" in error.lower()
  assert "skip_empty" not in error  # skipping would not help


BUILD_IN_A_PROCESS = """
import sys
from evolver.data import tfds_builders
source = tfds_builders.load_expert_source(["maze"], 0, 6, sys.argv[1])
print(len(source), source[5].item_id)
"""


def test_processes_sharing_a_data_dir_build_one_config_in_turn(tmp_path):
  # Two processes that first use one config at once (the jobs of a sweep, parallel test workers): without the
  # lock both build it and the later one fails renaming its temporary directory onto the first one's result.
  procs = [subprocess.Popen([sys.executable, "-c", BUILD_IN_A_PROCESS, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True) for _ in range(4)]
  outs = [p.communicate(timeout=300) for p in procs]
  for p, (out, err) in zip(procs, outs):
    assert p.returncode == 0, err[-2000:]
    assert out.splitlines()[-1].split() == ["6", "maze_5"]
  built = tmp_path / "expert_trajectories" / "maze_6"
  assert sorted(os.listdir(built)) == ["1.0.0", "1.0.0.lock"]  # one build, no temporary directory left
