"""Env benchmark: steps per second in process, and over HTTP on loopback with 1 and 16 keep-alive clients.

  python -m launch.benchmark --suite env [--env textcraft] [--seconds 3]

The server is the real one (`python -m launch.serve_env`, its own process). Load comes from a separate
process: an asyncio load generator (this module, `--loadgen`) holding one keep-alive HTTP/1.1 connection
and one env session per client, each client sending its next /step as soon as the previous answer arrives
(closed loop) and resetting its session when the episode ends. Steps cycle through a few valid actions in
AgentGym's ReAct form. For scale: AgentGym's own TextCraft server (FastAPI) gave about 750 steps/s with one
keep-alive client on a 2-core machine; it is not run here, so `peer` and `speedup` are null.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from typing import Any

from launch.benchmarks import common

GENERATOR = "asyncio keep-alive HTTP/1.1 load generator (separate process)"
_ACTIONS = {
    "textcraft": ("Thought: Let me look at what I have.\nAction: inventory",
                  "Thought: I need a raw material.\nAction: get 1 oak log",
                  "Thought: I try a recipe.\nAction: craft 1 oak planks using 1 oak log"),
    "maze": ("Thought: Up looks open.\nAction: move up", "Thought: Try down.\nAction: move down",
             "Thought: Try left.\nAction: move left", "Thought: Try right.\nAction: move right"),
}


# ----------------------------------------------------------------------------------------------------------
# The load generator (runs in its own process).
# ----------------------------------------------------------------------------------------------------------


def _request(path: str, payload: dict[str, Any], host: str) -> bytes:
  body = json.dumps(payload).encode()
  return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
          f"Content-Length: {len(body)}\r\n\r\n").encode() + body


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
  head = await reader.readuntil(b"\r\n\r\n")
  status = int(head[9:12])
  length = 0
  for line in head.split(b"\r\n")[1:]:
    if line[:15].lower() == b"content-length:":
      length = int(line[15:])
  return status, json.loads(await reader.readexactly(length))


async def _client(host: str, port: int, actions: tuple[str, ...], task: int, deadline_warm: float,
                  deadline_end: float, latencies: list[float]) -> int:
  reader, writer = await asyncio.open_connection(host, port)
  hostname = f"{host}:{port}"
  writer.write(_request("/create", {"data_idx": task}, hostname))
  status, created = await _read_response(reader)
  if status != 200:
    raise RuntimeError(f"/create answered {status}: {created}")
  session = created["id"]
  steps = [_request("/step", {"id": session, "action": a}, hostname) for a in actions]
  reset = _request("/reset", {"id": session, "data_idx": task}, hostname)
  counted, k = 0, 0
  while True:
    start = time.perf_counter()
    if start >= deadline_end:
      break
    writer.write(steps[k % len(steps)])
    k += 1
    status, answer = await _read_response(reader)
    end = time.perf_counter()
    if status != 200:
      raise RuntimeError(f"/step answered {status}: {answer}")
    if start >= deadline_warm:
      counted += 1
      latencies.append(end - start)
    if answer["done"]:
      writer.write(reset)
      status, answer = await _read_response(reader)
      if status != 200:
        raise RuntimeError(f"/reset answered {status}: {answer}")
  writer.write(_request("/close", {"id": session}, hostname))
  await _read_response(reader)
  writer.close()
  return counted


async def _load(host: str, port: int, clients: int, seconds: float, warmup: float, env: str,
                server_pid: int | None) -> dict[str, Any]:
  actions = _ACTIONS.get(env, _ACTIONS["textcraft"])
  now = time.perf_counter()
  warm, end = now + warmup, now + warmup + seconds
  latencies: list[float] = []
  cpu: dict[str, float | None] = {}

  async def sample_cpu() -> None:
    # CPU use of both processes over the measured window only: which side is the bottleneck.
    await asyncio.sleep(warm - time.perf_counter())
    own, server = time.process_time(), _cpu_seconds(server_pid)
    await asyncio.sleep(end - time.perf_counter())
    cpu["loadgen_cpu"] = (time.process_time() - own) / seconds
    after = _cpu_seconds(server_pid)
    cpu["server_cpu"] = None if server is None or after is None else (after - server) / seconds

  counts, _ = await asyncio.gather(
      asyncio.gather(*(_client(host, port, actions, i, warm, end, latencies) for i in range(clients))), sample_cpu())
  latencies.sort()
  pick = lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1e3 if latencies else float("nan")
  return {"steps": sum(counts), "seconds": seconds, "steps_per_s": sum(counts) / seconds,
          "p50_ms": pick(0.5), "p99_ms": pick(0.99), **cpu}


def loadgen_main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description="closed-loop keep-alive HTTP load on an env server")
  parser.add_argument("--host", default="127.0.0.1")
  parser.add_argument("--port", type=int, required=True)
  parser.add_argument("--clients", type=int, default=1)
  parser.add_argument("--seconds", type=float, default=3.0)
  parser.add_argument("--warmup", type=float, default=0.5)
  parser.add_argument("--env", default="textcraft")
  parser.add_argument("--server_pid", type=int, default=None, help="report this process's CPU use too")
  args = parser.parse_args(argv)
  result = asyncio.run(_load(args.host, args.port, args.clients, args.seconds, args.warmup, args.env,
                             args.server_pid))
  print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------------------------------------
# The suite.
# ----------------------------------------------------------------------------------------------------------


def _in_process(env_name: str, seconds: float) -> dict[str, Any]:
  from evolver import envs
  env = envs.make(env_name)
  actions = _ACTIONS.get(env_name, _ACTIONS["textcraft"])
  env.reset(0)
  steps, k = 0, 0
  end = time.perf_counter() + seconds
  while time.perf_counter() < end:
    for _ in range(100):
      _, _, done, _ = env.step(actions[k % len(actions)])
      k += 1
      if done:
        env.reset(0)
    steps += 100
  return {"steps": steps, "seconds": seconds, "steps_per_s": steps / seconds}


def _start_server(env_name: str) -> tuple[subprocess.Popen, int]:
  process = subprocess.Popen([sys.executable, "-m", "launch.serve_env", "--env", env_name, "--port", "0"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.time() + 120
  while time.time() < deadline:
    line = process.stdout.readline()
    if not line:
      raise RuntimeError(f"env server exited early: {process.stderr.read()}")
    if line.startswith("READY "):
      return process, int(line.rsplit(":", 1)[1])
  process.kill()
  raise RuntimeError("env server did not print READY within 120 s")


def _cpu_seconds(pid: int | None) -> float | None:
  """User + system CPU time of process `pid` (Linux /proc), or None where that is not available."""
  if pid is None:
    return None
  try:
    with open(f"/proc/{pid}/stat") as f:
      fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
  except (OSError, ValueError, IndexError):
    return None


def _run_loadgen(port: int, clients: int, seconds: float, env_name: str, server_pid: int) -> dict[str, Any]:
  args = ["--port", str(port), "--clients", str(clients), "--seconds", str(seconds), "--env", env_name,
          "--server_pid", str(server_pid)]
  return common.run_worker("launch.benchmarks.env", args, timeout=seconds + 120)


def run(args: list[str]) -> dict[str, Any]:
  parser = argparse.ArgumentParser(prog="launch.benchmark --suite env")
  parser.add_argument("--env", default="textcraft", help="which built-in env to serve and step")
  parser.add_argument("--seconds", type=float, default=3.0, help="measured seconds per configuration")
  options = parser.parse_args(args)

  in_process = _in_process(options.env, options.seconds)
  server, port = _start_server(options.env)
  try:
    http_1 = _run_loadgen(port, 1, options.seconds, options.env, server.pid)
    http_16 = _run_loadgen(port, 16, options.seconds, options.env, server.pid)
  finally:
    server.terminate()
    server.wait(timeout=30)

  cpu = lambda value: "-" if value is None else f"{value:.2f}"
  rows = [("in_process", "-", f"{in_process['steps_per_s']:.0f}", "-", "-", "-", "-")]
  rows += [(name, clients, f"{row['steps_per_s']:.0f}", f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}",
            cpu(row["server_cpu"]), cpu(row["loadgen_cpu"]))
           for name, clients, row in (("http_1", 1, http_1), ("http_16", 16, http_16))]
  common.print_table(f"env benchmark: {options.env}, {options.seconds:g} s per row, one server process, "
                     f"{os.cpu_count()} CPUs (CPU columns: cores busy during the measured window)",
                     ("mode", "clients", "steps/s", "p50 ms", "p99 ms", "server CPU", "loadgen CPU"), rows)
  print(f"load generator: {GENERATOR}")
  print("for scale (not run here): AgentGym's FastAPI TextCraft server, ~750 steps/s with 1 client")
  return {"suite": "env", "ours": round(http_16["steps_per_s"], 1), "peer": None, "unit": "steps/s",
          "speedup": None, "env": options.env, "generator": GENERATOR,
          "in_process": round(in_process["steps_per_s"], 1), "http_1": round(http_1["steps_per_s"], 1),
          "http_16": round(http_16["steps_per_s"], 1), "http_1_p50_ms": round(http_1["p50_ms"], 3),
          "http_16_p50_ms": round(http_16["p50_ms"], 3), "http_16_p99_ms": round(http_16["p99_ms"], 3),
          "http_16_server_cpu": http_16["server_cpu"], "http_16_loadgen_cpu": http_16["loadgen_cpu"]}


if __name__ == "__main__":
  loadgen_main(sys.argv[1:])
