"""Shared fixtures of the data tests: the shipped tokenizer and one tiny expert dataset built once per session."""

import pytest

from evolver.data import tfds_builders
from evolver.models.tokenizer import load_tokenizer

# BabyAI has non-round rewards; maze and wordle are quick. Eight train tasks each.
TINY_ENVS = ("babyai", "maze", "wordle")
TINY_COUNT = 8


@pytest.fixture(scope="session")
def tokenizer():
  return load_tokenizer()


@pytest.fixture(scope="session")
def expert_data_dir(tmp_path_factory):
  """A data_dir holding expert_trajectories/babyai+maze+wordle_8."""
  data_dir = str(tmp_path_factory.mktemp("tensorflow_datasets"))
  tfds_builders.expert_builder(TINY_ENVS, 0, TINY_COUNT, data_dir).download_and_prepare()
  return data_dir
