"""The shipped tiny tokenizer and the chat-template path that real tokenizers share."""

import os

import pytest

import evolver.envs as envs
from evolver.data import chat
from evolver.models import tokenizer as tokenizer_lib


@pytest.fixture(scope="module")
def tok():
  return tokenizer_lib.load_tokenizer()


def test_shipped_tokenizer_is_small_and_has_chat_template(tok):
  size = sum(os.path.getsize(os.path.join(tokenizer_lib.TINY_TOKENIZER_DIR, f))
             for f in os.listdir(tokenizer_lib.TINY_TOKENIZER_DIR))
  assert size < 400_000
  assert tok.chat_template
  assert chat.end_of_turn_ids(tok) == (tok.convert_tokens_to_ids(chat.TURN_END),)
  assert tok.pad_token == chat.PAD_TOKEN


def test_chat_template_renders_chatml(tok):
  messages = [{"role": "user", "content": "Go."}, {"role": "assistant", "content": "Thought: ok\nAction: move up"}]
  text = chat.render_chat(tok, messages, add_generation_prompt=False)
  assert text == ("<|im_start|>user\nGo.<|im_end|>\n<|im_start|>assistant\nThought: ok\nAction: move up<|im_end|>\n")
  prompt = chat.render_chat(tok, messages[:1], add_generation_prompt=True)
  assert prompt.endswith("<|im_end|>\n<|im_start|>assistant\n")
  ids = tok(text, add_special_tokens=False)["input_ids"]
  assert ids.count(tok.convert_tokens_to_ids("<|im_end|>")) == 2
  assert tok.decode(ids) == text


@pytest.mark.parametrize("name", envs.names())
def test_env_text_round_trips_compactly(tok, name):
  env = envs.make(name)
  texts = [env.instruction(), env.reset(0, "train"), env.expert_action()]
  for text in texts:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text
    assert len(ids) < 0.5 * len(text)  # trained on this text: well under one token per two characters


def test_missing_tokenizer_directory_is_clear(tmp_path):
  with pytest.raises(FileNotFoundError, match="does not exist"):
    tokenizer_lib.load_tokenizer(str(tmp_path / "nope"))


SAMPLE = "Map:\n#.S#\nYou are at (0, 12).  Action: go north 3 steps, then   look."


def test_a_directory_of_the_generic_class_loads_as_saved(tok):
  """The shipped tokenizers declare the generic fast class: loaded as such directly (the shared checkpoint's
  config.json says qwen2, whose own tokenizer class would split text another way)."""
  from transformers import PreTrainedTokenizerFast
  shared = os.path.join(os.path.dirname(tokenizer_lib.TINY_TOKENIZER_DIR), "checkpoints", "bc_tiny")
  for path in (tokenizer_lib.TINY_TOKENIZER_DIR, shared):
    loaded, saved = tokenizer_lib.load_tokenizer(path), PreTrainedTokenizerFast.from_pretrained(path)
    assert type(loaded) is type(saved) and loaded.special_tokens_map == saved.special_tokens_map
    assert loaded(SAMPLE)["input_ids"] == saved(SAMPLE)["input_ids"] == tok(SAMPLE)["input_ids"]


def test_a_family_class_that_splits_otherwise_falls_back_to_tokenizer_json(tok, tmp_path):
  """A directory naming a model family's tokenizer class goes through AutoTokenizer; where that class would cut
  text otherwise than the directory's tokenizer.json (Qwen2's pre-tokenizer on a GPT-2-split vocabulary), the
  tokenizer is loaded from tokenizer.json as saved."""
  import json
  import shutil
  from transformers import AutoTokenizer
  for name in os.listdir(tokenizer_lib.TINY_TOKENIZER_DIR):
    shutil.copy(os.path.join(tokenizer_lib.TINY_TOKENIZER_DIR, name), tmp_path)
  config_file = tmp_path / "tokenizer_config.json"
  config_file.write_text(json.dumps(dict(json.loads(config_file.read_text()), tokenizer_class="Qwen2Tokenizer")))
  assert type(AutoTokenizer.from_pretrained(str(tmp_path))).__name__ == "Qwen2Tokenizer"
  assert not tokenizer_lib._tokenizes_as_saved(AutoTokenizer.from_pretrained(str(tmp_path)), str(tmp_path))
  loaded = tokenizer_lib.load_tokenizer(str(tmp_path))
  assert type(loaded).__name__ != "Qwen2Tokenizer" and loaded(SAMPLE)["input_ids"] == tok(SAMPLE)["input_ids"]
