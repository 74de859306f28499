"""Real HTTP servers on loopback for the tests' fake endpoints: a JSON request handler and a context manager that
serves one."""

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from typing import Any


class JSONHandler(http.server.BaseHTTPRequestHandler):
  """A request handler that reads and answers JSON, and logs nothing."""

  def read_json(self) -> Any:
    return json.loads(self.rfile.read(int(self.headers["Content-Length"])))

  def send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
    data = json.dumps(payload).encode()
    self.send_response(status)
    for key, value in (headers or {}).items():
      self.send_header(key, value)
    self.send_header("Content-Type", "application/json")
    self.send_header("Content-Length", str(len(data)))
    self.end_headers()
    self.wfile.write(data)

  def log_message(self, *args):
    pass


@contextlib.contextmanager
def serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
  """Serves `handler` on 127.0.0.1 (a free port, one thread per request) while the block runs; yields its base
  URL, e.g. "http://127.0.0.1:40123"."""
  server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=server.serve_forever, daemon=True)
  thread.start()
  try:
    yield f"http://127.0.0.1:{server.server_address[1]}"
  finally:
    server.shutdown()
    server.server_close()


class EchoChat(JSONHandler):
  """A fake OpenAI-compatible chat endpoint: answers "echo: <the first message>"; the model "broken" gets a 500.
  Each request is kept in `requests` as (path, Authorization header or None, body)."""
  requests: list[tuple[str, str | None, Any]] = []

  def do_POST(self):  # noqa: N802 (http.server's name)
    body = self.read_json()
    type(self).requests.append((self.path, self.headers.get("Authorization"), body))
    if body["model"] == "broken":
      return self.send_json(500, {"error": {"message": "model crashed"}})
    self.send_json(200, {"choices": [{"message": {"role": "assistant",
                                                  "content": "echo: " + body["messages"][0]["content"]}}]})


@contextlib.contextmanager
def echo_chat() -> Iterator[str]:
  """Serves `EchoChat` (its request log emptied) while the block runs; yields the base URL with /v1."""
  EchoChat.requests = []
  with serving(EchoChat) as url:
    yield url + "/v1"
