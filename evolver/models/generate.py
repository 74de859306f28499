"""Generate adapters: the one way an LLM role calls a model. The roles are the experience summarizer
(`evolver.experience.summarizer.LLMSummarizer`), the llm step judge (`evolver.train.credit.AdcaAdvantages`) and the
LLM task proposer (`evolver.tasks.generate.generate_tasks`; in an RL run, `SyntheticTasks` of
`evolver.train.synthetic_tasks`); each takes a `Generate`, a callable

  generate(prompts: list[str]) -> list[str]      one reply per prompt, in order; each prompt is one user message

and any of three plays it:

  OpenAIGenerate      an OpenAI-compatible endpoint (`evolver.models.openai_api.OpenAIChat`: retries, backoff,
                      timeouts, a rate limit), prompts `max_workers` at a time. The API key is read from the
                      environment variable `api_key_env` names: a config holds the variable's name, never a key.
  CheckpointGenerate  another checkpoint, loaded once and sampled in process (`evolver.models.sampler.Sampler`).
  LivePolicyGenerate  the policy being trained, through the RL run's own sampler, between steps.

Each is gin-configurable under its class name; a role takes one under a scope of its own, e.g.

  AdcaAdvantages.generate = @judge/OpenAIGenerate()
  judge/OpenAIGenerate.base_url = 'http://127.0.0.1:8000/v1'
  judge/OpenAIGenerate.model = 'qwen2.5-7b-instruct'
  judge/OpenAIGenerate.api_key_env = 'OPENAI_API_KEY'     # the variable's name; unset or empty: an error naming it
  ExperienceManager.summarizer = @LLMSummarizer()
  LLMSummarizer.generate = @summarizer/LivePolicyGenerate()
  generate_tasks.llm = @proposer/CheckpointGenerate()
  proposer/CheckpointGenerate.load_policy = @init_policy
  proposer/CheckpointGenerate.hf_checkpoint = 'evolver/assets/checkpoints/bc_tiny'

The gin names are registered when this module is imported; every module that declares a `generate` parameter
(`evolver.train.credit`, `evolver.tasks.generate`, `evolver.experience.summarizer`) imports it for the `Generate`
type, so a config that can bind a role can also name its adapter.

The in-process adapters sample each prompt through the tokenizer's chat template (one user message, the generation
prompt) until an end-of-turn token or `max_new_tokens`, `batch_size` prompts at a time; a prompt whose tokens and
`max_new_tokens` do not fit the sampler's `max_length` gets "" (every role treats that as an unparseable reply).
A prompt's reply depends on the weights, the prompt, the adapter's `seed` and the sampling knobs only (its
randomness is keyed on the prompt's text: `prompt_keys`), never on what else is in the batch or on how many calls
came before, so a resumed run replies as an unbroken one. Temperature 0 (every adapter's default) is greedy.

The live policy. An RL run serves the weights it trains for as long as it runs:

  with generate_lib.live_policy(lambda: loop.engine):
    ...                                                  # ext.start, resume, loop.run, finish

(`evolver.train.rl.train_grpo` does the same with `serve_live_policy` right after `loop = Loop(..)`, stopping in
its `finally`.)

`provider()` returns anything with `.sampler` (a `Sampler`) and `.tokenizer` (a `LivePolicy`, or the loop's
`RolloutEngine`); it is called at every `LivePolicyGenerate` call. `loop.engine` holds the weights last put in by
`loop.sync_policy()`: during a step (the judge before the update, the summarizer during it, an in-run proposer
after it) those of the policy that sampled the step's rollouts, so replies do not depend on how far a concurrent
update has got; before the first step (`ExperienceManager.init_from`), the starting policy. `LivePolicyGenerate` raises `NoLivePolicy` when no
run serves one (a task-generation job, `init_experience_pool`, a test). The roles share the sampler with the
rollouts: role calls take turns (a lock), and the loop runs no rollout while one is in flight (the summarizer the
update overlaps is collected in `after_step`, before the next step's rollouts). `serve_live_policy` does the same
as the `with` for code that does not hold a block open.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import threading
import zlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import gin
import jax
import numpy as np
from transformers import PreTrainedTokenizerBase

from evolver.data.chat import end_of_turn_ids, render_chat
from evolver.models.decoder import Decoder
from evolver.models.openai_api import OpenAIChat, api_key_from_env
from evolver.models.sampler import Sampler, SamplingParams, fold_in_rows
from evolver.models.tokenizer import load_tokenizer

Generate = Callable[[list[str]], list[str]]
"""A batch of prompts (each one user message) -> one reply text per prompt, in order."""

LIVE_POLICY_MODEL = "live_policy"  # what `LivePolicyGenerate.model` (an LLM summary's author) says


class NoLivePolicy(RuntimeError):
  """`LivePolicyGenerate` was called while no RL run serves its weights (`live_policy`)."""


class LivePolicy(NamedTuple):
  """What a live-policy provider returns (the loop's `RolloutEngine` has the same two attributes)."""

  sampler: Sampler
  tokenizer: PreTrainedTokenizerBase


# ----------------------------------------------------------------------------------------------------------
# Sampling in process (another checkpoint, the live policy)
# ----------------------------------------------------------------------------------------------------------


def prompt_keys(prompts: Sequence[str], seed: int) -> np.ndarray:
  """Raw PRNG keys `[len(prompts), K]` uint32, one per prompt: `PRNGKey(seed)` folded with the prompt's CRC-32,
  then with how many copies of it came earlier in `prompts` (so copies differ at temperature > 0)."""
  copies: collections.Counter[str] = collections.Counter()
  digests, occurrences = [], []
  for prompt in prompts:
    digests.append(zlib.crc32(prompt.encode("utf-8")))
    occurrences.append(copies[prompt])
    copies[prompt] += 1
  base = np.asarray(jax.random.key_data(jax.random.PRNGKey(seed)), np.uint32)
  keys = np.broadcast_to(base, (len(prompts), *base.shape))
  return fold_in_rows(fold_in_rows(keys, digests), occurrences)


def user_prompt_tokens(tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str]) -> list[list[int]]:
  """Each prompt as one user message through the chat template, with the generation prompt, as token ids (as
  `evolver.rollout.turns.prompt_tokens` renders an opening; that layer sits above this one)."""
  texts = [render_chat(tokenizer, [{"role": "user", "content": p}], add_generation_prompt=True) for p in prompts]
  return [list(ids) for ids in tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]]


def sample_replies(sampler: Sampler, tokenizer: PreTrainedTokenizerBase, prompts: Sequence[str],
                   params: SamplingParams, *, batch_size: int, seed: int) -> list[str]:
  """One reply per prompt (module docstring): sampled `batch_size` prompts per `sampler.generate` call, decoded
  without the stop token and special tokens; "" for a prompt that does not fit `sampler.max_length`."""
  if not prompts:
    return []
  tokens = user_prompt_tokens(tokenizer, prompts)
  keys = prompt_keys(prompts, seed)
  replies = [""] * len(prompts)
  rows = [i for i, ids in enumerate(tokens) if len(ids) + params.max_new_tokens <= sampler.max_length]
  for first in range(0, len(rows), batch_size):
    chunk = rows[first:first + batch_size]
    out = sampler.generate([tokens[i] for i in chunk], params, seed=keys[chunk])
    for i, sampled, stopped in zip(chunk, out.tokens, out.stopped):
      replies[i] = tokenizer.decode(sampled[:-1] if stopped else sampled, skip_special_tokens=True)
  return replies


def _sampling_params(tokenizer: PreTrainedTokenizerBase, max_new_tokens: int, temperature: float,
                     top_p: float) -> SamplingParams:
  return SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        stop_ids=end_of_turn_ids(tokenizer))


def _check_batch_size(batch_size: int) -> None:
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")


@gin.configurable
class CheckpointGenerate:
  """Another checkpoint plays the role: loaded once, here, and sampled in process (module docstring).

  Args:
    load_policy: `(init_checkpoint=, hf_checkpoint=) -> Decoder`; gin: `@init_policy` (`evolver.train.trainer`,
      which this layer does not import).
    init_checkpoint: an evolver run's MODEL_DIR (its val-selected policy, else its latest), or
    hf_checkpoint: a transformers checkpoint directory; exactly one of them.
    tokenizer_path: the checkpoint's tokenizer (None: the shipped tiny one).
    max_new_tokens, temperature, top_p: sampling; temperature 0 is greedy.
    batch_size: prompts per sampler call.
    seed: the sampling randomness (`prompt_keys`).
    max_length: the sampler's cache in tokens per row, prompt and reply (None: the model's positions, at most
      `evolver.models.sampler.DEFAULT_MAX_LENGTH`).
  """

  def __init__(self, *, load_policy: Callable[..., Decoder], init_checkpoint: str | None = None,
               hf_checkpoint: str | None = None, tokenizer_path: str | None = None, max_new_tokens: int = 512,
               temperature: float = 0.0, top_p: float = 1.0, batch_size: int = 16, seed: int = 0,
               max_length: int | None = None):
    if bool(init_checkpoint) == bool(hf_checkpoint):
      raise ValueError("CheckpointGenerate plays a role with a saved policy: give init_checkpoint (an evolver run's "
                       "MODEL_DIR) or hf_checkpoint (a transformers directory), exactly one; for the weights being "
                       "trained use LivePolicyGenerate")
    _check_batch_size(batch_size)
    self.model = init_checkpoint or hf_checkpoint
    self.tokenizer = load_tokenizer(tokenizer_path)
    self.sampler = Sampler(load_policy(init_checkpoint=init_checkpoint, hf_checkpoint=hf_checkpoint),
                           max_length=max_length)
    self.params = _sampling_params(self.tokenizer, max_new_tokens, temperature, top_p)
    self.batch_size = batch_size
    self.seed = seed

  def __call__(self, prompts: list[str]) -> list[str]:
    return sample_replies(self.sampler, self.tokenizer, list(prompts), self.params, batch_size=self.batch_size,
                          seed=self.seed)


# ----------------------------------------------------------------------------------------------------------
# The live policy
# ----------------------------------------------------------------------------------------------------------

_served: Callable[[], Any] | None = None  # the provider of the run serving its weights (module docstring)
_served_lock = threading.Lock()           # guards `_served`
_sampling_lock = threading.Lock()         # role calls on the live sampler take turns


def serve_live_policy(provider: Callable[[], Any]) -> Callable[[], None]:
  """Serves `provider` (module docstring) to `LivePolicyGenerate` until the returned function is called (once or
  more). One live policy per process: serving a second while one is served raises RuntimeError."""
  global _served
  if not callable(provider):
    raise TypeError(f"a live policy's provider is a function returning its sampler and tokenizer (e.g. "
                    f"`lambda: loop.engine`), got {type(provider).__name__}")
  with _served_lock:
    if _served is not None:
      raise RuntimeError("a live policy is already being served in this process: one RL run at a time")
    _served = provider

  def stop() -> None:
    global _served
    with _served_lock:
      if _served is provider:
        _served = None

  return stop


@contextlib.contextmanager
def live_policy(provider: Callable[[], Any]) -> Iterator[None]:
  """`LivePolicyGenerate` samples from `provider()` while the block runs (module docstring for the wiring)."""
  stop = serve_live_policy(provider)
  try:
    yield
  finally:
    stop()


def current_live_policy() -> LivePolicy:
  """The served policy's sampler and tokenizer, as `provider()` gives them now. Raises NoLivePolicy when none is
  served, TypeError when the provider returns something without `.sampler` and `.tokenizer`."""
  provider = _served
  if provider is None:
    raise NoLivePolicy("LivePolicyGenerate plays a role with the weights being trained, which only a running RL "
                       "loop serves (evolver.train.rl.train_grpo, `with live_policy(...)`); here none is served: "
                       "use CheckpointGenerate (a saved checkpoint) or OpenAIGenerate (an endpoint) instead")
  policy = provider()
  sampler, tokenizer = getattr(policy, "sampler", None), getattr(policy, "tokenizer", None)
  if not isinstance(sampler, Sampler) or tokenizer is None:
    raise TypeError(f"the live policy's provider returned a {type(policy).__name__}; it must have .sampler (a "
                    "Sampler) and .tokenizer, as a LivePolicy or the loop's RolloutEngine has")
  return LivePolicy(sampler, tokenizer)


@gin.configurable
class LivePolicyGenerate:
  """The policy being trained plays the role, through the RL run's sampler (module docstring). Built anywhere;
  called only while a run serves its policy (else NoLivePolicy).

  Args:
    max_new_tokens, temperature, top_p: sampling; temperature 0 is greedy.
    batch_size: prompts per sampler call.
    seed: the sampling randomness (`prompt_keys`).
  """

  model = LIVE_POLICY_MODEL

  def __init__(self, *, max_new_tokens: int = 512, temperature: float = 0.0, top_p: float = 1.0,
               batch_size: int = 16, seed: int = 0):
    _check_batch_size(batch_size)
    SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p)  # checks the knobs now
    self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
    self.batch_size = batch_size
    self.seed = seed

  def __call__(self, prompts: list[str]) -> list[str]:
    policy = current_live_policy()
    params = _sampling_params(policy.tokenizer, self.max_new_tokens, self.temperature, self.top_p)
    with _sampling_lock:
      return sample_replies(policy.sampler, policy.tokenizer, list(prompts), params, batch_size=self.batch_size,
                            seed=self.seed)


# ----------------------------------------------------------------------------------------------------------
# An OpenAI-compatible endpoint
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
class OpenAIGenerate:
  """An OpenAI-compatible endpoint plays the role: each prompt one user message to `{base_url}/chat/completions`,
  `max_workers` prompts in flight. A failure that outlasts the client's retries raises its
  `evolver.models.openai_api.APIError` (the server's message; never the key).

    generate = OpenAIGenerate("http://127.0.0.1:8000/v1", "qwen2.5-7b-instruct", api_key_env="OPENAI_API_KEY")

  Args:
    base_url: the API root, e.g. "http://127.0.0.1:8000/v1".
    model: the model the endpoint serves.
    api_key_env: the environment variable holding the key, read here (None: no key, e.g. a local server). An
      unset or empty variable is a ValueError that names it.
    max_new_tokens: the reply's limit (the request's `max_tokens`; None: the server's default).
    temperature: 0 is greedy.
    seed: sent for reproducible sampling where the server supports it (None: not sent).
    timeout_s, max_retries, backoff_s, requests_per_s: the client's (`OpenAIChat`).
    max_workers: requests in flight at once.
  """

  def __init__(self, base_url: str, model: str, *, api_key_env: str | None = None, max_new_tokens: int | None = 1024,
               temperature: float = 0.0, seed: int | None = None, timeout_s: float = 120.0, max_retries: int = 3,
               backoff_s: float = 1.0, requests_per_s: float | None = None, max_workers: int = 4):
    if max_workers < 1:
      raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    self.client = OpenAIChat(base_url, model, api_key_from_env(api_key_env), timeout_s=timeout_s,
                             max_retries=max_retries, backoff_s=backoff_s, requests_per_s=requests_per_s)
    self.url = self.client.url
    self.model = model
    self.api_key_env = api_key_env
    self.max_new_tokens = max_new_tokens
    self.temperature = temperature
    self.seed = seed
    self.max_workers = max_workers

  def _one(self, prompt: str) -> str:
    return self.client.chat([{"role": "user", "content": prompt}], max_tokens=self.max_new_tokens,
                            temperature=self.temperature, seed=self.seed).text

  def __call__(self, prompts: list[str]) -> list[str]:
    prompts = list(prompts)
    if len(prompts) <= 1:
      return [self._one(p) for p in prompts]
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(self.max_workers, len(prompts))) as workers:
      return list(workers.map(self._one, prompts))
