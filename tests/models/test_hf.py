"""load_hf / save_hf against transformers' PyTorch models on the same weights."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from evolver import models  # noqa: E402
from evolver.models import hf as hf_lib  # noqa: E402

CASES = {
    # name: (architecture, config kwargs)
    "qwen2_gqa_tied_bias_theta": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
                                                 rope_theta=123456.0)),
    "qwen2_mha_untied": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=False)),
    "llama_gqa_untied": ("llama", dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False,
                                       rope_theta=500000.0)),
    "llama_mha_tied_bias": ("llama", dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                                          attention_bias=True)),
}


def _make_reference(arch: str, kwargs: dict, path: str, seed: int = 0):
  torch.manual_seed(seed)
  common = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, max_position_embeddings=128,
                rms_norm_eps=1e-6)
  common.update(kwargs)
  if arch == "qwen2":
    model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**common))
  else:
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
  # Random biases and norm scales so that every tensor matters.
  with torch.no_grad():
    for name, p in model.named_parameters():
      if name.endswith("bias") or "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
  model.eval()
  model.save_pretrained(path)
  return model


def _torch_logits(model, ids: np.ndarray) -> np.ndarray:
  with torch.no_grad():
    return model(torch.as_tensor(ids)).logits.float().numpy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers_and_roundtrip(case, tmp_path):
  arch, kwargs = CASES[case]
  ref = _make_reference(arch, kwargs, str(tmp_path / "ref"))
  ids = np.random.default_rng(0).integers(0, 97, size=(2, 11)).astype(np.int32)
  expected = _torch_logits(ref, ids)

  model = models.load_hf(str(tmp_path / "ref"))
  ours = np.asarray(model(ids))
  np.testing.assert_allclose(ours, expected, atol=1e-4, rtol=0)
  if "rope_theta" in kwargs:
    assert model.config.rope_theta == kwargs["rope_theta"]

  models.save_hf(model, str(tmp_path / "out"))
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "out"))
  reloaded.eval()
  np.testing.assert_allclose(_torch_logits(reloaded, ids), expected, atol=1e-4, rtol=0)


def test_sharded_checkpoint_loads(tmp_path):
  arch, kwargs = CASES["qwen2_mha_untied"]
  ref = _make_reference(arch, kwargs, str(tmp_path / "ref"))
  model = models.load_hf(str(tmp_path / "ref"))
  models.save_hf(model, str(tmp_path / "sharded"), max_shard_bytes=20_000)
  files = os.listdir(tmp_path / "sharded")
  assert "model.safetensors.index.json" in files and sum(f.endswith(".safetensors") for f in files) > 2
  ids = np.arange(12, dtype=np.int32).reshape(2, 6)
  np.testing.assert_allclose(np.asarray(models.load_hf(str(tmp_path / "sharded"))(ids)), _torch_logits(ref, ids),
                             atol=1e-4, rtol=0)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "sharded"))
  np.testing.assert_allclose(_torch_logits(reloaded.eval(), ids), _torch_logits(ref, ids), atol=1e-5, rtol=0)


def test_rope_theta_read_from_top_level_and_rope_parameters():
  base = dict(model_type="qwen2", vocab_size=10, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
              num_attention_heads=2, num_key_value_heads=1)
  assert hf_lib.config_from_hf({**base, "rope_theta": 777.0}).rope_theta == 777.0
  assert hf_lib.config_from_hf({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 555.0}}).rope_theta == 555.0


def test_mismatched_checkpoint_names_keys(tmp_path):
  arch, kwargs = CASES["qwen2_mha_untied"]
  _make_reference(arch, kwargs, str(tmp_path / "ref"))
  config = json.loads((tmp_path / "ref" / "config.json").read_text())
  config["intermediate_size"] = 40  # mis-shaped mlp
  config["num_hidden_layers"] = 3   # layer 2 missing
  (tmp_path / "ref" / "config.json").write_text(json.dumps(config))
  with pytest.raises(hf_lib.CheckpointMismatchError) as err:
    models.load_hf(str(tmp_path / "ref"))
  msg = str(err.value)
  assert "missing keys: model.layers.2." in msg
  assert "mis-shaped keys: model.layers.0.mlp.down_proj.weight: checkpoint (32, 48) vs config (32, 40)" in msg


def test_unexpected_keys_named(tmp_path):
  arch, kwargs = CASES["qwen2_gqa_tied_bias_theta"]
  _make_reference("qwen2", dict(kwargs, num_hidden_layers=3), str(tmp_path / "ref"))
  config = json.loads((tmp_path / "ref" / "config.json").read_text())
  config["num_hidden_layers"] = 2
  (tmp_path / "ref" / "config.json").write_text(json.dumps(config))
  with pytest.raises(hf_lib.CheckpointMismatchError, match=r"unexpected keys: model\.layers\.2\."):
    models.load_hf(str(tmp_path / "ref"))


def test_bad_inputs_are_clear(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    models.load_hf(str(tmp_path / "nope"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(FileNotFoundError, match="no config.json"):
    models.load_hf(str(tmp_path / "empty"))
  (tmp_path / "gpt2").mkdir()
  (tmp_path / "gpt2" / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
  with pytest.raises(ValueError, match="unsupported architecture: model_type='gpt2'"):
    models.load_hf(str(tmp_path / "gpt2"))
  arch, kwargs = CASES["qwen2_mha_untied"]
  _make_reference(arch, kwargs, str(tmp_path / "ref"))
  model = models.load_hf(str(tmp_path / "ref"))
  with pytest.raises(ValueError, match=r"token ids out of the vocabulary \[0, 97\): \[97, 1000\]"):
    model(np.array([[1, 97, 1000]], np.int32))


def test_long_sequences_match_transformers(tmp_path):
  """RoPE and the causal mask far past the short cases above (episodes here run to ~1,500 tokens)."""
  arch, kwargs = CASES["qwen2_gqa_tied_bias_theta"]
  ref = _make_reference(arch, dict(kwargs, max_position_embeddings=2048), str(tmp_path / "ref"))
  ids = np.random.default_rng(1).integers(0, 97, size=(1, 1200)).astype(np.int32)
  np.testing.assert_allclose(np.asarray(models.load_hf(str(tmp_path / "ref"))(ids)), _torch_logits(ref, ids),
                             atol=1e-4, rtol=0)
