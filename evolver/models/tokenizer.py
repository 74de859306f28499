"""Tokenizers: any HF tokenizer directory through transformers, the chat template, and the shipped tiny one.

The tiny default's tokenizer (`evolver/assets/tokenizer`) is a byte-level BPE trained with `tokenizers` on
the built-in environments' text (`python -m launch.build_tokenizer`) and saved in HF format with a ChatML
template, so the tiny model and real checkpoints load through the same path.
"""

import json
import os
from collections.abc import Iterable

from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

from evolver.data.chat import CHATML_TEMPLATE, PAD_TOKEN, SPECIAL_TOKENS, TURN_END, TURN_START

TINY_TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "tokenizer")
# The `tokenizer_class` of a directory whose tokenizer is its `tokenizer.json` alone (evolver's own tokenizers and
# exports write the first; transformers 4 wrote the second).
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def load_tokenizer(path: str | None = None) -> PreTrainedTokenizerBase:
  """An HF tokenizer directory (default: the shipped tiny tokenizer), tokenizing as its `tokenizer.json` says. It
  must carry a chat template.

  transformers 5's AutoTokenizer builds the tokenizer of some model types (a directory whose config.json says
  qwen2 gets `Qwen2Tokenizer`) from the vocabulary and merges with that family's own normalizer and pre-tokenizer,
  whatever `tokenizer.json` holds. A tokenizer trained with others (the tiny one splits as GPT-2 does) would then
  cut text differently from how the policy was trained, so such a directory is loaded from `tokenizer.json` as
  saved (`PreTrainedTokenizerFast`). A directory that declares that class itself is loaded as such directly:
  AutoTokenizer would build the same tokenizer, after importing every model family's configuration (and torch,
  where it is installed: seconds at each process start).
  """
  path = path or TINY_TOKENIZER_DIR
  if not os.path.isdir(path):
    raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
  if _declared_class(path) in GENERIC_TOKENIZER_CLASSES and os.path.isfile(os.path.join(path, "tokenizer.json")):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
  else:
    from transformers import AutoTokenizer  # pylint: disable=import-outside-toplevel
    tokenizer = AutoTokenizer.from_pretrained(path)
  if not _tokenizes_as_saved(tokenizer, path):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(path)
  if not getattr(tokenizer, "chat_template", None):
    raise ValueError(f"tokenizer at {path!r} has no chat template; set one (tokenizer.chat_template = ...)")
  return tokenizer


def _declared_class(path: str) -> str | None:
  """The `tokenizer_class` that `path/tokenizer_config.json` names (None without one)."""
  config_file = os.path.join(path, "tokenizer_config.json")
  if not os.path.isfile(config_file):
    return None
  with open(config_file) as f:
    return json.load(f).get("tokenizer_class")


def _tokenizes_as_saved(tokenizer: PreTrainedTokenizerBase, path: str) -> bool:
  """Whether the loaded tokenizer's normalizer, pre-tokenizer and model are those of `path/tokenizer.json` (True
  when there is no such file or no fast backend to compare)."""
  saved_file = os.path.join(path, "tokenizer.json")
  backend = getattr(tokenizer, "backend_tokenizer", None)
  if backend is None or not os.path.isfile(saved_file):
    return True
  with open(saved_file) as f:
    saved = json.load(f)
  loaded = json.loads(backend.to_str())
  return all(saved.get(key) == loaded.get(key) for key in ("normalizer", "pre_tokenizer", "model"))


def train_tokenizer(texts: Iterable[str], vocab_size: int, out_dir: str) -> PreTrainedTokenizerFast:
  """Trains a byte-level BPE on `texts` and saves it in HF format with the ChatML template."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.post_processor = processors.ByteLevel(trim_offsets=False)
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS), min_frequency=2,
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(texts, trainer=trainer)
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=TURN_END, pad_token=PAD_TOKEN,
                                 additional_special_tokens=[TURN_START], clean_up_tokenization_spaces=False)
  fast.chat_template = CHATML_TEMPLATE
  fast.model_max_length = 4096
  os.makedirs(out_dir, exist_ok=True)
  fast.save_pretrained(out_dir)
  return fast
