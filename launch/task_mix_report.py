"""Why a GRPO run's training-time success moves: each step's rollout success beside the success the start policy
would have on the tasks that step drew (the start's per-env success rates weighted by the step's env mix).

  python -m launch.task_mix_report results/experience_cpu/*/seed=0 --out results/rl_signal/task_mix.md

Each RUN is a run directory with `operative_config.gin` and `metrics.jsonl`, whose tasks came from the uniform draw
(`train_grpo.task_source = None`, no extension replacing them): the draws are recomputed exactly
(`slices.draw_tasks`, as `curriculum.UniformTasks`). When the observed success follows the prediction, the changes of
training-time success are the task mix's, not the updates'. `--rates` are the start's success per env at the
rollouts' temperature (the default: maze and babyai from the overfit probe's start, sampled avg@4 at temperature 1 on
train tasks, results/rl_signal/probe; sql and textcraft the shared BC checkpoint's held-out figures).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import re
from collections.abc import Mapping, Sequence

import numpy as np

from evolver.train.slices import draw_tasks

DEFAULT_RATES = "maze=0.552,babyai=0.146,sql=0.04,textcraft=0.0"


def parse_rates(text: str) -> dict[str, float]:
  """'maze=0.55,sql=0.04' -> {'maze': 0.55, 'sql': 0.04}."""
  rates = {}
  for item in filter(None, text.split(",")):
    name, sep, value = item.partition("=")
    if not sep:
      raise ValueError(f"--rates items are ENV=RATE, got {item!r}")
    rates[name.strip()] = float(value)
  return rates


def _binding(config: str, name: str, default: str | None = None) -> str:
  match = re.search(rf"^{re.escape(name)} = (\[.*?\]|.+?)$", config, re.M | re.S)
  if match:
    return match.group(1)
  if default is None:
    raise ValueError(f"the operative config has no {name}: not a GRPO run")
  return default


def run_draws(config: str) -> tuple[list[str], int, int, int, int]:
  """(envs, seed, tasks_per_step, explore_start, explore_count) of a GRPO run's operative config; refuses runs
  whose tasks did not come from the uniform draw."""
  if _binding(config, "train_grpo.task_source", "None") != "None":
    raise ValueError("the run's tasks came from a task source, not the uniform draw: its draws are the source's")
  if "SyntheticTasks()" in _binding(config, "train_grpo.extensions", "[]"):
    raise ValueError("self-questioning replaces the run's tasks: its draws are not the uniform draw's")
  seed = _binding(config, "train_grpo.seed")
  if seed == "%SEED":
    seed = _binding(config, "SEED")
  return (ast.literal_eval(_binding(config, "train_grpo.envs")), int(seed),
          int(_binding(config, "train_grpo.tasks_per_step")), int(_binding(config, "TaskSlices.explore_start", "80")),
          int(_binding(config, "TaskSlices.explore_count", "320")))


def task_mix(run_dir: str, rates: Mapping[str, float]) -> list[dict]:
  """[{step, mix: {env: tasks}, observed, predicted}] for each logged step with rollouts (step s drew with index
  s - 1, `rl.train_grpo`)."""
  with open(os.path.join(run_dir, "operative_config.gin")) as f:
    envs, seed, per_step, start, count = run_draws(f.read())
  missing = sorted(set(envs) - set(rates))
  if missing:
    raise ValueError(f"--rates has no rate for {missing}")
  rows = []
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if "rollout/success" not in row:
        continue
      tasks = draw_tasks(envs, start, count, per_step, seed, row["step"] - 1)
      mix = {env: sum(t.env == env for t in tasks) for env in envs}
      rows.append({"step": row["step"], "mix": mix, "observed": row["rollout/success"],
                   "predicted": float(np.mean([rates[t.env] for t in tasks]))})
  return rows


def report(runs: Sequence[str], rates: Mapping[str, float]) -> str:
  lines = [f"Start rates per env: {', '.join(f'{k} {v:.3f}' for k, v in rates.items())}.", ""]
  lines += ["| run | steps | observed success by step | predicted from the task mix | correlation | first half "
            "obs / pred | second half obs / pred |", "|---|---|---|---|---|---|---|"]
  for run in runs:
    rows = task_mix(run, rates)
    obs = np.array([r["observed"] for r in rows])
    pred = np.array([r["predicted"] for r in rows])
    half = len(rows) // 2
    corr = float(np.corrcoef(obs, pred)[0, 1]) if len(rows) > 2 and obs.std() and pred.std() else float("nan")
    lines.append(f"| {run} | {len(rows)} | {' '.join(f'{x:.2f}' for x in obs)} | "
                 f"{' '.join(f'{x:.2f}' for x in pred)} | {corr:+.2f} | {obs[:half].mean():.3f} / "
                 f"{pred[:half].mean():.3f} | {obs[half:].mean():.3f} / {pred[half:].mean():.3f} |")
  return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("runs", nargs="+", help="GRPO run directories (operative_config.gin, metrics.jsonl)")
  parser.add_argument("--rates", default=DEFAULT_RATES, help="the start's success per env: ENV=RATE,...")
  parser.add_argument("--out", help="also write the table here")
  args = parser.parse_args(argv)
  command = " ".join(["python -m launch.task_mix_report", *args.runs, "--rates", args.rates])
  text = f"# Training-time success and the task mix\n\n{command}\n\n" + report(args.runs, parse_rates(args.rates))
  if args.out:
    with open(args.out, "w") as f:
      f.write(text)
  print(text)


if __name__ == "__main__":
  main()
