"""Model configuration of the Llama / Qwen2 decoder family."""

import dataclasses
from typing import Any

import gin
import jax.numpy as jnp

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}

# Implementations of attention without a KV cache (`evolver.models.decoder.attention`).
ATTENTION_IMPLS = ("auto", "einsum", "xla", "cudnn", "splash")


def resolve_dtype(name: str | Any) -> Any:
  """Maps 'float32' | 'bfloat16' | 'float16' (or a dtype) to a jnp dtype; anything else is an error."""
  if not isinstance(name, str):
    return jnp.dtype(name).type
  if name not in _DTYPES:
    raise ValueError(f"unknown dtype {name!r}; choose one of {sorted(_DTYPES)}")
  return _DTYPES[name]


@gin.configurable
@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape and precision of a decoder.

  `param_dtype` is what the weights are stored in, `dtype` what matmuls compute in; norms, softmax, logits,
  log-probabilities and losses are always float32. `remat` recomputes each layer's activations in the
  backward pass (activation checkpointing): 'none' | 'full' | 'dots_saveable'. `causal_block` splits causal
  self-attention without a cache (training, scoring) into query blocks of this many tokens, each attending to
  the keys up to its own end only: the all-masked upper triangle is skipped (0: one block, the full square).
  `attention_impl` picks the implementation of that attention (`evolver.models.decoder.attention`): 'auto' (the
  platform's fused kernel where the shapes fit; on CPU the blocked einsums), or 'einsum' | 'xla' | 'cudnn' |
  'splash' forced. Attention over a KV cache (the sampler) has one implementation on every platform.
  """

  vocab_size: int = 32000
  hidden_size: int = 384
  num_layers: int = 6
  num_heads: int = 6
  num_kv_heads: int = 2
  head_dim: int | None = None
  intermediate_size: int = 1024
  rope_theta: float = 10000.0
  rms_norm_eps: float = 1e-6
  tie_embeddings: bool = True
  qkv_bias: bool = False
  o_bias: bool = False
  mlp_bias: bool = False
  max_position_embeddings: int = 32768
  param_dtype: str = "float32"
  dtype: str = "float32"
  remat: str = "none"
  causal_block: int = 256
  attention_impl: str = "auto"
  model_type: str = "qwen2"

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size"):
      if getattr(self, name) <= 0:
        raise ValueError(f"ModelConfig.{name} must be positive, got {getattr(self, name)}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
    if self.head_dim is None and self.hidden_size % self.num_heads:
      raise ValueError(f"hidden_size ({self.hidden_size}) is not divisible by num_heads ({self.num_heads}); set head_dim")
    if self.causal_block < 0:
      raise ValueError(f"causal_block must be >= 0 (0 = one block), got {self.causal_block}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl must be one of {ATTENTION_IMPLS}, got {self.attention_impl!r}")
    if self.remat not in ("none", "full", "dots_saveable"):
      raise ValueError(f"remat must be 'none', 'full' or 'dots_saveable', got {self.remat!r}")
    if self.model_type not in ("qwen2", "llama"):
      raise ValueError(f"model_type must be 'qwen2' or 'llama', got {self.model_type!r}")
    resolve_dtype(self.param_dtype)
    resolve_dtype(self.dtype)

  @property
  def resolved_head_dim(self) -> int:
    return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

  @property
  def num_groups(self) -> int:
    """Query heads per KV head (GQA group size)."""
    return self.num_heads // self.num_kv_heads

  def num_params(self) -> int:
    d, f, hd = self.hidden_size, self.intermediate_size, self.resolved_head_dim
    attn = d * hd * (self.num_heads * 2 + self.num_kv_heads * 2)
    if self.qkv_bias:
      attn += hd * (self.num_heads + 2 * self.num_kv_heads)
    if self.o_bias:
      attn += d
    mlp = 3 * d * f + (2 * f + d if self.mlp_bias else 0)
    per_layer = attn + mlp + 2 * d
    embed = self.vocab_size * d * (1 if self.tie_embeddings else 2)
    return self.num_layers * per_layer + embed + d

  def flops_per_token(self, seq_len: int) -> float:
    """Forward FLOPs per token (2 per multiply-add), matmuls plus attention scores at length `seq_len`."""
    d, hd = self.hidden_size, self.resolved_head_dim
    matmul = 2 * (self.num_layers * (d * hd * (2 * self.num_heads + 2 * self.num_kv_heads)
                                     + 3 * d * self.intermediate_size) + self.vocab_size * d)
    attention = 2 * 2 * self.num_layers * self.num_heads * hd * seq_len
    return float(matmul + attention)
