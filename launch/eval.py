"""Evaluate a policy on the environments: per-env success rate, mean reward and turns -> eval_results.json.

  python -m launch.eval --hf_checkpoint DIR --envs maze,wordle --split eval --num_tasks 100 --out DIR/eval.json
  python -m launch.eval --model_dir runs/bc [--step 400 | --best] --envs maze,wordle --num_samples 4 --temperature 1.0
  python -m launch.eval --hf_checkpoint DIR --env_urls maze=http://127.0.0.1:36001   # a served env
  python -m launch.eval --policy openai --base_url http://127.0.0.1:8000/v1 --model NAME --envs maze,sql \
      --num_tasks 100 --max_concurrency 16 --requests_per_s 20 --out eval.json

`--hf_checkpoint` is a transformers directory (its tokenizer is loaded from it too); `--model_dir` is a
training run (the latest checkpoint, `--step N`, or `--best`, the one selected on `val`), with the shipped
tiny tokenizer unless `--tokenizer` says otherwise. Greedy by default; `--num_samples k` reports avg@k
(`success`) and best@k (`best_success`).

`--policy openai` plays the same episodes with a model behind an OpenAI-compatible chat endpoint (a vLLM or SGLang
server, or a hosted API; `evolver.rollout.api`): each assistant turn is one `/chat/completions` request with the
conversation so far. Requests are retried with backoff on connection errors, 429 (after its Retry-After) and
5xx; a 401/403/404 stops the run with the server's message. The API key is read from the environment variable
that `--api_key_env` names (default OPENAI_API_KEY; none needed for a local server) and never written out; the
results carry the endpoint and model under "policy" and the request counts under "api_stats".
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from evolver import envs as envs_lib
from evolver.models import load_hf
from evolver.models import tokenizer as tokenizer_lib
from evolver.models.openai_api import APIRequestError, OpenAIChat
from evolver.models.sampler import Sampler
from evolver.rollout import APIRolloutEngine
from evolver.train import evaluation

POLICIES = ("local", "openai")


def load_policy(args: argparse.Namespace):
  """(model, tokenizer, description) from --hf_checkpoint or --model_dir."""
  if bool(args.hf_checkpoint) == bool(args.model_dir):
    raise SystemExit("give exactly one of --hf_checkpoint DIR and --model_dir RUN_DIR")
  if args.hf_checkpoint:
    model = load_hf(args.hf_checkpoint)
    tok = tokenizer_lib.load_tokenizer(args.tokenizer or args.hf_checkpoint)
    return model, tok, {"hf_checkpoint": args.hf_checkpoint}
  from evolver.train.checkpoints import restore_model  # the training stack, only when a run is evaluated
  model, step = restore_model(args.model_dir, step=args.step, best=args.best)
  tok = tokenizer_lib.load_tokenizer(args.tokenizer)
  return model, tok, {"model_dir": args.model_dir, "step": int(step), "best": args.best}


def api_engine(args: argparse.Namespace, env_factory) -> APIRolloutEngine:
  """The --policy openai engine: the endpoint's client (key from the --api_key_env variable) and the env factory."""
  if not args.base_url or not args.model:
    raise SystemExit("--policy openai needs --base_url (the API root, e.g. http://127.0.0.1:8000/v1) and --model")
  if args.hf_checkpoint or args.model_dir:
    raise SystemExit("--policy openai takes no --hf_checkpoint or --model_dir: the endpoint serves the model")
  api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
  try:
    client = OpenAIChat(args.base_url, args.model, api_key, timeout_s=args.timeout_s, max_retries=args.max_retries,
                        requests_per_s=args.requests_per_s)
  except ValueError as error:
    raise SystemExit(str(error)) from None
  return APIRolloutEngine(client, env_factory=env_factory, max_concurrency=args.max_concurrency,
                          stop=[s for s in args.stop if s])


def env_factory_for(urls: dict[str, list[str]]):
  """Built-in envs in process, except those given a server URL (`RemoteEnv`)."""

  def make(name: str) -> Any:
    if name in urls:
      return envs_lib.RemoteEnv(urls[name], name)
    return envs_lib.make(name)

  return make


def parse_env_urls(text: str) -> dict[str, list[str]]:
  """'maze=http://a:1,maze=http://b:2,wordle=http://c:3' -> {maze: [a, b], wordle: [c]}."""
  urls: dict[str, list[str]] = {}
  for item in filter(None, (s.strip() for s in text.split(","))):
    name, sep, url = item.partition("=")
    if not sep or not url:
      raise SystemExit(f"--env_urls entries are NAME=URL, got {item!r}")
    urls.setdefault(name, []).append(url)
  return urls


def results_path(out: str | None, model_dir: str | None) -> str:
  """Where the results go: `--out`, else the run's own MODEL_DIR/eval_results.json, else the working directory."""
  if out:
    return out
  return os.path.join(model_dir, "eval_results.json") if model_dir else "eval_results.json"


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--policy", default="local", choices=POLICIES,
                      help="local: a checkpoint in process; openai: a model behind an OpenAI-compatible endpoint")
  parser.add_argument("--hf_checkpoint", default=None, help="a transformers directory (model + tokenizer)")
  parser.add_argument("--model_dir", default=None, help="a training run directory")
  parser.add_argument("--step", type=int, default=None, help="with --model_dir: which checkpoint (default latest)")
  parser.add_argument("--best", action="store_true", help="with --model_dir: the checkpoint selected on val")
  parser.add_argument("--tokenizer", default=None, help="a tokenizer directory (overrides the default)")
  parser.add_argument("--envs", default=",".join(envs_lib.names()),
                      help="comma-separated env names (default the built-in suite; benchmarks such as bfcl by name)")
  parser.add_argument("--env_urls", default="", help="NAME=URL,... to evaluate served envs (RemoteEnv)")
  parser.add_argument("--split", default="eval", choices=["train", "eval"])
  parser.add_argument("--num_tasks", type=int, default=None, help="the first N tasks of each env (default all)")
  parser.add_argument("--start", type=int, default=0, help="first task index (with --num_tasks: a slice)")
  parser.add_argument("--num_samples", type=int, default=1, help="episodes per task (k of avg@k / best@k)")
  parser.add_argument("--temperature", type=float, default=None, help="default 0 (greedy) for k=1, else 1.0")
  parser.add_argument("--top_p", type=float, default=1.0)
  parser.add_argument("--max_new_tokens", type=int, default=128, help="per assistant turn")
  parser.add_argument("--max_rounds", type=int, default=None, help="default: each env's own limit")
  parser.add_argument("--batch_size", type=int, default=64, help="episodes in flight at once")
  parser.add_argument("--max_context_tokens", type=int, default=None,
                      help="tokens an episode may hold (the sampler's cache per row; default the model's positions, "
                           "at most 4,096); an episode that outgrows it ends, marked truncated")
  parser.add_argument("--seed", type=int, default=0)
  api = parser.add_argument_group("--policy openai")
  api.add_argument("--base_url", default=None, help="the API root, e.g. http://127.0.0.1:8000/v1")
  api.add_argument("--model", default=None, help="the model name the endpoint serves")
  api.add_argument("--api_key_env", default="OPENAI_API_KEY",
                   help="the environment variable holding the API key (unset or empty: no key is sent)")
  api.add_argument("--max_concurrency", type=int, default=8, help="episodes (so requests) in flight at once")
  api.add_argument("--requests_per_s", type=float, default=None, help="client-side rate limit (default none)")
  api.add_argument("--timeout_s", type=float, default=120.0, help="per request, seconds")
  api.add_argument("--max_retries", type=int, default=5, help="retries of a connection error, 429 or 5xx")
  api.add_argument("--stop", action="append", default=[], help="a stop string (repeatable; default none)")
  parser.add_argument("--out", default=None,
                      help="output file (or directory); default MODEL_DIR/eval_results.json with --model_dir, "
                           "else eval_results.json")
  args = parser.parse_args(argv)

  names = [n.strip() for n in args.envs.split(",") if n.strip()]
  urls = parse_env_urls(args.env_urls)
  known = envs_lib.names() + envs_lib.benchmark_names()
  unknown = [n for n in names if n not in known and n not in urls]
  if unknown:
    raise SystemExit(f"unknown envs {unknown}; built-in: {known} (or serve them and pass --env_urls)")
  env_factory = env_factory_for(urls)
  if args.policy == "openai":
    policy, tok = api_engine(args, env_factory), None
    source = policy.describe()
  else:
    if args.base_url or args.model:
      raise SystemExit("--base_url and --model are for --policy openai (an endpoint); the local policy is "
                       "--hf_checkpoint DIR or --model_dir RUN")
    model, tok, source = load_policy(args)
    policy = Sampler(model, max_length=args.max_context_tokens)
  try:
    results = evaluation.evaluate(
        policy, tok, names, split=args.split, start=args.start, num_tasks=args.num_tasks,
        num_samples=args.num_samples, temperature=args.temperature, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, max_rounds=args.max_rounds, batch_size=args.batch_size, seed=args.seed,
        env_factory=env_factory)
  except APIRequestError as error:
    raise SystemExit(f"the endpoint refused a request: {error}") from None
  finally:
    if isinstance(policy, APIRolloutEngine):
      policy.close()
  results["policy"] = source
  out = results_path(args.out, args.model_dir)
  path = evaluation.write_eval_results(out, results)
  evaluation.print_table(results)
  print(f"wrote {path}")
  sys.stdout.flush()
  return results


if __name__ == "__main__":
  main()
