"""Helpers for the env tests: real env servers on loopback as subprocesses, one-shot HTTP requests, and readings
along an expert episode."""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class ServerProcess:
  """`python -m launch.serve_env` in a subprocess; waits for its READY line."""

  def __init__(self, env: str, port: int = 0, *extra: str):
    self.env = env
    self.process = subprocess.Popen(
        [sys.executable, "-m", "launch.serve_env", "--env", env, "--port", str(port), *extra],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while True:
      line = self.process.stdout.readline()
      if not line:
        raise RuntimeError(f"server exited: {self.process.stderr.read()}")
      if line.startswith("READY "):
        self.url = line.split()[1]
        self.port = int(self.url.rsplit(":", 1)[1])
        return
      if time.time() > deadline:
        self.kill()
        raise RuntimeError("server did not become ready")

  def kill(self) -> None:
    """SIGKILL: no clean shutdown, as in a crash."""
    if self.process.poll() is None:
      self.process.kill()
      self.process.wait(timeout=30)
    for stream in (self.process.stdout, self.process.stderr):
      stream.close()


def request(port: int, method: str, path: str, body: bytes | str | dict | None = None,
            headers: dict[str, str] | None = None) -> tuple[int, object]:
  """One request on a fresh connection: (status, decoded JSON body)."""
  conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
  if isinstance(body, dict):
    body = json.dumps(body)
  conn.request(method, path, body=body, headers=headers or {})
  response = conn.getresponse()
  data = response.read()
  conn.close()
  return response.status, json.loads(data) if data else None


def expert_length(env, index: int) -> int:
  """Turns the scripted expert takes on `train` task `index` of `env` (which it resets)."""
  env.reset(index)
  turns, done = 0, False
  while not done:
    _, _, done, _ = env.step(env.expert_action())
    turns += 1
  return turns


def expert_readings(env, index: int, read, split: str = "train") -> list:
  """`read(env)` before each expert turn of task `index` (`split`), and once more at the end."""
  env.reset(index, split)
  readings, done = [read(env)], False
  while not done:
    _, _, done, _ = env.step(env.expert_action())
    readings.append(read(env))
  return readings
