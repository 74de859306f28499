"""`launch.export` for serving: a run's policy as a transformers directory that transformers loads as it is (logits
match the JAX model), whose tokenizer renders the chat as evolver does, whose generation config stops where the
rollout engine stops, and which `launch.eval --hf_checkpoint` evaluates."""

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from evolver import models
from evolver.data.chat import end_of_turn_ids, render_chat
from evolver.models.tokenizer import load_tokenizer
from evolver.models import load_hf
from evolver.train import checkpoints as ckpt_lib
from evolver.train.evaluation import params_digest

CHAT = [{"role": "user", "content": "Map:\n#.S#\nYou are at (0, 2)."}, {"role": "assistant", "content": "Ok."},
        {"role": "user", "content": "Open: left."}, {"role": "assistant", "content": "Thought: go\nAction: move left"}]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A tiny run directory: one qwen2-shaped policy (qkv bias, tied embeddings) saved at step 7 as training does."""
  tok = load_tokenizer()
  config = models.ModelConfig(vocab_size=-(-len(tok) // 128) * 128, hidden_size=64, num_layers=2, num_heads=4,
                              num_kv_heads=2, intermediate_size=128, max_position_embeddings=2048, qkv_bias=True,
                              tie_embeddings=True, model_type="qwen2")
  model = models.make_model(config, seed=3)
  # Biases and norm scales away from their initial 0 and 1, so that the export of every parameter kind is checked.
  rng = np.random.default_rng(0)
  flat = dict(nnx.to_flat_state(nnx.split(model)[1]))
  for path, var in flat.items():
    if path[-1] in ("qkv_bias", "scale"):
      value = var.get_value()
      flat[path] = var.replace(value + jnp.asarray(rng.normal(0.0, 0.1, value.shape), value.dtype))
  params = nnx.from_flat_state(flat)
  directory = tmp_path_factory.mktemp("run")
  checkpointer = ckpt_lib.Checkpointer(str(directory), async_save=False)
  checkpointer.save(7, params, None, {"model_config": ckpt_lib.model_config_to_json(config)})
  checkpointer.close()
  return directory


@pytest.fixture(scope="module")
def exported(run_dir, tmp_path_factory):
  from launch import export
  out = tmp_path_factory.mktemp("export") / "policy"
  record = export.main(["--model_dir", str(run_dir), "--out", str(out), "--dtype", "float32"])
  assert record["step"] == 7 and record["dtype"] == "float32"
  return out


def test_the_export_holds_what_a_server_needs(exported):
  files = set(os.listdir(exported))
  assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
          "generation_config.json", "export.json"} <= files
  template = (exported / "chat_template.jinja").read_text() if "chat_template.jinja" in files else json.loads(
      (exported / "tokenizer_config.json").read_text())["chat_template"]
  assert template == load_tokenizer().chat_template


def test_transformers_loads_the_export_with_matching_logits(run_dir, exported):
  torch = pytest.importorskip("torch")
  from transformers import AutoModelForCausalLM
  model, _ = ckpt_lib.restore_model(str(run_dir))
  hf = AutoModelForCausalLM.from_pretrained(str(exported), dtype=torch.float32).eval()
  ids = (np.arange(48, dtype=np.int32)[None] * 37 + 5) % model.config.vocab_size
  want = np.asarray(model(ids))
  with torch.no_grad():
    got = hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, atol=1e-4, rtol=1e-4)


def test_the_tokenizer_renders_and_stops_as_evolver_does(exported):
  from transformers import AutoTokenizer, GenerationConfig
  ours = load_tokenizer()
  theirs = AutoTokenizer.from_pretrained(str(exported))
  loaded = load_tokenizer(str(exported))  # what launch.eval --hf_checkpoint and HF_CHECKPOINT runs read
  for add in (False, True):
    chat = CHAT[:3] if add else CHAT
    text = theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=add)
    assert text == render_chat(ours, chat, add_generation_prompt=add) == render_chat(loaded, chat, add)
    # transformers 5 gives a qwen2 directory Qwen's pre-tokenizer; evolver reads tokenizer.json as saved.
    assert loaded(text)["input_ids"] == ours(text)["input_ids"]
  stop_ids = end_of_turn_ids(ours)  # what the rollout engine stops on
  generation = GenerationConfig.from_pretrained(str(exported))
  assert sorted(np.atleast_1d(generation.eos_token_id).tolist()) == list(stop_ids)
  assert generation.pad_token_id == ours.pad_token_id
  assert end_of_turn_ids(load_tokenizer(str(exported))) == stop_ids


def test_launch_eval_evaluates_the_export(exported, tmp_path):
  from launch import eval as eval_cli
  out = tmp_path / "eval.json"
  results = eval_cli.main(["--hf_checkpoint", str(exported), "--envs", "maze", "--num_tasks", "2",
                           "--max_new_tokens", "16", "--max_rounds", "2", "--out", str(out)])
  written = json.loads(out.read_text())
  assert written["envs"]["maze"]["num_tasks"] == 2 and written["envs"]["maze"]["num_failed"] == 0
  assert written["policy"] == {"hf_checkpoint": str(exported),
                               "params_digest": params_digest(nnx.state(load_hf(str(exported)), nnx.Param))}
  assert results["overall"]["num_episodes"] == 2


def test_a_run_is_exported_and_evaluated_with_the_tokenizer_it_keeps(run_dir, tmp_path):
  """A run keeps its tokenizer (`MODEL_DIR/tokenizer/`); export and `launch.eval --model_dir` read the run with
  it, not with the tiny default (a SmolLM2 run read through the tiny vocabulary answered gibberish)."""
  import argparse
  import shutil
  from launch import eval as eval_cli
  from launch import export
  run = tmp_path / "run"
  shutil.copytree(run_dir, run)
  kept = load_tokenizer()
  kept.chat_template = "{{- 'You are an agent.\\n' }}" + kept.chat_template
  ckpt_lib.save_run_tokenizer(run, kept)
  export.main(["--model_dir", str(run), "--out", str(tmp_path / "policy"), "--dtype", "float32"])
  assert load_tokenizer(str(tmp_path / "policy")).chat_template == kept.chat_template
  args = argparse.Namespace(hf_checkpoint=None, gguf=None, model_dir=str(run), step=None, best=False, tokenizer=None)
  _, tokenizer, policy = eval_cli.load_policy(args)
  assert tokenizer.chat_template == kept.chat_template and policy["step"] == 7
  args.tokenizer = load_tokenizer().name_or_path  # --tokenizer still overrides
  assert eval_cli.load_policy(args)[1].chat_template == load_tokenizer().chat_template
