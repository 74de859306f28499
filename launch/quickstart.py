"""The quickstart: self-evolution of the shipped BC checkpoint, measured against its start.

  python -m launch.quickstart [--model_dir DIR] [--smoke]      (what `bash launch/quickstart.sh` runs)

Four stages, each with its progress bars, each skipped when its records exist (run the same command again to
resume a stopped run or to print its table again):
  1. start: the shipped tiny policy (`evolver/assets/checkpoints/bc_tiny`, BC on expert episodes) evaluated on the
     tasks it will practise (sampled, avg@k) and on held-out tasks of the `eval` split (greedy and avg@k);
  2. evolve: GRPO from that checkpoint on the practised tasks (`gin_configs/quickstart.gin`): the policy plays
     each task several times, and its own successes and failures are the only training signal;
  3. evolved: the last policy evaluated exactly as the start was: the same tasks and sampling seeds, so every
     episode has a partner;
  4. report: the evolved policy minus the start, per kind, with a paired bootstrap 95% interval over tasks
     (`sweep_report.paired_comparison`), printed and written to MODEL_DIR/quickstart.md, and the learning curve
     (the practised tasks' success per step of training) as MODEL_DIR/learning_curve.png.

The practised tasks are train tasks outside the expert slice the checkpoint was trained on; the held-out ones are
never trained on. `--smoke` runs the same stages at the smallest size (what CI runs in a venv set up for `run`
alone): it checks that the pipeline runs in this install, not what it learns.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time
from typing import Any

from launch import sweep_report

START_CHECKPOINT = "evolver/assets/checkpoints/bc_tiny"
GIN_FILE = "gin_configs/quickstart.gin"
SMOKE_GIN_FILE = "gin_configs/quickstart_smoke.gin"
REPORT_FILE = "quickstart.md"
CURVE_FILE = "learning_curve.png"
TIMES_FILE = "quickstart_times.json"  # each stage's wall seconds when it last ran (a skipped stage keeps its own)


@dataclasses.dataclass(frozen=True)
class Plan:
  """What the quickstart evaluates; the GRPO recipe is the gin file's.

  envs: the envs played. practised_start, practised_tasks: the train tasks [start, start + n) GRPO practises
  (outside the expert slice [0, 80)), evaluated with practised_samples episodes each. held_out_tasks: the first n
  tasks of each env's `eval` split, evaluated greedily and with held_out_samples episodes each. max_rounds
  (None: each env's own) and max_new_tokens: the limits of every episode, trained on or evaluated. batch_size:
  the evaluations' episodes in flight (each of the plan's evaluations in one chunk, none waiting on a chunk's tail).
  """
  envs: tuple[str, ...] = ("maze",)
  practised_start: int = 80
  practised_tasks: int = 8
  practised_samples: int = 6
  held_out_tasks: int = 20
  held_out_samples: int = 4
  max_rounds: int | None = 12
  max_new_tokens: int = 96
  batch_size: int = 128


PLAN = Plan()
SMOKE_PLAN = Plan(practised_tasks=2, practised_samples=2, held_out_tasks=2, held_out_samples=2, max_rounds=4,
                  max_new_tokens=32)


def eval_args(plan: Plan, policy: list[str], kind: str, out: str, baseline: str | None = None) -> list[str]:
  """`launch.eval`'s arguments for one evaluation of the plan: kind "practised" (the practised train tasks,
  sampled) or "held_out" (the held-out tasks, sampled and greedy), of `policy` (its `launch.eval` arguments), into
  the directory `out` (eval_samples.json, and eval_results.json for the greedy one), paired with `baseline` (a
  directory of the same kind's evaluation) when given."""
  args = [*policy, "--envs", ",".join(plan.envs), "--max_new_tokens", str(plan.max_new_tokens), "--seed", "0",
          "--temperature", "1.0", "--batch_size", str(plan.batch_size)]
  if plan.max_rounds is not None:
    args += ["--max_rounds", str(plan.max_rounds)]
  if kind == "practised":
    args += ["--split", "train", "--start", str(plan.practised_start), "--num_tasks", str(plan.practised_tasks),
             "--num_samples", str(plan.practised_samples), "--out", os.path.join(out, sweep_report.SAMPLES_FILE)]
  elif kind == "held_out":
    args += ["--split", "eval", "--num_tasks", str(plan.held_out_tasks), "--num_samples",
             str(plan.held_out_samples), "--with_greedy", "--out", out]
  else:
    raise ValueError(f"unknown evaluation kind {kind!r}: 'practised' or 'held_out'")
  if baseline is not None:
    args += ["--baseline", baseline]
  return args


def train_args(plan: Plan, model_dir: str, smoke: bool) -> list[str]:
  """`launch.train`'s arguments: the quickstart's GRPO recipe on the plan's envs and practised tasks, its rollouts
  under the plan's limits (those of its evaluations)."""
  bindings = [f"MODEL_DIR = {model_dir!r}", f"train_grpo.envs = {list(plan.envs)!r}",
              f"TaskSlices.explore_start = {plan.practised_start}",
              f"TaskSlices.explore_count = {plan.practised_tasks}",
              f"train_grpo.max_rounds = {plan.max_rounds!r}", f"train_grpo.max_new_tokens = {plan.max_new_tokens}"]
  files = [GIN_FILE] + ([SMOKE_GIN_FILE] if smoke else [])
  return [f"--gin_file={f}" for f in files] + [f"--gin_bindings={b}" for b in bindings]


def stage_dirs(model_dir: str) -> dict[str, str]:
  """Where each evaluation's records go: {start,evolved}_{practised,held_out} -> a directory under model_dir."""
  return {f"{who}_{kind}": os.path.join(model_dir, who, kind) for who in ("start", "evolved")
          for kind in ("practised", "held_out")}


def evaluated(directory: str, kind: str) -> bool:
  """Whether `directory` holds the evaluation `kind` ("practised" | "held_out"): its sampled results file, and
  for held_out its greedy one too, so that its stage can be skipped."""
  files = [sweep_report.SAMPLES_FILE] + ([sweep_report.EVAL_FILE] if kind == "held_out" else [])
  return all(os.path.exists(os.path.join(directory, f)) for f in files)


def run(module: str, args: list[str]) -> None:
  """`python -m module args` in this interpreter, its output streamed; stops the quickstart where it fails."""
  command = [sys.executable, "-m", module, *args]
  result = subprocess.run(command, check=False)
  if result.returncode:
    raise SystemExit(f"[quickstart] `{' '.join(command)}` failed (exit {result.returncode}); run the quickstart "
                     "again to resume")


def comparisons(model_dir: str) -> list[tuple[str, dict[str, Any]]]:
  """(label, `paired_comparison`) of the evolved policy against the start: practised tasks (sampled), then
  held-out (greedy, sampled)."""
  dirs = stage_dirs(model_dir)
  out = []
  for kind, label in (("practised", "practised tasks"), ("held_out", "held-out tasks")):
    evolved = sweep_report.read_baseline_eval(dirs[f"evolved_{kind}"])
    start = sweep_report.read_baseline_eval(dirs[f"start_{kind}"])
    for which in sweep_report.KINDS:
      if evolved.evaluation(which) is not None and start.evaluation(which) is not None:
        out.append((label, sweep_report.paired_comparison(evolved.evaluation(which), start.evaluation(which))))
  return out


def table(model_dir: str) -> str:
  """The report's markdown table: per comparison, env and overall, the start's and the evolved policy's success,
  their paired difference and its bootstrap 95% interval."""
  lines = ["| tasks | kind | env | start | evolved | evolved - start [95% CI] | tasks paired |",
           "|---|---|---|---|---|---|---|"]
  for label, c in comparisons(model_dir):
    envs = list(c["envs"].items()) + ([("overall", c["overall"])] if len(c["envs"]) > 1 else [])
    for env, e in envs:
      lines.append(f"| {label} | {c['kind']} | {env} | {e['baseline']:.3f} | {e['this']:.3f} | {e['diff']:+.3f} "
                   f"[{e['lo']:+.3f}, {e['hi']:+.3f}] | {e['tasks']} |")
  return "\n".join(lines) + "\n"


def learning_curve(model_dir: str) -> bytes | None:
  """PNG: success on the practised tasks against the GRPO updates applied: each step's own rollouts (step k's
  episodes are played by the policy after k - 1 updates) and the start's and the evolved policy's evaluations (at
  0 and at the last step); None where the run logged no step."""
  metrics = sweep_report.read_metrics(os.path.join(model_dir, "metrics.jsonl"))
  points = sorted((step - 1, float(m["rollout/success"])) for step, m in metrics.items() if "rollout/success" in m)
  if not points:
    return None
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  from matplotlib import ticker

  fig, ax = plt.subplots(figsize=(6.4, 3.8))
  ax.plot([s for s, _ in points], [v for _, v in points], marker="o", linewidth=1.2,
          label="the step's own rollouts (what it trained on)")
  practised = [c for label, c in comparisons(model_dir) if label == "practised tasks"]
  if practised:
    o = practised[0]["overall"]
    ax.plot([0, points[-1][0] + 1], [o["baseline"], o["this"]], "s", color="black",
            label=f"{practised[0]['kind']} evaluation, start and evolved: {o['diff']:+.3f} "
                  f"[{o['lo']:+.3f}, {o['hi']:+.3f}]")
  ax.set_xlabel("GRPO updates applied")
  ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
  ax.set_ylabel("success on the practised tasks")
  ax.set_ylim(0, 1)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="lower right")
  ax.set_title("self-evolution from the shipped BC checkpoint")
  data = sweep_report._png(fig)  # pylint: disable=protected-access
  plt.close(fig)
  return data


def report(model_dir: str, plan: Plan, seconds: dict[str, float]) -> str:
  """Writes MODEL_DIR/quickstart.md (the table, the plan and the stages' wall times) and the learning curve;
  returns the markdown."""
  held_out = f"the first {plan.held_out_tasks} tasks of the eval split"
  text = (f"# Quickstart: self-evolution from {START_CHECKPOINT}\n\n"
          f"- envs: {', '.join(plan.envs)}\n"
          f"- practised tasks: train tasks [{plan.practised_start}, {plan.practised_start + plan.practised_tasks}),"
          f" avg@{plan.practised_samples}\n"
          f"- held-out tasks: {held_out}, greedy and avg@{plan.held_out_samples}\n"
          f"- the evolved policy is the run's last; pairs: (env, task, sample), same seeds\n"
          + "".join(f"- {name}: {s:.0f} s\n" for name, s in seconds.items()) + "\n" + table(model_dir))
  with open(os.path.join(model_dir, REPORT_FILE), "w") as f:
    f.write(text)
  png = learning_curve(model_dir)
  if png is not None:
    with open(os.path.join(model_dir, CURVE_FILE), "wb") as f:
      f.write(png)
  return text


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--model_dir", default=None,
                      help="where the run lives (default runs/quickstart, or runs/quickstart_smoke with --smoke)")
  parser.add_argument("--smoke", action="store_true", help="the same stages at the smallest size (CI's smoke)")
  args = parser.parse_args(argv)
  plan = SMOKE_PLAN if args.smoke else PLAN
  model_dir = args.model_dir or ("runs/quickstart_smoke" if args.smoke else "runs/quickstart")
  dirs = stage_dirs(model_dir)
  start_policy = ["--hf_checkpoint", START_CHECKPOINT]
  evolved_policy = ["--model_dir", model_dir]
  times_path = os.path.join(model_dir, TIMES_FILE)
  seconds: dict[str, float] = {}
  if os.path.exists(times_path):
    with open(times_path) as f:
      seconds = json.load(f)
  stages = [
      ("1/4 start", [("practised", start_policy, None), ("held_out", start_policy, None)], "start"),
      ("2/4 evolve", None, None),
      ("3/4 evolved", [("practised", evolved_policy, "start_practised"),
                       ("held_out", evolved_policy, "start_held_out")], "evolved"),
  ]
  for name, evaluations, who in stages:
    t0, ran = time.perf_counter(), False
    if evaluations is None:
      print(f"[quickstart] {name}: GRPO from the start on the practised tasks ({GIN_FILE})", flush=True)
      if evaluated(dirs["evolved_held_out"], "held_out"):
        print("[quickstart]   done before: skipped")
      else:
        run("launch.train", train_args(plan, model_dir, args.smoke))  # resumes from the run's last checkpoint
        ran = True
    else:
      for kind, policy, baseline in evaluations:
        out = dirs[f"{who}_{kind}"]
        print(f"[quickstart] {name}: {kind.replace('_', '-')} tasks -> {out}", flush=True)
        if evaluated(out, kind):
          print("[quickstart]   done before: skipped")
          continue
        run("launch.eval", eval_args(plan, policy, kind, out, dirs[baseline] if baseline else None))
        ran = True
    if ran:
      seconds[name] = time.perf_counter() - t0
      os.makedirs(model_dir, exist_ok=True)
      with open(times_path, "w") as f:
        json.dump(seconds, f, indent=1)
  print("[quickstart] 4/4 report", flush=True)
  text = report(model_dir, plan, seconds)
  print("\n" + text)
  print(f"[quickstart] wrote {os.path.join(model_dir, REPORT_FILE)} and {os.path.join(model_dir, CURVE_FILE)}")


if __name__ == "__main__":
  main()
