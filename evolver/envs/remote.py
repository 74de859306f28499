"""`RemoteEnv`: the Env interface over HTTP, so a rollout cannot tell a served env from a local one.

  env = RemoteEnv(["http://10.0.0.5:36001", "http://10.0.0.6:36001"])      # our servers, spread round-robin
  env = RemoteEnv("http://127.0.0.1:36005", env_name="textcraft", server="agentgym",
                  task_ranges={"train": (0, 400), "eval": (400, 500)})         # AgentGym's TextCraft server
  env = RemoteEnv("http://127.0.0.1:8080", env_name="appworld", server="agentevolver")  # AgentEvolver's EnvService

Failure handling, in order:
- a kept-alive connection that the server closed while it sat idle (uvicorn, which serves AgentGym's envs,
  closes them after 5 s; an LLM often thinks longer between turns) is noticed before sending and replaced;
- a request that certainly did not reach the server is sent again, even a step: the connection was refused,
  or it broke before the whole request was sent, or the server answered 429/503; a reused connection that
  the server closed before any byte of an answer (the race with its idle timeout) is resent at once, once,
  on a fresh connection. uvicorn and our server close a kept-alive connection unanswered only while it is
  idle or when their process dies, which loses the session too (the resent request then gets "unknown
  session", and a replay); a server that handled a request and then closed unanswered but kept the session
  would see it twice;
- other transient failures (timeouts, a connection reset after part of an answer, a fresh connection closed
  unanswered, HTTP 5xx) are retried with exponential backoff, `max_retries` times, each request with a
  `timeout_s` socket timeout; but not a step, which the server may have applied: see the next point;
- when the server no longer knows our session (HTTP 404 after a restart, or an idle reap), or a step's
  outcome is unknown because the connection broke, the client opens a fresh session, resets it to the same
  task and replays the episode's actions so far (envs are deterministic by task index), checking that every
  replayed observation matches the one recorded; then it carries on as if nothing happened (`recoveries`
  counts these);
- when that cannot work (the replay diverges, or the servers stay unreachable), the step reports the episode
  as failed: `done=True`, `info["success"]=False`, `info["error"]` saying why. Never silently wrong.
Sessions start on the URLs in round-robin order (process-wide); recovery moves to the next URL when one
stays unreachable, so rollouts scale out over many env servers on many hosts. `close()` ends the session on
the server (ours; AgentGym's TextCraft, BabyAI and ScienceWorld; AgentEvolver's EnvService, by `/release`;
AgentGym's other servers have no `/close`): best effort, one request with a `close_timeout_s` timeout.

A URL that answers another protocol than `server` says so at construction (`adapters.ProtocolMismatchError`),
with what to pass instead; `task_ranges` that overlap, are empty or reversed, or start below 0 are refused.

Tasks given as specs (`reset_spec`), state keys (`state_key`, from `GET /state`), the step judges' measures
(`measures`, from `GET /measures`), explorations (`reset_world`, `hindsight_tasks`) and target keys
(`target_key`, `spec_target_key`) need our servers. AgentGym's servers take no specs and open no worlds without
their goal (`reset_spec`, `reset_world`, `hindsight_tasks`, `target_key` and `spec_target_key` raise
NotImplementedError), their state keys fall back to the latest observation (`state_key_source ==
"observation"`, with a warning on first use), and they have no measures (both None, asked of no server).
"""

from __future__ import annotations

import dataclasses
import http.client
import itertools
import json
import operator
import random
import select
import socket
import threading
import time
import warnings
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from evolver.envs import adapters, base

_RETRYABLE = (OSError, http.client.HTTPException)  # refused, reset, timed out, or a garbled answer
_MAX_RECOVERIES = 3  # fresh sessions tried for one call before the episode is given up


class _NotDelivered(Exception):
  """Inside HttpClient: the server certainly did not handle the request (see `HttpClient.request`)."""


def _has_input(sock: socket.socket) -> bool:
  """Whether `sock` can be read without waiting: at end of stream, reset, or with bytes waiting."""
  if hasattr(select, "poll"):  # select.select fails on descriptors above 1023
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))
  return bool(select.select([sock], [], [], 0)[0])


def _answer_begins(sock: socket.socket) -> bool:
  """Waits (up to the socket's timeout) for the first byte of an answer, without consuming it; False when
  the server closed or reset the connection before sending any."""
  try:
    return bool(sock.recv(1, socket.MSG_PEEK))
  except ConnectionResetError:
    return False


class HttpClient:
  """One keep-alive HTTP/1.1 connection to one server (stdlib `http.client`), JSON in and out.

  `timeout_s` (settable) is the socket timeout of each request; `resends` counts requests sent again at once
  because a kept-alive connection closed under them before they reached the server.
  """

  def __init__(self, url: str, timeout_s: float):
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname:
      raise ValueError(f"expected a URL like http://host:port, got {url!r}")
    self.url = url
    self.timeout_s = timeout_s
    self.resends = 0
    self._host = parts.hostname
    self._port = parts.port or 80
    self._prefix = parts.path.rstrip("/")
    self._conn: http.client.HTTPConnection | None = None

  def request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> tuple[int, Any]:
    """(status, decoded JSON or text).

    Raises:
      adapters.TransportError: no answer came back. `maybe_delivered` is False when the server certainly did
        not handle the request: the connection was refused, or broke before the whole request was sent.
        After the whole request went out, a failure may hide a handled request (`maybe_delivered` True: a
        timeout, part of an answer, a fresh connection closed unanswered), with one exception: a reused
        kept-alive connection closed before any byte of an answer is the server's idle timeout closing it as
        the request went out, and the request is sent again at once, once, on a fresh connection.
    """
    body = None if payload is None else json.dumps(payload).encode("utf-8")
    headers = {"Content-Type": "application/json"} if body is not None else {}
    what = f"{method} {self.url}{path}"
    if self._conn is not None and (self._conn.sock is None or _has_input(self._conn.sock)):
      self.close()  # between requests a server sends nothing: it closed the idle connection; nothing was sent
    reused = self._conn is not None
    try:
      return self._exchange(method, path, body, headers, reused)
    except _NotDelivered as error:
      if not reused:
        raise adapters.TransportError(f"{what}: {error}", maybe_delivered=False) from error.__cause__
    self.resends += 1
    try:
      return self._exchange(method, path, body, headers, reused=False)
    except _NotDelivered as error:
      raise adapters.TransportError(f"{what}: {error} (resent on a fresh connection after the kept-alive one "
                                    "closed)", maybe_delivered=False) from error.__cause__

  def _exchange(self, method: str, path: str, body: bytes | None, headers: dict[str, str],
                reused: bool) -> tuple[int, Any]:
    """One request and its answer; raises _NotDelivered or adapters.TransportError (see `request`)."""
    if self._conn is None:
      self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
      try:
        self._conn.connect()
      except _RETRYABLE as error:
        self.close()
        raise _NotDelivered(f"could not connect: {error.__class__.__name__}: {error}") from error
    else:
      self._conn.sock.settimeout(self.timeout_s)
    try:
      self._conn.request(method, self._prefix + path, body=body, headers=headers)  # one send of head and body
    except _RETRYABLE as error:  # the request did not go out whole: the server cannot have handled it
      self.close()
      raise _NotDelivered(f"the connection broke while sending: {error.__class__.__name__}: {error}") from error
    what = f"{method} {self.url}{path}"
    try:
      answered = _answer_begins(self._conn.sock)
      if answered:
        response = self._conn.getresponse()
        data = response.read()
        if response.will_close:
          self.close()
    except _RETRYABLE as error:  # timed out, or broke during the answer: the server may have handled it
      self.close()
      raise adapters.TransportError(f"{what}: {error.__class__.__name__}: {error}") from error
    if not answered:
      self.close()
      if reused:
        raise _NotDelivered("the server had closed the kept-alive connection (its idle timeout)")
      raise adapters.TransportError(f"{what}: the server closed a fresh connection without answering")
    try:
      return response.status, json.loads(data)
    except ValueError:
      return response.status, data.decode("utf-8", "replace")

  def close(self) -> None:
    if self._conn is not None:
      self._conn.close()
      self._conn = None


def _measures(http: HttpClient, session: int) -> dict[str, Any]:
  """`GET /measures` of a session on one of our servers: `{"cost_to_go": int | None, "progress": float | None}`;
  raises as the adapter's calls do (`adapters._check`, our servers' status codes)."""
  status, answer = http.request("GET", f"/measures?id={session}")
  if status == 404 and "unknown route" in str(answer):  # not a lost session: a server from before /measures
    raise NotImplementedError(f"this evolver env server has no GET /measures (it predates measures): {answer}")
  answer = adapters._check(status, answer, "GET /measures")  # pylint: disable=protected-access
  return {"cost_to_go": answer["cost_to_go"], "progress": answer["progress"]}


def check_task_ranges(task_ranges: Any) -> dict[str, tuple[int, int]]:
  """AgentGym task ranges as {split: (start, stop)}, [start, stop) in the server's data-index space.

  Raises:
    ValueError: the splits are not exactly train and eval, a range is not a pair of integers, starts below 0,
      is empty or reversed, or the two ranges overlap (evaluation tasks would be trained on).
  """
  example = "task_ranges={'train': (0, 400), 'eval': (400, 500)}"
  if not isinstance(task_ranges, Mapping) or set(task_ranges) != set(base.SPLITS):
    raise ValueError(f"AgentGym servers have no splits: pass task_ranges with exactly 'train' and 'eval', each "
                     f"[start, stop) in their data-index space, e.g. {example}; got {task_ranges!r}")
  ranges = {}
  for split in base.SPLITS:
    where = f"task_ranges[{split!r}] = {task_ranges[split]!r}"
    try:
      start, stop = task_ranges[split]
    except (TypeError, ValueError):
      raise ValueError(f"{where}: each range is a (start, stop) pair, e.g. {example}") from None
    if isinstance(start, bool) or isinstance(stop, bool):
      raise ValueError(f"{where}: start and stop must be integers")
    try:
      start, stop = operator.index(start), operator.index(stop)
    except TypeError:
      raise ValueError(f"{where}: start and stop must be integers") from None
    if start < 0:
      raise ValueError(f"{where} starts below 0: data indices start at 0")
    if stop <= start:
      raise ValueError(f"{where} is {'empty' if stop == start else 'reversed'}: it is [start, stop), with "
                       "start < stop")
    ranges[split] = (start, stop)
  (train_start, train_stop), (eval_start, eval_stop) = ranges["train"], ranges["eval"]
  if train_start < eval_stop and eval_start < train_stop:
    raise ValueError(f"task_ranges overlap: train [{train_start}, {train_stop}) and eval [{eval_start}, "
                     f"{eval_stop}) share data indices [{max(train_start, eval_start)}, "
                     f"{min(train_stop, eval_stop)}); evaluation tasks must not be trained on")
  return ranges


_round_robin_lock = threading.Lock()
_round_robin: dict[tuple[str, ...], itertools.count] = {}


def _next_start(urls: tuple[str, ...]) -> int:
  with _round_robin_lock:
    counter = _round_robin.setdefault(urls, itertools.count())
    return next(counter) % len(urls)


@dataclasses.dataclass(frozen=True)
class _World:
  """An exploration's task: the world of task `index` of `split`, with no goal (`RemoteEnv.reset_world`)."""
  index: int
  split: str
  max_rounds: int | None


class ReplayDivergedError(RuntimeError):
  """Replaying the episode on a fresh session gave other observations: the server's env changed."""


class RemoteEnv:
  """An Env served over HTTP (see the module docstring).

  Not thread-safe: use one per rollout worker. `close()` (or `with RemoteEnv(...) as env:`) ends the server
  session; a forgotten one is reaped by the server once idle.
  """

  def __init__(self, urls: str | list[str], env_name: str | None = None, *, server: str = "evolver",
               task_ranges: dict[str, tuple[int, int]] | None = None, task_splits: dict[str, str] | None = None,
               timeout_s: float = 60.0, max_retries: int = 8, backoff_s: float = 0.05, max_backoff_s: float = 2.0,
               close_timeout_s: float = 2.0):
    """
    Args:
      urls: one server URL or several; sessions spread over them round-robin.
      env_name: for our servers, checked against the server's `/info`; for AgentGym's, picks the adapter; for
        AgentEvolver's EnvService, the `env_type` it serves ("appworld", "bfcl", ...).
      server: "evolver" (ours, `launch.serve_env`), "agentgym" (their per-env servers) or "agentevolver"
        (AgentEvolver's EnvService, `adapters.EnvServiceAdapter`).
      task_ranges: AgentGym servers only: split -> [start, stop) of their data indices; the two must not
        overlap (see `check_task_ranges`).
      task_splits: AgentEvolver's EnvService only: our split -> the service's split name, whose task list
        (`/get_env_profile`) our indices run over; defaults: AppWorld's "train"/"dev", BFCL's "train"/"test".
      timeout_s: socket timeout of each request, seconds.
      max_retries: attempts per request before giving up on a URL.
      backoff_s, max_backoff_s: first and largest wait between attempts, seconds (doubling, with jitter).
      close_timeout_s: socket timeout of the one `/close` request of `close()`, seconds.

    Raises:
      ValueError: bad arguments; `adapters.ProtocolMismatchError` (a ValueError) when the server does not
        speak the protocol `server` names.
      adapters.UnreachableError: no server answered.
    """
    self.urls = (urls,) if isinstance(urls, str) else tuple(urls)
    if not self.urls:
      raise ValueError("RemoteEnv needs at least one server URL")
    if task_splits is not None and server != "agentevolver":
      raise ValueError("task_splits is only for server='agentevolver' (AgentEvolver's EnvService)")
    if server == "evolver":
      if task_ranges is not None:
        raise ValueError("task_ranges is only for server='agentgym': our servers have train and eval splits "
                         "of their own (see their /info)")
      self._adapter: adapters.Adapter = adapters.EvolverAdapter()
      self._task_ranges = None
    elif server == "agentgym":
      if env_name not in adapters.AGENTGYM_ADAPTERS:
        raise ValueError(f"no AgentGym adapter for env {env_name!r}; have {sorted(adapters.AGENTGYM_ADAPTERS)}")
      self._task_ranges = check_task_ranges(task_ranges)
      self._adapter = adapters.AGENTGYM_ADAPTERS[env_name]()
    elif server == "agentevolver":
      if not env_name:
        raise ValueError("server='agentevolver' needs env_name: the env_type the EnvService serves, e.g. 'appworld'")
      if task_ranges is not None:
        raise ValueError("task_ranges is only for server='agentgym'; AgentEvolver's EnvService lists its tasks per "
                         "split (pass task_splits to name its splits)")
      self._adapter = adapters.EnvServiceAdapter(env_name, task_splits)
      self._task_ranges = None
    else:
      raise ValueError(f"server must be 'evolver', 'agentgym' or 'agentevolver', got {server!r}")
    self._timeout_s = timeout_s
    self._close_timeout_s = close_timeout_s
    self._max_retries = max_retries
    self._backoff_s = backoff_s
    self._max_backoff_s = max_backoff_s
    self._url_index = _next_start(self.urls)
    self._http = HttpClient(self.urls[self._url_index], timeout_s)
    self._session: int | None = None
    self._info = self._with_retries(lambda: self._adapter.info(self._http))
    if server == "evolver" and env_name is not None and self._info["name"] != env_name:
      raise ValueError(f"{self._http.url} serves {self._info['name']!r}, not {env_name!r}")
    self.name: str = self._info["name"]
    self.version: str = self._info["version"]
    self.max_rounds: int = int(self._info["max_rounds"])
    # Where state keys come from: the server's true state ("env"), or the observation text ("observation").
    self.state_key_source = "env" if self._adapter.has_state_keys else "observation"
    self._warned_state_key = False
    # The episode so far, for replay after a lost session: the task is (index, split), a TaskSpec or a _World.
    self._task: tuple[int, str] | base.TaskSpec | _World | None = None
    self._turns: list[str] = []
    self._observations: list[str] = []
    self._observation = ""
    self._reward = 0.0
    self._done = False
    self._success = False
    self.recoveries = 0  # how many times a session was recreated and replayed

  # --- the Env protocol ---------------------------------------------------------------------------------

  def instruction(self) -> str:
    return self._info["instruction"]

  def num_tasks(self, split: str) -> int:
    base.check_split(split)
    if self._task_ranges is not None:
      start, stop = self._task_ranges[split]
      return stop - start
    return int(self._info["num_tasks"][split])

  def reset(self, index: int, split: str = "train") -> str:
    base.check_index(index, split, self.num_tasks(split))
    return self._begin((index, split))

  def reset_spec(self, spec: base.TaskSpec | dict[str, Any]) -> str:
    """Starts the task `spec` describes on the server (see `TextEnv.reset_spec`); a lost session replays it.

    Raises:
      NotImplementedError: the server is AgentGym's, whose servers take no specs.
      EnvError: the spec is malformed, for another env, out of range, or refused by the server's env.
    """
    if not self._adapter.takes_specs:
      raise NotImplementedError(f"{self._adapter.kind} {self.name} servers take no task specs, only their own "
                                "data_idx tasks; serve the env with `python -m launch.serve_env` to run specs")
    spec = base.TaskSpec.from_json(spec)
    if spec.env != self.name:
      raise base.EnvError(f"this is the {self.name!r} env; the spec is for {spec.env!r}")
    base.check_index(spec.world, spec.split, self.num_tasks(spec.split))
    return self._begin(spec)

  def reset_world(self, index: int, split: str = "train", max_rounds: int | None = None) -> str:
    """Opens the world of task `index` with no goal on the server (see `TextEnv.reset_world`); a lost session
    replays it.

    Raises:
      NotImplementedError: the server is AgentGym's (or one of ours from before explorations).
      EnvError: bad split, index or `max_rounds`.
    """
    if not self._adapter.explores:
      raise NotImplementedError(f"{self._adapter.kind} {self.name} servers cannot open a world without its goal; "
                                "serve the env with `python -m launch.serve_env` to explore")
    base.check_index(index, split, self.num_tasks(split))
    return self._begin(_World(index, split, max_rounds))

  @property
  def exploring(self) -> bool:
    """Whether the current (or last) episode is an exploration (`reset_world`)."""
    return isinstance(self._task, _World)

  def hindsight_tasks(self) -> list[base.HindsightTask]:
    """The exploration's outcomes as tasks, from the server's `GET /hindsight` (see `TextEnv.hindsight_tasks`).

    Raises:
      EpisodeNotStartedError: no episode was started.
      EnvError: the episode is not an exploration.
    """
    if self._task is None:
      raise base.EpisodeNotStartedError(f"{self.name}: call reset_world(index, split) before hindsight_tasks()")
    if not self.exploring:
      raise base.EnvError(f"{self.name}: hindsight tasks come from an exploration episode (reset_world); the "
                          "current episode plays a task")
    answer = self._query(lambda session: self._adapter.hindsight(self._http, session))
    return [base.HindsightTask.from_json(task) for task in answer]

  def target_key(self, index: int, split: str) -> str:
    """What task `index` of `split` asks, on which world, from the server (see `TextEnv.target_key`)."""
    base.check_index(index, split, self.num_tasks(split))
    if not self._adapter.explores:
      raise NotImplementedError(f"{self._adapter.kind} {self.name} servers have no target keys")
    task = {"data_idx": self._data_idx(index, split), "split": split}
    return self._with_retries(lambda: self._adapter.target_key(self._http, task))

  def spec_target_key(self, spec: base.TaskSpec | dict[str, Any]) -> str:
    """`target_key` for a task given as a spec, from the server (see `TextEnv.spec_target_key`)."""
    if not self._adapter.explores:
      raise NotImplementedError(f"{self._adapter.kind} {self.name} servers have no target keys")
    spec = base.TaskSpec.from_json(spec)
    return self._with_retries(lambda: self._adapter.target_key(self._http, {"spec": spec.to_json()}))

  def step(self, text: str) -> tuple[str, float, bool, dict[str, Any]]:
    if self._task is None:
      raise base.EpisodeNotStartedError(f"{self.name}: call reset(index, split) before step()")
    if not isinstance(text, str):
      raise base.EnvError(f"action must be a string, got {type(text).__name__}")
    if self._done:
      observation = "The episode is over; no further actions are accepted. Reset to start a new task."
      return observation, self._reward, True, {"success": self._success}
    try:
      observation, reward, done, info = self._with_session(
          lambda session: self._adapter.step(self._http, session, text), idempotent=False, replay=True)
    except (adapters.TransportError, adapters.SessionLostError, ReplayDivergedError) as error:
      return self._abort(f"the env server failed and the episode could not be recovered: {error}")
    self._turns.append(text)
    self._observations.append(observation)
    if not self._adapter.ends_at_max_rounds and not done and len(self._turns) >= self.max_rounds:
      done = True
      observation += f"\nOut of rounds ({self.max_rounds}); the episode is over."
    info.setdefault("success", False)
    self._observation, self._reward, self._done, self._success = observation, reward, done, bool(info["success"])
    return observation, reward, done, info

  def expert_action(self) -> str:
    if self._task is None:
      raise base.EpisodeNotStartedError(f"{self.name}: call reset(index, split) before expert_action()")
    if not self._adapter.has_expert:
      raise NotImplementedError(f"{self._adapter.kind} {self.name} servers have no scripted expert")
    return self._query(lambda session: self._adapter.expert(self._http, session))

  def state_key(self) -> str:
    """The key of the current true state, from the server's `GET /state` (see `TextEnv.state_key`).

    AgentGym's servers have none: the key is then the task and a digest of the latest observation text, which
    can repeat in different states; `state_key_source` says which, and the first such call warns.
    """
    if self._task is None:
      raise base.EpisodeNotStartedError(f"{self.name}: call reset(index, split) before state_key()")
    if not self._adapter.has_state_keys:
      if not self._warned_state_key:
        self._warned_state_key = True
        warnings.warn(f"{self._adapter.kind} {self.name} servers have no state keys: RemoteEnv.state_key falls "
                      "back to the latest observation text, which may repeat in different true states",
                      stacklevel=2)
      return f"{self._task_identity()}|obs={base.stable_digest(self._observation)}"
    return self._query(lambda session: self._adapter.state(self._http, session))

  def measures(self) -> dict[str, Any]:
    """The step judges' measures of the current true state, `{"cost_to_go", "progress"}`, from the server's
    `GET /measures` (see `TextEnv.measures`). AgentGym's servers have none: both are None, and no request is sent.

    Raises:
      EpisodeNotStartedError: no episode was started.
      NotImplementedError: one of our servers from before measures (it has no `GET /measures`).
    """
    if self._task is None:
      raise base.EpisodeNotStartedError(f"{self.name}: call reset(index, split) before measures()")
    if not self._adapter.has_state_keys:
      return {"cost_to_go": None, "progress": None}
    return self._query(lambda session: _measures(self._http, session))

  def _query(self, call):
    """A read of the episode's state (idempotent), recovering a lost session by replay; an episode that cannot
    be recovered is aborted and SessionLostError raised."""
    try:
      return self._with_session(call, idempotent=True, replay=True)
    except ReplayDivergedError as error:
      self._abort(f"the env server failed and the episode could not be recovered: {error}")
      raise adapters.SessionLostError(str(error)) from error

  # --- conveniences -------------------------------------------------------------------------------------

  @property
  def observation(self) -> str:
    return self._observation

  @property
  def spec(self) -> base.TaskSpec | None:
    """The spec of the task being played, or None for an indexed task (and before any reset)."""
    return self._task if isinstance(self._task, base.TaskSpec) else None

  @property
  def done(self) -> bool:
    return self._done

  @property
  def url(self) -> str:
    """The server this env's session lives on."""
    return self._http.url

  def close(self) -> None:
    """Ends the server session and the connection; the env can start a new episode (on a new session) after.

    Best effort: one `/close` request with a `close_timeout_s` timeout, whose failure is ignored (ours reaps
    a session left idle; AgentGym's keep it until they restart). Only AgentGym's TextCraft, BabyAI and
    ScienceWorld servers have a `/close`; AgentEvolver's EnvService releases the instance.
    """
    if self._session is not None and self._adapter.has_close:
      self._http.timeout_s = min(self._timeout_s, self._close_timeout_s)
      try:
        self._adapter.close(self._http, self._session)
      except (adapters.TransportError, adapters.SessionLostError, base.EnvError):
        pass  # unreachable, already gone (or a server from before /close: 404), or refused
      finally:
        self._http.timeout_s = self._timeout_s
    self._session = None
    self._http.close()

  def __enter__(self) -> "RemoteEnv":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  # --- plumbing -----------------------------------------------------------------------------------------

  def _data_idx(self, index: int, split: str) -> int:
    return index if self._task_ranges is None else self._task_ranges[split][0] + index

  def _reset_session(self, session: int, task: tuple[int, str] | base.TaskSpec | _World) -> str:
    if isinstance(task, base.TaskSpec):
      return self._adapter.reset_spec(self._http, session, task.to_json())
    if isinstance(task, _World):
      return self._adapter.reset_world(self._http, session, self._data_idx(task.index, task.split), task.split,
                                       task.max_rounds)
    index, split = task
    return self._adapter.reset(self._http, session, self._data_idx(index, split), split)

  def _begin(self, task: tuple[int, str] | base.TaskSpec | _World) -> str:
    """Resets the session to `task` and starts recording the episode; a refused reset leaves no episode."""
    self._task = None
    observation = self._with_session(lambda session: self._reset_session(session, task), idempotent=True,
                                     replay=False)
    self._task = task
    self._turns, self._observations = [], [observation]
    self._observation, self._reward, self._done, self._success = observation, 0.0, False, False
    return observation

  def _task_identity(self) -> str:
    if isinstance(self._task, base.TaskSpec):
      return f"{self.name}/spec/{base.stable_digest(self._task.key())}"
    if isinstance(self._task, _World):
      return f"{self.name}/explore/{self._task.split}/{self._task.index}"
    index, split = self._task
    return f"{self.name}/{split}/{index}"

  def _sleep(self, attempt: int) -> None:
    delay = min(self._max_backoff_s, self._backoff_s * 2**attempt)
    time.sleep(delay * (0.5 + random.random() / 2))

  def _with_retries(self, call, idempotent: bool = True):
    """Runs `call` until it gets an answer; moves to the next URL after `max_retries` transport failures.

    A request that is not idempotent (a step) is not resent once it may have reached the server: the error
    goes up, and `_with_session` replays the episode on a fresh session instead.
    """
    last: Exception | None = None
    for rotation in range(len(self.urls)):
      for attempt in range(self._max_retries):
        try:
          return call()
        except adapters.TransportError as error:
          if not idempotent and error.maybe_delivered:
            raise
          last = error
          self._sleep(attempt)
      if rotation + 1 < len(self.urls):
        self._move_to_next_url()
    raise adapters.UnreachableError(f"no answer after {self._max_retries} tries on each of {list(self.urls)}: {last}")

  def _move_to_next_url(self) -> None:
    self._http.close()
    self._url_index = (self._url_index + 1) % len(self.urls)
    self._http = HttpClient(self.urls[self._url_index], self._timeout_s)
    self._session = None

  def _with_session(self, call, *, idempotent: bool, replay: bool):
    """Runs `call(session)`, creating the session first, and recreating it (replaying the episode when
    `replay`) when the server lost it or a request's outcome is unknown."""
    last: Exception | None = None
    for _ in range(_MAX_RECOVERIES):
      try:
        if self._session is None:
          self._session = self._with_retries(lambda: self._adapter.create(self._http))
          if replay:
            self._replay()
        session = self._session
        return self._with_retries(lambda: call(session), idempotent=idempotent)
      except adapters.UnreachableError:
        self._session = None
        raise
      except (adapters.SessionLostError, adapters.TransportError) as error:
        last = error
        self._session = None
        self.recoveries += 1
    raise adapters.SessionLostError(f"the session was lost {_MAX_RECOVERIES} times in a row: {last}")

  def _replay(self) -> None:
    """Brings the fresh session to where the episode was; raises ReplayDivergedError if it differs."""
    task = self._task
    session = self._session
    observation = self._with_retries(lambda: self._reset_session(session, task))
    if observation != self._observations[0]:
      raise ReplayDivergedError("the replay diverged: after a server restart the task's first observation "
                                "differs")
    for turn, expected in zip(self._turns, self._observations[1:]):
      observation = self._with_retries(lambda: self._adapter.step(self._http, session, turn), idempotent=False)[0]
      if observation != expected:
        raise ReplayDivergedError("the replay diverged: after a server restart a replayed step gave another "
                                  "observation")

  def _abort(self, why: str) -> tuple[str, float, bool, dict[str, Any]]:
    self._session = None
    self._done, self._success, self._reward = True, False, 0.0
    self._observation = f"Episode aborted: {why}"
    return self._observation, 0.0, True, {"success": False, "error": why}

