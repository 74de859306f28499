"""RL-step benchmark: what one real GRPO step costs, cold and warm, beside its decode floor.

  python -m launch.benchmark --suite rl_step [--steps 4] [--envs maze,babyai,sql] [--compilation_cache fresh]

GRPO steps of the CPU comparison's recipe (gin_configs/experience/no_pool.gin + gin_configs/compare/cpu/grpo.gin:
8 tasks x 4 episodes = 32 episodes a step over `--envs`, temperature 1, 96 tokens a turn, each env's turn limit,
4 minibatches, learning rate 1e-4) from the shipped shared BC checkpoint, run by `launch.train`'s own code path
(`train_grpo`) in a fresh process, without val or held-out evaluation (`measure_steps`; `--recipe` names other gin
files, and the smollm2 suite runs it for SmolLM2's GRPO step). The first step is the cold one (every
program compiled: `--compilation_cache fresh` starts from an empty persistent cache, `shared` uses the user's);
the warm figures are medians over the later steps.

Each step's breakdown comes from the run's own metrics rows (`evolver.train.rl`): prefill, decode, row
selection, env steps, templating, idle decode rows, old and reference log-probabilities, the PPO updates;
XLA compilations per jitted function (count and seconds; persistent-cache hits apart) from
`evolver.runtime.CompileLog`; resident memory. The floor (`rollout_floor_s`) is the step's decoded tokens (each
turn's first token comes with its prefill), packed perfectly over the 32 episodes in flight, at the mean seconds
per decode step measured in the same step (compilation excluded): decoding with no row ever idle.

The peer is the floor: `speedup` = rollout_floor_s / warm_rollout_s (1.0 would be a rollout at the floor). Beside it,
`rollout_sequential_floor_s`: the longest episode's decoded tokens at the same per-step cost (its tokens come one
after another, so no schedule beats it); `rollout_over_max_floor` divides by the larger of the two floors.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Sequence

from launch.benchmarks import common

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RECIPE = ("gin_configs/experience/no_pool.gin", "gin_configs/compare/cpu/grpo.gin")
_ROLLOUT_PARTS = ("time/prefill_s", "time/decode_s", "time/select_s", "time/rollout_compile_s", "time/env_s",
                  "time/template_s")
_UPDATE_PARTS = ("time/credit_s", "time/old_logp_s", "time/ref_logp_s", "time/ppo_s")


def _worker(args: argparse.Namespace) -> dict:
  """Runs `args.steps` GRPO steps in this process and returns their metrics rows and compile log."""
  from absl import logging
  logging.set_verbosity(logging.WARNING)
  from evolver import runtime
  from evolver.train import gin_config
  from evolver.train import metrics as metrics_lib
  log = runtime.compile_log()  # listening before anything compiles
  model_dir = tempfile.mkdtemp(prefix="rl_step_run_")
  try:
    bindings = [f"MODEL_DIR = {model_dir!r}", f"TRAIN_STEPS = {args.steps}",
                f"train_grpo.envs = {args.envs.split(',')!r}", "TaskSlices.val_count = 0",
                "LoopConfig.eval_tasks = 0", f"TrainerConfig.checkpoint_every = {args.steps + 1}"]
    recipe = [os.path.join(ROOT, f) for f in args.recipe.split(",")]
    gin_config.parse(recipe, bindings + list(args.gin_bindings), [])
    gin_config.run()
    rows = [r for r in metrics_lib.read_metrics(model_dir) if "time/rollout_s" in r]
  finally:
    shutil.rmtree(model_dir, ignore_errors=True)
  by_step = {}
  for event in log.events:
    by_step.setdefault(event.tag or "setup", []).append(event)
  return {"rows": rows, "compiles": {tag: runtime.CompileLog.by_function(events) for tag, events in by_step.items()},
          "peak_rss_gb": runtime.peak_resident_gb()}


def measure_steps(*, steps: int, envs: str, recipe: Sequence[str] = RECIPE, gin_bindings: Sequence[str] = (),
                  compilation_cache: str = "fresh") -> dict:
  """Runs `steps` GRPO steps of the gin files `recipe` (paths from the repository root) plus `gin_bindings` over
  `envs` (comma-separated) in a fresh process (`_worker`), with an empty persistent compilation cache (`fresh`) or
  the user's (`shared`). Returns its metrics rows (one a step), compilations per phase and `peak_rss_gb` (the most
  resident memory that process held, GB)."""
  env = {}
  cache_dir = None
  if compilation_cache == "fresh":
    cache_dir = tempfile.mkdtemp(prefix="rl_step_xla_cache_")
    env["JAX_COMPILATION_CACHE_DIR"] = cache_dir
  worker_args = ["--steps", str(steps), "--envs", envs, "--recipe", ",".join(recipe), "--compilation_cache",
                 compilation_cache, "--worker", *[f"--gin_bindings={b}" for b in gin_bindings]]
  try:
    out = common.run_worker("launch.benchmarks.rl_step", worker_args, env=env, timeout=3600)
  finally:
    if cache_dir:
      shutil.rmtree(cache_dir, ignore_errors=True)
  if len(out["rows"]) != steps:
    raise RuntimeError(f"the run logged {len(out['rows'])} RL steps; expected {steps}")
  return out


def _median(rows: list[dict], key: str) -> float:
  values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
  return statistics.median(values) if values else float("nan")


def _step_s(row: dict) -> float:
  return row["time/rollout_s"] + row["time/update_s"]


def run(argv: list[str]) -> dict:
  parser = argparse.ArgumentParser(prog="launch.benchmark --suite rl_step")
  parser.add_argument("--steps", type=int, default=4, help="GRPO steps: the first is cold, the rest warm")
  parser.add_argument("--envs", default="maze,babyai,sql")
  parser.add_argument("--compilation_cache", choices=("fresh", "shared"), default="fresh",
                      help="fresh: an empty persistent compilation cache (a true cold start); shared: the user's")
  parser.add_argument("--gin_bindings", action="append", default=[], help="extra bindings for the run")
  parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
  parser.add_argument("--recipe", default=",".join(RECIPE), help="comma-separated gin files, from the repository root")
  args = parser.parse_args(argv)
  if args.worker:
    result = _worker(args)
    sys.stdout.flush()
    print(json.dumps(result))
    return result
  if args.steps < 2:
    parser.error("--steps must be >= 2 (one cold step, then warm ones)")

  out = measure_steps(steps=args.steps, envs=args.envs, recipe=args.recipe.split(","), gin_bindings=args.gin_bindings,
                      compilation_cache=args.compilation_cache)
  rows = out["rows"]
  cold, warm = rows[0], rows[1:]
  compiles_after_first = sum(r.get("compile/compiles", 0) for r in warm)

  header = ["step", "step_s", "rollout_s", "floor_s", "seq floor", "prefill", "decode", "select", "r.compile", "env", "template",
            "idle rows", "old_logp", "ref_logp", "ppo", "compiles", "compile_s", "cache hits", "rss GB"]
  table = []
  for r in rows:
    table.append([r["step"], f"{_step_s(r):.1f}", f"{r['time/rollout_s']:.1f}", f"{r['time/rollout_floor_s']:.2f}",
                  f"{r.get('time/rollout_sequential_floor_s', float('nan')):.2f}", *(f"{r.get(k, 0.0):.2f}" for k in _ROLLOUT_PARTS), f"{r['rollout/idle_row_fraction']:.2f}",
                  *(f"{r.get(k, 0.0):.2f}" for k in _UPDATE_PARTS[1:]), r.get("compile/compiles", 0),
                  f"{r.get('compile/compile_s', 0.0):.1f}", r.get("compile/cache_hits", 0),
                  f"{r.get('memory/rss_gb', float('nan')):.2f}"])
  common.print_table(f"GRPO steps of the CPU recipe ({args.envs}; step 1 cold, {args.compilation_cache} compilation "
                     "cache; seconds)", header, table)
  fn_rows = []
  for tag, functions in out["compiles"].items():
    for name, s in list(functions.items())[:8]:
      fn_rows.append([tag, name, s["compiles"], f"{s['compile_s']:.2f}", s["cache_hits"], f"{s['trace_s']:.2f}"])
  common.print_table("XLA compilations per jitted function (top 8 per phase)",
                     ["phase", "function", "compiles", "compile_s", "cache hits", "trace_s"], fn_rows)

  warm_rollout = _median(warm, "time/rollout_s")
  floor = _median(warm, "time/rollout_floor_s")
  sequential = _median(warm, "time/rollout_sequential_floor_s")
  result = {
      "suite": "rl_step", "unit": "seconds per RL step (32 episodes)",
      "ours": warm_rollout, "peer": floor, "speedup": floor / warm_rollout if warm_rollout else None,
      "warm_step_s": statistics.median(_step_s(r) for r in warm), "warm_rollout_s": warm_rollout,
      "rollout_floor_s": floor, "rollout_over_floor": warm_rollout / floor if floor else None,
      # The longest episode's decoded tokens at the same per-step cost: no schedule decodes them faster.
      "rollout_sequential_floor_s": sequential,
      "rollout_over_max_floor": warm_rollout / max(floor, sequential) if floor else None,
      "cold_step_s": _step_s(cold), "cold_rollout_s": cold["time/rollout_s"],
      "compiles_first": cold.get("compile/compiles", 0), "compile_s_first": cold.get("compile/compile_s", 0.0),
      "compiles_after_first": compiles_after_first, "peak_rss_gb": out["peak_rss_gb"],
      "warm": {k: _median(warm, k) for k in (*_ROLLOUT_PARTS, *_UPDATE_PARTS, "rollout/idle_row_fraction",
                                             "rollout/decode_steps", "rollout/sampled_tokens", "rollout/turns",
                                             "time/update_s", "memory/rss_gb")},
      "rows": rows, "compiles": out["compiles"], "envs": args.envs, "steps": args.steps,
      "compilation_cache": args.compilation_cache,
  }
  print(f"\nwarm step {result['warm_step_s']:.1f} s (rollout {warm_rollout:.1f} s = "
        f"{result['rollout_over_floor']:.1f}x its floor {floor:.2f} s, {result['rollout_over_max_floor']:.1f}x the "
        f"longest episode's {sequential:.2f} s or that floor), cold step {result['cold_step_s']:.1f} s, "
        f"{compiles_after_first} compilations after the first step, peak RSS {out['peak_rss_gb']:.2f} GB")
  return result


if __name__ == "__main__":
  run(sys.argv[1:])
