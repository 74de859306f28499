"""Model-size gin files: they parse, and their shapes have the published parameter counts."""

import os

import gin
import jax
import numpy as np
import pytest
from flax import nnx

from evolver.models import ModelConfig, make_model
from evolver.models import tokenizer as tokenizer_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Published sizes (transformers' num_parameters on the real checkpoints), relative tolerance 0.5%.
EXPECTED = {"tiny": None, "qwen2_5_0_5b": 494_032_768, "qwen2_5_1_5b": 1_543_714_304,
            "qwen2_5_7b": 7_615_616_512, "llama2_7b": 6_738_415_616, "smollm2_135m": 134_515_008}


def config_from_gin(name: str) -> ModelConfig:
  gin.clear_config()
  try:
    gin.parse_config_files_and_bindings([os.path.join(ROOT, "gin_configs", "models", f"{name}.gin")],
                                        ["TOKENIZER_PATH = None"])
    return ModelConfig()
  finally:
    gin.clear_config()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_gin_model_sizes(name):
  config = config_from_gin(name)
  abstract = nnx.eval_shape(lambda: make_model(config))
  counted = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nnx.state(abstract)))
  assert counted == config.num_params()
  if EXPECTED[name] is None:
    assert 1_000_000 < counted < 10_000_000  # "a few million"
    assert config.vocab_size >= len(tokenizer_lib.load_tokenizer())
  else:
    assert counted == pytest.approx(EXPECTED[name], rel=5e-3)


def test_bad_model_config_is_refused():
  with pytest.raises(ValueError, match="multiple of num_kv_heads"):
    ModelConfig(num_heads=6, num_kv_heads=4)
  with pytest.raises(ValueError, match="unknown dtype 'float8'"):
    ModelConfig(param_dtype="float8")
  with pytest.raises(ValueError, match="remat must be"):
    ModelConfig(remat="sometimes")
