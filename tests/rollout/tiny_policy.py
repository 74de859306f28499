"""A tiny random policy whose greedy turns are deterministic and varied, shared by the rollout and eval tests.

Untied output weights scaled by 30 separate the logits widely (float noise cannot flip a greedy choice) and
make the next token a random function of the context rather than a copy of the last token, as a random tied
embedding would. The end-of-turn column is boosted so that some turns stop on it and others are cut at
max_new_tokens: the engine's two turn endings both occur.
"""

from evolver import models
from evolver.models.sampler import Sampler
from evolver.data.chat import end_of_turn_ids
from evolver.models.tokenizer import load_tokenizer

LOGIT_SCALE = 30.0
END_OF_TURN_BOOST = 1.6


def tiny_model(tokenizer=None, seed: int = 0) -> models.Decoder:
  tokenizer = tokenizer or load_tokenizer()
  vocab = -(-len(tokenizer) // 128) * 128
  config = models.ModelConfig(vocab_size=vocab, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                              intermediate_size=128, max_position_embeddings=2048, tie_embeddings=False,
                              model_type="llama")  # no biases: a valid Llama checkpoint for save_hf
  model = models.make_model(config, seed=seed)
  head = model.lm_head.get_value() * LOGIT_SCALE
  for token in end_of_turn_ids(tokenizer):
    head = head.at[:, token].multiply(END_OF_TURN_BOOST)
  model.lm_head.set_value(head)
  return model


def tiny_sampler(model: models.Decoder) -> Sampler:
  # Coarse buckets: few distinct shapes, so few programs compile.
  return Sampler(model, chunk_bucket=64, max_length=2048)
