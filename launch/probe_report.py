"""The overfit probe's table: each job's val (the trained tasks, sampled avg@k at fixed seeds) against the start's,
paired by (env, index, sample) with a bootstrap 95% interval over tasks (`sweep_report.paired_comparison`), beside
the KL to the start, ||dθ||/||θ|| of the step and the episodes spent up to it (DAPO's refills count); then where
each job's gain comes from: its trained tasks grouped by how many samples the start solved (`by_start_passes`).

  python -m launch.probe_report results/rl_signal/probe     # writes results/rl_signal/probe/probe.md

ROOT holds `start/step_0.json` (the start's val episodes) and the sweep's jobs `POINT/seed=S/` with `val/step_N.json`
and `metrics.jsonl`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os

from launch import sweep_report


def val_results(path: str) -> dict:
  """A val record (`MODEL_DIR/val/step_N.json`) as an evaluation `paired_comparison` reads."""
  with open(path) as f:
    record = json.load(f)
  return dict(record, split="train", top_p=1.0)


def table(root: str) -> str:
  start = val_results(os.path.join(root, "start", "step_0.json"))
  lines = ["| job | step | episodes | maze | babyai | overall | overall - start [95% CI] | kl_ref | ||dθ||/||θ|| |",
           "|---|---|---|---|---|---|---|---|---|"]
  base = sweep_report.paired_comparison(start, start)
  lines.append(f"| start | 0 | 0 | {base['envs']['maze']['baseline']:.3f} | {base['envs']['babyai']['baseline']:.3f} | "
               f"{base['overall']['baseline']:.3f} | | | |")
  for job in sorted(glob.glob(os.path.join(root, "*", "seed=*"))):
    rows = {}
    with open(os.path.join(job, "metrics.jsonl")) as f:
      for line in f:
        row = json.loads(line)
        rows.setdefault(row["step"], {}).update(row)
    for path in sorted(glob.glob(os.path.join(job, "val", "step_*.json")),
                       key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0])):
      step = int(path.rsplit("_", 1)[1].split(".")[0])
      c = sweep_report.paired_comparison(val_results(path), start)
      o, m = c["overall"], rows.get(step, {})
      episodes = sum(r.get("rollout/episodes", 0) for s, r in rows.items() if 0 < s <= step)
      lines.append(f"| {os.path.relpath(job, root)} | {step} | {episodes} | {c['envs']['maze']['this']:.3f} | "
                   f"{c['envs']['babyai']['this']:.3f} | {o['this']:.3f} | {o['diff']:+.3f} [{o['lo']:+.3f}, "
                   f"{o['hi']:+.3f}] | {m.get('kl_ref', float('nan')):.3f} | "
                   f"{m.get('update/param_change', float('nan')):.4f} |")
  return "\n".join(lines) + "\n"


def task_passes(record: dict) -> dict[tuple[str, int], int]:
  """A val record's successes per task: (env, index) -> how many of its samples succeeded."""
  passes: dict[tuple[str, int], int] = {}
  for episode in record["episodes"]:
    key = (episode["env"], int(episode["index"]))
    passes[key] = passes.get(key, 0) + int(bool(episode["success"]))
  return passes


def by_start_passes(root: str) -> str:
  """Where each job's last val gain comes from: per env, the tasks grouped by how many of their k samples the start
  solved (0..k), each group's task count and its success (avg@k) at the start and at the job's last val. A task the
  start never solves gives GRPO no signal (all its group's rewards are equal) unless a sample happens to succeed."""
  with open(os.path.join(root, "start", "step_0.json")) as f:
    start_record = json.load(f)
  k = int(start_record["num_samples"])
  start = task_passes(start_record)
  envs = sorted({env for env, _ in start}, key=lambda e: (e != "maze", e))
  lines = [f"Success by the start's passes (of {k} samples per task), start -> the job's last val:", "",
           "| job | step | " + " | ".join(f"{env}: {n}/{k}" for env in envs for n in range(k + 1)) + " |",
           "|---|---|" + "---|" * (len(envs) * (k + 1))]
  for job in sorted(glob.glob(os.path.join(root, "*", "seed=*"))):
    records = sorted(glob.glob(os.path.join(job, "val", "step_*.json")),
                     key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
    if not records:
      continue
    with open(records[-1]) as f:
      last_record = json.load(f)
    last = task_passes(last_record)
    cells = []
    for env in envs:
      for n in range(k + 1):
        tasks = [key for key, passes in start.items() if key[0] == env and passes == n]
        now = sum(last.get(key, 0) for key in tasks) / (k * len(tasks)) if tasks else None
        cells.append(f"{len(tasks)} tasks: {n / k:.2f} -> {now:.2f}" if tasks else "-")
    lines.append(f"| {os.path.relpath(job, root)} | {last_record['step']} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def headroom(root: str) -> str:
  """What GRPO can reach on the probe's tasks from the signal the start gives it: per env, the success if every task
  the start solved at least once (of its k samples) were always solved and the rest stayed unsolved (a group whose
  rewards are all equal has zero advantage: only a lucky success makes such a task trainable)."""
  with open(os.path.join(root, "start", "step_0.json")) as f:
    start_record = json.load(f)
  k = int(start_record["num_samples"])
  start = task_passes(start_record)
  envs = sorted({env for env, _ in start}, key=lambda e: (e != "maze", e))
  now, reach = {}, {}
  for env in envs:
    passes = [n for (e, _), n in start.items() if e == env]
    now[env] = sum(passes) / (k * len(passes))
    reach[env] = sum(n > 0 for n in passes) / len(passes)
  overall_now, overall_reach = (sum(d.values()) / len(d) for d in (now, reach))
  per_env = ", ".join(f"{env} {now[env]:.3f} -> {reach[env]:.3f}" for env in envs)
  return (f"Headroom from the start's signal: every task the start solved at least once (of {k}) always solved, the "
          f"others never: {per_env}; overall {overall_now:.3f} -> {overall_reach:.3f} "
          f"({overall_reach - overall_now:+.3f}). A gain beyond it needs tasks the start never solved in {k} samples.\n")


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("root", help="the probe's records: start/step_0.json and POINT/seed=S/ jobs")
  root = parser.parse_args(argv).root
  text = table(root) + "\n" + by_start_passes(root) + "\n" + headroom(root)
  with open(os.path.join(root, "probe.md"), "w") as f:
    f.write(text)
  print(text)


if __name__ == "__main__":
  main()
