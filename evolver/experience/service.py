"""ReMe 0.2's task-memory HTTP API over evolver's experience store, and one interface for both ways to use it.

  POST /retrieve_task_memory {workspace_id, query, top_k?=3}
      -> answer: the memories as one text (`manager.format_experiences`, ReMe's format; "" when none),
         metadata: {memory_list: [ReMe memory dicts], scores: [cosine per memory], query: the query used}
         A query that parses as a JSON list of messages (what AgentEvolver's EMClient sends) is reduced to the
         task's text (`manager.task_query`). An unknown workspace answers "" (nothing found), as ReMe does, and
         stays unknown (nothing is opened or created for it).
  POST /summary_task_memory {workspace_id, trajectories: [{messages, score, task_id?, metadata?}], step?}
      -> answer: JSON of the committed memories, metadata: {memory_list, stats, update_result}
         Answers once the memories are committed and indexed: a retrieval right after finds them.
  POST /record_task_memory {workspace_id, memory_dicts: [{memory_id, ...}], update_utility?=false, step?}
      -> freq += 1 for each listed memory (an id listed twice is bumped twice), and utility += 1 too when
         update_utility, as ReMe's UpdateMemoryFreqOp and UpdateMemoryUtilityOp; `step` (a non-negative int, the
         RL step) stamps the bumps as the in-process pool's are, so `Workspace.set_aside_after` undoes them.
         metadata: {memory_list (the updated memories, once each), update_result: {updated_count (bumps
         applied), missing_ids (listed ids with no live memory, once each)}}
  POST /delete_task_memory {workspace_id, freq_threshold, utility_threshold}
      -> deletes the memories with freq >= freq_threshold (a positive integer) and utility / freq <
         utility_threshold (ReMe's DeleteMemoryOp); metadata: {deleted_memory_ids, update_result}
  POST /vector_store {action, workspace_id?, ...}          -> metadata.action_result (JSON, not ReMe's str())
      list        {workspace_id}: its memories; without workspace_id: the workspaces
      count       {workspace_id}: how many live memories it holds -> {count} (0 for an unknown workspace, which
                  stays unknown; reads the count, not the memories)
      dump        {workspace_id, path}: writes `<path>/<workspace_id>.jsonl` (ReMe's layout: path is a folder;
                  a path ending in .jsonl names the file itself) -> {path, count}
      load        {workspace_id, path}: reads the same file into the workspace (created if new) -> {path, count}
      delete      {workspace_id}: the whole workspace -> {deleted}
      delete_ids  {workspace_id, memory_ids} -> {deleted}
      copy        {src_workspace_id, workspace_id}: a new workspace_id holding src's memories -> {count}
  GET  /health -> {status: "healthy", embedder, workspaces}

Paths: dump and load touch only files under the library directory (`library_dir`, by default
`<store>/libraries`): a relative path is taken inside it, an absolute one must resolve (symlinks followed) to a
place inside it, and anything else is refused with 403.

Access and limits (`ExperienceServer` and `ExperienceService` arguments; `launch.serve_experience` flags):
  * token: with one (the launcher reads it from the environment variable that --token_env names), every route,
    /health included, needs `Authorization: Bearer <token>`. A request without it or with another token gets 401
    with `WWW-Authenticate: Bearer` and a body that says only that (nothing about the store), before its body is
    read, and the connection is closed. Tokens are compared in constant time (`hmac.compare_digest`). Without a
    token there is no authentication: bind loopback then (the default).
  * max_connections (default 64): open connections, idle keep-alive ones included. One past the cap is answered
    503 with `Retry-After: 1` and closed at once, without reaching the service; the others are unaffected.
  * max_workspaces (default 1000): the only requests that create a workspace are a summary, a `load` and a `copy`
    into a new one. Past the cap they are refused with 409 (Conflict: the store is full until a workspace is
    deleted) and create nothing; a summary is refused before summarizing. Nothing else creates a workspace.
  * max_open_pools (default 64): workspaces whose pool (vector index and database connection) stays open; past it
    the least recently used pool is closed, and reopened from the store when next needed. Record, list, count and
    dump open the workspace's database only, not a pool. So memory stays bounded however many workspaces exist.

Every answer is ReMe's `{answer, messages, success, metadata}`; errors add `error` (success false): 400 malformed
body, field or workspace id, bad top_k or step; 401 a missing or wrong token; 403 a path outside the library
directory; 404 unknown route, workspace (where one must exist) or library file; 405 wrong method; 408 a body not
complete within `request_timeout_s`; 409 a new workspace past `max_workspaces`; 411 chunked bodies; 413 a body
over `max_body_bytes`; 431 headers over 64 KiB; 422 when the store or the summarizer fails on a request; 503 when
the summarizer's model cannot be reached, or a connection past `max_connections`. Never 500.

Concurrency: requests are answered by a pool of worker threads; every store and index operation runs on one
data thread (SQLite connections stay on the thread that made them, and commits are serialised), while an LLM
summarizer's generation runs on the request's worker, outside it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import collections
import contextlib
import hmac
import json
import math
import os
import sys
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from evolver.experience import manager
from evolver.experience.records import ExperienceError, TaskMemory, check_workspace_id
from evolver.experience.summarizer import (ExtractiveSummarizer, Summarizer, SummarizerUnavailable, SummaryResult,
                                           pool_size, summarize_and_commit, trajectory_payload)
from evolver.json_http import MAX_HEADER_BYTES, HttpError, LoopThread, json_response, parse_head, serve

DEFAULT_TOP_K = 3  # ReMe's RecallVectorStoreOp default
MAX_TOP_K = 100
MAX_BODY_BYTES = 32 * 1024 * 1024  # a summary batch carries whole conversations
REQUEST_TIMEOUT_S = 60.0
KEEP_ALIVE_TIMEOUT_S = 60.0
MAX_CONNECTIONS = 64  # open connections, idle keep-alive ones included; one more is answered 503
MAX_WORKSPACES = 1000  # a request that would create one more is answered 409
MAX_OPEN_POOLS = 64  # workspaces whose pool (index, database connection) stays open; least recently used closed
RETRY_AFTER_S = 1  # what a connection past the cap is told to wait
LINGER_S = 2.0  # how long a refused connection's input is drained before the close (see `_refuse`)
VECTOR_STORE_ACTIONS = ("list", "count", "dump", "load", "delete", "delete_ids", "copy")

_UNAUTHORIZED = "this service needs the header 'Authorization: Bearer <token>' with its token"


def reme_response(answer: Any = "", metadata: dict[str, Any] | None = None, success: bool = True) -> dict[str, Any]:
  """ReMe's response object."""
  return {"answer": answer, "messages": [], "success": success, "metadata": metadata or {}}


def _error(message: str) -> dict[str, Any]:
  payload = reme_response(success=False)
  payload["error"] = message
  return payload


class _Secret:
  """A bearer token, kept out of reprs, logs and tracebacks' locals."""

  __slots__ = ("value",)

  def __init__(self, value: str):
    self.value = value

  def __repr__(self) -> str:
    return "<secret>"


def _check_token(token: Any, source: str) -> str:
  """The token, if it can travel in an HTTP header (visible ASCII, no spaces: RFC 6750's b64token and kin)."""
  if not isinstance(token, str) or not token or not all("!" <= c <= "~" for c in token):
    raise ValueError(f"{source} must hold a non-empty bearer token of visible ASCII characters (no spaces)")
  return token


def token_from_env(name: str) -> str:
  """The bearer token held by the environment variable `name`. Raises ValueError naming the variable (never its
  value) when it is unset, empty or not a token."""
  if not isinstance(name, str) or not name:
    raise ValueError(f"token_env must name an environment variable, got {name!r}")
  token = os.environ.get(name, "")
  if not token:
    raise ValueError(f"the environment variable {name} (token_env) is unset or empty: set it to the experience "
                     "service's bearer token")
  return _check_token(token, f"the environment variable {name}")


# ----------------------------------------------------------------------------------------------------------
# One interface: the in-process pool or the service.
# ----------------------------------------------------------------------------------------------------------


@runtime_checkable
class ExperienceBackend(Protocol):
  """Retrieval, summary, freq/utility records and counts, in process (`LocalBackend`) or over HTTP
  (`ExperienceClient`)."""

  def retrieve(self, queries: Sequence[str], top_k: int,
               workspace_id: str | None = None) -> list[list[tuple[TaskMemory, float]]]:
    """Per query (the task's text, or the JSON of messages, reduced by `manager.task_query`), up to top_k
    (memory, cosine) pairs, best first."""
    ...

  def summarize(self, trajectories: Sequence[Any], workspace_id: str | None = None,
                step: int | None = None) -> SummaryResult:
    """Summarizes trajectories (ReMe dicts or evolver Trajectories) and commits the records, stamped with step;
    returns when a retrieval finds them."""
    ...

  def record(self, memory_ids: Sequence[str], update_utility: bool = False, workspace_id: str | None = None,
             step: int | None = None) -> dict[str, Any]:
    """freq += 1 for each listed id (an id listed twice is bumped twice), utility += 1 too when update_utility;
    the bumps are stamped with step (a non-negative RL step, or None) so `Workspace.set_aside_after` undoes them.
    Returns {"updated_count": bumps applied, "missing_ids": listed ids with no live memory, once each}."""
    ...

  def count(self, workspace_id: str | None = None) -> int:
    """How many live memories the workspace holds (0 for one that does not exist; nothing is created)."""
    ...


def _check_top_k(top_k: Any, limit: int = MAX_TOP_K) -> int:
  if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= limit:
    raise HttpError(400, f"top_k must be an integer in [1, {limit}], got {str(top_k)[:40]!r}")
  return top_k


def _memory_ids(memory_ids: Sequence[str]) -> list[str]:
  """The ids as a list (every occurrence kept); a lone string is refused rather than read as its characters."""
  if isinstance(memory_ids, str):
    raise TypeError(f"memory_ids must be a sequence of ids, got the string {memory_ids[:60]!r}")
  return list(memory_ids)


def _missing(listed: Sequence[str], found: Sequence[TaskMemory]) -> list[str]:
  """The listed ids (once each, in order) that no found memory has."""
  have = {m.memory_id for m in found}
  return [i for i in dict.fromkeys(listed) if i not in have]


def _unique_contents(hits: Sequence[tuple[TaskMemory, float]]) -> list[tuple[TaskMemory, float]]:
  """Hits without repeated contents (ReMe's RecallVectorStoreOp keeps the first of each)."""
  seen, kept = set(), []
  for memory, score in hits:
    if memory.content not in seen:
      seen.add(memory.content)
      kept.append((memory, float(score)))
  return kept


class LocalBackend:
  """`ExperienceBackend` over an in-process `ExperiencePool` (one workspace) and a summarizer."""

  def __init__(self, pool: Any, summarizer: Summarizer | None = None):
    self.pool = pool
    self.summarizer = summarizer or ExtractiveSummarizer()

  @property
  def workspace_id(self) -> str:
    return self.pool.workspace_id

  def _check_workspace(self, workspace_id: str | None) -> None:
    if workspace_id is not None and workspace_id != self.workspace_id:
      raise ValueError(f"this backend serves workspace {self.workspace_id!r}, not {workspace_id!r}")

  def retrieve(self, queries: Sequence[str], top_k: int,
               workspace_id: str | None = None) -> list[list[tuple[TaskMemory, float]]]:
    self._check_workspace(workspace_id)
    try:
      _check_top_k(top_k)
    except HttpError as error:
      raise ValueError(error.message) from None
    texts = [manager.task_query(q) for q in queries]
    results: list[list[tuple[TaskMemory, float]]] = [[] for _ in texts]
    asked = [i for i, text in enumerate(texts) if text]
    if asked and pool_size(self.pool):
      for i, hits in zip(asked, self.pool.retrieve([texts[i] for i in asked], top_k)):
        results[i] = _unique_contents(hits)
    return results

  def summarize(self, trajectories: Sequence[Any], workspace_id: str | None = None,
                step: int | None = None) -> SummaryResult:
    self._check_workspace(workspace_id)
    return summarize_and_commit(self.pool, trajectories, step, summarizer=self.summarizer)

  def record(self, memory_ids: Sequence[str], update_utility: bool = False, workspace_id: str | None = None,
             step: int | None = None) -> dict[str, Any]:
    self._check_workspace(workspace_id)
    ids = _memory_ids(memory_ids)
    workspace = self.pool.workspace
    applied = workspace.bump(ids, freq=1, utility=int(bool(update_utility)), step=step) if ids else 0
    found = workspace.get(list(dict.fromkeys(ids))) if ids else []
    return {"updated_count": applied, "missing_ids": _missing(ids, found)}

  def count(self, workspace_id: str | None = None) -> int:
    self._check_workspace(workspace_id)
    return self.pool.workspace.count()


class ExperienceServiceError(RuntimeError):
  """The experience service refused a request (`status`, the HTTP code) or could not be reached (status None)."""

  def __init__(self, status: int | None, message: str):
    super().__init__(f"{status}: {message}" if status else message)
    self.status = status
    self.message = message


class ExperienceClient:
  """`ExperienceBackend` over the HTTP service (stdlib only), plus the rest of its API.

    client = ExperienceClient("http://127.0.0.1:8001", workspace_id="default")
    hits = client.retrieve(["Your task is to ..."], top_k=3)
    client = ExperienceClient(url, token_env="EVOLVER_EXPERIENCE_TOKEN")  # a service started with --token_env

  Errors are `ExperienceServiceError` (status None when the service could not be reached). The token is read once,
  at construction, and appears in no repr or error message.
  """

  def __init__(self, url: str, workspace_id: str = "default", *, timeout_s: float = 300.0,
               token_env: str | None = None):
    """
    Args:
      url: the service, e.g. http://127.0.0.1:8001.
      workspace_id: the workspace calls use when they name none.
      timeout_s: per request, seconds.
      token_env: the name of the environment variable holding the service's bearer token (ValueError naming it
        when it is unset or empty); None sends no token.
    """
    self.url = url.rstrip("/")
    self.workspace_id = check_workspace_id(workspace_id)
    self.timeout_s = timeout_s
    self.token_env = token_env
    self._token = _Secret(token_from_env(token_env)) if token_env is not None else None

  def __repr__(self) -> str:
    auth = f", token_env={self.token_env!r}" if self.token_env is not None else ""
    return f"ExperienceClient({self.url!r}, workspace_id={self.workspace_id!r}{auth})"

  def _call(self, method: str, route: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
    data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if self._token is not None:
      headers["Authorization"] = f"Bearer {self._token.value}"
    request = urllib.request.Request(self.url + route, data=data, method=method, headers=headers)
    try:
      with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
        return json.loads(response.read())
    except urllib.error.HTTPError as error:
      raw = error.read()
      try:
        message = json.loads(raw).get("error", "")
      except (ValueError, AttributeError):
        message = raw[:300].decode("utf-8", "replace")
      message = message or str(error.reason)
      if error.code == 401 and self._token is None:
        message += " (ExperienceClient sends one from the environment variable that token_env names)"
      raise ExperienceServiceError(error.code, message) from None
    except (urllib.error.URLError, OSError, ValueError) as error:
      raise ExperienceServiceError(None, f"{self.url}{route} failed: {error}") from None

  def _workspace(self, workspace_id: str | None) -> str:
    return check_workspace_id(workspace_id) if workspace_id is not None else self.workspace_id

  def health(self) -> dict[str, Any]:
    return self._call("GET", "/health")

  def retrieve_answer(self, query: str, top_k: int = DEFAULT_TOP_K, workspace_id: str | None = None) -> dict:
    """The raw ReMe response for one query."""
    return self._call("POST", "/retrieve_task_memory",
                      {"workspace_id": self._workspace(workspace_id), "query": query, "top_k": top_k})

  def retrieve(self, queries: Sequence[str], top_k: int,
               workspace_id: str | None = None) -> list[list[tuple[TaskMemory, float]]]:
    results = []
    for query in queries:
      metadata = self.retrieve_answer(query, top_k, workspace_id)["metadata"]
      memories = [TaskMemory.from_json(m) for m in metadata.get("memory_list", [])]
      scores = metadata.get("scores") or [math.nan] * len(memories)
      results.append(list(zip(memories, (float(s) for s in scores))))
    return results

  def summarize(self, trajectories: Sequence[Any], workspace_id: str | None = None,
                step: int | None = None) -> SummaryResult:
    body = {"workspace_id": self._workspace(workspace_id),
            "trajectories": [trajectory_payload(t) for t in trajectories]}
    if step is not None:
      body["step"] = int(step)
    metadata = self._call("POST", "/summary_task_memory", body)["metadata"]
    return SummaryResult([TaskMemory.from_json(m) for m in metadata.get("memory_list", [])],
                         dict(metadata.get("stats", {})))

  def record(self, memory_ids: Sequence[str], update_utility: bool = False, workspace_id: str | None = None,
             step: int | None = None) -> dict[str, Any]:
    body = {"workspace_id": self._workspace(workspace_id),
            "memory_dicts": [{"memory_id": i} for i in _memory_ids(memory_ids)], "update_utility": bool(update_utility)}
    if step is not None:
      body["step"] = int(step)
    return dict(self._call("POST", "/record_task_memory", body)["metadata"]["update_result"])

  def count(self, workspace_id: str | None = None) -> int:
    return int(self.vector_store("count", workspace_id=self._workspace(workspace_id))["count"])

  def load_library(self, path: str, workspace_id: str | None = None) -> int:
    """Loads a JSONL library from the service's library directory (`path` relative to it, or a folder holding
    `<workspace_id>.jsonl`) into the workspace, created if new. Returns how many memories it read."""
    return int(self.vector_store("load", workspace_id=self._workspace(workspace_id), path=path)["count"])

  def delete_by_utility(self, freq_threshold: int, utility_threshold: float,
                        workspace_id: str | None = None) -> list[str]:
    """ReMe's threshold deletion; returns the deleted ids."""
    return self._call("POST", "/delete_task_memory", {
        "workspace_id": self._workspace(workspace_id), "freq_threshold": freq_threshold,
        "utility_threshold": utility_threshold})["metadata"]["deleted_memory_ids"]

  def vector_store(self, action: str, **fields: Any) -> Any:
    """A /vector_store action; returns its action_result."""
    return self._call("POST", "/vector_store", {"action": action, **fields})["metadata"]["action_result"]


# ----------------------------------------------------------------------------------------------------------
# The service: routes over a store, independent of HTTP framing.
# ----------------------------------------------------------------------------------------------------------


def _field(body: Mapping[str, Any], name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
  if name not in body or body[name] is None:
    if default is ...:
      raise HttpError(400, f"missing field {name!r}")
    return default
  value = body[name]
  kinds = kind if isinstance(kind, tuple) else (kind,)
  if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
    names = " or ".join(k.__name__ for k in kinds)
    raise HttpError(400, f"field {name!r} must be {names}, got {type(value).__name__}")
  return value


def _workspace_id(body: Mapping[str, Any], name: str = "workspace_id") -> str:
  value = _field(body, name, str)
  try:
    return check_workspace_id(value)
  except ExperienceError as error:
    raise HttpError(400, f"{name}: {error}") from None


def _close(thing: Any) -> None:
  close = getattr(thing, "close", None)
  if callable(close):
    close()


def _found(result: Any) -> list[TaskMemory]:
  values = result.values() if isinstance(result, Mapping) else result
  return [m for m in values if m is not None]


def default_pool_factory(store: Any, workspace_id: str, embedder: Any, min_score: float) -> Any:
  from evolver.experience.pool import ExperiencePool  # pylint: disable=import-outside-toplevel
  return ExperiencePool(store, workspace_id, embedder, min_score=min_score)


class ExperienceService:
  """The routes (module docstring) over an `ExperienceStore`; `handle` answers one request and never raises."""

  def __init__(self, store: Any, embedder: Any, *, summarizer: Summarizer | None = None,
               library_dir: str | os.PathLike | None = None, min_score: float = 0.0, max_top_k: int = MAX_TOP_K,
               max_workspaces: int = MAX_WORKSPACES, max_open_pools: int = MAX_OPEN_POOLS,
               pool_factory: Callable[[Any, str, Any, float], Any] = default_pool_factory):
    """
    Args:
      store: an `ExperienceStore` (or anything with its API).
      embedder: embeds queries and memories (`evolver.experience.embedders`).
      summarizer: for /summary_task_memory (default: `ExtractiveSummarizer()`).
      library_dir: the only folder dump and load may touch (default `<store root>/libraries`).
      min_score: retrieval drops hits below this cosine.
      max_top_k: the largest top_k a retrieval may ask for.
      max_workspaces: the most workspaces the store may hold; a request that would create one more gets 409.
      max_open_pools: the most pools kept open at once (least recently used closed past it).
      pool_factory: (store, workspace_id, embedder, min_score) -> an `ExperiencePool`.
    """
    for name, value in (("max_workspaces", max_workspaces), ("max_open_pools", max_open_pools)):
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    self.store = store
    self.embedder = embedder
    self.summarizer = summarizer or ExtractiveSummarizer()
    root = getattr(store, "root", None)
    if library_dir is None:
      if root is None:
        raise ValueError("give library_dir: the store does not say its root")
      library_dir = os.path.join(os.fspath(root), "libraries")
    self.library_dir = os.path.realpath(os.fspath(library_dir))
    os.makedirs(self.library_dir, exist_ok=True)
    self.min_score = float(min_score)
    self.max_top_k = max_top_k
    self.max_workspaces = max_workspaces
    self.max_open_pools = max_open_pools
    self._pool_factory = pool_factory
    self._pools: collections.OrderedDict[str, Any] = collections.OrderedDict()  # least recently used first
    self._data = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="experience-data")
    self._routes: dict[str, tuple[str, Callable[[dict[str, Any]], Any]]] = {
        "/retrieve_task_memory": ("POST", self.retrieve), "/summary_task_memory": ("POST", self.summary),
        "/record_task_memory": ("POST", self.record), "/delete_task_memory": ("POST", self.delete),
        "/vector_store": ("POST", self.vector_store), "/health": ("GET", self.health),
        "/": ("GET", lambda _: reme_response("This is evolver's experience service (ReMe 0.2's task-memory API).")),
    }

  # -- plumbing -------------------------------------------------------------------------------------------

  def handle(self, method: str, target: str, body: bytes) -> tuple[int, dict[str, Any]]:
    """Answers one request: (status, JSON-able payload). Never raises."""
    try:
      path = target.partition("?")[0]
      if path not in self._routes:
        raise HttpError(404, f"unknown route {path[:100]!r}")
      allowed, handler = self._routes[path]
      if method != allowed and not (method == "HEAD" and allowed == "GET"):
        raise HttpError(405, f"{path} takes {allowed}, not {method[:10]}")
      arguments: Any = {}
      if allowed == "POST":
        try:
          arguments = json.loads(body) if body.strip() else None
        except (ValueError, RecursionError) as error:
          raise HttpError(400, f"body is not valid JSON: {error}") from None
        if not isinstance(arguments, dict):
          raise HttpError(400, "body must be a JSON object")
      return 200, handler(arguments)
    except HttpError as error:
      return error.status, _error(error.message)
    except ExperienceError as error:
      return 400, _error(str(error))
    except SummarizerUnavailable as error:
      return 503, _error(str(error))
    except Exception as error:  # a store or summarizer bug must not take the service down or answer 500
      traceback.print_exc(file=sys.stderr)
      return 422, _error(f"the experience service failed on this request: {error.__class__.__name__}: {error}")

  def _on_data(self, fn: Callable[..., Any], *args: Any) -> Any:
    """Runs fn on the data thread (every store and index operation goes there) and returns its result."""
    return self._data.submit(fn, *args).result()

  def _exists(self, workspace_id: str) -> bool:
    if workspace_id in self._pools:
      return True
    exists = getattr(self.store, "exists", None)
    return exists(workspace_id) if callable(exists) else workspace_id in set(self.store.workspaces())

  def _check_room(self, workspace_id: str) -> None:
    """Raises HttpError 409 when workspace_id is new and the store already holds `max_workspaces` (data thread)."""
    if self._exists(workspace_id):
      return
    held = len(self.store.workspaces())
    if held >= self.max_workspaces:
      raise HttpError(409, f"the store holds {held} workspaces, the most this service keeps (max_workspaces); "
                      f"delete one (vector_store action 'delete') before creating {workspace_id!r}")

  def _pool(self, workspace_id: str, create: bool) -> Any:
    """The workspace's pool (data thread only), its index reloaded when the store changed behind it (another
    process, or this service's own freq/utility bumps); None when it does not exist and create is False. A new
    workspace is created only within `max_workspaces` (else HttpError 409); past `max_open_pools` open pools, the
    least recently used is closed."""
    pool = self._pools.get(workspace_id)
    if pool is not None:
      self._pools.move_to_end(workspace_id)
      if getattr(pool, "stale", False):
        pool.reload()
      return pool
    if not self._exists(workspace_id):
      if not create:
        return None
      self._check_room(workspace_id)
    pool = self._pools[workspace_id] = self._pool_factory(self.store, workspace_id, self.embedder, self.min_score)
    while len(self._pools) > self.max_open_pools:
      self._forget(next(iter(self._pools)))
    return pool

  def _existing_pool(self, workspace_id: str) -> Any:
    pool = self._pool(workspace_id, create=False)
    if pool is None:
      raise HttpError(404, f"no workspace {workspace_id!r}")
    return pool

  @contextlib.contextmanager
  def _existing_workspace(self, workspace_id: str) -> Iterator[Any]:
    """The workspace's `Workspace` without opening a pool (its open pool's when there is one); HttpError 404 when it
    does not exist. Data thread only."""
    if not self._exists(workspace_id):
      raise HttpError(404, f"no workspace {workspace_id!r}")
    with self._workspace(workspace_id, self._pools.get(workspace_id)) as workspace:
      yield workspace

  @contextlib.contextmanager
  def _workspace(self, workspace_id: str, pool: Any) -> Iterator[Any]:
    """The pool's own `Workspace`, or one opened for the occasion (and closed after it)."""
    workspace = getattr(pool, "workspace", None)
    if workspace is not None:
      yield workspace
      return
    workspace = self.store.open(workspace_id, create=False)
    try:
      yield workspace
    finally:
      _close(workspace)

  def _forget(self, workspace_id: str) -> None:
    pool = self._pools.pop(workspace_id, None)
    _close(pool if callable(getattr(pool, "close", None)) else getattr(pool, "workspace", None))

  def library_path(self, raw: Any, workspace_id: str) -> str:
    """The library file a dump or load names: `<path>/<workspace_id>.jsonl`, or path itself when it ends in
    .jsonl; relative paths are inside `library_dir`. Raises HttpError 403 for a place outside it."""
    if not isinstance(raw, str) or not raw.strip() or "\x00" in raw:
      raise HttpError(400, "field 'path' must be a non-empty string")
    path = raw if os.path.isabs(raw) else os.path.join(self.library_dir, raw)
    if not path.endswith(".jsonl"):
      path = os.path.join(path, f"{workspace_id}.jsonl")
    resolved = os.path.realpath(path)
    if os.path.commonpath([resolved, self.library_dir]) != self.library_dir or resolved == self.library_dir:
      raise HttpError(403, f"path {raw[:200]!r} is outside the library directory {self.library_dir} (dump and load "
                      "use only files under it; give a path relative to it)")
    return resolved

  def close(self) -> None:
    def close_all():
      for workspace_id in list(self._pools):
        self._forget(workspace_id)
    self._on_data(close_all)
    self._data.shutdown(wait=True)

  # -- routes ---------------------------------------------------------------------------------------------

  def health(self, _: Any) -> dict[str, Any]:
    return {"status": "healthy", "embedder": getattr(self.embedder, "name", ""),
            "workspaces": len(self._on_data(self.store.workspaces))}

  def retrieve(self, body: dict[str, Any]) -> dict[str, Any]:
    workspace_id = _workspace_id(body)
    query = _field(body, "query", str)
    top_k = _check_top_k(_field(body, "top_k", int, DEFAULT_TOP_K), self.max_top_k)
    try:
      text = manager.task_query(query)
    except ValueError as error:
      raise HttpError(400, f"query: {error}") from None
    if not text:
      raise HttpError(400, "the query is empty")

    def run():
      pool = self._pool(workspace_id, create=False)
      if pool is None or not pool_size(pool):
        return []
      return _unique_contents(pool.retrieve([text], top_k)[0])

    hits = self._on_data(run)
    return reme_response(manager.format_experiences(hits), {
        "memory_list": [m.to_json() for m, _ in hits], "scores": [s for _, s in hits], "query": text})

  def summary(self, body: dict[str, Any]) -> dict[str, Any]:
    workspace_id = _workspace_id(body)
    trajectories = _field(body, "trajectories", list, [])
    step = _field(body, "step", int, None)
    if trajectories:  # refuse a new workspace past the cap before any summarizing
      self._on_data(self._check_room, workspace_id)
    # extraction (a model's generation, for the LLM backend) runs here, off the data thread
    proposed = self.summarizer.propose(trajectories, workspace_id)

    def commit():
      pool = self._pool(workspace_id, create=bool(proposed.memories))
      result = self.summarizer.deduplicate(proposed, pool=pool, embedder=self.embedder)
      if result.memories:
        pool.commit(result.memories, step=step)
      return result

    result = self._on_data(commit)
    memories = [m.to_json() for m in result.memories]
    return reme_response(json.dumps(memories, ensure_ascii=False), {
        "memory_list": memories, "stats": result.stats,
        "update_result": {"deleted_count": 0, "inserted_count": len(memories)}})

  def record(self, body: dict[str, Any]) -> dict[str, Any]:
    workspace_id = _workspace_id(body)
    items = _field(body, "memory_dicts", list)
    update_utility = _field(body, "update_utility", bool, False)
    step = _field(body, "step", int, None)
    if step is not None and step < 0:
      raise HttpError(400, f"step must be a non-negative integer (the RL step), got {step}")
    ids = []  # every occurrence: an id listed twice is bumped twice, as `LocalBackend.record` does
    for i, item in enumerate(items):
      memory_id = item.get("memory_id") if isinstance(item, Mapping) else item
      if not isinstance(memory_id, str) or not memory_id:
        raise HttpError(400, f"memory_dicts[{i}] needs a string 'memory_id'")
      ids.append(memory_id)

    def run():
      with self._existing_workspace(workspace_id) as workspace:
        if not ids:
          return 0, []
        applied = workspace.bump(ids, freq=1, utility=int(update_utility), step=step)
        return applied, _found(workspace.get(list(dict.fromkeys(ids))))

    applied, updated = self._on_data(run)
    return reme_response("", {"memory_list": [m.to_json() for m in updated],
                              "update_result": {"updated_count": applied, "missing_ids": _missing(ids, updated)}})

  def delete(self, body: dict[str, Any]) -> dict[str, Any]:
    workspace_id = _workspace_id(body)
    freq_threshold = _field(body, "freq_threshold", int)
    if freq_threshold < 1:
      raise HttpError(400, f"freq_threshold must be a positive integer (memories never retrieved have freq 0 and "
                      f"no utility ratio), got {freq_threshold}")
    utility_threshold = float(_field(body, "utility_threshold", (int, float)))
    if not math.isfinite(utility_threshold):
      raise HttpError(400, "utility_threshold must be finite")

    def run():
      return list(self._existing_pool(workspace_id).delete_by_thresholds(freq_threshold, utility_threshold))

    doomed = self._on_data(run)
    return reme_response("", {"deleted_memory_ids": doomed,
                              "update_result": {"deleted_count": len(doomed), "inserted_count": 0}})

  def vector_store(self, body: dict[str, Any]) -> dict[str, Any]:
    action = _field(body, "action", str)
    if action not in VECTOR_STORE_ACTIONS:
      raise HttpError(400, f"unknown action {action[:40]!r}; use one of {list(VECTOR_STORE_ACTIONS)}")
    if action == "list" and "workspace_id" not in body:
      return reme_response("", {"action_result": sorted(self._on_data(self.store.workspaces))})
    workspace_id = _workspace_id(body)
    result = getattr(self, f"_action_{action}")(body, workspace_id)
    return reme_response("", {"action_result": result})

  def _action_list(self, body: dict[str, Any], workspace_id: str) -> list[dict[str, Any]]:
    del body

    def run():
      with self._existing_workspace(workspace_id) as workspace:
        return [m.to_json() for m in workspace.all()]

    return self._on_data(run)

  def _action_count(self, body: dict[str, Any], workspace_id: str) -> dict[str, int]:
    del body

    def run():
      if not self._exists(workspace_id):
        return 0
      with self._existing_workspace(workspace_id) as workspace:
        return workspace.count()

    return {"count": self._on_data(run)}

  def _action_dump(self, body: dict[str, Any], workspace_id: str) -> dict[str, Any]:
    path = self.library_path(body.get("path"), workspace_id)

    def run():
      with self._existing_workspace(workspace_id) as workspace:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return workspace.export_jsonl(path)

    return {"path": path, "count": self._on_data(run)}

  def _action_load(self, body: dict[str, Any], workspace_id: str) -> dict[str, Any]:
    path = self.library_path(body.get("path"), workspace_id)
    if not os.path.isfile(path):
      raise HttpError(404, f"no library file {path}")

    def run():
      pool = self._pool(workspace_id, create=True)
      with self._workspace(workspace_id, pool) as workspace:
        count = workspace.import_jsonl(path)
      pool.reload()
      return count

    return {"path": path, "count": self._on_data(run)}

  def _action_delete(self, body: dict[str, Any], workspace_id: str) -> dict[str, Any]:
    del body

    def run():
      if not self._exists(workspace_id):
        return False
      self._forget(workspace_id)
      self.store.delete_workspace(workspace_id)
      return True

    return {"deleted": self._on_data(run)}

  def _action_delete_ids(self, body: dict[str, Any], workspace_id: str) -> dict[str, Any]:
    ids = _field(body, "memory_ids", list)
    if not all(isinstance(i, str) and i for i in ids):
      raise HttpError(400, "memory_ids must be a list of non-empty strings")

    def run():
      pool = self._existing_pool(workspace_id)
      deleted = pool.delete(ids) if ids else 0
      return deleted if isinstance(deleted, int) else len(ids)

    return {"deleted": self._on_data(run)}

  def _action_copy(self, body: dict[str, Any], workspace_id: str) -> dict[str, Any]:
    source = _workspace_id(body, "src_workspace_id")
    if source == workspace_id:
      raise HttpError(400, "src_workspace_id and workspace_id are the same")

    def run():
      if not self._exists(source):
        raise HttpError(404, f"no workspace {source!r}")
      if self._exists(workspace_id):
        raise HttpError(400, f"workspace {workspace_id!r} exists; delete it first or copy into a new one")
      self._check_room(workspace_id)
      _close(self.store.copy_workspace(source, workspace_id))
      with self._workspace(workspace_id, self._pool(workspace_id, create=True)) as workspace:
        return workspace.count()

    return {"count": self._on_data(run)}


# ----------------------------------------------------------------------------------------------------------
# HTTP/1.1 on asyncio streams (the head parse, answers and limits shared with the env server: `evolver.json_http`).
# ----------------------------------------------------------------------------------------------------------


class ExperienceServer:
  """Serves an `ExperienceService` over HTTP. `await start()` binds; `port` is then the bound port."""

  def __init__(self, service: ExperienceService, *, host: str = "127.0.0.1", port: int = 0,
               max_body_bytes: int = MAX_BODY_BYTES, request_timeout_s: float = REQUEST_TIMEOUT_S,
               keep_alive_timeout_s: float = KEEP_ALIVE_TIMEOUT_S, workers: int = 8,
               max_connections: int = MAX_CONNECTIONS, token: str | None = None):
    """
    Args:
      service: answers the requests.
      host, port: where to listen (loopback by default); port 0 picks a free one.
      max_body_bytes: larger bodies get 413.
      request_timeout_s: a body must arrive within this many seconds of its headers (else 408).
      keep_alive_timeout_s: an idle connection is closed after this many seconds.
      workers: requests answered at once (store work is serialised on the service's data thread).
      max_connections: open connections at once (idle keep-alive ones included); one more is answered 503 with
        Retry-After and closed.
      token: when given, every request needs `Authorization: Bearer <token>` (else 401); None: no authentication.
    """
    if request_timeout_s <= 0 or keep_alive_timeout_s <= 0:
      raise ValueError("timeouts must be positive")
    if isinstance(max_connections, bool) or not isinstance(max_connections, int) or max_connections < 1:
      raise ValueError(f"max_connections must be a positive integer, got {max_connections!r}")
    self._token = None if token is None else _Secret(_check_token(token, "token"))
    self.max_connections = max_connections
    self.service = service
    self.host = host
    self.port = port
    self.max_body_bytes = max_body_bytes
    self.request_timeout_s = request_timeout_s
    self.keep_alive_timeout_s = keep_alive_timeout_s
    self._workers = concurrent.futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="experience-http")
    self._server: asyncio.AbstractServer | None = None
    self._tasks: set[asyncio.Task] = set()  # one per open connection
    self._refusals: set[asyncio.Task] = set()  # one per connection past the cap, being answered 503

  async def start(self) -> int:
    self._server = await asyncio.start_server(self._connection, self.host, self.port, limit=MAX_HEADER_BYTES,
                                              reuse_address=True, backlog=1024)
    self.port = self._server.sockets[0].getsockname()[1]
    return self.port

  async def stop(self) -> None:
    if self._server is not None:
      self._server.close()
    tasks = list(self._tasks | self._refusals)
    for task in tasks:
      task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    self._workers.shutdown(wait=False, cancel_futures=True)

  async def serve_forever(self, on_ready: Callable[[int], None] | None = None) -> None:
    """Binds, calls `on_ready(port)`, and serves until cancelled (`json_http.serve`)."""
    await serve(self, on_ready)

  async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    task = asyncio.current_task()
    over = len(self._tasks) >= self.max_connections
    if over and len(self._refusals) >= self.max_connections:  # a flood: not even a 503, just the close
      writer.close()
      return
    group = self._refusals if over else self._tasks
    group.add(task)
    try:
      if over:
        await self._refuse(reader, writer, 503, f"the service has {self.max_connections} connections open, its "
                           f"most (max_connections); retry in {RETRY_AFTER_S} s", {"Retry-After": str(RETRY_AFTER_S)})
      else:
        while await self._one_request(reader, writer):
          pass
    except (ConnectionError, OSError, asyncio.IncompleteReadError):
      pass
    except asyncio.CancelledError:  # stop(): end quietly (asyncio's streams callback chokes on a cancelled task)
      pass
    finally:
      group.discard(task)
      writer.close()

  async def _refuse(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int, message: str,
                    headers: Mapping[str, str]) -> bool:
    """Answers `status` without reading the request, then closes the connection. What the client still sends is
    read and dropped until it closes (at most LINGER_S): closing with unread input would send a TCP reset, which
    can reach the client before it has read the answer. Returns False (the connection is done)."""
    writer.write(json_response(status, _error(message), keep_alive=False, headers=headers))
    await writer.drain()
    if writer.can_write_eof():
      writer.write_eof()
    deadline = asyncio.get_running_loop().time() + LINGER_S
    with contextlib.suppress(asyncio.TimeoutError):
      while await asyncio.wait_for(reader.read(65536), max(deadline - asyncio.get_running_loop().time(), 0.0)):
        pass
    return False

  def _authorized(self, authorization: Sequence[str]) -> bool:
    """Whether the request's Authorization headers are exactly one `Bearer <token>` with this server's token."""
    if self._token is None:
      return True
    if len(authorization) != 1:
      return False
    scheme, _, credentials = authorization[0].partition(" ")
    given = credentials.strip().encode("latin-1")  # the head was decoded as latin-1: this gives its bytes back
    same = hmac.compare_digest(given, self._token.value.encode("ascii"))  # constant time whatever the scheme
    return same and scheme.lower() == "bearer"

  async def _fail(self, writer: asyncio.StreamWriter, status: int, message: str) -> bool:
    writer.write(json_response(status, _error(message), keep_alive=False))
    await writer.drain()
    return False

  async def _one_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
    """Answers the next request on the connection; False when the connection should close."""
    try:
      head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), self.keep_alive_timeout_s)
    except asyncio.IncompleteReadError as error:
      if error.partial.strip():
        return await self._fail(writer, 400, "incomplete request headers")
      return False
    except asyncio.LimitOverrunError:
      return await self._fail(writer, 431, f"request headers larger than {MAX_HEADER_BYTES} bytes")
    except asyncio.TimeoutError:
      return False
    try:
      request = parse_head(head[:-4])
    except HttpError as error:
      return await self._fail(writer, error.status, error.message)
    length = request.content_length
    if not self._authorized(request.authorization):  # before the body is read: a stranger's body costs nothing
      return await self._refuse(reader, writer, 401, _UNAUTHORIZED, {"WWW-Authenticate": "Bearer"})
    if length > self.max_body_bytes:
      return await self._fail(writer, 413, f"body larger than {self.max_body_bytes} bytes")
    if request.expect_continue and length:
      writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
    try:
      body = await asyncio.wait_for(reader.readexactly(length), self.request_timeout_s) if length else b""
    except asyncio.TimeoutError:
      return await self._fail(writer, 408, f"the body did not arrive within {self.request_timeout_s:g} s")
    loop = asyncio.get_running_loop()
    status, payload = await loop.run_in_executor(self._workers, self.service.handle, request.method, request.target,
                                                 body)
    writer.write(json_response(status, payload, request.keep_alive, head_only=request.method == "HEAD"))
    await writer.drain()
    return request.keep_alive


class ServiceThread(LoopThread[ExperienceServer]):
  """An `ExperienceServer` on its own event loop in a daemon thread (tests, notebooks, an in-process service);
  `port`, `url`, `stop()` and the context manager come from `LoopThread`.

    with ServiceThread(ExperienceService(store, embedder)) as server:
      client = ExperienceClient(server.url)
  """

  def __init__(self, service: ExperienceService, **kwargs):
    """`service` and `kwargs` as `ExperienceServer`'s."""
    super().__init__(ExperienceServer(service, **kwargs), name="experience-server", label="the experience server")
