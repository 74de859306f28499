"""Multi-turn rollouts: many episodes across environments at once, the policy's KV cache kept across turns.

  from evolver import models
  from evolver.models.sampler import Sampler
  from evolver.models.tokenizer import load_tokenizer
  from evolver.rollout import RolloutConfig, RolloutEngine, Task

  tok = load_tokenizer()
  model = models.make_model(models.ModelConfig(vocab_size=2432, hidden_size=64, num_layers=2, num_heads=4,
                                               num_kv_heads=2, intermediate_size=128))
  with RolloutEngine(Sampler(model), tok) as engine:
    out = engine.run([Task("maze", 0, "eval"), Task("wordle", 3, "eval")],
                     RolloutConfig(max_new_tokens=32, max_rounds=3, temperature=1.0, num_samples=2))
  for t in out.trajectories:
    print(t.item_id, t.group, t.sample, t.turns, t.reward, t.success, t.finish_reason)

An episode follows AgentGym: [user: env.instruction(), assistant: "Ok." (given, not sampled), user:
env.reset(index, split)], then sample an assistant turn (stopping on the end-of-turn ids), `env.step(text)`,
append the observation as the next user turn, until the env says done, `max_rounds`, or the context limit.

Every episode in flight is one row of the sampler's batch, its KV cache kept across turns: the first turn
prefills the rendered prompt, later turns feed only what the chat template adds after the sampled end-of-turn
token (the observation turn and the next generation prompt, `evolver.rollout.turns`). Two schedules
(`RolloutConfig.schedule`), the same episodes either way:
- "continuous" (the default): rows decode independently (`Sampler.open_slots`). Whenever an eighth of the rows
  in play have finished their turn, those turns are collected, their envs stepped and their next turns begun at
  once, while the other rows are anywhere in theirs: no row waits for the longest turn of the batch. When the
  rows in play fall to a quarter of the batch, they move to a smaller one (`Sampler.repack_slots`).
- "turns": every live episode samples its turn in one `Sampler.generate` call, and the next turn starts when the
  longest one has finished; finished episodes leave the batch (`Sampler.select`).
The env calls run on a thread pool (they overlap for `RemoteEnv`s); an env that raises (or a `RemoteEnv` that
reports an unrecoverable server error) fails its own trajectory and the batch goes on.

Decisions worth knowing:
- `token_ids` are the conversation *as the policy saw it*: the prompt, the sampled tokens (not a
  re-tokenization of their text) and the template/observation tokens in between, ending with the last
  sampled token. The observation that follows the last turn is in `messages` but never reached the policy,
  so it is not in `token_ids`. `loss_mask` is 1 exactly on sampled tokens (the end-of-turn token included);
  `logprobs` are the sampler's (behaviour policy, temperature 1, no truncation) there and 0 elsewhere.
- A turn that hits `max_new_tokens` without an end-of-turn token (a *cut* turn) is, by default
  (`cut_turn="continue"`), sent to the env as it is, like AgentGym's controller does; the end-of-turn token
  is then fed as a given token (loss_mask 0) so the history stays the template's. `cut_turn="end"` ends the
  episode there instead, marked truncated, without stepping the env.
- The context limit is checked before each turn: when the history, the new tokens and a full
  `max_new_tokens` turn would not fit in `max_context_tokens`, the episode ends, marked truncated. An episode
  whose opening alone leaves no room for its first turn (e.g. too much experience added to it) never started:
  it ends as "opening", counted as failed (left out of scores, groups and rates) and in `opening_too_long`, not
  scored as a failure of the policy.
- The cache holds exactly each row's tokens (no padding), so `max_context_tokens` may be as large as the
  sampler's `max_length`.

Extension points for RL loops:
- Per-episode randomness. An episode's key is `PRNGKey(config.seed)` folded with a stable 32-bit hash of the
  task's identity (`Task.key()`: env, split, index, or the spec's key; zlib.crc32), the occurrence of that task
  in the `tasks` list (two copies of a task in one call are different episodes) and the sample index; turn k
  samples with row key `fold_in(episode_key, k)` (and the sampler draws position t with `fold_in(row_key, t)`).
  So an episode is the same whatever else is in the batch, however `batch_size` chunks the work and however
  many hosts split the tasks between them. Loops vary `config.seed` per step (e.g. from run seed and RL step).
- Tasks as specs: `Task.from_spec(spec)` runs an `evolver.envs.base.TaskSpec` through `env.reset_spec(spec)`;
  its rollouts carry `item_id = spec.item_id` and the spec's JSON in `task_spec`.
- Opening transform: `run(..., transform_openings=f)` calls `f([EpisodeOpening(task, sample, opening), ...])` once
  per chunk, with every started episode (each sample of a task separately, so a batched retrieval serves them
  all); an `OpeningChange` replaces the opening the policy sees (e.g. experience in some of a task's samples)
  and the rollout records the `base_opening` and what was `added`. `strip_added` (`evolver.rollout.strip`) later
  re-renders the base opening in front of the sampled turns and flags the rollout `experience["exp_mask"] = 1`
  (HET-PPO's off-policy tokens).
- Per-turn records, one per sampled turn: `turn_spans`, `step_rewards`, `state_keys` (the env's
  `state_key()` right before the step, in the same env-thread call; the observation the action answered for
  envs without one) and, with `record_expert_actions`, `expert_actions` (`env.expert_action()` at that state;
  None where it raises) and, with `record_measures`, `step_measures` (`env.measures()` right before and right
  after the step: the step judges' cost to go and progress, `evolver.credit.judges`). A turn that ends the
  episode without stepping the env (`cut_turn="end"`, or out of context mid-turn) still records its state (and
  expert action; its "after" measures are its "before"), and its step reward is the unchanged score.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import time
import warnings
import zlib
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import gin
import jax
import numpy as np
from transformers import PreTrainedTokenizerBase

from evolver import distributed
from evolver import envs as envs_lib
from evolver.data.chat import end_of_turn_ids
from evolver.data.trajectory import Message, Trajectory
from evolver.envs.base import TaskSpec
from evolver.models.decoder import Decoder
from evolver.models.sampler import Sampler, SamplerStats, SamplingParams, fold_in_rows
from evolver.rollout import turns as turns_lib

FINISH_REASONS = ("done", "max_rounds", "context", "cut_turn", "error", "opening")
UNSCORED_REASONS = ("error", "opening")  # an env error; an opening with no room for a first turn
SCHEDULES = ("continuous", "turns")
# The continuous schedule collects finished turns once this share of the rows in play has finished (at least
# one): more often means more, smaller prefills and env batches; less often, finished rows idling longer. On 32
# episodes of the CPU recipe (BC policy, temperature 1) an eighth took 674 decode steps and 27.5 s, a quarter 695
# and 29.8 s; repacking at a half instead of a quarter saved no time.
_COLLECT_SHARE = 0.125


@dataclasses.dataclass(frozen=True)
class Task:
  """One environment task: `env` names what `env_factory` builds; `index` into its `split` ("train" or "eval").

  A task given as a spec (`Task.from_spec`) runs through `env.reset_spec(spec)`; its `env`, `index` and `split`
  are the spec's env, world and split.
  """

  env: str
  index: int
  split: str = "train"
  spec: TaskSpec | None = None

  def __post_init__(self):
    if self.spec is None:
      return
    if not isinstance(self.spec, TaskSpec):
      raise TypeError(f"Task.spec must be an evolver.envs.base.TaskSpec, got {type(self.spec).__name__}")
    if (self.env, self.index, self.split) != (self.spec.env, self.spec.world, self.spec.split):
      raise ValueError(f"a spec task's env/index/split ({self.env!r}, {self.index}, {self.split!r}) must be its "
                       f"spec's env/world/split ({self.spec.env!r}, {self.spec.world}, {self.spec.split!r}); "
                       "use Task.from_spec(spec)")

  @classmethod
  def from_spec(cls, spec: TaskSpec) -> "Task":
    """The task that runs `spec` (env = spec.env, index = spec.world, split = spec.split)."""
    if not isinstance(spec, TaskSpec):
      raise TypeError(f"Task.from_spec needs an evolver.envs.base.TaskSpec, got {type(spec).__name__}")
    return cls(spec.env, spec.world, spec.split, spec)

  def key(self) -> str:
    """The task's identity as text: the spec's canonical key, or "env/split/index"."""
    return self.spec.key() if self.spec is not None else f"{self.env}/{self.split}/{self.index}"

  @property
  def item_id(self) -> str:
    """The id of this task's episodes: the spec's `item_id`, or "<env>_<index>"."""
    return self.spec.item_id if self.spec is not None else f"{self.env}_{self.index}"


def task_hash(task: Task) -> int:
  """A process-independent 32-bit hash of the task's identity (zlib.crc32 of `task.key()`; Python's `hash` is
  salted per process)."""
  return zlib.crc32(task.key().encode("utf-8"))


def episode_keys(seed: int, tasks: Sequence[Task], occurrences: Sequence[int], samples: Sequence[int]) -> np.ndarray:
  """The raw key `[N, K]` uint32 of each episode: `PRNGKey(seed)` folded with `task_hash(task)`, then the task's
  occurrence in its `tasks` list, then the sample index. Depends on nothing else (not the batch, not the host)."""
  if not len(tasks) == len(occurrences) == len(samples):
    raise ValueError(f"got {len(tasks)} tasks, {len(occurrences)} occurrences and {len(samples)} samples")
  seed_key = np.asarray(jax.random.key_data(jax.random.PRNGKey(seed)), np.uint32)
  keys = np.broadcast_to(seed_key, (len(tasks), *seed_key.shape))
  keys = fold_in_rows(keys, [task_hash(t) for t in tasks])
  keys = fold_in_rows(keys, occurrences)
  return fold_in_rows(keys, samples)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class RolloutConfig:
  """How to roll out. temperature 0 = greedy; top_k 0 and top_p 1 disable those filters.

  max_new_tokens: per assistant turn. max_rounds: assistant turns per episode (None: each env's own
  `max_rounds`; the env also ends the episode at its own limit). max_context_tokens: the policy's context in
  tokens (None: as much as the sampler's cache allows, see `RolloutEngine.context_limit`). num_samples:
  rollouts per task (one group). batch_size: episodes in flight at once (more are run in chunks).
  reuse_cache: False re-prefills the whole history every turn (same results, slower: the reference the cached
  path is tested and benchmarked against). cut_turn: "continue" | "end", what a turn that hits
  max_new_tokens without an end-of-turn token does (module docstring). seed: sampling randomness; each
  episode's key derives from it, the task and the sample index (module docstring), so RL loops set it per step.
  record_expert_actions: also record `env.expert_action()` at every sampled turn's state (`Rollout.expert_actions`).
  record_measures: also record `env.measures()` before and after every sampled turn's step
  (`Rollout.step_measures`; envs without `measures()` record None for both).
  compact_rows: True drops the rows of ended episodes from the batch (`Sampler.select`, `Sampler.repack_slots`:
  later turns decode fewer rows, at the price of a program per batch size); False keeps the batch's shape, the
  ended episodes' rows taking no part (fewer programs to compile, more rows per decode step).
  schedule: "continuous" | "turns" (module docstring); reuse_cache=False always runs "turns".
  across_processes: in a multi-process run (`evolver.distributed`), each process rolls out its share of the
  task groups on its own envs and every process gets all the trajectories back; False: each process rolls out
  all of them itself. No effect with one process.
  Episodes are the same whatever the schedule, the batch and its compaction, and the number of processes.
  """

  max_new_tokens: int = 128
  temperature: float = 0.0
  top_k: int = 0
  top_p: float = 1.0
  max_rounds: int | None = None
  max_context_tokens: int | None = None
  num_samples: int = 1
  batch_size: int = 64
  reuse_cache: bool = True
  cut_turn: str = "continue"
  seed: int = 0
  record_expert_actions: bool = False
  record_measures: bool = False
  compact_rows: bool = True
  schedule: str = "continuous"
  across_processes: bool = True

  def __post_init__(self):
    if self.num_samples < 1:
      raise ValueError(f"num_samples must be >= 1, got {self.num_samples}")
    if self.batch_size < 1:
      raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
    if self.max_rounds is not None and self.max_rounds < 1:
      raise ValueError(f"max_rounds must be >= 1 or None, got {self.max_rounds}")
    if self.cut_turn not in ("continue", "end"):
      raise ValueError(f"cut_turn must be 'continue' or 'end', got {self.cut_turn!r}")
    if self.schedule not in SCHEDULES:
      raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
    SamplingParams(max_new_tokens=self.max_new_tokens, temperature=self.temperature, top_k=self.top_k,
                   top_p=self.top_p)  # validates the sampling knobs


@dataclasses.dataclass
class Rollout(Trajectory):
  """A trajectory from the engine, with what RL and evaluation need beyond `Trajectory`.

  `Trajectory.num_turns` counts every assistant message, the given "Ok." included; `turns` counts the
  sampled ones. The per-turn lists (`turn_spans`, `step_rewards`, `state_keys`, `expert_actions` when
  recorded) have one entry per sampled turn for episodes that did not fail.
  """

  group: int = -1            # position of the task in the list given to `run`: a task's samples share it
  sample: int = 0            # which of the task's `num_samples`
  turns: int = 0             # sampled assistant turns
  finish_reason: str = ""    # one of FINISH_REASONS
  truncated: bool = False    # ended by the context limit or a cut turn (cut_turn="end"), not by the env
  cut_turns: int = 0         # turns that hit max_new_tokens without an end-of-turn token
  # [start, stop) of each sampled turn in token_ids (step-level credit broadcasts over these).
  turn_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
  # The env's reward after each step (the unchanged score for a last turn that ended without a step).
  step_rewards: list[float] = dataclasses.field(default_factory=list)
  # The key of the state each sampled turn's action was taken in (`env.state_key()`, else that observation).
  state_keys: list[str] = dataclasses.field(default_factory=list)
  # `env.expert_action()` at each of those states (None where it raised); None when not recorded.
  expert_actions: list[str | None] | None = None
  # {"before": env.measures(), "after": env.measures()} around each of those steps (values None where the env
  # has no measure); None when not recorded.
  step_measures: list[dict[str, dict[str, Any]]] | None = None
  opening_len: int = 0       # messages of the opening as the policy saw it
  prompt_len: int = 0        # tokens of the first prompt (the opening rendered with the generation prompt)
  base_opening: list[Message] | None = None  # the opening before `transform_openings` changed it; None if unchanged
  added: dict[str, Any] = dataclasses.field(default_factory=dict)  # what the transform added; {} if unchanged


@dataclasses.dataclass
class RolloutStats:
  """Counters and timings (seconds) of one `run`."""

  episodes: int = 0
  failed: int = 0
  opening_too_long: int = 0  # of the failed: openings that left no room for a first turn (finish_reason "opening")
  generate_calls: int = 0
  rows_generated: int = 0    # live rows summed over generate calls
  select_calls: int = 0      # times finished rows left the batch
  rows_dropped: int = 0
  prefill_tokens: int = 0    # tokens fed to the model (prompts, new turns, pending tokens)
  sampled_tokens: int = 0
  expert_errors: int = 0     # turns whose `env.expert_action()` raised (record_expert_actions)
  measure_errors: int = 0    # turns whose `env.measures()` raised (record_measures)
  measure_s: float = 0.0     # env threads' time in `env.measures()`, summed over turns (record_measures)
  generate_s: float = 0.0
  env_s: float = 0.0
  template_s: float = 0.0    # rendering and tokenizing
  total_s: float = 0.0
  # Inside generate (the sampler's `SamplerStats` over this run): prefill, decode steps and row
  # selection, each without the compilation that happened inside it; decode row-steps of the padded batch and
  # those whose row sampled a token.
  prefill_s: float = 0.0
  decode_s: float = 0.0
  select_s: float = 0.0
  compile_s: float = 0.0     # the sampler's tracing and compiling (not in the three above)
  compiles: int = 0
  decode_steps: int = 0
  decode_row_steps: int = 0
  decode_live_row_steps: int = 0

  @property
  def episodes_per_s(self) -> float:
    return self.episodes / self.total_s if self.total_s else 0.0

  @property
  def idle_row_fraction(self) -> float:
    """The share of decode row-steps whose row sampled nothing (finished, waiting, or padding)."""
    return 1.0 - self.decode_live_row_steps / self.decode_row_steps if self.decode_row_steps else 0.0

  def add_sampler_stats(self, work: SamplerStats) -> None:
    """Adds the sampler's work (`SamplerStats.minus` over this run)."""
    self.prefill_s += work.prefill_s
    self.decode_s += work.decode_s
    self.select_s += work.select_s
    self.compile_s += work.compile_s
    self.compiles += work.compiles
    self.decode_steps += work.decode_steps
    self.decode_row_steps += work.decode_row_steps
    self.decode_live_row_steps += work.decode_live_row_steps

  @classmethod
  def combined(cls, parts: Sequence["RolloutStats"]) -> "RolloutStats":
    """The processes' stats of one multi-process run as one: counts summed, seconds the longest (the run waits
    for its slowest process)."""
    return cls(**{f.name: (max if isinstance(f.default, float) else sum)(getattr(p, f.name) for p in parts)
                  for f in dataclasses.fields(cls)})

  def as_dict(self) -> dict[str, float]:
    out = dataclasses.asdict(self)
    out["episodes_per_s"] = self.episodes_per_s
    out["idle_row_fraction"] = self.idle_row_fraction
    return out


@dataclasses.dataclass
class RolloutBatch:
  trajectories: list[Rollout]  # in task order, a task's samples together; failed ones included (failed=True)
  stats: RolloutStats

  def completed(self) -> list[Rollout]:
    """The trajectories that did not fail: what training and success rates use."""
    return [t for t in self.trajectories if not t.failed]


Opening = Callable[[Task, str, str], list[Message]]


@dataclasses.dataclass
class OpeningChange:
  """What `transform_openings` gives to change an episode's opening: the opening the policy sees instead (it
  must end with a user message) and what was added, e.g. `{"experience": [...]}` (non-empty: it is recorded on
  the rollout and kept by `strip_added`)."""

  messages: list[Message]
  added: dict[str, Any]


class EpisodeOpening(NamedTuple):
  """What an opening transform sees of one episode: its task, which of the task's samples it is, and (a copy of)
  its opening messages."""

  task: Task
  sample: int
  messages: list[Message]


# A chunk's openings -> one OpeningChange or None each (batched: e.g. one retrieval for every episode of a step).
OpeningTransform = Callable[[list[EpisodeOpening]], "Sequence[OpeningChange | None]"]


def agentgym_opening(task: Task, instruction: str, observation: str) -> list[Message]:
  """AgentGym's conversation start: the instruction, the agent's given "Ok.", the task's first observation."""
  del task
  return [Message("user", instruction), Message("assistant", "Ok."), Message("user", observation)]


@dataclasses.dataclass
class _Episode:
  """Mutable state of one episode in flight."""

  task: Task
  group: int
  sample: int
  key: np.ndarray | None = None  # [K] uint32 raw episode key (None when greedy: nothing is drawn)
  env: Any = None
  env_version: str = ""
  max_rounds: int = 0
  messages: list[Message] = dataclasses.field(default_factory=list)
  tokens: list[int] = dataclasses.field(default_factory=list)
  mask: list[float] = dataclasses.field(default_factory=list)
  logprobs: list[float] = dataclasses.field(default_factory=list)
  next_tokens: list[int] = dataclasses.field(default_factory=list)  # fed before the next turn is sampled
  pending: int | None = None  # replaces the last sampled token as the cache's pending token (another stop id)
  turn_spans: list[tuple[int, int]] = dataclasses.field(default_factory=list)
  step_rewards: list[float] = dataclasses.field(default_factory=list)
  state_keys: list[str] = dataclasses.field(default_factory=list)
  expert_actions: list[str | None] = dataclasses.field(default_factory=list)
  step_measures: list[dict[str, dict[str, Any]]] = dataclasses.field(default_factory=list)
  observation: str = ""  # the env's latest observation (what the next action answers)
  opening_len: int = 0
  prompt_len: int = 0
  base_opening: list[Message] | None = None
  added: dict[str, Any] = dataclasses.field(default_factory=dict)
  reward: float = 0.0
  success: bool = False
  turns: int = 0
  cut_turns: int = 0
  finish_reason: str = ""
  truncated: bool = False
  error: str | None = None

  @property
  def ended(self) -> bool:
    return bool(self.finish_reason)

  def end(self, reason: str, error: str | None = None) -> None:
    self.finish_reason = reason
    self.truncated = reason in ("context", "cut_turn")
    self.error = error

  def feed(self, tokens: Sequence[int]) -> None:
    """Tokens the policy reads but did not sample."""
    self.tokens.extend(tokens)
    self.mask.extend([0.0] * len(tokens))
    self.logprobs.extend([0.0] * len(tokens))


class _Turns(NamedTuple):
  """Sampled turns of some episodes, in their order (what `_record_turns` reads of a `Generation`)."""

  tokens: list[list[int]]
  logprobs: list[np.ndarray]
  stopped: np.ndarray


# The continuous schedule repacks its rows into a smaller batch once no more than 1/_REPACK_FRACTION of them are in
# play, but not below _MIN_SLOT_ROWS rows (each batch size is programs to compile).
_REPACK_FRACTION = 4
_MIN_SLOT_ROWS = 8


def _describe(error: BaseException) -> str:
  return f"{type(error).__name__}: {error}"


class _NoResetSpec(TypeError):
  """A spec task's env has no `reset_spec`: a configuration error, raised from `run` (not an episode failure)."""


def _check_opening(messages: Any, what: str) -> None:
  if not isinstance(messages, list) or not messages or not all(isinstance(m, Message) for m in messages):
    raise ValueError(f"{what} must be a non-empty list of Message")
  if messages[-1].role != "user":
    raise ValueError(f"{what} must end with a user message, got {messages[-1].role!r}")


class RolloutEngine:
  """Runs batches of episodes with one policy (a `Sampler`) over environments built by `env_factory`.

  Envs are pooled per name and reused across chunks and calls (an env that failed is dropped); `close()`
  (or `with`) closes them. Not thread-safe: one `run` at a time.
  """

  def __init__(self, sampler: Sampler | Decoder, tokenizer: PreTrainedTokenizerBase, *,
               env_factory: Callable[[str], Any] = envs_lib.make, opening: Opening = agentgym_opening,
               env_threads: int = 16):
    """
    Args:
      sampler: the policy (a Decoder is wrapped in a default Sampler; keep one Sampler across calls so its
        compiled programs are reused, and swap weights with `sampler.update_params`).
      tokenizer: with a chat template that has the prefix property (`evolver.rollout.turns`).
      env_factory: env name -> a fresh env (anything with the Env interface: `evolver.envs.make`, or a
        `RemoteEnv` per name).
      opening: builds the first messages from (task, instruction, first observation); the last must be a user
        message. The default is AgentGym's; experience injection replaces it.
      env_threads: env calls in flight at once.
    """
    self.sampler = sampler if isinstance(sampler, Sampler) else Sampler(sampler)
    self.tokenizer = tokenizer
    self.env_factory = env_factory
    self.opening = opening
    self.stop_ids = end_of_turn_ids(tokenizer)
    self.turn_end_id = turns_lib.turn_end_id(tokenizer, self.stop_ids)
    if len(tokenizer) > self.sampler.config.vocab_size:
      raise ValueError(f"the tokenizer has {len(tokenizer)} tokens but the model's vocabulary is "
                       f"{self.sampler.config.vocab_size}: they do not belong together")
    self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=env_threads, thread_name_prefix="rollout-env")
    self._free_envs: dict[str, list[Any]] = {}
    self._warned_no_state_key: set[str] = set()

  # -- lifecycle ------------------------------------------------------------------------------------------

  def close(self) -> None:
    """Closes the pooled envs and stops the env threads."""
    for pool in self._free_envs.values():
      for env in pool:
        _close_env(env)
    self._free_envs.clear()
    self._pool.shutdown(wait=True)

  def __enter__(self) -> "RolloutEngine":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def context_limit(self) -> int:
    """The largest `max_context_tokens` the sampler's cache holds: its `max_length` (slots hold real tokens
    only)."""
    return self.sampler.max_length

  def precompile(self, config: RolloutConfig, tasks: int) -> int:
    """Compiles ahead of time every sampler program a continuous-schedule `run` of `tasks` tasks with `config`
    can meet (`Sampler.precompile_slots`), so that no later run of that size compiles. Returns the
    programs compiled (0 for the turns schedule, whose programs depend on what the episodes do)."""
    if config.schedule != "continuous" or not config.reuse_cache:
      return 0
    if config.across_processes:
      tasks = len(distributed.own_groups(tasks))  # this process's share
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                            top_k=config.top_k, top_p=config.top_p, stop_ids=self.stop_ids)
    return self.sampler.precompile_slots(min(config.batch_size, tasks * config.num_samples), params,
                                         min_rows=_MIN_SLOT_ROWS, repack_fraction=_REPACK_FRACTION)

  # -- the public entry point -----------------------------------------------------------------------------

  def run(self, tasks: Sequence[Task], config: RolloutConfig | None = None, *,
          transform_openings: OpeningTransform | None = None,
          progress: Callable[[int], None] | None = None) -> RolloutBatch:
    """Rolls out `config.num_samples` episodes per task, `config.batch_size` at a time.

    Args:
      tasks: what to roll out; an episode's randomness depends on its task (and the task's occurrence in this
        list), its sample index and `config.seed` only (module docstring).
      config: how (default `RolloutConfig()`).
      transform_openings: called on the main thread once per chunk with an `EpisodeOpening` (task, sample, a
        copy of the opening the constructor's `opening` built) for every episode that started; returns one
        `OpeningChange` (to replace that opening) or None (to keep it) per episode, in order.
      progress: called with how many more of this process's episodes have ended, after each turn's env steps
        and after each chunk (the calls add up to its episode count), e.g. a progress bar's `update`.

    Returns:
      The trajectories in task order (a task's samples together, `group` = the task's position in `tasks`) and
      the run's counters. In a multi-process run (`config.across_processes`), every process returns every
      trajectory, and the processes' counters summed (`RolloutStats.combined`).

    Raises:
      TypeError: a spec task's env has no `reset_spec`.
    """
    config = config or RolloutConfig()
    limit = config.max_context_tokens or self.context_limit
    if limit > self.context_limit:
      raise ValueError(f"max_context_tokens {limit} exceeds what the sampler's cache holds ({self.context_limit} "
                       f"= its max_length); raise the "
                       "Sampler's max_length")
    if config.max_new_tokens >= limit:
      raise ValueError(f"max_new_tokens {config.max_new_tokens} leaves no room for a prompt in {limit} tokens")
    stats = RolloutStats()
    start = time.perf_counter()
    sampler_before = dataclasses.replace(self.sampler.stats)
    for task in tasks:
      if not isinstance(task, Task):
        raise TypeError(f"tasks must be Task instances, got {type(task).__name__}")
    seen: collections.Counter[str] = collections.Counter()
    specs = []  # (task, group, occurrence, sample)
    for group, task in enumerate(tasks):
      identity = task.key()
      specs.extend((task, group, seen[identity], sample) for sample in range(config.num_samples))
      seen[identity] += 1
    keys = [None] * len(specs)
    if config.temperature > 0:  # greedy draws nothing
      keys = list(episode_keys(config.seed, [t for t, _, _, _ in specs], [o for _, _, o, _ in specs],
                               [s for _, _, _, s in specs]))
    own = None  # this process's groups, in a multi-process run
    if config.across_processes and distributed.process_count() > 1:
      own = set(distributed.own_groups(len(tasks)))
    episodes = [_Episode(task=t, group=g, sample=s, key=k) for (t, g, _, s), k in zip(specs, keys)
                if own is None or g in own]
    out: list[Rollout] = []
    reported = 0

    def report_ended() -> None:
      nonlocal reported
      if progress is None:
        return
      ended = sum(ep.ended for ep in episodes)
      if ended > reported:
        progress(ended - reported)
        reported = ended

    for first in range(0, len(episodes), config.batch_size):
      chunk = episodes[first:first + config.batch_size]
      if config.schedule == "continuous" and config.reuse_cache:
        self._run_chunk_continuous(chunk, config, limit, transform_openings, stats, report_ended)
      else:
        self._run_chunk(chunk, config, limit, transform_openings, stats, report_ended)
      report_ended()
      out.extend(_to_rollout(ep, config) for ep in chunk)
    stats.episodes = len(out)
    stats.failed = sum(t.failed for t in out)
    stats.opening_too_long = sum(t.finish_reason == "opening" for t in out)
    stats.add_sampler_stats(self.sampler.stats.minus(sampler_before))
    if own is not None:  # every process gets every trajectory, in the order one process would give them
      parts = distributed.allgather_objects((out, stats))
      out = distributed.sort_by_group([r for part, _ in parts for r in part])
      stats = RolloutStats.combined([s for _, s in parts])
    stats.total_s = time.perf_counter() - start
    return RolloutBatch(trajectories=out, stats=stats)

  # -- one chunk of episodes, turn by turn ----------------------------------------------------------------

  def _run_chunk(self, episodes: list[_Episode], config: RolloutConfig, limit: int,
                 transform_openings: OpeningTransform | None, stats: RolloutStats,
                 report_ended: Callable[[], None]) -> None:
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                            top_k=config.top_k, top_p=config.top_p, stop_ids=self.stop_ids)
    try:
      self._start(episodes, config, limit, transform_openings, stats)
      session, session_rows = None, []
      while live := [ep for ep in episodes if not ep.ended]:
        if not config.reuse_cache:
          session = None
        if session is not None and not config.compact_rows:
          rows = session_rows  # the batch keeps its shape: ended episodes stay, as rows that take no part
        else:
          rows = live
          # Rows whose episodes ended leave the cache; the survivors keep their order.
          if session is not None and len(live) < len(session_rows):
            keep = [i for i, ep in enumerate(session_rows) if not ep.ended]
            session = self.sampler.select(session, keep)
            stats.select_calls += 1
            stats.rows_dropped += len(session_rows) - len(keep)
        active = [not ep.ended for ep in rows]
        replaced = [(i, ep.pending) for i, ep in enumerate(rows) if not ep.ended and ep.pending is not None]
        if session is not None and replaced:
          session = self.sampler.set_pending(session, [i for i, _ in replaced], [t for _, t in replaced])
        for ep in live:
          ep.pending = None
        if session is None:
          # A fresh prefill of each whole history (the first turn's prompt, or every turn without reuse_cache).
          chunks = [ep.tokens + ep.next_tokens for ep in rows]
        else:  # the sampler prepends each active row's pending sampled token
          chunks = [ep.next_tokens if on else [] for ep, on in zip(rows, active)]
        stats.prefill_tokens += sum(len(c) for c in chunks) + (0 if session is None else len(live))
        t0 = time.perf_counter()
        seed = 0  # greedy: nothing is drawn
        if config.temperature > 0:  # turn k of an episode samples with fold_in(episode key, k)
          seed = fold_in_rows(np.stack([ep.key for ep in rows]), [ep.turns for ep in rows])
        gen = self.sampler.generate(chunks, params, seed=seed, session=session,
                                    active=None if all(active) else active)
        stats.generate_s += time.perf_counter() - t0
        stats.generate_calls += 1
        stats.rows_generated += len(live)
        session, session_rows = gen.session, rows
        if not all(active):
          taking = [i for i, on in enumerate(active) if on]
          gen = dataclasses.replace(gen, tokens=[gen.tokens[i] for i in taking],
                                    logprobs=[gen.logprobs[i] for i in taking], stopped=gen.stopped[taking])
        self._record_turns(live, gen, config, stats)
        self._step_envs(live, config, stats)
        self._prepare_next_turns([ep for ep in live if not ep.ended], config, limit, stats)
        report_ended()
    finally:
      self._release(episodes)  # also when something raises: failed envs are closed, the others pooled

  def _run_chunk_continuous(self, episodes: list[_Episode], config: RolloutConfig, limit: int,
                            transform_openings: OpeningTransform | None, stats: RolloutStats,
                            report_ended: Callable[[], None]) -> None:
    """The chunk's episodes as rows of `Sampler.open_slots`, each row's turns begun as soon as its previous turn
    has been collected and its env stepped (module docstring)."""
    params = SamplingParams(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                            top_k=config.top_k, top_p=config.top_p, stop_ids=self.stop_ids)
    try:
      self._start(episodes, config, limit, transform_openings, stats)
      live = [ep for ep in episodes if not ep.ended]
      if not live:
        return
      slots = self.sampler.open_slots(len(live), params)
      rows: list[_Episode | None] = live + [None] * (len(slots.open) - len(live))
      slots = self._begin_turns(slots, rows, list(range(len(live))), config, stats, first=True)
      while slots.open.any():
        t0 = time.perf_counter()
        slots, finished = self.sampler.decode_slots(slots, until=max(1, int(_COLLECT_SHARE * slots.open.sum())))
        stats.generate_s += time.perf_counter() - t0
        turned = [rows[turn.row] for turn in finished]
        self._record_turns(turned, _Turns(tokens=[t.tokens for t in finished],
                                          logprobs=[t.logprobs for t in finished],
                                          stopped=np.array([t.stopped for t in finished], bool)), config, stats)
        self._step_envs(turned, config, stats)
        self._prepare_next_turns([ep for ep in turned if not ep.ended], config, limit, stats)
        report_ended()
        for turn in finished:
          if rows[turn.row].ended:
            rows[turn.row] = None
        again = [turn.row for turn in finished if rows[turn.row] is not None]
        if again:
          slots = self._begin_turns(slots, rows, again, config, stats, first=False)
        in_play = [r for r, ep in enumerate(rows) if ep is not None]
        if (config.compact_rows and in_play and len(slots.open) > _MIN_SLOT_ROWS
            and len(in_play) <= len(slots.open) // _REPACK_FRACTION):
          slots = self.sampler.repack_slots(slots, in_play, min_rows=_MIN_SLOT_ROWS)
          stats.select_calls += 1
          stats.rows_dropped += len(rows) - len(slots.open)
          rows = [rows[r] for r in in_play] + [None] * (len(slots.open) - len(in_play))
    finally:
      self._release(episodes)  # also when something raises: failed envs are closed, the others pooled

  def _begin_turns(self, slots, rows: list["_Episode | None"], begin: list[int], config: RolloutConfig,
                   stats: RolloutStats, *, first: bool):
    """Begins the next turn of the episodes in rows `begin`: a first turn reads the prompt; a later one its
    pending token (the last in `tokens`: the sampled one, or the end-of-turn token standing in for it) and then
    what the template adds. Turn k of an episode samples with fold_in(episode key, k)."""
    eps = [rows[r] for r in begin]
    chunks = [ep.next_tokens if first else [ep.tokens[-1]] + ep.next_tokens for ep in eps]
    for ep in eps:
      ep.pending = None
    keys = None
    if config.temperature > 0:
      keys = fold_in_rows(np.stack([ep.key for ep in eps]), [ep.turns for ep in eps])
    stats.prefill_tokens += sum(len(c) for c in chunks)
    stats.generate_calls += 1
    stats.rows_generated += len(eps)
    t0 = time.perf_counter()
    slots = self.sampler.begin_turns(slots, begin, chunks, keys, new_rows=begin if first else ())
    stats.generate_s += time.perf_counter() - t0
    return slots

  def _start(self, episodes: list[_Episode], config: RolloutConfig, limit: int,
             transform_openings: OpeningTransform | None, stats: RolloutStats) -> None:
    """Acquires and resets an env per episode (in parallel), builds (and transforms) the openings, renders and
    tokenizes the first prompts."""

    open_episodes(episodes, config, self._pool, self._take_env, self.env_factory, self.opening, stats)
    if transform_openings is not None:
      self._transform_openings([ep for ep in episodes if not ep.ended], transform_openings)
    t0 = time.perf_counter()
    started = [ep for ep in episodes if not ep.ended]
    prompts = turns_lib.prompt_tokens(self.tokenizer, [[m.to_dict() for m in ep.messages] for ep in started])
    for ep, prompt in zip(started, prompts):
      ep.opening_len = len(ep.messages)
      ep.prompt_len = len(prompt)
      ep.next_tokens = prompt
      if len(prompt) + config.max_new_tokens > limit:
        ep.end("opening", f"the opening ({len(prompt)} tokens) leaves no room for a {config.max_new_tokens}-token "
                          f"turn in the context ({limit} tokens)")
    stats.template_s += time.perf_counter() - t0

  @staticmethod
  def _transform_openings(episodes: list[_Episode], transform_openings: OpeningTransform) -> None:
    """Applies the opening transform to a chunk's started episodes in one call (it gets copies of the openings,
    so it cannot alter the base)."""
    requests = [EpisodeOpening(ep.task, ep.sample, [dataclasses.replace(m) for m in ep.messages]) for ep in episodes]
    changes = list(transform_openings(requests))
    if len(changes) != len(episodes):
      raise ValueError(f"transform_openings returned {len(changes)} changes for {len(episodes)} openings")
    for ep, change in zip(episodes, changes):
      if change is None:
        continue
      what = f"transform_openings({ep.task.item_id}, sample {ep.sample})"
      if not isinstance(change, OpeningChange):
        raise TypeError(f"{what} must give an OpeningChange or None, got {type(change).__name__}")
      _check_opening(change.messages, f"the messages of {what}")
      if not isinstance(change.added, dict) or not change.added:
        raise ValueError(f"{what} gave an OpeningChange whose `added` is {change.added!r}: say what was added "
                         "(a non-empty dict, e.g. {'experience': [...]}), or give None to keep the opening")
      ep.base_opening = ep.messages
      ep.messages = list(change.messages)
      ep.added = dict(change.added)

  def _record_turns(self, live: list[_Episode], gen, config: RolloutConfig, stats: RolloutStats) -> None:
    """Appends each row's fed and sampled tokens and its assistant message."""
    for ep, tokens, logprobs, stopped in zip(live, gen.tokens, gen.logprobs, gen.stopped):
      ep.feed(ep.next_tokens)
      ep.next_tokens = []
      ep.turn_spans.append((len(ep.tokens), len(ep.tokens) + len(tokens)))
      ep.tokens.extend(tokens)
      ep.mask.extend([1.0] * len(tokens))
      ep.logprobs.extend(np.asarray(logprobs, np.float32).tolist())
      if stopped and tokens[-1] != self.turn_end_id:
        # It stopped on another stop id (e.g. EOS) than the template's end-of-turn token, which the rendered
        # history has there: that token stands in its place, given (not trained), in the tokens and the cache.
        ep.tokens[-1], ep.mask[-1], ep.logprobs[-1] = self.turn_end_id, 0.0, 0.0
        ep.pending = self.turn_end_id
      ep.turns += 1
      stats.sampled_tokens += len(tokens)
      content = tokens[:-1] if stopped else tokens
      ep.messages.append(Message("assistant", self.tokenizer.decode(content, skip_special_tokens=False,
                                                                    clean_up_tokenization_spaces=False)))
      if not stopped:
        ep.cut_turns += 1
        if len(tokens) < config.max_new_tokens:
          ep.end("context")  # the sampler ran out of cache slots mid-turn (not expected: the limit guards it)
        elif config.cut_turn == "end":
          ep.end("cut_turn")

  def _step_envs(self, episodes: list[_Episode], config: RolloutConfig, stats: RolloutStats) -> None:
    """Records each episode's state (and expert action), then steps its env on the last assistant turn, all in
    parallel, one env-thread call per episode. Episodes that the turn already ended (cut, out of context) are
    not stepped; their state is still recorded and their step reward is the unchanged score."""
    t0 = time.perf_counter()
    futures = []
    for ep in episodes:
      has_state_key = callable(getattr(ep.env, "state_key", None))
      if not has_state_key and ep.task.env not in self._warned_no_state_key:
        self._warned_no_state_key.add(ep.task.env)
        warnings.warn(f"env {ep.task.env!r} ({type(ep.env).__name__}) has no state_key(); its rollouts record "
                      "the observation each action answered as the action's state key", stacklevel=2)
      futures.append(self._pool.submit(_observe_and_step, ep.env, ep.messages[-1].content, not ep.ended,
                                       ep.observation if not has_state_key else None,
                                       config.record_expert_actions, config.record_measures))
    for ep, future in zip(episodes, futures):
      try:
        outcome = future.result()
      except Exception as error:  # pylint: disable=broad-except
        ep.end("error", _describe(error))
        continue
      _apply_step(ep, outcome, config, stats)
    stats.env_s += time.perf_counter() - t0

  def _prepare_next_turns(self, episodes: list[_Episode], config: RolloutConfig, limit: int,
                          stats: RolloutStats) -> None:
    """Computes the tokens each continuing episode feeds next; ends those whose next turn would not fit."""
    if not episodes:
      return
    t0 = time.perf_counter()
    chats = [[m.to_dict() for m in ep.messages[:-1]] for ep in episodes]
    new = [[ep.messages[-1].to_dict()] for ep in episodes]
    for ep, (closing, opening) in zip(episodes, turns_lib.next_turn_tokens(self.tokenizer, chats, new,
                                                                           self.stop_ids)):
      stopped = ep.tokens[-1] in self.stop_ids  # else the turn was cut and its end-of-turn token is given
      ep.next_tokens = (closing[1:] if stopped else closing) + opening
      if len(ep.tokens) + len(ep.next_tokens) + config.max_new_tokens > limit:
        ep.end("context")
    stats.template_s += time.perf_counter() - t0

  # -- env pool -------------------------------------------------------------------------------------------

  def _take_env(self, name: str) -> Any:
    pool = self._free_envs.get(name)
    return pool.pop() if pool else None

  def _release(self, episodes: list[_Episode]) -> None:
    for ep in episodes:
      if ep.env is None:
        continue
      if ep.finish_reason == "error":
        _close_env(ep.env)  # its state is unknown; a fresh one replaces it
      else:
        self._free_envs.setdefault(ep.task.env, []).append(ep.env)
      ep.env = None


def open_episodes(episodes: Sequence[_Episode], config: RolloutConfig, pool: concurrent.futures.Executor,
                  take_env: Callable[[str], Any], env_factory: Callable[[str], Any], opening: Opening,
                  stats: RolloutStats) -> None:
  """Acquires (`take_env`, else `env_factory`) and resets an env per episode, in parallel on `pool`, and builds
  each one's opening messages; an episode whose env fails ends with the error. Env seconds go to `stats`.

  Raises:
    TypeError: a spec task's env has no `reset_spec` (after every episode has been tried).
  """
  t0 = time.perf_counter()
  futures = [pool.submit(_open_env, ep, take_env(ep.task.env), env_factory) for ep in episodes]
  unsupported = None
  for ep, future in zip(episodes, futures):
    try:
      instruction, observation = future.result()
    except _NoResetSpec as error:
      unsupported = error
      ep.end("error", _describe(error))
      continue
    except Exception as error:  # pylint: disable=broad-except
      ep.end("error", _describe(error))
      continue
    ep.max_rounds = min(config.max_rounds or ep.env.max_rounds, ep.env.max_rounds)
    ep.observation = observation
    ep.messages = opening(ep.task, instruction, observation)
    _check_opening(ep.messages, "the opening messages")
  stats.env_s += time.perf_counter() - t0
  if unsupported is not None:
    raise TypeError(str(unsupported))


def _close_env(env: Any) -> None:
  close = getattr(env, "close", None)
  if close is not None:
    try:
      close()
    except Exception:  # pylint: disable=broad-except
      pass  # closing is best effort: the server reaps idle sessions


_NO_MEASURES = {"cost_to_go": None, "progress": None}


def _measures(env: Any) -> tuple[dict[str, Any], bool]:
  """`env.measures()` (no measures for envs without it) and whether it raised (then no measures)."""
  measure = getattr(env, "measures", None)
  if not callable(measure):
    return dict(_NO_MEASURES), False
  try:
    return {**_NO_MEASURES, **measure()}, False
  except Exception:  # pylint: disable=broad-except
    return dict(_NO_MEASURES), True


def _open_env(ep: _Episode, env: Any, env_factory: Callable[[str], Any]) -> tuple[str, str]:
  """Gives the episode its env (`env`, or a new one from `env_factory` when None) and resets it on the episode's
  task (`reset`, or `reset_spec` for a spec task). Returns (instruction, first observation)."""
  env = env if env is not None else env_factory(ep.task.env)
  ep.env = env  # set before anything can raise, so a failed env is closed, not pooled
  ep.env_version = str(getattr(env, "version", ""))
  instruction = env.instruction()
  if ep.task.spec is None:
    return instruction, env.reset(ep.task.index, ep.task.split)
  reset_spec = getattr(env, "reset_spec", None)
  if not callable(reset_spec):
    raise _NoResetSpec(f"env {ep.task.env!r} ({type(env).__name__}) has no reset_spec(spec), so it cannot run "
                       f"spec tasks ({ep.task.item_id}); run spec tasks on envs that implement it")
  return instruction, reset_spec(ep.task.spec)


def _apply_step(ep: _Episode, outcome: tuple, config: RolloutConfig, stats: RolloutStats) -> None:
  """Records what `_observe_and_step` returned on the episode: the state (and expert action, measures), then the
  step's observation, reward and success, ending the episode when the env is done or `max_rounds` is reached."""
  state_key, expert, expert_failed, measures, measure_errors, measure_s, result = outcome
  ep.state_keys.append(state_key)
  if config.record_expert_actions:
    ep.expert_actions.append(expert)
    stats.expert_errors += expert_failed
  if config.record_measures:
    ep.step_measures.append(measures)
    stats.measure_errors += measure_errors
    stats.measure_s += measure_s
  if result is None:  # ended without a step: the score stands
    ep.step_rewards.append(ep.reward)
    return
  observation, reward, done, info = result
  if info.get("error"):  # a RemoteEnv whose server failed beyond recovery
    ep.end("error", str(info["error"]))
    return
  ep.messages.append(Message("user", observation))
  ep.observation = observation
  ep.reward = float(reward)
  ep.step_rewards.append(ep.reward)
  ep.success = bool(info.get("success", False))
  if done:
    ep.end("done")
  elif ep.turns >= ep.max_rounds:
    ep.end("max_rounds")


def _observe_and_step(env: Any, text: str, step: bool, observation: str | None, record_expert: bool,
                      record_measures: bool = False
                      ) -> tuple[str, str | None, bool, dict[str, dict[str, Any]] | None, int, float,
                                 tuple[str, float, bool, dict[str, Any]] | None]:
  """One env-thread call: the state's key (`env.state_key()`, or `observation` when given: envs without one),
  the expert action there if asked (None and a True flag where it raises), the measures before the step if
  asked, the step (None if `step` is False), and the measures after it (the "before" ones when not stepped).
  Returns (state_key, expert_action, expert_failed, measures or None, measure errors, seconds measuring, step
  result)."""
  state_key = str(env.state_key()) if observation is None else observation
  expert, expert_failed = None, False
  if record_expert:
    try:
      expert = env.expert_action()
    except Exception:  # pylint: disable=broad-except
      expert_failed = True
  measures, errors, seconds = None, 0, 0.0
  if record_measures:
    started = time.perf_counter()
    before, failed = _measures(env)
    errors += failed
    seconds += time.perf_counter() - started
  result = env.step(text) if step else None
  if record_measures:
    started = time.perf_counter()
    after, failed = _measures(env) if step else (before, False)
    errors += failed
    seconds += time.perf_counter() - started
    measures = {"before": before, "after": after}
  return state_key, expert, expert_failed, measures, errors, seconds, result


def _to_rollout(ep: _Episode, config: RolloutConfig) -> Rollout:
  task = ep.task
  return Rollout(
      item_id=task.item_id, messages=ep.messages, env=task.env, task_index=task.index,
      split=task.split, env_version=ep.env_version, reward=ep.reward, success=ep.success,
      failed=ep.finish_reason in UNSCORED_REASONS, error=ep.error,
      task_spec=task.spec.to_json() if task.spec is not None else None,
      token_ids=np.asarray(ep.tokens, np.int32), loss_mask=np.asarray(ep.mask, np.float32),
      logprobs=np.asarray(ep.logprobs, np.float32), group=ep.group, sample=ep.sample, turns=ep.turns,
      finish_reason=ep.finish_reason, truncated=ep.truncated, cut_turns=ep.cut_turns, turn_spans=ep.turn_spans,
      step_rewards=ep.step_rewards, state_keys=ep.state_keys,
      expert_actions=ep.expert_actions if config.record_expert_actions else None,
      step_measures=ep.step_measures if config.record_measures else None, opening_len=ep.opening_len,
      prompt_len=ep.prompt_len, base_opening=ep.base_opening, added=ep.added)


def rollout(sampler: Sampler | Decoder, tokenizer: PreTrainedTokenizerBase, tasks: Sequence[Task],
            config: RolloutConfig | None = None, *, env_factory: Callable[[str], Any] = envs_lib.make,
            opening: Opening = agentgym_opening, transform_openings: OpeningTransform | None = None) -> RolloutBatch:
  """One-shot `RolloutEngine(...).run(tasks, config)` (its envs are closed afterwards)."""
  with RolloutEngine(sampler, tokenizer, env_factory=env_factory, opening=opening) as engine:
    return engine.run(tasks, config, transform_openings=transform_openings)
