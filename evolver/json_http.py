"""The HTTP/1.1 pieces that evolver's two JSON servers share: the env server (`evolver.envs.server`, an
`asyncio.Protocol` parser with pipelining) and the experience service (`evolver.experience.service`, on asyncio
streams with worker threads, bearer auth and a connection cap). Each server keeps its own framing loop and its own
error answers (`_fail`); what is the same in both lives here:

  HttpError(status, message)   the error answer both servers' routes raise and their `_fail` turns into JSON
  REASONS                      reason phrases per status code
  json_response(...)           a JSON answer: status line, headers and body, as bytes
  parse_head(head)             request line and header fields -> `RequestHead` (or HttpError 400 / 411)
  MAX_HEADER_BYTES             the bound on a request's head (431 beyond)
  serve(server, on_ready)      runs a server on the current event loop until cancelled (`serve_forever`)
  LoopThread(server)           a server on its own event loop in a daemon thread (`ServerThread`, `ServiceThread`)

The rules are the servers' own: bodies come with Content-Length only (a chunked body is 411), keep-alive by default
on HTTP/1.1 and off on HTTP/1.0, `Expect: 100-continue` honoured. This module sits below every room (envs, data,
models, rollout, experience, ...) and imports nothing from evolver.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, Protocol, TypeVar

MAX_HEADER_BYTES = 64 * 1024  # request line, header fields and the blank line that ends them

REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
           405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict", 411: "Length Required",
           413: "Payload Too Large", 422: "Unprocessable Entity", 429: "Too Many Requests",
           431: "Request Header Fields Too Large", 501: "Not Implemented", 503: "Service Unavailable"}


class HttpError(Exception):
  """An error answer: status code and message."""

  def __init__(self, status: int, message: str):
    super().__init__(message)
    self.status = status
    self.message = message


def json_response(status: int, payload: Any, keep_alive: bool, head_only: bool = False,
                  headers: Mapping[str, str] | None = None) -> bytes:
  """One answer: `payload` as compact UTF-8 JSON, with Content-Type, Content-Length, `headers` (name -> value, in
  order, before Connection) and Connection. `head_only` (a HEAD request) leaves the body out, not its length."""
  body = json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
  extra = "".join(f"{name}: {value}\r\n" for name, value in headers.items()) if headers else ""
  head = (f"HTTP/1.1 {status} {REASONS.get(status, 'Error')}\r\nContent-Type: application/json\r\n"
          f"Content-Length: {len(body)}\r\n{extra}"
          f"{'Connection: keep-alive' if keep_alive else 'Connection: close'}\r\n\r\n")
  return head.encode("latin-1") + (b"" if head_only else body)


@dataclasses.dataclass(frozen=True, slots=True)
class RequestHead:
  """What a server needs of a request's head."""
  method: str
  target: str  # path and query, as sent
  keep_alive: bool  # HTTP/1.1 unless `Connection: close`; HTTP/1.0 only with `Connection: keep-alive`
  content_length: int  # bytes of body that follow the head (0 without Content-Length)
  expect_continue: bool  # `Expect: 100-continue`: the client waits for "100 Continue" before sending the body
  authorization: tuple[str, ...]  # every Authorization field's value (stripped), in order


def parse_head(head: bytes | bytearray) -> RequestHead:
  """Parses a request line and its header fields: `head` is the bytes up to, not including, the blank line.

  Raises:
    HttpError: 400 "malformed request line" (not three parts, or no HTTP/1.x version), 400 "bad Content-Length"
      (not 1*DIGIT in ASCII), 411 for any Transfer-Encoding (chunked bodies are not supported). The first bad
      field in order decides.
  """
  lines = head.decode("latin-1").split("\r\n")
  parts = lines[0].split(" ")
  if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
    raise HttpError(400, "malformed request line")
  method, target, version = parts
  length, keep_alive, expect_continue, authorization = 0, version == "HTTP/1.1", False, []
  for line in lines[1:]:
    name, _, value = line.partition(":")
    name, value = name.strip().lower(), value.strip()
    if name == "content-length":
      # 1*DIGIT, as HTTP says: int() would take "+5" and "1_0", and '²'.isdigit() is True while int('²') raises.
      if not (value.isascii() and value.isdigit()):
        raise HttpError(400, "bad Content-Length")
      length = int(value)
    elif name == "connection":
      value = value.lower()
      keep_alive = value == "keep-alive" or (keep_alive and value != "close")
    elif name == "transfer-encoding":
      raise HttpError(411, "chunked bodies are not supported; send Content-Length")
    elif name == "expect":
      expect_continue = value.lower() == "100-continue"
    elif name == "authorization":
      authorization.append(value)
  return RequestHead(method, target, keep_alive, length, expect_continue, tuple(authorization))


class LoopServer(Protocol):
  """What `serve` and `LoopThread` run: binds on `start()` (then `port` is the bound port), closes everything on
  `stop()`."""
  host: str
  port: int

  async def start(self) -> int: ...

  async def stop(self) -> None: ...


async def serve(server: LoopServer, on_ready: Callable[[int], None] | None = None) -> None:
  """Starts `server`, calls `on_ready(port)` once it is bound, and serves until cancelled; then stops it."""
  await server.start()
  if on_ready is not None:
    on_ready(server.port)
  try:
    await asyncio.Event().wait()
  finally:
    await server.stop()


ServerT = TypeVar("ServerT", bound=LoopServer)


class LoopThread(Generic[ServerT]):
  """`server` on its own event loop in a daemon thread (tests, notebooks, in-process servers). The constructor
  returns once the server is bound, or raises RuntimeError when it fails to bind or start within 60 s; `stop()`
  (or leaving the `with` block) stops the loop, awaits `server.stop()` and joins the thread.

    with LoopThread(server, name="my-server", label="my server") as thread:
      urllib.request.urlopen(thread.url + "/health")
  """

  def __init__(self, server: ServerT, *, name: str, label: str):
    """
    Args:
      server: has async `start()` and `stop()`, and `host` and `port`.
      name: the thread's name.
      label: the server in the RuntimeError messages ("<label> did not start ...").
    """
    self.server = server
    self._label = label
    self._loop = asyncio.new_event_loop()
    self._ready = threading.Event()
    self._failure: BaseException | None = None
    self._thread = threading.Thread(target=self._run, name=name, daemon=True)
    self._thread.start()
    if not self._ready.wait(timeout=60):
      raise RuntimeError(f"{label} did not start within 60 s")
    if self._failure is not None:
      raise RuntimeError(f"{label} did not start: {self._failure}") from self._failure

  def _run(self) -> None:
    asyncio.set_event_loop(self._loop)
    try:
      self._loop.run_until_complete(self.server.start())
    except BaseException as error:  # reported by __init__
      self._failure = error
      self._ready.set()
      return
    self._ready.set()
    self._loop.run_forever()
    self._loop.run_until_complete(self.server.stop())
    self._loop.close()

  @property
  def port(self) -> int:
    return self.server.port

  @property
  def url(self) -> str:
    return f"http://{self.server.host}:{self.server.port}"

  def stop(self) -> None:
    if self._thread.is_alive():
      self._loop.call_soon_threadsafe(self._loop.stop)
      self._thread.join(timeout=30)

  def __enter__(self) -> "LoopThread[ServerT]":
    return self

  def __exit__(self, *exc) -> None:
    self.stop()
