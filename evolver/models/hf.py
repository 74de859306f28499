"""Import and export of transformers checkpoints (config.json + safetensors, sharded or not).

transformers v5 has no Flax models, so the model is ours; this module converts between its layout and
transformers' PyTorch layout (`[out, in]` linear weights, separate gate/up projections). Every import checks
the checkpoint's tensors against what the config implies and names the missing, unexpected and mis-shaped keys.
"""

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors import safe_open
from safetensors.flax import save_file

from evolver.data.chat import end_of_turn_ids
from evolver.models.config import ModelConfig, resolve_dtype
from evolver.models.decoder import Decoder

SUPPORTED_MODEL_TYPES = ("qwen2", "llama")
_ARCHITECTURES = {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
# Buffers some checkpoints carry that are not parameters.
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)


class CheckpointMismatchError(ValueError):
  """The checkpoint's tensors do not fit the model its config describes."""


def _rope_theta(hf: Mapping[str, Any]) -> float:
  # transformers v5 keeps rope settings under `rope_parameters`; older configs have `rope_theta` on top.
  params = hf.get("rope_parameters") or {}
  scaling = hf.get("rope_scaling") or {}
  for block in (params, scaling):
    rope_type = block.get("rope_type", block.get("type", "default"))
    if rope_type not in (None, "default"):
      raise ValueError(f"unsupported rope_type {rope_type!r}: only the default RoPE is implemented")
  theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
  return float(theta)


def config_from_hf(hf: Mapping[str, Any], param_dtype: str = "float32", dtype: str = "float32") -> ModelConfig:
  """ModelConfig from a transformers config dict; unsupported architectures and features raise ValueError."""
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"unsupported architecture: model_type={model_type!r} (architectures={hf.get('architectures')}); "
                     f"evolver implements {SUPPORTED_MODEL_TYPES}")
  if hf.get("use_sliding_window"):
    raise ValueError("sliding-window attention (use_sliding_window=true) is not implemented")
  if hf.get("hidden_act", "silu") != "silu":
    raise ValueError(f"unsupported hidden_act {hf.get('hidden_act')!r}; only silu (SwiGLU) is implemented")
  num_heads = hf["num_attention_heads"]
  if model_type == "qwen2":
    qkv_bias, o_bias, mlp_bias = True, False, False
  else:
    qkv_bias = o_bias = bool(hf.get("attention_bias", False))
    mlp_bias = bool(hf.get("mlp_bias", False))
  return ModelConfig(
      vocab_size=hf["vocab_size"], hidden_size=hf["hidden_size"], num_layers=hf["num_hidden_layers"],
      num_heads=num_heads, num_kv_heads=hf.get("num_key_value_heads") or num_heads,
      head_dim=hf.get("head_dim"), intermediate_size=hf["intermediate_size"], rope_theta=_rope_theta(hf),
      rms_norm_eps=hf.get("rms_norm_eps", 1e-6), tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
      qkv_bias=qkv_bias, o_bias=o_bias, mlp_bias=mlp_bias,
      max_position_embeddings=hf.get("max_position_embeddings", 32768), param_dtype=param_dtype, dtype=dtype,
      model_type=model_type)


def config_to_hf(config: ModelConfig, torch_dtype: str = "float32") -> dict[str, Any]:
  hf = {
      "architectures": [_ARCHITECTURES[config.model_type]], "model_type": config.model_type,
      "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
      "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
      "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
      "head_dim": config.resolved_head_dim, "hidden_act": "silu",
      "max_position_embeddings": config.max_position_embeddings, "rms_norm_eps": config.rms_norm_eps,
      "rope_theta": config.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
      "tie_word_embeddings": config.tie_embeddings, "torch_dtype": torch_dtype, "dtype": torch_dtype,
      "use_cache": True,
  }
  if config.model_type == "qwen2":
    if not config.qkv_bias or config.o_bias or config.mlp_bias:
      raise ValueError("a qwen2 model has q/k/v biases and no o/mlp biases; use model_type='llama' otherwise")
    hf.update(use_sliding_window=False, sliding_window=None, max_window_layers=config.num_layers)
  else:
    if config.qkv_bias != config.o_bias:
      raise ValueError("llama's attention_bias covers q/k/v and o together; qkv_bias and o_bias must agree")
    hf.update(attention_bias=config.qkv_bias, mlp_bias=config.mlp_bias)
  return hf


def _hf_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
  """Every tensor a transformers checkpoint of this config holds, with its shape."""
  d, f, hd = config.hidden_size, config.intermediate_size, config.resolved_head_dim
  h, hkv = config.num_heads, config.num_kv_heads
  shapes = {"model.embed_tokens.weight": (config.vocab_size, d), "model.norm.weight": (d,)}
  if not config.tie_embeddings:
    shapes["lm_head.weight"] = (config.vocab_size, d)
  for i in range(config.num_layers):
    p = f"model.layers.{i}."
    shapes.update({
        p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
        p + "self_attn.q_proj.weight": (h * hd, d), p + "self_attn.k_proj.weight": (hkv * hd, d),
        p + "self_attn.v_proj.weight": (hkv * hd, d), p + "self_attn.o_proj.weight": (d, h * hd),
        p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d), p + "mlp.down_proj.weight": (d, f),
    })
    if config.qkv_bias:
      shapes.update({p + "self_attn.q_proj.bias": (h * hd,), p + "self_attn.k_proj.bias": (hkv * hd,),
                     p + "self_attn.v_proj.bias": (hkv * hd,)})
    if config.o_bias:
      shapes[p + "self_attn.o_proj.bias"] = (d,)
    if config.mlp_bias:
      shapes.update({p + "mlp.gate_proj.bias": (f,), p + "mlp.up_proj.bias": (f,), p + "mlp.down_proj.bias": (d,)})
  return shapes


def _check_tensors(found: Mapping[str, tuple[int, ...]], config: ModelConfig, where: str) -> None:
  expected = _hf_shapes(config)
  found = {k: v for k, v in found.items() if not k.endswith(_IGNORED_SUFFIXES)}
  if config.tie_embeddings:
    found.pop("lm_head.weight", None)  # Some tied checkpoints store the shared matrix twice.
  missing = sorted(set(expected) - set(found))
  unexpected = sorted(set(found) - set(expected))
  misshaped = sorted(f"{k}: checkpoint {tuple(found[k])} vs config {expected[k]}"
                     for k in set(expected) & set(found) if tuple(found[k]) != tuple(expected[k]))
  if missing or unexpected or misshaped:
    def show(items):
      return (", ".join(items[:8]) + (f", ... ({len(items)} in all)" if len(items) > 8 else "")) or "none"
    raise CheckpointMismatchError(
        f"checkpoint {where} does not fit its config: missing keys: {show(missing)}; "
        f"unexpected keys: {show(unexpected)}; mis-shaped keys: {show(misshaped)}")


def _safetensors_files(path: str) -> list[str]:
  index = os.path.join(path, "model.safetensors.index.json")
  if os.path.exists(index):
    with open(index) as f:
      weight_map = json.load(f)["weight_map"]
    return [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
  single = os.path.join(path, "model.safetensors")
  if os.path.exists(single):
    return [single]
  raise FileNotFoundError(f"no model.safetensors or model.safetensors.index.json in {path}")


def _fuse_qkv(q, k, v, hkv: int, hd: int):
  """q `[..., H*hd]`, k and v `[..., Hkv*hd]` (last axis = output features) -> `[..., Hkv, G + 2, hd]`."""
  lead = q.shape[:-1]
  q = q.reshape(*lead, hkv, -1, hd)
  k = k.reshape(*lead, hkv, 1, hd)
  v = v.reshape(*lead, hkv, 1, hd)
  return jnp.concatenate([q, k, v], axis=-2)


def _split_qkv(qkv, g: int):
  """Inverse of `_fuse_qkv`: `[..., Hkv, G + 2, hd]` -> q `[..., H*hd]`, k, v `[..., Hkv*hd]`."""
  lead = qkv.shape[:-3]
  flat = lambda x: x.reshape(*lead, -1)
  return flat(qkv[..., :g, :]), flat(qkv[..., g, :]), flat(qkv[..., g + 1, :])


def _to_model_layout(tensors: Mapping[str, jax.Array], config: ModelConfig) -> dict[str, Any]:
  """transformers names/layout -> a nested dict matching the Decoder's nnx.State."""
  d, hd = config.hidden_size, config.resolved_head_dim
  h, hkv = config.num_heads, config.num_kv_heads
  t = tensors
  state: dict[str, Any] = {"embed": t["model.embed_tokens.weight"], "final_norm": {"scale": t["model.norm.weight"]},
                           "layers": {}}
  if not config.tie_embeddings:
    state["lm_head"] = t["lm_head.weight"].T
  for i in range(config.num_layers):
    p = f"model.layers.{i}."
    attn = {
        "qkv": _fuse_qkv(t[p + "self_attn.q_proj.weight"].T, t[p + "self_attn.k_proj.weight"].T,
                         t[p + "self_attn.v_proj.weight"].T, hkv, hd),
        "o": t[p + "self_attn.o_proj.weight"].T.reshape(h, hd, d),
    }
    if config.qkv_bias:
      attn["qkv_bias"] = _fuse_qkv(t[p + "self_attn.q_proj.bias"], t[p + "self_attn.k_proj.bias"],
                                   t[p + "self_attn.v_proj.bias"], hkv, hd)
    if config.o_bias:
      attn["o_bias"] = t[p + "self_attn.o_proj.bias"]
    mlp = {"gate_up": jnp.stack([t[p + "mlp.gate_proj.weight"].T, t[p + "mlp.up_proj.weight"].T], axis=1),
           "down": t[p + "mlp.down_proj.weight"].T}
    if config.mlp_bias:
      mlp.update(gate_up_bias=jnp.stack([t[p + "mlp.gate_proj.bias"], t[p + "mlp.up_proj.bias"]]),
                 down_bias=t[p + "mlp.down_proj.bias"])
    state["layers"][i] = {"attn_norm": {"scale": t[p + "input_layernorm.weight"]},
                          "mlp_norm": {"scale": t[p + "post_attention_layernorm.weight"]},
                          "attn": attn, "mlp": mlp}
  return state


def _from_model_layout(model: Decoder) -> dict[str, jax.Array]:
  """The Decoder's weights under transformers' names and layout."""
  config = model.config
  d, hd = config.hidden_size, config.resolved_head_dim
  h, hkv = config.num_heads, config.num_kv_heads
  val = lambda p: p.get_value()
  out = {"model.embed_tokens.weight": val(model.embed), "model.norm.weight": val(model.final_norm.scale)}
  if not config.tie_embeddings:
    out["lm_head.weight"] = val(model.lm_head).T
  for i, layer in enumerate(model.layers):
    p = f"model.layers.{i}."
    a, m = layer.attn, layer.mlp
    q, k, v = _split_qkv(val(a.qkv), config.num_groups)
    out.update({
        p + "input_layernorm.weight": val(layer.attn_norm.scale),
        p + "post_attention_layernorm.weight": val(layer.mlp_norm.scale),
        p + "self_attn.q_proj.weight": q.T, p + "self_attn.k_proj.weight": k.T, p + "self_attn.v_proj.weight": v.T,
        p + "self_attn.o_proj.weight": val(a.o).reshape(h * hd, d).T,
        p + "mlp.gate_proj.weight": val(m.gate_up)[:, 0].T, p + "mlp.up_proj.weight": val(m.gate_up)[:, 1].T,
        p + "mlp.down_proj.weight": val(m.down).T,
    })
    if config.qkv_bias:
      qb, kb, vb = _split_qkv(val(a.qkv_bias), config.num_groups)
      out.update({p + "self_attn.q_proj.bias": qb, p + "self_attn.k_proj.bias": kb, p + "self_attn.v_proj.bias": vb})
    if config.o_bias:
      out[p + "self_attn.o_proj.bias"] = val(a.o_bias)
    if config.mlp_bias:
      out.update({p + "mlp.gate_proj.bias": val(m.gate_up_bias)[0], p + "mlp.up_proj.bias": val(m.gate_up_bias)[1],
                  p + "mlp.down_proj.bias": val(m.down_bias)})
  return out


def read_hf_config(path: str) -> dict[str, Any]:
  if not os.path.isdir(path):
    raise FileNotFoundError(f"checkpoint directory {path!r} does not exist")
  config_path = os.path.join(path, "config.json")
  if not os.path.exists(config_path):
    raise FileNotFoundError(f"{path!r} has no config.json: not a transformers checkpoint directory")
  try:
    with open(config_path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{config_path} is not valid JSON: {e}") from e


def load_hf(path: str, *, param_dtype: str = "float32", dtype: str = "float32", remat: str = "none",
            causal_block: int = 256) -> Decoder:
  """Reads a transformers checkpoint directory into a Decoder (weights cast to `param_dtype`; `dtype`, `remat` and
  `causal_block` are how it computes, which the checkpoint does not say)."""
  config = dataclasses.replace(config_from_hf(read_hf_config(path), param_dtype=param_dtype, dtype=dtype),
                               remat=remat, causal_block=causal_block)
  files = _safetensors_files(path)
  shapes, tensors = {}, {}
  for file in files:
    with safe_open(file, framework="flax") as f:
      for key in f.keys():
        shapes[key] = tuple(f.get_slice(key).get_shape())
  _check_tensors(shapes, config, path)
  wanted = set(_hf_shapes(config))
  pdt = resolve_dtype(param_dtype)
  for file in files:
    with safe_open(file, framework="flax") as f:
      for key in f.keys():
        if key in wanted:
          tensors[key] = f.get_tensor(key).astype(pdt)
  return decoder_from_hf_tensors(tensors, config, where=path)


def decoder_from_hf_tensors(tensors: Mapping[str, Any], config: ModelConfig, *, where: str = "tensors") -> Decoder:
  """A Decoder of `config` holding `tensors` (transformers' names and `[out, in]` layout, numpy or jax arrays;
  a tied checkpoint's `lm_head.weight` may be present), cast to `config.param_dtype`. The missing, unexpected and
  mis-shaped keys are named (`CheckpointMismatchError`), with `where` the tensors came from."""
  _check_tensors({k: tuple(v.shape) for k, v in tensors.items()}, config, where)
  wanted = set(_hf_shapes(config))
  pdt = resolve_dtype(config.param_dtype)
  tensors = {k: jnp.asarray(v, pdt) for k, v in tensors.items() if k in wanted}
  abstract = nnx.eval_shape(lambda: Decoder(config, rngs=nnx.Rngs(0)))
  graphdef, state = nnx.split(abstract)
  new_values = _to_model_layout(tensors, config)
  flat = dict(nnx.to_flat_state(state))
  nested = nnx.to_flat_state(nnx.State(new_values))
  for path_key, value in nested:
    if path_key not in flat:
      raise CheckpointMismatchError(f"internal layout error: {path_key} is not a model parameter")
    expected_shape = flat[path_key].get_value().shape
    if tuple(value.shape) != tuple(expected_shape):
      raise CheckpointMismatchError(f"{'/'.join(map(str, path_key))}: converted shape {value.shape} vs {expected_shape}")
    flat[path_key] = flat[path_key].replace(jnp.asarray(value, pdt))
  if missing := [k for k, v in flat.items() if isinstance(v.get_value(), jax.ShapeDtypeStruct)]:
    raise CheckpointMismatchError(f"parameters left unset after conversion: {missing[:8]}")
  return nnx.merge(graphdef, nnx.from_flat_state(flat))


def save_hf(model: Decoder, path: str, *, tokenizer=None, max_shard_bytes: int = 4 << 30) -> None:
  """Writes config.json and safetensors (sharded above `max_shard_bytes`) that transformers loads; with a
  `tokenizer`, also its files (the chat template included) and `generation_config.json` with the ids a turn
  ends on (`save_generation_config`), so that the directory is ready to serve (vLLM, SGLang)."""
  os.makedirs(path, exist_ok=True)
  tensors = {k: jnp.asarray(v) for k, v in _from_model_layout(model).items()}
  dtype_name = {jnp.dtype(jnp.float32): "float32", jnp.dtype(jnp.bfloat16): "bfloat16",
                jnp.dtype(jnp.float16): "float16"}[jnp.dtype(model.embed.get_value().dtype)]
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config_to_hf(model.config, dtype_name), f, indent=2)
  shards, current, size = [], {}, 0
  for key in sorted(tensors):
    nbytes = tensors[key].size * tensors[key].dtype.itemsize
    if current and size + nbytes > max_shard_bytes:
      shards.append(current)
      current, size = {}, 0
    current[key] = tensors[key]
    size += nbytes
  shards.append(current)
  for stale in ("model.safetensors", "model.safetensors.index.json"):
    if os.path.exists(os.path.join(path, stale)):
      os.remove(os.path.join(path, stale))
  if len(shards) == 1:
    save_file(shards[0], os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
  else:
    weight_map = {}
    for i, shard in enumerate(shards):
      name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
      save_file(shard, os.path.join(path, name), metadata={"format": "pt"})
      weight_map.update({k: name for k in shard})
    total = int(sum(v.size * v.dtype.itemsize for v in tensors.values()))
    with open(os.path.join(path, "model.safetensors.index.json"), "w") as f:
      json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
  if tokenizer is not None:
    save_generation_config(path, tokenizer)
    tokenizer.save_pretrained(path)


def save_generation_config(path: str, tokenizer) -> dict[str, Any]:
  """Writes `path/generation_config.json` whose `eos_token_id` lists every id an assistant turn ends on
  (`evolver.data.chat.end_of_turn_ids`: the template's end-of-turn token, EOS, and the ids of the tokenizer
  directory's own generation config), so transformers' `generate`, vLLM and SGLang stop where the rollout engine
  stops; `pad_token_id` and `bos_token_id` come from the tokenizer. Other fields of the tokenizer directory's
  `generation_config.json` (sampling defaults of a released model) are kept. Returns what was written."""
  from transformers import __version__ as transformers_version  # pylint: disable=import-outside-toplevel
  source = os.path.join(str(getattr(tokenizer, "name_or_path", "") or ""), "generation_config.json")
  config: dict[str, Any] = {}
  if os.path.isfile(source):
    with open(source) as f:
      config = json.load(f)
  config["eos_token_id"] = list(end_of_turn_ids(tokenizer))
  for name in ("pad_token_id", "bos_token_id"):
    value = getattr(tokenizer, name, None)
    if value is not None:
      config.setdefault(name, int(value))
  config["transformers_version"] = transformers_version
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "generation_config.json"), "w") as f:
    json.dump(config, f, indent=2)
    f.write("\n")
  return config
