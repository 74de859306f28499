"""A client for OpenAI-compatible chat endpoints (`POST {base_url}/chat/completions`): vLLM, SGLang, hosted APIs.

  client = OpenAIChat("http://127.0.0.1:8000/v1", "qwen2.5-7b-instruct", api_key=api_key_from_env("OPENAI_API_KEY"),
                      requests_per_s=10)
  reply = client.chat([{"role": "user", "content": "Hi"}], max_tokens=64, temperature=0.0)
  reply.text, reply.finish_reason, reply.completion_tokens

Standard library only; one client is shared by threads. Every request waits for the client-side rate limit
(`requests_per_s`, over all threads), then is sent with a timeout. Connection errors, timeouts, 408, 409, 429 and
5xx answers are retried `max_retries` times with exponential backoff (`backoff_s * 2**attempt`, at most
`max_backoff_s`), or after the server's `Retry-After` when it gives one (seconds or an HTTP date, also capped);
then `APIUnavailable` is raised. Any other 4xx is not retried: `APIRequestError` (with the status and the server's
message), or its subclass `ContextLengthExceeded` for a 400 that says the prompt does not fit the model's context.
The API key travels only in the Authorization header; it is never part of an error message or of `stats()`.
Configs name the environment variable that holds it (`api_key_from_env`), never the key.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any

RETRY_STATUSES = frozenset({408, 409, 429, 500, 502, 503, 504})
# How servers word a prompt that does not fit the context (vLLM, SGLang, OpenAI).
_CONTEXT_MARKERS = ("maximum context length", "context length", "context_length_exceeded", "too many tokens",
                    "longer than the model")


class APIError(RuntimeError):
  """A chat request that did not produce an answer."""


class APIUnavailable(APIError):
  """The endpoint could not be reached or kept failing with retryable errors after every retry."""


class APIRequestError(APIError):
  """The endpoint refused the request with a status that retrying does not change (a 4xx: bad key, unknown model,
  bad body). `status` is the HTTP status."""

  def __init__(self, message: str, status: int):
    super().__init__(message)
    self.status = status


class ContextLengthExceeded(APIRequestError):
  """A 400 saying the conversation and `max_tokens` do not fit the model's context."""


@dataclasses.dataclass(frozen=True)
class ChatReply:
  """One completion: its text, the server's `finish_reason` ("stop", "length", ...), and token usage (0 when the
  server reports none)."""

  text: str
  finish_reason: str
  prompt_tokens: int = 0
  completion_tokens: int = 0


class RateLimiter:
  """At most `per_s` acquisitions per second over all threads (evenly spaced); None or 0: no limit."""

  def __init__(self, per_s: float | None):
    if per_s is not None and per_s < 0:
      raise ValueError(f"requests_per_s must be >= 0 or None, got {per_s}")
    self.interval = 1.0 / per_s if per_s else 0.0
    self._next = 0.0
    self._lock = threading.Lock()

  def acquire(self) -> None:
    if not self.interval:
      return
    with self._lock:
      now = time.monotonic()
      slot = max(now, self._next)
      self._next = slot + self.interval
    if slot > now:
      time.sleep(slot - now)


def retry_after_s(value: str | None) -> float | None:
  """Seconds to wait from a `Retry-After` header (delta seconds or an HTTP date); None if absent or unreadable."""
  if not value:
    return None
  try:
    return max(0.0, float(value))
  except ValueError:
    pass
  try:
    when = email.utils.parsedate_to_datetime(value)
  except (TypeError, ValueError):
    return None
  return max(0.0, when.timestamp() - time.time())


def api_key_from_env(name: str | None) -> str | None:
  """The API key held by the environment variable `name`; None for no name (no key: a local server). Raises
  ValueError naming the variable, never a value, when it is unset or empty."""
  if name is None:
    return None
  if not isinstance(name, str) or not name:
    raise ValueError(f"api_key_env must name an environment variable, got {name!r}")
  key = os.environ.get(name, "")
  if not key:
    raise ValueError(f"the environment variable {name} (api_key_env) is unset or empty: export the endpoint's API key "
                     f"in it, or set api_key_env = None for an endpoint that needs none")
  return key


class OpenAIChat:
  """Chat completions from one model of an OpenAI-compatible endpoint (module docstring), safe to share by threads.

  Args:
    base_url: the API root, e.g. "http://127.0.0.1:8000/v1" (requests go to `{base_url}/chat/completions`).
    model: the model name the endpoint serves.
    api_key: sent as `Authorization: Bearer ...` when given.
    timeout_s: per request, seconds.
    max_retries: retries of a retryable failure (so at most 1 + max_retries attempts).
    backoff_s: the first retry's wait, seconds; doubled for each further retry.
    max_backoff_s: the longest wait between attempts, seconds (also caps `Retry-After`).
    requests_per_s: client-side rate limit over all threads; None: none.
  """

  def __init__(self, base_url: str, model: str, api_key: str | None = None, *, timeout_s: float = 120.0,
               max_retries: int = 5, backoff_s: float = 1.0, max_backoff_s: float = 60.0,
               requests_per_s: float | None = None):
    if not base_url.startswith(("http://", "https://")):
      raise ValueError(f"base_url must be an http(s) URL such as http://127.0.0.1:8000/v1, got {base_url!r}")
    if max_retries < 0:
      raise ValueError(f"max_retries must be >= 0, got {max_retries}")
    self.base_url = base_url.rstrip("/")
    self.url = self.base_url + "/chat/completions"
    self.model = model
    self._api_key = api_key
    self.timeout_s = timeout_s
    self.max_retries = max_retries
    self.backoff_s = backoff_s
    self.max_backoff_s = max_backoff_s
    self.limiter = RateLimiter(requests_per_s)
    self._lock = threading.Lock()
    self._stats = {"requests": 0, "retries": 0, "prompt_tokens": 0, "completion_tokens": 0, "request_s": 0.0}

  def stats(self) -> dict[str, float]:
    """Counters so far: requests sent (attempts), retries among them, tokens the server reported, and seconds
    spent in requests (summed over threads)."""
    with self._lock:
      return dict(self._stats)

  def _count(self, **increments: float) -> None:
    with self._lock:
      for key, value in increments.items():
        self._stats[key] += value

  def chat(self, messages: Sequence[Mapping[str, str]], *, max_tokens: int | None = None, temperature: float = 0.0,
           top_p: float | None = None, stop: Sequence[str] = (), seed: int | None = None,
           extra: Mapping[str, Any] | None = None) -> ChatReply:
    """One completion of `messages` (`[{"role", "content"}, ...]`).

    Args:
      max_tokens: the longest reply in tokens (None: the server's default).
      temperature: 0 is greedy.
      top_p: nucleus filter (None: not sent).
      stop: strings that end the reply (not part of it).
      seed: sent for reproducible sampling where the server supports it (None: not sent).
      extra: more body fields, sent as they are.

    Raises:
      APIRequestError: a non-retryable 4xx (ContextLengthExceeded for a prompt that does not fit).
      APIUnavailable: no answer after every retry, or an answer that is not a chat completion.
    """
    body: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages],
                            "temperature": temperature}
    if max_tokens:
      body["max_tokens"] = int(max_tokens)
    if top_p is not None and top_p < 1.0:
      body["top_p"] = top_p
    if stop:
      body["stop"] = list(stop)
    if seed is not None:
      body["seed"] = int(seed)
    body.update(extra or {})
    answer = self._post(json.dumps(body).encode("utf-8"))
    try:
      choice = answer["choices"][0]
      content = choice["message"]["content"]
    except (KeyError, IndexError, TypeError):
      raise APIUnavailable(f"{self.url} answered without choices[0].message.content: {str(answer)[:200]}") from None
    usage = answer.get("usage") or {}
    reply = ChatReply(text=content if isinstance(content, str) else "",
                      finish_reason=str(choice.get("finish_reason") or ""),
                      prompt_tokens=int(usage.get("prompt_tokens") or 0),
                      completion_tokens=int(usage.get("completion_tokens") or 0))
    self._count(prompt_tokens=reply.prompt_tokens, completion_tokens=reply.completion_tokens)
    return reply

  def _post(self, data: bytes) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if self._api_key:
      headers["Authorization"] = f"Bearer {self._api_key}"
    last = ""
    for attempt in range(self.max_retries + 1):
      if attempt:
        self._count(retries=1)
      self.limiter.acquire()
      self._count(requests=1)
      started = time.perf_counter()
      wait = None
      try:
        request = urllib.request.Request(self.url, data=data, headers=headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
          raw = response.read()
        try:
          answer = json.loads(raw)
        except ValueError:
          raise APIUnavailable(f"{self.url} answered with no JSON: {raw[:200]!r}") from None
        if not isinstance(answer, dict):
          raise APIUnavailable(f"{self.url} answered {str(answer)[:200]}, not a JSON object")
        return answer
      except urllib.error.HTTPError as error:
        detail = _error_detail(error)
        if error.code not in RETRY_STATUSES:
          kind = ContextLengthExceeded if error.code == 400 and _is_context_error(detail) else APIRequestError
          hint = {401: " (check the API key: --api_key_env names the variable that holds it)",
                  403: " (the key may not be allowed to use this model)",
                  404: f" (is {self.base_url!r} the API root, e.g. http://host:8000/v1, and {self.model!r} "
                       "a model it serves?)"}.get(error.code, "")
          raise kind(f"{self.url} answered {error.code}: {detail}{hint}", error.code) from None
        last = f"{error.code}: {detail}"
        wait = retry_after_s(error.headers.get("Retry-After") if error.headers else None)
      except (urllib.error.URLError, OSError) as error:  # refused, reset, DNS, timeout
        last = f"{type(error).__name__}: {getattr(error, 'reason', error)}"
      finally:
        self._count(request_s=time.perf_counter() - started)
      if attempt < self.max_retries:
        backoff = self.backoff_s * 2 ** attempt
        time.sleep(min(self.max_backoff_s, backoff if wait is None else wait))
    raise APIUnavailable(f"{self.url} failed after {self.max_retries + 1} attempts; last: {last}")


def _error_detail(error: urllib.error.HTTPError) -> str:
  """The server's error message (OpenAI's `{"error": {"message": ...}}`, else the body's start)."""
  try:
    raw = error.read()[:2000].decode("utf-8", "replace")
  except OSError:
    return str(error.reason)
  try:
    parsed = json.loads(raw)
  except ValueError:
    return raw[:500]
  if isinstance(parsed, dict):
    inner = parsed.get("error", parsed.get("detail", parsed.get("message")))
    if isinstance(inner, dict):
      inner = inner.get("message", inner)
    if inner is not None:
      return str(inner)[:500]
  return raw[:500]


def _is_context_error(detail: str) -> bool:
  lowered = detail.lower()
  return any(marker in lowered for marker in _CONTEXT_MARKERS)
