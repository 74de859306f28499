"""Serve an experience store over ReMe 0.2's task-memory HTTP API (AgentEvolver's EMClient works against it).

  python -m launch.serve_experience --store runs/exp_store --embedder minilm --host 127.0.0.1 --port 8001
  python -m launch.serve_experience --store /tmp/exp --embedder hashing --port 0   # a free port, printed

  # reachable by other hosts: require a token (clients: ExperienceClient(url, token_env=...))
  export EVOLVER_EXPERIENCE_TOKEN=$(openssl rand -hex 32)
  python -m launch.serve_experience --store runs/exp --host 0.0.0.0 --port 8001 --token_env EVOLVER_EXPERIENCE_TOKEN

Once it accepts requests it prints one line `READY <url>` (flushed), so scripts can wait for it. It binds
loopback unless --host says otherwise. dump and load (`/vector_store`) touch only files under --library_dir
(default `<store>/libraries`). The summarizer is extractive unless --summarizer openai, which calls an
OpenAI-compatible endpoint (--llm_base_url, --llm_model; the key, if any, from the environment variable that
--llm_api_key_env names).

Access and limits:
  --token_env NAME     the bearer token is read from the environment variable NAME (an unset or empty one is an
                       error at start-up); every route, /health included, then needs `Authorization: Bearer
                       <token>`, else 401. Clients: `ExperienceClient(url, token_env=NAME)`. Without the flag
                       there is no authentication.
  --max_connections N  open connections (idle keep-alive ones included); one more is answered 503 with
                       Retry-After and closed.
  --max_workspaces N   a summary, load or copy that would create a workspace past N is refused with 409 and
                       creates nothing.
  --max_open_pools N   pools (vector index, database connection) kept open; the least recently used is closed.
Routes and status codes: see `evolver/experience/service.py`.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys

from evolver.experience import summarizer as summarizer_lib
from evolver.models.generate import OpenAIGenerate
from evolver.experience.service import (MAX_BODY_BYTES, MAX_CONNECTIONS, MAX_OPEN_POOLS, MAX_TOP_K, MAX_WORKSPACES,
                                        ExperienceServer, ExperienceService, token_from_env)


def _summarizer(args: argparse.Namespace) -> summarizer_lib.Summarizer:
  common = {"success_threshold": args.success_threshold, "dedup_threshold": args.dedup_threshold}
  if args.summarizer == "extractive":
    return summarizer_lib.ExtractiveSummarizer(**common)
  if not args.llm_base_url or not args.llm_model:
    raise SystemExit("--summarizer openai needs --llm_base_url and --llm_model")
  generate = OpenAIGenerate(args.llm_base_url, args.llm_model, api_key_env=args.llm_api_key_env)
  return summarizer_lib.LLMSummarizer(generate, model=args.llm_model, **common)


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--store", required=True, help="the store's root folder (created if new)")
  parser.add_argument("--embedder", default="minilm", choices=("minilm", "hashing"),
                      help="embeds queries and memories (hashing: dependency-free, for tests)")
  parser.add_argument("--host", default="127.0.0.1", help="interface to bind (default: loopback only)")
  parser.add_argument("--port", type=int, default=0, help="TCP port; 0 picks a free one and prints it")
  parser.add_argument("--library_dir", default=None,
                      help="the only folder /vector_store dump and load may use (default: <store>/libraries)")
  parser.add_argument("--summarizer", default="extractive", choices=("extractive", "openai"))
  parser.add_argument("--llm_base_url", default=None, help="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1")
  parser.add_argument("--llm_model", default=None, help="model name sent to the endpoint")
  parser.add_argument("--llm_api_key_env", default=None, help="environment variable holding the endpoint's key")
  parser.add_argument("--success_threshold", type=float, default=summarizer_lib.SUCCESS_THRESHOLD,
                      help="a trajectory succeeded when its score is at least this")
  parser.add_argument("--dedup_threshold", type=float, default=summarizer_lib.DEDUP_THRESHOLD,
                      help="a new memory this similar (cosine) to a stored or earlier one is dropped")
  parser.add_argument("--min_score", type=float, default=0.0, help="retrieval drops hits below this cosine")
  parser.add_argument("--max_top_k", type=int, default=MAX_TOP_K, help="the largest top_k a retrieval may ask")
  parser.add_argument("--max_body_mb", type=float, default=MAX_BODY_BYTES / 2**20, help="request body limit")
  parser.add_argument("--token_env", default=None, metavar="NAME",
                      help="the environment variable holding the bearer token every request must carry "
                      "(Authorization: Bearer <token>); unset or empty is an error. Default: no authentication")
  parser.add_argument("--max_connections", type=int, default=MAX_CONNECTIONS,
                      help="open connections at once; one more is answered 503 with Retry-After")
  parser.add_argument("--max_workspaces", type=int, default=MAX_WORKSPACES,
                      help="workspaces the store may hold; creating one more is refused with 409")
  parser.add_argument("--max_open_pools", type=int, default=MAX_OPEN_POOLS,
                      help="workspace pools (index and database connection) kept open; least recently used closed")
  args = parser.parse_args(argv)
  for flag in ("max_connections", "max_workspaces", "max_open_pools"):
    if getattr(args, flag) < 1:
      parser.error(f"--{flag} must be at least 1, got {getattr(args, flag)}")
  try:
    token = token_from_env(args.token_env) if args.token_env is not None else None
  except ValueError as error:
    parser.error(str(error))
  if token is None and args.host not in ("127.0.0.1", "localhost", "::1"):
    print(f"warning: serving {args.host} without a token: whoever reaches the port can read and change the store "
          "(give --token_env)", file=sys.stderr, flush=True)

  from evolver.experience.embedders import make_embedder  # pylint: disable=import-outside-toplevel
  from evolver.experience.store import ExperienceStore  # pylint: disable=import-outside-toplevel

  store = ExperienceStore(args.store)
  embedder = make_embedder(args.embedder)
  service = ExperienceService(store, embedder, summarizer=_summarizer(args), library_dir=args.library_dir,
                              min_score=args.min_score, max_top_k=args.max_top_k, max_workspaces=args.max_workspaces,
                              max_open_pools=args.max_open_pools)
  server = ExperienceServer(service, host=args.host, port=args.port, max_body_bytes=int(args.max_body_mb * 2**20),
                            max_connections=args.max_connections, token=token)

  def ready(port: int) -> None:
    auth = f"bearer token from ${args.token_env}" if token is not None else "no authentication"
    print(f"serving experience store {os.path.abspath(args.store)} (embedder {args.embedder}, summarizer "
          f"{service.summarizer.author}, libraries under {service.library_dir}, {auth}) on port {port}", flush=True)
    print(f"READY http://{args.host}:{port}", flush=True)

  try:
    asyncio.run(server.serve_forever(on_ready=ready))
  except KeyboardInterrupt:
    pass
  finally:
    service.close()
  sys.stdout.flush()


if __name__ == "__main__":
  main()
