"""The env HTTP server over real loopback HTTP: protocol, concurrency, bad requests, limits."""

import concurrent.futures
import socket
import time

import pytest

from evolver import envs
from evolver.envs.remote import RemoteEnv
from evolver.envs.server import ServerThread
from evolver.json_http import MAX_HEADER_BYTES

from tests.envs.helpers import request


def test_protocol_round_trip(maze_server):
  port = maze_server.port
  assert request(port, "GET", "/health") == (200, {"status": "ok", "env": "maze", "sessions": 0})
  status, info = request(port, "GET", "/info")
  local = envs.make("maze")
  assert status == 200 and info == {"name": "maze", "version": local.version, "instruction": local.instruction(),
                                    "max_rounds": local.max_rounds,
                                    "num_tasks": {"train": local.num_tasks("train"), "eval": local.num_tasks("eval")}}
  status, created = request(port, "POST", "/create", {})
  assert status == 200 and set(created) == {"id", "observation", "reward", "done"}
  session = created["id"]
  assert isinstance(session, int) and created["done"] is False
  status, answer = request(port, "POST", "/reset", {"id": session, "data_idx": 4, "split": "eval"})
  assert status == 200 and answer["observation"] == local.reset(4, "eval") and answer["reward"] == 0.0
  assert request(port, "GET", f"/observation?id={session}") == (200, answer["observation"])
  status, expert = request(port, "GET", f"/expert?id={session}")
  assert status == 200 and expert == local.expert_action()
  status, stepped = request(port, "POST", "/step", {"id": session, "action": expert})
  assert status == 200 and set(stepped) == {"observation", "reward", "done", "info"}
  assert (stepped["observation"], stepped["reward"], stepped["done"], stepped["info"]) == local.step(expert)
  assert request(port, "GET", f"/observation?id={session}") == (200, stepped["observation"])
  # /create with a task resets at once; the default split is train.
  status, direct = request(port, "POST", "/create", {"data_idx": 9})
  assert status == 200 and direct["observation"] == local.reset(9)
  assert request(port, "POST", "/close", {"id": session}) == (200, {"closed": True})
  assert request(port, "POST", "/close", {"id": direct["id"]}) == (200, {"closed": True})
  assert request(port, "POST", "/step", {"id": session, "action": expert})[0] == 404
  assert request(port, "GET", "/")[0] == 200  # AgentGym's hello route


def _expert_episode(url: str, index: int) -> tuple[list, list]:
  """(remote trajectory, local trajectory) of the expert on train task `index`."""
  remote, local = RemoteEnv(url, "maze"), envs.make("maze")
  trajectories = []
  for env in (remote, local):
    steps = [env.reset(index)]
    done = False
    while not done:
      observation, reward, done, info = env.step(env.expert_action())
      steps.append((observation, reward, done, info))
    trajectories.append(steps)
  remote.close()
  return trajectories[0], trajectories[1]


def test_64_concurrent_expert_episodes_without_cross_talk(maze_server):
  with concurrent.futures.ThreadPoolExecutor(64) as pool:
    results = list(pool.map(lambda i: _expert_episode(maze_server.url, 100 + i), range(64)))
  for remote, local in results:
    assert remote == local and remote[-1][3]["success"]
  assert request(maze_server.port, "GET", "/health")[1]["sessions"] == 0


def _bad_requests(session: int, closed: int) -> list[tuple[str, str, object, dict]]:
  """(method, path, body, headers) of every kind of bad request."""
  return [
      ("POST", "/step", "{not json", {}),
      ("POST", "/step", "[1, 2]", {}),
      ("POST", "/step", '"text"', {}),
      ("POST", "/step", b"\xff\xfe", {}),
      ("POST", "/step", "[" * 100_000, {}),  # nesting deeper than the JSON decoder recurses
      ("POST", "/reset", '{"id": 1e400, "data_idx": 1}', {}),
      ("POST", "/step", {"action": "move up"}, {}),  # missing id
      ("POST", "/step", {"id": session}, {}),  # missing action
      ("POST", "/step", {"id": str(session), "action": "move up"}, {}),
      ("POST", "/step", {"id": True, "action": "move up"}, {}),
      ("POST", "/step", {"id": session, "action": 7}, {}),
      ("POST", "/step", {"id": session, "action": None}, {}),
      ("POST", "/step", {"id": 123456789, "action": "move up"}, {}),  # unknown id
      ("POST", "/step", {"id": closed, "action": "move up"}, {}),  # closed id
      ("POST", "/step", {"id": session, "action": "move up"}, {}),  # before any reset
      ("GET", f"/expert?id={session}", None, {}),  # before any reset
      ("POST", "/reset", {"id": session}, {}),  # missing data_idx
      ("POST", "/reset", {"id": session, "data_idx": "3"}, {}),
      ("POST", "/reset", {"id": session, "data_idx": 3.5}, {}),
      ("POST", "/reset", {"id": session, "data_idx": -1}, {}),
      ("POST", "/reset", {"id": session, "data_idx": 10**9}, {}),
      ("POST", "/reset", {"id": session, "data_idx": 1, "split": "test"}, {}),
      ("POST", "/reset", {"id": session, "data_idx": 1, "split": 3}, {}),
      ("POST", "/reset", {"id": closed, "data_idx": 1}, {}),
      ("POST", "/create", {"data_idx": 10**9}, {}),
      ("POST", "/create", {"data_idx": 1, "split": "validation"}, {}),
      ("POST", "/close", {}, {}),
      ("POST", "/close", {"id": closed}, {}),
      ("GET", "/observation", None, {}),
      ("GET", "/observation?id=abc", None, {}),
      ("GET", "/observation?id=987654321", None, {}),
      ("GET", "/nowhere", None, {}),
      ("POST", "/info", {}, {}),  # wrong method
      ("GET", "/step", None, {}),  # wrong method
      ("DELETE", "/close", None, {}),
      ("POST", "/step", "{}", {"Content-Length": "-5"}),
      ("POST", "/step", "x" * (1024 * 1024 + 1), {}),  # too large
  ]


def test_every_bad_request_gets_a_4xx_with_a_json_error(maze_server):
  port = maze_server.port
  session = request(port, "POST", "/create", {})[1]["id"]
  closed = request(port, "POST", "/create", {})[1]["id"]
  request(port, "POST", "/close", {"id": closed})
  for method, path, body, headers in _bad_requests(session, closed):
    try:
      status, answer = request(port, method, path, body, headers)
    except ConnectionError:  # a server may close after answering an unreadable request; it must answer first
      pytest.fail(f"{method} {path} {body!r:.60}: connection dropped without an answer")
    assert 400 <= status < 500, f"{method} {path} {body!r:.60} -> {status} {answer}"
    assert isinstance(answer, dict) and isinstance(answer["error"], str) and answer["error"]
  # The session is unharmed by all of that.
  assert request(port, "POST", "/reset", {"id": session, "data_idx": 1})[0] == 200
  assert request(port, "POST", "/step", {"id": session, "action": "Action: move up"})[0] == 200
  assert request(port, "GET", "/health")[0] == 200


def test_specific_status_codes(maze_server):
  port = maze_server.port
  session = request(port, "POST", "/create", {})[1]["id"]
  assert request(port, "POST", "/step", {"id": session, "action": "x"})[0] == 409  # before reset
  assert request(port, "POST", "/step", {"id": 5, "action": "x"})[0] == 404
  assert request(port, "GET", "/nowhere")[0] == 404
  assert request(port, "GET", "/step")[0] == 405
  assert request(port, "POST", "/reset", {"id": session, "data_idx": 10**9})[0] == 400
  request(port, "POST", "/close", {"id": session})


def _raw_exchange(port: int, payload: bytes, expect_responses: int) -> list[bytes]:
  with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
    sock.sendall(payload)
    data = b""
    while data.count(b"HTTP/1.1 ") < expect_responses or not data.endswith(b"}"):
      chunk = sock.recv(65536)
      if not chunk:
        break
      data += chunk
  return [b"HTTP/1.1 " + part for part in data.split(b"HTTP/1.1 ")[1:]]


def test_keep_alive_pipelining_chunked_and_bad_framing(maze_server):
  port = maze_server.port
  health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
  responses = _raw_exchange(port, health * 3, 3)
  assert len(responses) == 3 and all(r.startswith(b"HTTP/1.1 200") for r in responses)
  chunked = b"POST /create HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n"
  assert _raw_exchange(port, chunked, 1)[0].startswith(b"HTTP/1.1 411")
  assert _raw_exchange(port, b"NONSENSE\r\n\r\n", 1)[0].startswith(b"HTTP/1.1 400")
  assert _raw_exchange(port, b"GET / HTTP/1.1\r\n" + b"X: y\r\n" * 20000, 1)[0].startswith(b"HTTP/1.1 431")


def test_live_sessions_are_bounded_and_idle_ones_reaped():
  with ServerThread("maze", max_sessions=3, idle_timeout_s=0.3) as server:
    ids = [request(server.port, "POST", "/create", {})[1]["id"] for _ in range(3)]
    status, answer = request(server.port, "POST", "/create", {})
    assert status == 429 and "too many" in answer["error"]
    time.sleep(1.0)  # all three go idle and are reaped
    assert request(server.port, "GET", "/health")[1]["sessions"] == 0
    assert request(server.port, "POST", "/reset", {"id": ids[0], "data_idx": 0})[0] == 404
    assert request(server.port, "POST", "/create", {})[0] == 200


def test_session_ids_differ_across_server_restarts():
  with ServerThread("maze") as first:
    a = request(first.port, "POST", "/create", {})[1]["id"]
  with ServerThread("maze") as second:
    b = request(second.port, "POST", "/create", {})[1]["id"]
    assert request(second.port, "POST", "/reset", {"id": a, "data_idx": 0})[0] == 404
  assert a != b


def test_env_failure_is_a_422_not_a_500():
  class Broken(envs.env_class("maze")):
    def _act(self, text):
      raise RuntimeError("boom")

  with ServerThread(env_factory=Broken) as server:
    session = request(server.port, "POST", "/create", {"data_idx": 0})[1]["id"]
    status, answer = request(server.port, "POST", "/step", {"id": session, "action": "x"})
    assert status == 422 and "boom" in answer["error"]
    assert request(server.port, "GET", "/health")[0] == 200


def test_serve_env_binds_loopback_by_default_and_reports_the_port(maze_server):
  assert maze_server.url.startswith("http://127.0.0.1:") and maze_server.port > 0
  listening = [conn for conn in _tcp_listeners() if conn[1] == maze_server.port]
  assert listening and all(address == "127.0.0.1" for address, _ in listening)


def _tcp_listeners() -> list[tuple[str, int]]:
  """(address, port) of the IPv4 TCP sockets in LISTEN state, from /proc/net/tcp."""
  listeners = []
  with open("/proc/net/tcp") as f:
    for line in f.readlines()[1:]:
      local, state = line.split()[1], line.split()[3]
      if state == "0A":
        host_hex, port_hex = local.split(":")
        address = ".".join(str(int(host_hex[i:i + 2], 16)) for i in (6, 4, 2, 0))
        listeners.append((address, int(port_hex, 16)))
  return listeners


def _read_until_closed(sock: socket.socket) -> bytes:
  data = b""
  while True:
    try:
      chunk = sock.recv(65536)
    except ConnectionResetError:
      return data
    if not chunk:
      return data
    data += chunk


@pytest.mark.parametrize("length", [b"\xb2", b"+5", b"1_0", b"-1", b"5 5", b""])
def test_a_malformed_content_length_gets_400_and_the_server_keeps_serving(length):
  with ServerThread("maze", request_timeout_s=2) as server:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
      sock.sendall(b"POST /create HTTP/1.1\r\nHost: x\r\nContent-Length: " + length + b"\r\n\r\n{}")
      answer = _read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 400") and b"bad Content-Length" in answer, answer[:80]
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
      sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
      assert _read_until_closed(sock).startswith(b"HTTP/1.1 200")


@pytest.mark.parametrize("partial", [
    b"POST /create HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n{}",  # body shorter than Content-Length
    b"GET /health HTTP/1.1\r\nHost: x\r\n",  # headers never finished
    b"P",
])
def test_an_incomplete_request_times_out_with_408_and_a_closed_connection(partial):
  with ServerThread("maze", request_timeout_s=0.3) as server:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
      start = time.monotonic()
      sock.sendall(partial)
      answer = _read_until_closed(sock)  # a server without the timeout holds it: recv times out after 5 s
      assert answer.startswith(b"HTTP/1.1 408") and b'"error"' in answer
      assert time.monotonic() - start < 3


def test_the_request_timeout_spares_idle_kept_alive_connections_and_slow_complete_requests():
  health = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
  with ServerThread("maze", request_timeout_s=0.3) as server:
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
      for pause in (0.0, 0.6):  # idle between requests is not a request in progress
        time.sleep(pause)
        sock.sendall(health)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
      sock.sendall(health[:10])  # a request that is complete within the timeout, in pieces
      time.sleep(0.1)
      sock.sendall(health[10:])
      assert sock.recv(65536).startswith(b"HTTP/1.1 200")


def _request_with_header_bytes(total: int) -> bytes:
  """A GET /health whose request line, header fields and blank line are exactly `total` bytes."""
  head = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Pad: "
  request = head + b"a" * (total - len(head) - 4) + b"\r\n\r\n"
  assert len(request) == total
  return request


def test_the_header_limit_is_exact(maze_server):
  port = maze_server.port
  assert _raw_exchange(port, _request_with_header_bytes(MAX_HEADER_BYTES), 1)[0].startswith(b"HTTP/1.1 200")
  assert _raw_exchange(port, _request_with_header_bytes(MAX_HEADER_BYTES + 1), 1)[0].startswith(b"HTTP/1.1 431")
  assert _raw_exchange(port, _request_with_header_bytes(70 * 1024), 1)[0].startswith(b"HTTP/1.1 431")
