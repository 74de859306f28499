"""gin_configs/real/: a real-model run config, end to end on a tiny Qwen2 checkpoint that transformers makes here
(bf16 compute, float32 master weights, the chunked LM head, microbatches); without a checkpoint, a clear error. Every
real config parses and every one of its bindings resolves (without weights); the Qwen2.5-7B ones carry AgentEvolver's
hyper-parameters and their hardware's mesh.

  python -m pytest tests/train/test_real_config.py -q
"""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from evolver.models.tokenizer import TINY_TOKENIZER_DIR  # noqa: E402
from evolver.train import checkpoints as ckpt_lib  # noqa: E402
from evolver.train import metrics as metrics_lib  # noqa: E402
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = "gin_configs/real/grpo.gin"


def launch(*bindings):
  env = one_device_env()  # one CPU device, as users run it
  return subprocess.run([sys.executable, "-m", "launch.train", f"--gin_file={CONFIG}",
                         *[f"--gin_bindings={b}" for b in bindings]], cwd=ROOT, capture_output=True, text=True,
                        env=env, timeout=600)


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory):
  """A Qwen2 checkpoint as transformers writes it, with the shipped tiny tokenizer and a Qwen-style
  generation_config.json (two EOS ids)."""
  path = tmp_path_factory.mktemp("qwen2_tiny")
  torch.manual_seed(0)
  config = transformers.Qwen2Config(vocab_size=2432, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                                    tie_word_embeddings=True)
  transformers.Qwen2ForCausalLM(config).save_pretrained(str(path))
  for name in os.listdir(TINY_TOKENIZER_DIR):
    shutil.copy(os.path.join(TINY_TOKENIZER_DIR, name), path)
  (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
  return path


@pytest.mark.slow
def test_the_real_config_runs_grpo_from_a_transformers_checkpoint(tiny_checkpoint, tmp_path):
  model_dir = tmp_path / "run"
  proc = launch(f"MODEL_DIR = '{model_dir}'", f"HF_CHECKPOINT = '{tiny_checkpoint}'", "TRAIN_STEPS = 1",
                "train_grpo.envs = ['maze']", "train_grpo.tasks_per_step = 2", "train_grpo.group_size = 2",
                "train_grpo.max_new_tokens = 16", "train_grpo.max_rounds = 2", "TaskSlices.val_count = 0",
                "train_grpo.precompile = False")  # one step: compile only the programs it meets
  assert proc.returncode == 0, proc.stderr[-3000:]
  operative = (model_dir / "operative_config.gin").read_text()
  assert "ModelConfig.dtype = 'bfloat16'" in operative and "head_chunk_rows = 2048" in operative
  (row,) = [r for r in metrics_lib.read_metrics(str(model_dir)) if "loss" in r]
  assert row["rollout/sampled_tokens"] > 0 and np.isfinite(row["loss"]) and np.isfinite(row["kl_ref"])
  checkpointer = ckpt_lib.Checkpointer(str(model_dir), async_save=False)
  assert checkpointer.all_steps() == [4]  # one RL step of 4 minibatches
  model, _ = ckpt_lib.restore_model(str(model_dir))
  assert model.config.hidden_size == 64 and model.config.dtype == "bfloat16"  # the checkpoint's shapes


def test_without_a_checkpoint_the_real_config_says_what_to_set(tmp_path):
  with ThreadPoolExecutor(2) as pool:  # two independent runs that must fail: side by side
    unset = pool.submit(launch, f"MODEL_DIR = '{tmp_path / 'run'}'")
    missing = pool.submit(launch, f"MODEL_DIR = '{tmp_path / 'run2'}'", f"HF_CHECKPOINT = '{tmp_path / 'nothing'}'")
    proc = unset.result()
    assert proc.returncode != 0 and "HF_CHECKPOINT" in proc.stderr[-2000:]
    proc = missing.result()
    assert proc.returncode != 0 and "is not a directory" in proc.stderr[-2000:]


REAL_CONFIGS = sorted(f"gin_configs/real/{name}" for name in os.listdir(os.path.join(ROOT, "gin_configs", "real"))
                      if name.endswith(".gin"))

# In a fresh process (gin's state is global), for each config: parse it with a checkpoint path that need not exist,
# resolve the bindings of everything a GRPO run calls (macros, references, and the extensions it would construct)
# and print one JSON line of what the tests check.
RESOLVE = """
import json, sys
import gin
from evolver.train import gin_config
from evolver.models.config import ModelConfig
from evolver.train.loop import LoopConfig
from evolver.train.slices import TaskSlices
from evolver.train.trainer import TrainerConfig

def flat(value):
  if isinstance(value, dict):
    return [v for item in value.values() for v in flat(item)]
  if isinstance(value, (list, tuple)):
    return [v for item in value for v in flat(item)]
  return [value]

for config in sys.argv[1:]:
  gin.clear_config()
  gin_config.parse([config], ["MODEL_DIR = 'runs/x'", "HF_CHECKPOINT = '/nowhere/Qwen2.5-7B-Instruct'",
                              "EXPERIENCE_SERVICE = 'http://10.0.0.2:8001'"])
  resolved = {name: gin.get_bindings(name) for name in ("run", "train_grpo", "het_ppo_loss_fn", "make_optimizer",
                                                        "init_policy")}
  assert not [v for v in flat(resolved) if v is gin.REQUIRED], (config, resolved)
  model, trainer, loop, slices = ModelConfig(), TrainerConfig(), LoopConfig(), TaskSlices()
  slices.check_disjoint("val", "explore")
  grpo, loss, opt = resolved["train_grpo"], resolved["het_ppo_loss_fn"], resolved["make_optimizer"]
  print(json.dumps({
      "config": config, "loop": resolved["run"]["loop"].__name__, "tokenizer_path": grpo["tokenizer_path"],
      "hf_checkpoint": grpo["hf_checkpoint"], "group_size": grpo.get("group_size"),
      "tasks_per_step": grpo.get("tasks_per_step"), "temperature": grpo.get("temperature"),
      "max_rounds": grpo.get("max_rounds"), "extensions": [type(e).__name__ for e in grpo["extensions"]],
      "lr": opt["learning_rate"], "kl_coef": loss["kl_coef"], "clip_high": loss["clip_high"],
      "off_clip_high": loss["off_clip_high"], "eval_max_rounds": loop.eval_max_rounds,
      "mesh": [trainer.mesh_data, trainer.mesh_fsdp, trainer.mesh_tensor], "microbatches": trainer.num_microbatches,
      "num_minibatches": grpo.get("num_minibatches"), "params": model.num_params(), "dtype": model.dtype,
      "experience": {k: getattr(e, k) for e in grpo["extensions"] for k in ("train_rollout_mode", "rollout_ratio",
                     "train_sample_mode", "retrieve_top_k", "updated_freq")},
      "service": {k: getattr(e, k) for e in grpo["extensions"] for k in ("service_url", "service_token_env")}}))
"""


@pytest.fixture(scope="module", autouse=True)
def resolving():
  """The RESOLVE process, started when this module's tests start so that it runs alongside their launch.train
  runs; `resolved` reads its answer."""
  proc = subprocess.Popen([sys.executable, "-c", RESOLVE, *REAL_CONFIGS], cwd=ROOT, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,
                          env=one_device_env())
  yield proc
  if proc.poll() is None:
    proc.kill()
    proc.communicate()


@pytest.fixture(scope="module")
def resolved(resolving):
  stdout, stderr = resolving.communicate(timeout=600)
  assert resolving.returncode == 0, stderr[-3000:]
  rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
  return {row["config"]: row for row in rows}


@pytest.mark.parametrize("config", REAL_CONFIGS)
def test_every_binding_of_a_real_config_resolves_without_weights(resolved, config):
  got = resolved[config]
  assert got["loop"] == "train_grpo" and got["hf_checkpoint"] == got["tokenizer_path"] == "/nowhere/Qwen2.5-7B-Instruct"
  assert got["dtype"] == "bfloat16"


@pytest.mark.parametrize("config, mesh, tasks, num_minibatches, microbatches", [
    ("gin_configs/real/qwen2_5_7b_grpo_exp_8gpu.gin", [1, 8, 1], 8, 4, 2),
    ("gin_configs/real/qwen2_5_7b_grpo_exp_v5p64.gin", [4, 8, 1], 32, 4, 1),
])
def test_the_qwen7b_configs_carry_agentevolvers_recipe_and_their_mesh(resolved, config, mesh, tasks, num_minibatches,
                                                                      microbatches):
  got = resolved[config]
  assert {k: got[k] for k in ("group_size", "temperature", "max_rounds", "lr", "kl_coef", "clip_high",
                              "off_clip_high", "eval_max_rounds")} == {
      "group_size": 8, "temperature": 0.9, "max_rounds": 30, "lr": 1e-6, "kl_coef": 0.001, "clip_high": 0.28,
      "off_clip_high": 0.6, "eval_max_rounds": 30}
  assert got["extensions"] == ["ExperienceManager"]
  assert got["experience"] == {"train_rollout_mode": "mixed", "rollout_ratio": 0.5, "train_sample_mode": "alldiscard",
                               "retrieve_top_k": 3, "updated_freq": 1}
  assert 7.6e9 < got["params"] < 7.7e9  # Qwen2.5-7B's shapes (what launch.aot compiles)
  assert got["mesh"] == mesh and got["tasks_per_step"] == tasks
  assert got["num_minibatches"] == num_minibatches and got["microbatches"] == microbatches
  # Multi-host shares one pool through a service: the slice's config takes its URL (the macro) and the name of
  # the environment variable holding its token; one host runs the in-process pool.
  multi_host = mesh[0] * mesh[1] * mesh[2] > 8
  assert got["service"] == ({"service_url": "http://10.0.0.2:8001", "service_token_env": "EVOLVER_EXPERIENCE_TOKEN"}
                            if multi_host else {"service_url": None, "service_token_env": None})
