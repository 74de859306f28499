"""Serve one built-in environment over HTTP (AgentGym's id-keyed protocol, extended).

  python -m launch.serve_env --env maze --host 127.0.0.1 --port 36001
  python -m launch.serve_env --env textcraft --port 0      # binds a free port and prints it

Once it accepts requests it prints one line `READY <url>` (flushed), so scripts can wait for it.
Routes and status codes: see `evolver/envs/server.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from evolver import envs
from evolver.envs.server import REQUEST_TIMEOUT_S, EnvServer


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--env", required=True, choices=envs.names() + envs.benchmark_names(),
                      help="which built-in env or benchmark to serve")
  parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
  parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one and prints it")
  parser.add_argument("--max_sessions", type=int, default=1024, help="live sessions allowed at once")
  parser.add_argument("--idle_timeout_s", type=float, default=900.0,
                      help="close sessions untouched for this many seconds")
  parser.add_argument("--request_timeout_s", type=float, default=REQUEST_TIMEOUT_S,
                      help="a request must arrive whole within this many seconds of its first byte (else 408)")
  args = parser.parse_args(argv)

  server = EnvServer(args.env, host=args.host, port=args.port, max_sessions=args.max_sessions,
                     idle_timeout_s=args.idle_timeout_s, request_timeout_s=args.request_timeout_s)

  def ready(port: int) -> None:
    info = server.service.info
    print(f"serving {info['name']} ({info['version']}) on port {port}", flush=True)
    print(f"READY http://{args.host}:{port}", flush=True)

  try:
    asyncio.run(server.serve_forever(on_ready=ready))
  except KeyboardInterrupt:
    pass
  sys.stdout.flush()


if __name__ == "__main__":
  main()
