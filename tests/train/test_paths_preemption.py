"""The path layer (`evolver.paths`) on local paths and on `gs://`, and preemption: SIGTERM saves and resumes.

`gs://` here is served by an in-memory filesystem: fsspec's memory filesystem registered as fsspec's `gcs`
protocol, which is what etils.epath's own fsspec backend asks fsspec for (with TensorFlow absent, or
`EPATH_USE_TF=false`). Every write that goes through epath runs there as it would on GCS: the path layer's atomic
writes, metrics (JSONL and TensorBoard event files), gin configs, eval results, explorations and the experience
run file. Orbax cannot use it (orbax writes arrays through tensorstore's own GCS driver, which talks to the real
service), so checkpoints, the loop and the launched runs are tested on local paths, which go through the same
layer.
"""

import importlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from etils.epath import backend as epath_backend
from fsspec.implementations.memory import MemoryFileSystem

from evolver import paths
from evolver.experience.records import TaskMemory
from evolver.models import ModelConfig, make_model
from evolver.models.tokenizer import load_tokenizer
from evolver.train import checkpoints as ckpt_lib
from evolver.train import evaluation, explorations
from evolver.train import experience as experience_lib
from evolver.train import metrics as metrics_lib
from evolver.train import optimizer as optimizer_lib
from evolver.train import step as step_lib
from evolver.train.loop import Loop, Preempted, scalar_metrics, write_gin_config
from evolver.train.trainer import Trainer, TrainerConfig
from tests.train.helpers import traj
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = ModelConfig(vocab_size=2432, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                     intermediate_size=64)


class FakeGcs(MemoryFileSystem):
  """An in-memory GCS: fsspec's memory filesystem answering to `gs://` and `gcs://` (its own store)."""

  protocol = ("gs", "gcs")
  store: dict = {}
  pseudo_dirs: list = [""]

  @classmethod
  def _strip_protocol(cls, path):
    path = str(path)
    for prefix in ("gs://", "gcs://"):
      path = path.removeprefix(prefix)
    return super()._strip_protocol(path)


@pytest.fixture
def bucket(monkeypatch):
  """`gs://bucket`, empty, served by FakeGcs for the test."""
  monkeypatch.setenv("EPATH_USE_TF", "false")
  FakeGcs.store.clear()
  FakeGcs.pseudo_dirs[:] = [""]
  monkeypatch.setitem(importlib.import_module("fsspec.registry")._registry, "gcs", FakeGcs)
  clear = type(epath_backend.fsspec_backend)._get_filesystem.cache_clear
  clear()
  yield "gs://bucket"
  clear()


def stored_names() -> list[str]:
  return sorted(FakeGcs.store)


# -- the path layer ----------------------------------------------------------------------------------------------


def test_as_path_keeps_uris_and_makes_local_paths_absolute(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert str(paths.as_path("runs/bc")) == os.path.join(str(tmp_path), "runs", "bc")
  assert str(paths.as_path(tmp_path / "x")) == str(tmp_path / "x")
  assert str(paths.as_path("gs://bucket/runs/bc")) == "gs://bucket/runs/bc"  # os.path.abspath would mangle it
  assert str(paths.as_path("gs://bucket/runs") / "bc" / "metrics.jsonl") == "gs://bucket/runs/bc/metrics.jsonl"
  assert paths.is_local("runs/bc") and not paths.is_local("gs://bucket/x")
  assert paths.local_dir("store", "the store") == os.path.join(str(tmp_path), "store")
  with pytest.raises(ValueError, match="the store needs a local directory, got 'gs://bucket/x'"):
    paths.local_dir("gs://bucket/x", "the store")
  with pytest.raises(ValueError, match="not memory://"):
    paths.as_path("memory://x")
  with pytest.raises(ValueError, match="non-empty"):
    paths.as_path("")
  with pytest.raises(TypeError, match="str or os.PathLike"):
    paths.as_path(3)


@pytest.mark.parametrize("where", ["local", "gs"])
def test_atomic_writes(where, tmp_path, bucket):
  root = paths.as_path(bucket if where == "gs" else str(tmp_path)) / "run"
  assert paths.write_text(root / "a" / "config.gin", "x = 1\n") == root / "a" / "config.gin"
  paths.write_text(root / "a" / "config.gin", "x = 2\n")  # replaces
  paths.write_json(root / "r.json", {"b": 1, "a": [1.5]})
  paths.write_bytes(root / "blob", b"\x00\x01")
  assert (root / "a" / "config.gin").read_text() == "x = 2\n"
  assert json.loads((root / "r.json").read_text()) == {"b": 1, "a": [1.5]}
  assert (root / "blob").read_bytes() == b"\x00\x01"
  assert sorted(p.name for p in root.iterdir()) == ["a", "blob", "r.json"]  # no temporary file left
  assert [p.name for p in (root / "a").iterdir()] == ["config.gin"]


def test_metrics_on_gs_resume_and_flush(bucket):
  run = f"{bucket}/runs/bc"
  writer = metrics_lib.MetricsWriter(run, flush_every_s=3600)
  for step in (1, 2, 3):
    writer.write(step, {"loss": 1.0 / step, "nan": float("nan"), "count": np.int64(step)})
  assert metrics_lib.read_metrics(run) == []  # an object store has no append: rows wait for a flush
  writer.flush()
  assert [r["step"] for r in metrics_lib.read_metrics(run)] == [1, 2, 3]
  writer.close()
  rows = metrics_lib.read_metrics(run)
  assert rows[1] == {"step": 2, "loss": 0.5, "nan": "nan", "count": 2}
  events = [n for n in stored_names() if n.startswith("/bucket/runs/bc/tensorboard/events.out.tfevents")]
  assert len(events) == 1 and len(FakeGcs.store[events[0]].getvalue()) > 0
  # Resumed at step 1: rows past it are dropped at once, and the new ones follow.
  writer = metrics_lib.MetricsWriter(run, resume_step=1, flush_every_s=0.0)
  assert [r["step"] for r in metrics_lib.read_metrics(run)] == [1]
  writer.write(2, {"loss": 0.25})  # flush_every_s 0: written through
  assert [(r["step"], r["loss"]) for r in metrics_lib.read_metrics(run)] == [(1, 1.0), (2, 0.25)]
  writer.close()


def test_configs_results_and_explorations_on_gs(bucket):
  run = f"{bucket}/runs/agentevol"
  assert write_gin_config(run) == f"{run}/config.gin"
  assert (paths.as_path(run) / "config.gin").exists()
  results = {"split": "eval", "overall": {"success": 0.5}}
  assert evaluation.write_eval_results(run + "/", results) == f"{run}/eval_results.json"
  assert json.loads(paths.as_path(f"{run}/eval_results.json").read_text()) == results

  rolled = [traj(5, ["x"], True), traj(6, ["y"], False, reward=0.25)]
  rolled[0].token_ids, rolled[0].loss_mask = np.arange(4, dtype=np.int32), np.ones(4, np.float32)
  rolled[0].logprobs = -np.arange(4, dtype=np.float32)
  meta = {"iteration": 1, "policy_step": 3}
  assert explorations.save_exploration(run, 1, rolled, meta) == f"{run}/explore/iter_1.json"
  loaded, loaded_meta = explorations.load_exploration(run, 1)
  assert loaded_meta == meta and [t.item_id for t in loaded] == ["maze_5", "maze_6"]
  np.testing.assert_array_equal(loaded[0].logprobs, rolled[0].logprobs)
  assert loaded[1].token_ids is None and explorations.load_exploration(run, 2) is None
  assert "/bucket/runs/agentevol/explore/iter_1.npz" in stored_names()

  tokenizer = load_tokenizer()
  ckpt_lib.save_run_tokenizer(run, tokenizer)
  assert "/bucket/runs/agentevol/tokenizer/tokenizer_config.json" in stored_names()
  assert ckpt_lib.load_run_tokenizer(run).get_vocab() == tokenizer.get_vocab()


def test_experience_store_is_local_and_its_snapshot_restores_elsewhere(bucket, tmp_path):
  run = f"{bucket}/runs/grpo"
  with pytest.raises(ValueError, match="experience store .* needs a local directory"):
    experience_lib.ExperienceManager().start(model_dir=run, envs=["maze"], seed=0)
  first = experience_lib.ExperienceManager(store_dir=str(tmp_path / "machine_a"), workspace_id="w")
  first.start(model_dir=run, envs=["maze"], seed=0)
  assert json.loads(paths.as_path(f"{run}/{experience_lib.RUN_FILE}").read_text()) == {"workspace_id": "w", "base": 0}
  memories = [TaskMemory("w", f"when the maze has {n} walls", f"go around {n} times") for n in range(3)]
  first.pool.commit(memories, step=1)
  first.step = 1
  files = first.state_files()  # what a checkpoint of step 1 keeps
  first.pool.commit([TaskMemory("w", "later", "after the checkpoint")], step=2)
  first.close()
  assert set(files) == {experience_lib.STATE_FILE, experience_lib.SNAPSHOT_FILE}
  # Resumed on another machine: its store lacks the workspace, the checkpoint's snapshot brings it back at step 1.
  second = experience_lib.ExperienceManager(store_dir=str(tmp_path / "machine_b"), workspace_id="w")
  second.start(model_dir=run, envs=["maze"], seed=0)
  assert second.new_workspace and second.size == 0
  second.load_state_files(files)
  assert second.size == 3 and second.step == 1
  assert sorted(m.memory_id for m in second.pool.workspace.all()) == sorted(m.memory_id for m in memories)
  (hit, _), = second.pool.retrieve(["when the maze has 2 walls"], 1)[0]
  assert hit.content == "go around 2 times"
  second.close()


# -- preemption --------------------------------------------------------------------------------------------------


def make_loop(model_dir, tokenizer):
  trainer = Trainer(model_dir, make_model(CONFIG, seed=0), optimizer_lib.make_optimizer(10, learning_rate=1e-2),
                    step_lib.sft_loss_fn, config=TrainerConfig(checkpoint_every=4, log_every=2))
  return Loop("test", model_dir, trainer, tokenizer, envs=["maze"])


def test_sigterm_finishes_the_step_checkpoints_it_and_resumes(tmp_path, tokenizer, batch):
  loop = make_loop(str(tmp_path), tokenizer)
  loop.resume()
  previous = signal.getsignal(signal.SIGTERM)

  def one_step():
    if loop.step == 2:  # during step 3, off both cadences (log every 2, checkpoint every 4)
      os.kill(os.getpid(), signal.SIGTERM)
    return scalar_metrics(loop.trainer.train_step(batch))

  with pytest.raises(Preempted, match=r"checkpoint of step 3 saved") as preempted:
    loop.run(one_step, until=8, extras=lambda: {"position": loop.step})
  assert preempted.value.step == 3
  assert signal.getsignal(signal.SIGTERM) is previous  # the loop's handler is gone
  assert ckpt_lib.Checkpointer(str(tmp_path), async_save=False).all_steps() == [3]
  assert [r["step"] for r in metrics_lib.read_metrics(str(tmp_path))] == [1, 2, 3]  # the last step is logged

  loop = make_loop(str(tmp_path), tokenizer)
  assert loop.resume() == {"position": 3} and loop.step == 3
  loop.run(lambda: scalar_metrics(loop.trainer.train_step(batch)), until=6)
  loop.close()
  assert [r["step"] for r in metrics_lib.read_metrics(str(tmp_path))] == [1, 2, 3, 4, 6]
  assert ckpt_lib.Checkpointer(str(tmp_path), async_save=False).all_steps() == [3, 4, 6]


def test_a_loop_off_the_main_thread_installs_no_handler(tmp_path, tokenizer, batch):
  loop = make_loop(str(tmp_path), tokenizer)
  loop.resume()
  previous = signal.getsignal(signal.SIGTERM)
  seen = []

  def one_step():
    seen.append(signal.getsignal(signal.SIGTERM))
    return scalar_metrics(loop.trainer.train_step(batch))

  worker = threading.Thread(target=loop.run, args=(one_step,), kwargs={"until": 1})
  worker.start()
  worker.join()
  loop.close()
  assert seen == [previous]


# A small model and dataset; no val or held-out report, a checkpoint cadence the run never reaches.
BC = ["ModelConfig.hidden_size = 64", "ModelConfig.num_layers = 2", "ModelConfig.intermediate_size = 128",
      "train_bc.envs = ['sql', 'wordle']", "TaskSlices.expert_count = 16", "TaskSlices.val_count = 0",
      "LoopConfig.eval_tasks = 0", "train_bc.batch_size = 4", "train_bc.buckets = (512,)",
      "train_bc.curriculum_steps = 0", "TrainerConfig.checkpoint_every = 1000"]


def bc_command(model_dir, steps: int) -> list[str]:
  bindings = [f"MODEL_DIR = '{model_dir}'", f"TRAIN_STEPS = {steps}", *BC]
  return [sys.executable, "-m", "launch.train", "--gin_file=gin_configs/runs/bc.gin",
          *[f"--gin_bindings={b}" for b in bindings]]


def bc_env() -> dict[str, str]:
  return one_device_env()  # one CPU device, as users run it


@pytest.mark.slow
def test_sigterm_stops_a_launched_run_cleanly_and_it_resumes(tmp_path):
  model_dir = tmp_path / "bc"
  proc = subprocess.Popen(bc_command(model_dir, 12), cwd=ROOT, env=bc_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
  try:
    deadline = time.monotonic() + 300
    while not metrics_lib.read_metrics(str(model_dir)):  # the first logged step
      assert proc.poll() is None and time.monotonic() < deadline, "the run ended before its first step was logged"
      time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  from evolver.train import gin_config
  assert proc.returncode == gin_config.PREEMPTED_EXIT_STATUS, stderr[-3000:]
  assert "Traceback" not in stderr and "preempted (SIGTERM)" in stderr
  logged = [r["step"] for r in metrics_lib.read_metrics(str(model_dir))]
  stopped = logged[-1]
  assert logged == list(range(1, stopped + 1)) and stopped < 12
  assert ckpt_lib.Checkpointer(str(model_dir), async_save=False).all_steps() == [stopped]

  proc = subprocess.run(bc_command(model_dir, 12), cwd=ROOT, env=bc_env(), capture_output=True, text=True,
                        timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert f"resuming at step {stopped}" in proc.stdout
  assert [r["step"] for r in metrics_lib.read_metrics(str(model_dir))] == list(range(1, 13))
  assert ckpt_lib.Checkpointer(str(model_dir), async_save=False).all_steps() == [stopped, 12]
