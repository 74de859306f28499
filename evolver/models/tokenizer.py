"""Tokenizers: any HF tokenizer directory through transformers, the chat template, and the shipped tiny one.

The tiny default's tokenizer (`evolver/assets/tokenizer`) is a byte-level BPE trained with `tokenizers` on
the built-in environments' text (`python -m launch.build_tokenizer`) and saved in HF format with a ChatML
template, so the tiny model and real checkpoints load through the same path.
"""

import os
from collections.abc import Iterable, Sequence

from transformers import AutoTokenizer, PreTrainedTokenizerBase, PreTrainedTokenizerFast

TINY_TOKENIZER_DIR = os.path.join(os.path.dirname(os.path.dirname(__file__)), "assets", "tokenizer")

PAD_TOKEN = "<|endoftext|>"
TURN_START = "<|im_start|>"
TURN_END = "<|im_end|>"  # End of every turn: the sampler stops on it and training puts it under the loss mask.
SPECIAL_TOKENS = (PAD_TOKEN, TURN_START, TURN_END)

# ChatML, as Qwen2 uses it (without Qwen's default system prompt).
CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def load_tokenizer(path: str | None = None) -> PreTrainedTokenizerBase:
  """An HF tokenizer directory (default: the shipped tiny tokenizer). It must carry a chat template."""
  path = path or TINY_TOKENIZER_DIR
  if not os.path.isdir(path):
    raise FileNotFoundError(f"tokenizer directory {path!r} does not exist")
  tokenizer = AutoTokenizer.from_pretrained(path)
  if not getattr(tokenizer, "chat_template", None):
    raise ValueError(f"tokenizer at {path!r} has no chat template; set one (tokenizer.chat_template = ...)")
  return tokenizer


def end_of_turn_ids(tokenizer: PreTrainedTokenizerBase) -> tuple[int, ...]:
  """Token ids that end an assistant turn: the template's end-of-turn token and EOS."""
  ids = set()
  for token in (TURN_END, "<|eot_id|>", tokenizer.eos_token):
    if token is None:
      continue
    token_id = tokenizer.convert_tokens_to_ids(token)
    if token_id is not None and token_id != tokenizer.unk_token_id:
      ids.add(int(token_id))
  if not ids:
    raise ValueError("the tokenizer has no end-of-turn or EOS token to stop generation on")
  return tuple(sorted(ids))


def render_chat(tokenizer: PreTrainedTokenizerBase, messages: Sequence[dict[str, str]],
                add_generation_prompt: bool = False) -> str:
  """The conversation as text through the tokenizer's chat template."""
  return tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=add_generation_prompt)


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
