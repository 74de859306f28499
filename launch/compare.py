"""The self-evolution comparison: BC, BC on 5x the expert data, GRPO, AgentEvol (and DPO) over seeds, held out.

  python -m launch.compare --root runs/compare --envs maze,babyai,sql --seeds 0,1,2 --eval_tasks 100
  python -m launch.compare --root runs/compare --methods bc,grpo --bindings "grpo:TRAIN_STEPS=100"
  python -m launch.compare --root runs/compare_cpu --recipe cpu --archive results/compare_cpu   # 2-core CPU size

Every method runs through `launch.train` with its gin file (`METHODS`) on one slice layout of each env's
`train` split (gin_configs/base.gin): D_s = [0, 80) for BC, AgentEvol's BC phase and the GRPO/DPO starting
point; [0, 400) for "BC x5"; AgentEvol, GRPO and DPO explore [80, 400); every method selects on val [400, 412).
A recipe (`--recipe`) is a directory of gin files, gin_configs/compare/RECIPE/METHOD.gin, layered after the
method's own file (`full`: none).
Each run's val-selected policy (its latest where it kept none) is then evaluated greedily on the first
`--eval_tasks` tasks of each env's held-out `eval` split. Runs live in ROOT/METHOD/seed_S; a run already
trained resumes (or returns at once), an evaluation already written is read back, so the sweep can be stopped
and started again. The table (per-env success, mean +- sample std over seeds) is printed and written to
ROOT/compare.json with every command that produced it.

`--archive DIR` keeps each evaluated run's record (its evaluation, metrics and operative config: kilobytes, no
checkpoints) in DIR/METHOD/seed_S, and a run whose evaluation is found there counts as done: it is not trained
again unless a method that starts from it (GRPO, DPO from BC) still has to run. So a sweep longer than one sitting
can be finished seed by seed, keeping only the archive (e.g. committed under results/) between sittings.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EVAL_FILE = "compare_eval.json"
# What --archive keeps of a run: its held-out evaluation, learning curves and the config that produced them.
RECORD_FILES = (EVAL_FILE, "metrics.jsonl", "operative_config.gin")


@dataclasses.dataclass(frozen=True)
class Method:
  gin_files: tuple[str, ...]
  loop: str                                # the gin name of the loop's function (for its `envs`)
  init_from: str | None = None             # a method whose run (same seed) is INIT_CHECKPOINT


_EXPERIENCE = "gin_configs/experience/"
METHODS = {
    "bc": Method(("gin_configs/compare/bc.gin",), "train_bc"),
    "bc_x5": Method(("gin_configs/compare/bc_x5.gin",), "train_bc"),
    "agentevol": Method(("gin_configs/runs/agentevol.gin",), "train_agentevol"),
    "grpo": Method(("gin_configs/runs/grpo.gin",), "train_grpo", init_from="bc"),
    "dpo": Method(("gin_configs/runs/dpo.gin",), "train_dpo", init_from="bc"),
    # GRPO from the shipped shared BC checkpoint with the experience pool (init + train + update), by method.
    "exp_woexp": Method((_EXPERIENCE + "init_train_update.gin", _EXPERIENCE + "woexp.gin"), "train_grpo"),
    "exp_discard": Method((_EXPERIENCE + "init_train_update.gin", _EXPERIENCE + "discard.gin"), "train_grpo"),
    "exp_keep": Method((_EXPERIENCE + "init_train_update.gin", _EXPERIENCE + "keep.gin"), "train_grpo"),
    "exp_hybrid": Method((_EXPERIENCE + "init_train_update.gin", _EXPERIENCE + "hybrid.gin"), "train_grpo"),
    # Self-questioning: GRPO from the shared BC on 16 original tasks per env, on those plus as many tasks
    # self-questioned in the same worlds (results/selfq_cpu/taskset), and on the full exploration slice.
    "selfq_scarce": Method((_EXPERIENCE + "no_pool.gin", "gin_configs/compare/selfq/scarce.gin"), "train_grpo"),
    "selfq_mix": Method(("gin_configs/tasks/grpo_selfq.gin", "gin_configs/compare/selfq/scarce.gin",
                         "gin_configs/compare/selfq/mix.gin"), "train_grpo"),
    "selfq_full": Method((_EXPERIENCE + "no_pool.gin",), "train_grpo"),
    # Self-attributing: GRPO from the shared BC on the full exploration slice with step credit (ADCA with the oracle
    # or the env judge, anchor-state grouping); plain GRPO on the same budget is selfq_full (the same recipe).
    "credit_adca_oracle": Method((_EXPERIENCE + "no_pool.gin", "gin_configs/credit/adca.gin"), "train_grpo"),
    "credit_adca_env": Method((_EXPERIENCE + "no_pool.gin", "gin_configs/credit/adca_env.gin"), "train_grpo"),
    "credit_anchor": Method((_EXPERIENCE + "no_pool.gin", "gin_configs/credit/anchor_state.gin"), "train_grpo"),
}
RECIPE_DIR = "gin_configs/compare"
# "full": the gin files as they are (bc.gin's 3,000 steps, AgentEvol's 320 exploration tasks per env: hours per run
# on a CPU). "cpu": the sweep sized for a 2-core CPU, the one measured in results/compare_cpu
# (gin_configs/compare/cpu/METHOD.gin).
RECIPES = ("full", "cpu")


def recipe_files(recipe: str, method: str) -> list[str]:
  """The recipe's gin file for `method` (relative to the repository), if it has one: METHOD.gin, else the file of
  its family (`exp.gin` for every `exp_*` method, `selfq.gin` for `selfq_*`, `credit.gin` for `credit_*`)."""
  if recipe == "full":
    return []
  for name in (method, method.split("_")[0] if method.startswith(("exp_", "selfq_", "credit_")) else None):
    path = os.path.join(RECIPE_DIR, recipe, f"{name}.gin") if name else None
    if path and os.path.exists(os.path.join(ROOT, path)):
      return [path]
  return []


def run_dir(root: str, method: str, seed: int) -> str:
  return os.path.join(root, method, f"seed_{seed}")


def train_command(root: str, method: str, seed: int, envs: Sequence[str], extra: Sequence[str],
                  recipe: str = "full") -> list[str]:
  """The `launch.train` command of one run: the method's gin file, the recipe's, then bindings (the run's
  directory, seed, envs and starting checkpoint, then `extra`, which come last and win)."""
  spec = METHODS[method]
  bindings = [f"MODEL_DIR = '{run_dir(root, method, seed)}'", f"SEED = {seed}", f"{spec.loop}.envs = {list(envs)!r}"]
  if spec.init_from:
    bindings.append(f"INIT_CHECKPOINT = '{run_dir(root, spec.init_from, seed)}'")
  bindings += list(extra)
  files = [*spec.gin_files, *recipe_files(recipe, method)]
  return [sys.executable, "-m", "launch.train", *[f"--gin_file={f}" for f in files],
          *[f"--gin_bindings={b}" for b in bindings]]


def eval_command(root: str, method: str, seed: int, envs: Sequence[str], eval_tasks: int,
                 max_new_tokens: int) -> list[str]:
  """Greedy held-out evaluation of the run's val-selected policy (its latest when it kept none)."""
  directory = run_dir(root, method, seed)
  from evolver.train import checkpoints as ckpt_lib
  best_dir = ckpt_lib.checkpoint_dir(os.path.join(ROOT, directory), ckpt_lib.BEST_SUBDIR)  # root may be relative
  best = ["--best"] if os.path.isdir(best_dir) else []
  return [sys.executable, "-m", "launch.eval", "--model_dir", directory, *best, "--envs", ",".join(envs),
          "--split", "eval", "--num_tasks", str(eval_tasks), "--max_new_tokens", str(max_new_tokens),
          "--out", os.path.join(directory, EVAL_FILE)]


def parse_bindings(items: Sequence[str], methods: Sequence[str]) -> dict[str, list[str]]:
  """'METHOD:BINDING' (or 'all:BINDING') -> {method: [bindings]}; an unknown method is an error."""
  out: dict[str, list[str]] = {m: [] for m in methods}
  for item in items:
    method, sep, binding = item.partition(":")
    if not sep or not binding.strip():
      raise SystemExit(f"--bindings entries are METHOD:BINDING (or all:BINDING), got {item!r}")
    if method != "all" and method not in METHODS:
      raise SystemExit(f"--bindings {item!r}: unknown method {method!r}; known: {sorted(METHODS)} or 'all'")
    for m in methods if method == "all" else [method]:
      if m in out:
        out[m].append(binding)
  return out


def ordered_methods(methods: Sequence[str]) -> list[str]:
  """`methods` with each one's `init_from` run first (added when missing)."""
  out: list[str] = []
  for method in methods:
    if method not in METHODS:
      raise SystemExit(f"unknown method {method!r}; known: {sorted(METHODS)}")
    parent = METHODS[method].init_from
    if parent and parent not in out:
      out.append(parent)
    if method not in out:
      out.append(method)
  return out


def summarize(results: dict[str, dict[int, dict[str, Any]]], envs: Sequence[str]) -> dict[str, Any]:
  """{method: {seed: eval results}} -> {method: {env: {mean, std, values}}, overall too}; std is the sample
  std (ddof 1) over seeds, 0 for a single seed."""
  table: dict[str, Any] = {}
  for method, by_seed in results.items():
    seeds = sorted(by_seed)
    row = {}
    for env in list(envs) + ["overall"]:
      values = [float((by_seed[s]["overall"] if env == "overall" else by_seed[s]["envs"][env])["success"])
                for s in seeds]
      row[env] = {"mean": float(np.mean(values)), "std": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0,
                  "values": values, "seeds": seeds}
    table[method] = row
  return table


def format_table(table: dict[str, Any], envs: Sequence[str]) -> str:
  columns = list(envs) + ["overall"]
  lines = ["| method | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
  for method, row in table.items():
    lines.append(f"| {method} | " + " | ".join(f"{row[c]['mean']:.3f} +- {row[c]['std']:.3f}" for c in columns)
                 + " |")
  return "\n".join(lines)


def evaluation_file(root: str, archive: str | None, method: str, seed: int) -> str | None:
  """The run's written evaluation: in ROOT, else in the archive, else None."""
  for base in (root, archive):
    if base:
      path = os.path.join(run_dir(base, method, seed), EVAL_FILE)
      if os.path.exists(path):
        return path
  return None


def needs_training(root: str, archive: str | None, method: str, seed: int, methods: Sequence[str]) -> bool:
  """False when the run is evaluated and no method still to run (same seed) starts from its checkpoint."""
  if evaluation_file(root, archive, method, seed) is None:
    return True
  return any(METHODS[m].init_from == method and evaluation_file(root, archive, m, seed) is None for m in methods)


def archive_run(directory: str, destination: str) -> None:
  """Copies the run's RECORD_FILES that exist to `destination`, paths inside the repository made relative to it
  (the records name their runs' directories)."""
  os.makedirs(destination, exist_ok=True)
  for name in RECORD_FILES:
    if os.path.exists(os.path.join(directory, name)):
      with open(os.path.join(directory, name)) as f:
        text = f.read().replace(ROOT + os.sep, "")
      with open(os.path.join(destination, name), "w") as f:
        f.write(text)


def check_reproduced(directory: str, archived: str) -> None:
  """A run retrained because a method starts from it, with its evaluation in the archive: its training curve
  must equal the archived one (step and loss of every row), or the archived evaluation would describe another
  policy than the one the dependent method starts from. Raises SystemExit saying what to do."""
  def curve(path: str) -> list[tuple[int, str]]:
    with open(os.path.join(path, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f if line.strip()]
    return [(int(r["step"]), repr(float(r["loss"]))) for r in rows if "loss" in r]  # repr: a NaN equals a NaN

  if not os.path.exists(os.path.join(archived, "metrics.jsonl")):
    return
  new, old = curve(directory), curve(archived)
  if new != old:
    differ = next((i for i, (a, b) in enumerate(zip(new, old)) if a != b), min(len(new), len(old)))
    raise SystemExit(f"{directory} was trained again (a method starts from it) but does not reproduce the archived "
                     f"run in {archived}: their curves differ from row {differ} on ({len(new)} vs {len(old)} rows). "
                     "Its archived evaluation would describe another policy; delete that archive record so that "
                     "this run is evaluated again")


def run(command: list[str], log: str) -> None:
  print("$ " + shlex.join(command[1:] if command[0] == sys.executable else command), flush=True)
  with open(log, "a") as f:
    proc = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
  if proc.returncode:
    raise SystemExit(f"the command above failed ({proc.returncode}); its output is in {log}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--root", required=True, help="where the runs go (ROOT/METHOD/seed_S)")
  parser.add_argument("--methods", default="bc,bc_x5,grpo,agentevol", help=f"comma-separated, of {sorted(METHODS)}")
  parser.add_argument("--envs", default="maze,babyai,sql")
  parser.add_argument("--seeds", default="0,1,2")
  parser.add_argument("--eval_tasks", type=int, default=100, help="held-out eval tasks per env")
  parser.add_argument("--max_new_tokens", type=int, default=96, help="per assistant turn in evaluation")
  parser.add_argument("--recipe", default="full", choices=RECIPES,
                      help="gin files gin_configs/compare/RECIPE/METHOD.gin layered after each method's (before --bindings)")
  parser.add_argument("--bindings", action="append", default=[], help="METHOD:BINDING or all:BINDING (repeatable)")
  parser.add_argument("--archive", default=None,
                      help="keep each evaluated run's record here; runs evaluated there are not redone")
  args = parser.parse_args(argv)
  envs = [e for e in args.envs.split(",") if e]
  seeds = [int(s) for s in args.seeds.split(",") if s]
  requested = [m for m in args.methods.split(",") if m]
  methods = ordered_methods(requested)
  extra = parse_bindings(args.bindings, methods)
  root = os.path.abspath(args.root)
  # Commands name the runs relative to the repository (where they run) when they live inside it.
  cmd_root = os.path.relpath(root, ROOT) if root.startswith(ROOT + os.sep) else root
  archive = os.path.abspath(args.archive) if args.archive else None
  commands: list[str] = []
  results: dict[str, dict[int, dict[str, Any]]] = {m: {} for m in requested}
  for seed in seeds:
    for method in methods:
      directory = run_dir(root, method, seed)
      log = os.path.join(directory, "compare.log")
      train = train_command(cmd_root, method, seed, envs, extra[method], args.recipe)
      if needs_training(root, archive, method, seed, methods):
        os.makedirs(directory, exist_ok=True)
        run(train, log)
        if archive and evaluation_file(root, archive, method, seed) == os.path.join(
            run_dir(archive, method, seed), EVAL_FILE):
          check_reproduced(directory, run_dir(archive, method, seed))
      evaluate = eval_command(cmd_root, method, seed, envs, args.eval_tasks, args.max_new_tokens)
      commands += [shlex.join(train[1:]), shlex.join(evaluate[1:])]
      out = evaluation_file(root, archive, method, seed)
      if out is None:
        run(evaluate, log)
        out = os.path.join(directory, EVAL_FILE)
      if archive and os.path.exists(os.path.join(directory, EVAL_FILE)):
        archive_run(directory, run_dir(archive, method, seed))
      if method in results:
        with open(out) as f:
          results[method][seed] = json.load(f)
  table = summarize(results, envs)
  text = format_table(table, envs)
  print(f"\nheld-out success ({args.eval_tasks} eval tasks per env, greedy), mean +- std over seeds {seeds}\n{text}")
  summary = {"envs": envs, "seeds": seeds, "eval_tasks": args.eval_tasks, "recipe": args.recipe, "table": table,
             "commands": commands}
  for directory in [root] + ([archive] if archive else []):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "compare.json"), "w") as f:
      json.dump(summary, f, indent=2)
  return summary


if __name__ == "__main__":
  main()
