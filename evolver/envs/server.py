"""The env HTTP server: AgentGym's id-keyed protocol, extended to carry the whole Env interface.

  POST /create {data_idx?, split?}     -> {id, observation, reward, done}   (resets at once if data_idx given)
  POST /create {spec}                  -> {id, observation, reward, done}   (resets at once to the spec's task)
  POST /reset  {id, data_idx, split?}  -> {id, observation, reward, done}
  POST /reset  {id, spec}              -> {id, observation, reward, done}   (a task given as a `TaskSpec` JSON)
  POST /reset  {id, data_idx, split?, explore: true, max_rounds?}
                                       -> {id, observation, reward, done, explore: true}   (the task's world
                                          with no goal: an exploration, `TextEnv.reset_world`; /create too)
  POST /step   {id, action}            -> {observation, reward, done, info}
  GET  /observation?id=                -> the latest observation, a JSON string
  GET  /expert?id=                     -> the scripted expert's next turn, a JSON string
  GET  /state?id=                      -> the key of the current true state (`TextEnv.state_key`), a JSON string
  GET  /measures?id=                   -> the step judges' measures of the current true state (`TextEnv.measures`):
                                          {cost_to_go, progress} (both null in an exploration)
  GET  /hindsight?id=                  -> the exploration's outcomes as tasks (`TextEnv.hindsight_tasks`):
                                          [{spec, actions, description}]
  POST /target_key {data_idx, split?}  -> what an indexed task asks, on which world (`TextEnv.target_key`), a
  POST /target_key {spec}                 JSON string; for a spec, `TextEnv.spec_target_key`
  POST /close  {id}                    -> {closed: true}
  GET  /info                           -> {name, version, instruction, max_rounds, num_tasks: {train, eval}}
  GET  /health                         -> {status, env, sessions}

AgentGym's `data_idx` form is unchanged; a spec comes instead of it (`data_idx` and `spec` together, or `/reset`
with neither, is a 400; so is `split` beside a spec, which carries its own). `explore` must be a boolean and
comes only with `data_idx`; `max_rounds` (the exploration's rounds) only with `explore: true`.

Errors are JSON `{"error": ...}`: 400 bad body or argument (malformed JSON, missing or mistyped field, bad
split, data_idx out of range, a malformed spec or one the env cannot check) and malformed framing (request
line, Content-Length), 404 unknown or closed id and unknown route, 405 wrong method, 408 a request not complete
within `request_timeout_s` of its first byte (headers or body: a slow or stalled client), 409 step, state or
measures before reset, 411 a chunked body, 413 body over 1 MiB, 422 when an env fails on a request, 429 too
many live sessions, 431 headers (request line, fields and the blank line after them) over 64 KiB. After a 400
on framing, 408, 411, 413 and 431 the server closes the connection. Never 500.

It is one process running a lean HTTP/1.1 server on asyncio (keep-alive, pipelining, `Expect: 100-continue`):
env steps take microseconds, so parsing and framing dominate, and a plain protocol class beats a framework
by a wide margin (see `launch/benchmarks/env.py`). Env calls run on the event loop; every built-in env keeps
its calls short (the SQL env stops queries after a quarter of a second). Session ids start at a random
offset so that a client holding an id from before a restart gets 404, never somebody else's session.
Sessions idle for `idle_timeout_s` are closed; at most `max_sessions` live at once. A connection idle between
requests is kept open (the request timeout runs only while a request is incomplete).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import secrets
import sys
import time
import traceback
from typing import Any, Callable
from urllib.parse import parse_qs

from evolver.envs import base
from evolver.json_http import MAX_HEADER_BYTES, HttpError, LoopThread, json_response, parse_head, serve

MAX_BODY_BYTES = 1024 * 1024
REQUEST_TIMEOUT_S = 30.0  # default time from a request's first byte to its last


class _Session:
  __slots__ = ("env", "last_used")

  def __init__(self, env: base.TextEnv):
    self.env = env
    self.last_used = time.monotonic()


def _field(body: dict[str, Any], name: str, kind: type, default: Any = ...) -> Any:
  if name not in body:
    if default is ...:
      raise HttpError(400, f"missing field {name!r}")
    return default
  value = body[name]
  if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
    raise HttpError(400, f"field {name!r} must be an integer, got {type(value).__name__}")
  if kind is str and not isinstance(value, str):
    raise HttpError(400, f"field {name!r} must be a string, got {type(value).__name__}")
  return value


@dataclasses.dataclass(frozen=True)
class _WorldBody:
  """A body's exploration: the world of task `index` of `split`, with no goal, for `max_rounds` rounds."""
  index: int
  split: str
  max_rounds: int | None


@dataclasses.dataclass(frozen=True)
class _SpecBody:
  """A body's `spec`, as sent: the env validates it (`TextEnv.reset_spec`), so that any refusal of a spec
  ends the session's episode, as it does locally."""
  raw: Any


def _task_of(arguments: dict[str, Any], required: bool) -> tuple[int, str] | _SpecBody | _WorldBody | None:
  """The task a /create or /reset body asks for: (data_idx, split), a spec, an exploration of a task's world,
  or None (only if not required).

  Raises:
    HttpError: 400 for both `data_idx` and `spec`, for neither when `required`, for `split` beside a spec, for
      `explore` that is not a boolean or comes without `data_idx`, and for `max_rounds` without `explore`.
  """
  explore = arguments.get("explore", False)
  if not isinstance(explore, bool):
    raise HttpError(400, f"field 'explore' must be true or false, got {type(explore).__name__}")
  if "max_rounds" in arguments and not explore:
    raise HttpError(400, "'max_rounds' is the rounds of an exploration: it comes only with 'explore': true")
  if explore:
    if "spec" in arguments or "data_idx" not in arguments:
      raise HttpError(400, "'explore' opens the world of an indexed task: give 'data_idx' (with 'split'), not "
                      "a spec")
    max_rounds = arguments.get("max_rounds")
    if max_rounds is not None:
      max_rounds = _field(arguments, "max_rounds", int)
    return _WorldBody(_field(arguments, "data_idx", int), _field(arguments, "split", str, "train"), max_rounds)
  has_index, has_spec = "data_idx" in arguments, "spec" in arguments
  if has_index and has_spec:
    raise HttpError(400, "give either 'data_idx' (with 'split') or 'spec', not both")
  if has_spec:
    if "split" in arguments:
      raise HttpError(400, "'split' goes inside the spec (spec.split), not beside it")
    return _SpecBody(arguments["spec"])
  if has_index:
    return _field(arguments, "data_idx", int), _field(arguments, "split", str, "train")
  if required:
    raise HttpError(400, "missing the task: give 'data_idx' (with 'split') or 'spec'")
  _field(arguments, "split", str, "train")
  return None


def _start(env: base.TextEnv, task: tuple[int, str] | _SpecBody | _WorldBody) -> str:
  if isinstance(task, _SpecBody):
    return env.reset_spec(task.raw)
  if isinstance(task, _WorldBody):
    return env.reset_world(task.index, task.split, task.max_rounds)
  return env.reset(*task)


def _started(session_id: int, observation: str, task: Any) -> dict[str, Any]:
  """The answer of /create and /reset; an exploration's says `explore: true`, so that a client can tell it
  from a server that predates explorations and would have ignored the field."""
  answer = {"id": session_id, "observation": observation, "reward": 0.0, "done": False}
  if isinstance(task, _WorldBody):
    answer["explore"] = True
  return answer


class EnvService:
  """The sessions and the routes, independent of HTTP framing (one instance per server)."""

  def __init__(self, env_factory: Callable[[], base.TextEnv], *, max_sessions: int = 1024,
               idle_timeout_s: float = 900.0):
    self._factory = env_factory
    self.max_sessions = max_sessions
    self.idle_timeout_s = idle_timeout_s
    self._sessions: dict[int, _Session] = {}
    self._next_id = secrets.randbelow(2**40)
    probe = self._probe = env_factory()  # also answers /target_key, which needs no session
    self.info = {"name": probe.name, "version": probe.version, "instruction": probe.instruction(),
                 "max_rounds": probe.max_rounds,
                 "num_tasks": {split: probe.num_tasks(split) for split in base.SPLITS}}
    self._routes: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = {
        "/create": ("POST", self.create), "/reset": ("POST", self.reset), "/step": ("POST", self.step),
        "/close": ("POST", self.close), "/observation": ("GET", self.observation), "/expert": ("GET", self.expert),
        "/state": ("GET", self.state), "/measures": ("GET", self.measures), "/hindsight": ("GET", self.hindsight),
        "/target_key": ("POST", self.target_key),
        "/info": ("GET", lambda _: self.info), "/health": ("GET", self.health),
        "/": ("GET", lambda _: f"This is environment {self.info['name']}."),
    }

  @property
  def num_sessions(self) -> int:
    return len(self._sessions)

  def handle(self, method: str, target: str, body: bytes) -> tuple[int, Any]:
    """Answers one request: (status, JSON-able payload). Never raises."""
    try:
      path, _, query = target.partition("?")
      if path not in self._routes:
        raise HttpError(404, f"unknown route {path[:100]!r}")
      allowed, handler = self._routes[path]
      if method != allowed and not (method == "HEAD" and allowed == "GET"):
        raise HttpError(405, f"{path} takes {allowed}, not {method[:10]}")
      if allowed == "GET":
        arguments = {k: v[-1] for k, v in parse_qs(query).items()}
      elif body.strip():
        try:
          arguments = json.loads(body)
        except (ValueError, RecursionError) as error:
          raise HttpError(400, f"body is not valid JSON: {error}") from None
        if not isinstance(arguments, dict):
          raise HttpError(400, "body must be a JSON object")
      else:
        arguments = {}
      return 200, handler(arguments)
    except HttpError as error:
      return error.status, {"error": error.message}
    except base.EpisodeNotStartedError as error:
      return 409, {"error": str(error)}
    except base.EnvError as error:
      return 400, {"error": str(error)}
    except Exception as error:  # An env bug must not take the server down or answer 500.
      traceback.print_exc(file=sys.stderr)
      return 422, {"error": f"the env failed on this request: {error.__class__.__name__}: {error}"}

  # --- sessions -------------------------------------------------------------------------------------------

  def _session(self, arguments: dict[str, Any], from_query: bool = False) -> _Session:
    if from_query:
      raw = arguments.get("id")
      if raw is None:
        raise HttpError(400, "missing query parameter 'id'")
      try:
        session_id = int(raw)
      except ValueError:
        raise HttpError(400, f"query parameter 'id' must be an integer, got {raw[:40]!r}") from None
    else:
      session_id = _field(arguments, "id", int)
    session = self._sessions.get(session_id)
    if session is None:
      raise HttpError(404, f"no session {session_id}: unknown, closed or reaped after being idle")
    session.last_used = time.monotonic()
    return session

  def reap_idle(self) -> int:
    """Closes sessions idle for longer than `idle_timeout_s`; returns how many."""
    cutoff = time.monotonic() - self.idle_timeout_s
    stale = [sid for sid, session in self._sessions.items() if session.last_used < cutoff]
    for sid in stale:
      self._drop(sid)
    return len(stale)

  def _drop(self, session_id: int) -> None:
    session = self._sessions.pop(session_id, None)
    if session is not None:
      session.env.close()

  def close_all(self) -> None:
    for sid in list(self._sessions):
      self._drop(sid)
    self._probe.close()

  # --- routes ---------------------------------------------------------------------------------------------

  def create(self, arguments: dict[str, Any]) -> dict[str, Any]:
    task = _task_of(arguments, required=False)  # validate before allocating anything
    if isinstance(task, _SpecBody):
      base.TaskSpec.from_json(task.raw)
    if len(self._sessions) >= self.max_sessions:
      self.reap_idle()
      if len(self._sessions) >= self.max_sessions:
        raise HttpError(429, f"too many live sessions ({self.max_sessions}); close some or retry later")
    env = self._factory()
    observation = "Session created; call /reset with a data_idx or a spec to start a task."
    if task is not None:
      try:
        observation = _start(env, task)
      except BaseException:
        env.close()
        raise
    session_id = self._next_id
    self._next_id += 1
    self._sessions[session_id] = _Session(env)
    return _started(session_id, observation, task)

  def reset(self, arguments: dict[str, Any]) -> dict[str, Any]:
    session = self._session(arguments)
    task = _task_of(arguments, required=True)
    return _started(arguments["id"], _start(session.env, task), task)

  def step(self, arguments: dict[str, Any]) -> dict[str, Any]:
    session = self._session(arguments)
    action = _field(arguments, "action", str)
    observation, reward, done, info = session.env.step(action)
    return {"observation": observation, "reward": reward, "done": done, "info": info}

  def observation(self, arguments: dict[str, Any]) -> str:
    return self._session(arguments, from_query=True).env.observation

  def expert(self, arguments: dict[str, Any]) -> str:
    return self._session(arguments, from_query=True).env.expert_action()

  def state(self, arguments: dict[str, Any]) -> str:
    return self._session(arguments, from_query=True).env.state_key()

  def measures(self, arguments: dict[str, Any]) -> dict[str, Any]:
    return self._session(arguments, from_query=True).env.measures()

  def hindsight(self, arguments: dict[str, Any]) -> list[dict[str, Any]]:
    return [task.to_json() for task in self._session(arguments, from_query=True).env.hindsight_tasks()]

  def target_key(self, arguments: dict[str, Any]) -> str:
    task = _task_of(arguments, required=True)
    if isinstance(task, _SpecBody):
      return self._probe.spec_target_key(task.raw)
    if isinstance(task, _WorldBody):
      raise HttpError(400, "/target_key takes a task ('data_idx' with 'split', or 'spec'), not an exploration")
    return self._probe.target_key(*task)

  def close(self, arguments: dict[str, Any]) -> dict[str, Any]:
    session_id = _field(arguments, "id", int)
    if session_id not in self._sessions:
      raise HttpError(404, f"no session {session_id}: unknown, closed or reaped after being idle")
    self._drop(session_id)
    return {"closed": True}

  def health(self, _: dict[str, Any]) -> dict[str, Any]:
    return {"status": "ok", "env": self.info["name"], "sessions": len(self._sessions)}


# ----------------------------------------------------------------------------------------------------------
# HTTP/1.1 framing on asyncio (the head parse, answers and limits shared with the experience service:
# `evolver.json_http`).
# ----------------------------------------------------------------------------------------------------------


class _HttpProtocol(asyncio.Protocol):
  """One connection: parses pipelined requests from the buffer and answers them in order.

  A request must arrive whole within `request_timeout_s` of its first byte, else 408 and the connection
  closes; the clock runs only while a request is incomplete (or a refused body is being swallowed).
  """

  def __init__(self, service: EnvService, connections: set, request_timeout_s: float):
    self._service = service
    self._connections = connections
    self._request_timeout_s = request_timeout_s
    self._buffer = bytearray()
    self._transport: asyncio.Transport | None = None
    self._sent_continue = False
    self._discard = 0  # bytes of a refused body still to swallow before closing
    self._deadline: asyncio.TimerHandle | None = None  # armed while a request is incomplete

  def connection_made(self, transport: asyncio.BaseTransport) -> None:
    self._transport = transport
    self._connections.add(transport)

  def connection_lost(self, exc: Exception | None) -> None:
    self._disarm()
    self._connections.discard(self._transport)

  def data_received(self, data: bytes) -> None:
    if self._discard:
      self._discard -= min(self._discard, len(data))
      if not self._discard:
        self._transport.close()
      return
    self._buffer += data
    while self._transport is not None and not self._transport.is_closing():
      if not self._next_request():
        break
    if self._transport.is_closing():
      self._disarm()
    elif (self._buffer or self._discard) and self._deadline is None:
      self._deadline = asyncio.get_running_loop().call_later(self._request_timeout_s, self._timed_out)

  def _disarm(self) -> None:
    if self._deadline is not None:
      self._deadline.cancel()
      self._deadline = None

  def _timed_out(self) -> None:
    self._deadline = None
    if self._transport.is_closing():
      return
    if self._discard:  # the 413 is already written: only close
      self._transport.close()
      return
    self._fail(408, f"the request was not complete within {self._request_timeout_s:g} s of its first byte")

  def _fail(self, status: int, message: str) -> None:
    self._transport.write(json_response(status, {"error": message}, keep_alive=False))
    self._transport.close()
    self._buffer.clear()

  def _next_request(self) -> bool:
    """Answers the first complete request in the buffer; False when more bytes are needed."""
    end = self._buffer.find(b"\r\n\r\n", 0, MAX_HEADER_BYTES)  # the blank line must end within the limit
    if end < 0:
      if len(self._buffer) >= MAX_HEADER_BYTES:
        self._fail(431, f"request headers larger than {MAX_HEADER_BYTES} bytes")
      return False
    try:
      head = parse_head(self._buffer[:end])
    except HttpError as error:
      self._fail(error.status, error.message)
      return False
    length = head.content_length
    if length > MAX_BODY_BYTES:
      # Answer now, then swallow what the client still sends (up to a bound) so that it can read the answer.
      received = len(self._buffer) - end - 4
      self._transport.write(json_response(413, {"error": f"body larger than {MAX_BODY_BYTES} bytes"},
                                          keep_alive=False))
      self._buffer.clear()
      self._discard = length - received
      if self._discard <= 0 or self._discard > 16 * MAX_BODY_BYTES:
        self._discard = 0
        self._transport.close()
      return False
    total = end + 4 + length
    if len(self._buffer) < total:
      if head.expect_continue and not self._sent_continue:
        self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._sent_continue = True
      return False
    body = bytes(self._buffer[end + 4:total])
    del self._buffer[:total]
    self._sent_continue = False
    self._disarm()  # the next request's clock starts with its own bytes
    status, payload = self._service.handle(head.method, head.target, body)
    self._transport.write(json_response(status, payload, head.keep_alive, head_only=head.method == "HEAD"))
    if not head.keep_alive:
      self._transport.close()
      return False
    return True


class EnvServer:
  """Serves one env over HTTP. `await start()` binds; `port` is then the bound port."""

  def __init__(self, env_name: str | None = None, *, env_factory: Callable[[], base.TextEnv] | None = None,
               host: str = "127.0.0.1", port: int = 0, max_sessions: int = 1024, idle_timeout_s: float = 900.0,
               request_timeout_s: float = REQUEST_TIMEOUT_S):
    """
    Args:
      env_name: a built-in env (`evolver.envs.names()`), or None with `env_factory`.
      env_factory: makes one env per session.
      host, port: where to listen; port 0 picks a free one (`port` holds it after `start()`).
      max_sessions: live sessions allowed at once (429 beyond, after reaping idle ones).
      idle_timeout_s: sessions untouched for this long are closed.
      request_timeout_s: a request (headers and body) must arrive whole within this many seconds of its
        first byte, else the server answers 408 and closes the connection.
    """
    if request_timeout_s <= 0:
      raise ValueError(f"request_timeout_s must be positive, got {request_timeout_s}")
    self.request_timeout_s = request_timeout_s
    if env_factory is None:
      from evolver import envs  # the registry; imported here to keep this module free of env imports
      env_factory = envs.env_class(env_name)
    self.service = EnvService(env_factory, max_sessions=max_sessions, idle_timeout_s=idle_timeout_s)
    self.host = host
    self.port = port
    self._server: asyncio.AbstractServer | None = None
    self._connections: set = set()
    self._reaper: asyncio.TimerHandle | None = None

  async def start(self) -> int:
    loop = asyncio.get_running_loop()
    self._server = await loop.create_server(
        lambda: _HttpProtocol(self.service, self._connections, self.request_timeout_s),
        self.host, self.port, reuse_address=True, backlog=1024)
    self.port = self._server.sockets[0].getsockname()[1]
    self._schedule_reap()
    return self.port

  def _schedule_reap(self) -> None:
    interval = max(0.05, min(30.0, self.service.idle_timeout_s / 4))

    def reap() -> None:
      self.service.reap_idle()
      self._reaper = asyncio.get_running_loop().call_later(interval, reap)

    self._reaper = asyncio.get_running_loop().call_later(interval, reap)

  async def stop(self) -> None:
    if self._reaper is not None:
      self._reaper.cancel()
    if self._server is not None:
      self._server.close()
    for transport in list(self._connections):
      transport.close()
    if self._server is not None:
      await self._server.wait_closed()
    self.service.close_all()

  async def serve_forever(self, on_ready: Callable[[int], None] | None = None) -> None:
    """Binds, calls `on_ready(port)`, and serves until cancelled (`json_http.serve`)."""
    await serve(self, on_ready)


class ServerThread(LoopThread[EnvServer]):
  """An `EnvServer` on its own event loop in a daemon thread (tests, notebooks, in-process benchmarks); `port`,
  `url`, `stop()` and the context manager come from `LoopThread`.

    with ServerThread("maze") as server:
      env = RemoteEnv(server.url)
  """

  def __init__(self, env_name: str | None = None, **kwargs):
    """`env_name` and `kwargs` as `EnvServer`'s."""
    super().__init__(EnvServer(env_name, **kwargs), name=f"env-server-{env_name}", label="env server")
