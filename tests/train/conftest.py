"""Fixtures shared by the training tests: the shipped tokenizer and a small batch of expert sql episodes."""

import pytest

from evolver.data import batching, expert
from evolver.models.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
  return load_tokenizer()


@pytest.fixture(scope="module")
def batch(tokenizer):
  """Two expert sql episodes as a train batch of 8 rows (`input_ids`, `loss_mask`)."""
  trajectories = [expert.expert_trajectory("sql", i) for i in range(2)]
  out = batching.batch_trajectories(trajectories, tokenizer, buckets=(512, 1024, 1536), batch_size=8)
  return {k: out[k] for k in ("input_ids", "loss_mask")}
