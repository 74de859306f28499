"""The policy model: decoder, HF checkpoints, sharding, sampler, tokenizer."""

from evolver.models.config import ModelConfig
from evolver.models.decoder import Decoder, KVCache, make_model
from evolver.models.hf import load_hf, save_hf

__all__ = ["ModelConfig", "Decoder", "KVCache", "make_model", "load_hf", "save_hf"]
