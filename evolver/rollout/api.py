"""Multi-turn rollouts with a policy behind an OpenAI-compatible chat endpoint (vLLM, SGLang, a hosted API).

  from evolver.models.openai_api import OpenAIChat
  from evolver.rollout import RolloutConfig, Task
  from evolver.rollout.api import APIRolloutEngine

  client = OpenAIChat("http://127.0.0.1:8000/v1", "qwen2.5-7b-instruct", requests_per_s=20)
  with APIRolloutEngine(client, max_concurrency=16) as engine:
    out = engine.run([Task("maze", 0, "eval")], RolloutConfig(max_new_tokens=128))

The same episodes as `RolloutEngine`: AgentGym's opening (or the `opening` given), one assistant turn per request
(the whole conversation as chat messages, `max_new_tokens` as `max_tokens`, the config's temperature and top_p),
the env stepped on the reply exactly as the engine steps it (`engine._observe_and_step`, `engine._apply_step`), the
same turn limit (`max_rounds`, capped by the env's own) and finish reasons, the same `Rollout`s and `RolloutStats`.
What differs, because the server holds the tokens: a rollout's `token_ids`, `loss_mask` and `logprobs` are empty; a
reply cut by `max_tokens` (finish_reason "length") is a cut turn; a prompt the server rejects as too long for its
context ends the episode as "context" (truncated), or as "opening" (unscored, as the engine's) when it is the
first turn's. Episodes run `max_concurrency` at a time, each on its own
thread, stepping its env there.

An endpoint that stays unavailable after the client's retries fails the episode (counted, the run goes on); a
request the endpoint refuses for good (401, 403, 404, a bad body) stops the whole run with
`evolver.models.openai_api.APIRequestError`, since every other request would meet the same answer.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from typing import Any

from evolver import envs as envs_lib
from evolver.data.trajectory import Message
from evolver.models.openai_api import APIError, APIRequestError, ContextLengthExceeded, OpenAIChat
from evolver.rollout.engine import (Opening, OpeningTransform, RolloutBatch, RolloutConfig, RolloutEngine,
                                    RolloutStats, Task, agentgym_opening, open_episodes)
# The engine's episode state and env stepping, shared so that both policies play the same episodes.
# pylint: disable-next=protected-access
from evolver.rollout.engine import (_apply_step, _close_env, _describe, _Episode, _observe_and_step, _to_rollout)


class APIRolloutEngine:
  """Runs episodes with a chat-endpoint policy (`OpenAIChat`) over environments built by `env_factory`.

  Envs are pooled per name and reused across calls (an env that failed is dropped); `close()` (or `with`) closes
  them. One `run` at a time.
  """

  def __init__(self, client: OpenAIChat, *, env_factory: Callable[[str], Any] = envs_lib.make,
               opening: Opening = agentgym_opening, max_concurrency: int = 8, stop: Sequence[str] = ()):
    """
    Args:
      client: the endpoint and model (its retries, timeouts and rate limit apply to every turn).
      env_factory: env name -> a fresh env (`evolver.envs.make`, or a `RemoteEnv` per name).
      opening: builds the first messages from (task, instruction, first observation); the last is a user message.
      max_concurrency: episodes in flight at once (so at most this many requests at a time).
      stop: strings that end a reply (sent as the request's `stop`); none by default, as the local sampler
        stops only on the chat template's end of turn, which the server applies itself.
    """
    if max_concurrency < 1:
      raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
    self.client = client
    self.env_factory = env_factory
    self.opening = opening
    self.max_concurrency = max_concurrency
    self.stop = tuple(stop)
    self._free_envs: dict[str, list[Any]] = {}
    self._lock = threading.Lock()

  def describe(self) -> dict[str, Any]:
    """What identifies the policy in results: the endpoint and the model (never the key)."""
    return {"kind": "openai", "base_url": self.client.base_url, "model": self.client.model,
            "max_concurrency": self.max_concurrency, "stop": list(self.stop)}

  def close(self) -> None:
    """Closes the pooled envs."""
    for pool in self._free_envs.values():
      for env in pool:
        _close_env(env)
    self._free_envs.clear()

  def __enter__(self) -> "APIRolloutEngine":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def run(self, tasks: Sequence[Task], config: RolloutConfig | None = None, *,
          transform_openings: OpeningTransform | None = None,
          progress: Callable[[int], None] | None = None) -> RolloutBatch:
    """Rolls out `config.num_samples` episodes per task, `config.batch_size` started at a time (the opening
    transform sees one such chunk per call), `max_concurrency` of them playing at once. `progress` is called with
    1 per episode ended (in task order), as `RolloutEngine.run`'s.

    Uses of `config`: max_new_tokens, temperature, top_p, max_rounds, num_samples, batch_size, cut_turn, seed
    (sent as the request's `seed` at temperature > 0, per episode and turn), record_expert_actions,
    record_measures. top_k, max_context_tokens (the server knows its context), reuse_cache, compact_rows and
    schedule do not apply.

    Returns:
      The trajectories in task order (a task's samples together) and the run's counters (`generate_s` sums the
      request time over threads; `prefill_tokens` and `sampled_tokens` are the server's reported usage).

    Raises:
      APIRequestError: the endpoint refused a request for good (bad key, unknown model, bad request).
      TypeError: a spec task's env has no `reset_spec`.
    """
    config = config or RolloutConfig()
    stats = RolloutStats()
    start = time.perf_counter()
    for task in tasks:
      if not isinstance(task, Task):
        raise TypeError(f"tasks must be Task instances, got {type(task).__name__}")
    seen: collections.Counter[str] = collections.Counter()
    episodes = []
    for group, task in enumerate(tasks):
      occurrence = seen[task.key()]
      seen[task.key()] += 1
      episodes.extend((_Episode(task=task, group=group, sample=s), occurrence)
                      for s in range(config.num_samples))
    out = []
    abort = threading.Event()
    with concurrent.futures.ThreadPoolExecutor(max_workers=self.max_concurrency,
                                               thread_name_prefix="api-rollout") as pool:
      for first in range(0, len(episodes), config.batch_size):
        chunk = episodes[first:first + config.batch_size]
        try:
          self._start([ep for ep, _ in chunk], config, transform_openings, stats, pool)
          futures = [pool.submit(self._play, ep, occurrence, config, stats, abort) for ep, occurrence in chunk]
          errors = []
          for future in futures:
            try:
              future.result()
            except APIRequestError as error:
              errors.append(error)
            if progress is not None:
              progress(1)
          if errors:
            raise errors[0]
        finally:
          self._release([ep for ep, _ in chunk])
        out.extend(_to_rollout(ep, config) for ep, _ in chunk)
    stats.episodes = len(out)
    stats.failed = sum(t.failed for t in out)
    stats.opening_too_long = sum(t.finish_reason == "opening" for t in out)
    stats.total_s = time.perf_counter() - start
    return RolloutBatch(trajectories=out, stats=stats)

  def _start(self, episodes: list, config: RolloutConfig, transform_openings: OpeningTransform | None,
             stats: RolloutStats, pool: concurrent.futures.ThreadPoolExecutor) -> None:
    """Acquires and resets an env per episode (in parallel) and builds (and transforms) the openings."""
    open_episodes(episodes, config, pool, self._take_env, self.env_factory, self.opening, stats)
    for ep in episodes:
      if not ep.ended:
        ep.opening_len = len(ep.messages)
    if transform_openings is not None:
      started = [ep for ep in episodes if not ep.ended]
      RolloutEngine._transform_openings(started, transform_openings)  # pylint: disable=protected-access
      for ep in started:
        ep.opening_len = len(ep.messages)

  def _play(self, ep, occurrence: int, config: RolloutConfig, stats: RolloutStats, abort: threading.Event) -> None:
    """Plays one episode to its end on this thread: request a turn, step the env, repeat."""
    has_state_key = ep.env is not None and callable(getattr(ep.env, "state_key", None))
    while not ep.ended:
      if abort.is_set():
        ep.end("error", "the run stopped: the endpoint refused a request for good")
        return
      seed = None
      if config.temperature > 0:
        seed = zlib.crc32(f"{config.seed}/{ep.task.key()}/{occurrence}/{ep.sample}/{ep.turns}".encode()) & 0x7FFFFFFF
      t0 = time.perf_counter()
      try:
        reply = self.client.chat([m.to_dict() for m in ep.messages], max_tokens=config.max_new_tokens,
                                 temperature=config.temperature, top_p=config.top_p, stop=self.stop, seed=seed)
      except ContextLengthExceeded as error:
        if ep.turns:
          ep.end("context")
        else:
          ep.end("opening", f"the endpoint has no room for the opening: {error}")
        return
      except APIRequestError:
        abort.set()
        ep.end("error", "the endpoint refused the request")
        raise
      except APIError as error:
        ep.end("error", _describe(error))
        return
      finally:
        with self._lock:
          stats.generate_s += time.perf_counter() - t0
      ep.messages.append(Message("assistant", reply.text))
      ep.turns += 1
      cut = reply.finish_reason == "length"
      if cut:
        ep.cut_turns += 1
        if config.cut_turn == "end":
          ep.end("cut_turn")
      with self._lock:
        stats.generate_calls += 1
        stats.rows_generated += 1
        stats.prefill_tokens += reply.prompt_tokens
        stats.sampled_tokens += reply.completion_tokens
      t0 = time.perf_counter()
      try:
        outcome = _observe_and_step(
            ep.env, reply.text, not ep.ended, ep.observation if not has_state_key else None,
            config.record_expert_actions, config.record_measures)
      except Exception as error:  # pylint: disable=broad-except
        ep.end("error", _describe(error))
        return
      finally:
        with self._lock:
          stats.env_s += time.perf_counter() - t0
      with self._lock:
        _apply_step(ep, outcome, config, stats)

  def _take_env(self, name: str) -> Any:
    with self._lock:
      pool = self._free_envs.get(name)
      return pool.pop() if pool else None

  def _release(self, episodes: list) -> None:
    with self._lock:
      for ep in episodes:
        if ep.env is None:
          continue
        if ep.finish_reason == "error":
          _close_env(ep.env)
        else:
          self._free_envs.setdefault(ep.task.env, []).append(ep.env)
        ep.env = None

