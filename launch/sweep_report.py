"""A sweep's results in one place: `python -m launch.sweep --root ROOT --report` calls `report` (with `--baseline POINT`
or `--baseline_eval DIR`: the comparisons below).

It reads (and never changes) what the sweep's jobs left, through the path layer (`evolver.paths`: ROOT may be a
local directory, a `gs://` URI, or an archived copy under results/ that holds records only, no checkpoints):

  ROOT/sweep.json               {"version": 1, "gin_files", "gin_bindings", "seeds", "axes", "jobs": [...]}: every
                                job in grid order, each {"name": "POINT/seed=S", "point": POINT, "seed": S,
                                "swept": {short name: value text as in the directory name}, ...}
  ROOT/POINT/seed=S/            a job's directory (its `name`), holding any of:
    job_status.json             {"state": "done" | "failed" | "interrupted", "returncode", "wall_s", "log_tail"}
    eval_results.json           the held-out evaluation (`evolver.train.evaluation.write_eval_results`, with the
                                train loop's `policy_step` and `selected_on`): greedy when num_samples == 1 and
                                temperature == 0, else sampled avg@k (k = num_samples)
    eval_samples.json           the same format: the sampled avg@k evaluation beside the greedy one
    eval_results_last.json,     the run's last policy held out alike (LoopConfig.eval_last), read instead of the
    eval_samples_last.json      two above by `--report --policy last` (results_last.csv, results_last.md)
    metrics.jsonl               one JSON object per line: `step` and metrics (`rollout/success`,
                                `memory/peak_rss_gb`, ...); a step written again (after a resume) takes the later
                                values
  DIR/ (--baseline_eval)        a fixed policy's evaluation outside the sweep (`launch.eval ... --num_samples k
                                --with_greedy --out DIR`): DIR/eval_results.json (greedy) and/or DIR/eval_samples.json
                                (sampled avg@k), or one results file

A job's state is its job_status.json's; without one (a job a scheduler ran from its bare `launch.train` line) it
is "done" where it wrote its evaluation, "incomplete" where it wrote only metrics, else "missing". A job's held-out figures count wherever an evaluation is recorded, except for a job
whose status says failed or interrupted (its evaluation, if any, is left from an earlier attempt).

What it writes (success figures are fractions of episodes in [0, 1]):

  ROOT/results.csv    one row per job, in sweep.json's order (`csv_columns`), after the --baseline_eval row where
                      there is one; empty cells where nothing is recorded
  ROOT/results.md     one row per grid point: each env's and the overall held-out greedy success as mean +- sample
                      std over the seeds with a result, each seed's overall figure, avg@k where recorded and, with a
                      baseline point, the paired bootstrap 95% interval of (point - baseline) overall success,
                      greedy and avg@k (`paired_job_episodes`: seed by seed, or every seed against a baseline point
                      of a single job); the best point is marked where its greedy gain is larger than the seed
                      spread and the interval is above 0. With --baseline_eval DIR instead, that evaluation is the
                      first row ("baseline_eval: DIR", DIR as given, one "seed") and every seed of every point is
                      paired with it by (env, index, sample); a point whose evaluations are not paired with it (split,
                      k, temperature, top_p or seed: `pairing_mismatch`) is refused
  ROOT/plots/success_<env|overall>.png   success against the first swept name, one line per value of the others
  ROOT/plots/curve_rollout_<success|reward>.png   learning curves against the step, one line per job
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from evolver import paths
from launch.sweep import DEFINITION_FILE as SWEEP_FILE
from launch.sweep import LAST_EVAL_FILES, REPORT_POLICIES
from launch.sweep import STATUS_FILE

EVAL_FILE = "eval_results.json"
SAMPLES_FILE = "eval_samples.json"
# Which policy of each job the report reads (`report(policy=...)`): its (greedy, sampled) files and what it writes.
POLICY_FILES = {"selected": (EVAL_FILE, SAMPLES_FILE), "last": LAST_EVAL_FILES}  # the last: LoopConfig.eval_last
REPORT_FILES = {"selected": ("results.csv", "results.md"), "last": ("results_last.csv", "results_last.md")}
METRICS_FILE = "metrics.jsonl"
STATES = ("done", "failed", "interrupted", "incomplete", "missing")
NO_RESULT_STATES = ("failed", "interrupted")   # a recorded evaluation of these is stale: not counted
CURVE_METRICS = ("rollout/success", "rollout/reward")
NUM_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
BEST_MARK = "(*)"
KINDS = ("greedy", "sampled")  # an evaluation's kind (`evaluation_kind`): greedy, or sampled avg@k
# What pairs two evaluations' episodes (`pairing_mismatch`), and its value where a file does not record it.
PAIRING_SETTINGS = ("split", "num_samples", "temperature", "top_p", "seed")
SETTING_DEFAULTS = {"num_samples": 1, "temperature": 0.0, "top_p": 1.0, "seed": 0}
PROTOCOL_SETTINGS = ("max_new_tokens", "max_rounds")  # limits that change an episode, not its pairing
BASELINE_EVAL = "baseline_eval"  # the --baseline_eval row's label: "baseline_eval: DIR"
BOTH_BASELINES = ("--baseline and --baseline_eval are mutually exclusive: compare with a point of the sweep "
                  "(--baseline POINT) or with one evaluation outside it (--baseline_eval DIR), not both")


@dataclasses.dataclass
class JobRecord:
  """What one job left: its sweep.json entry's fields, its state and its (parsed) files; None where absent."""
  name: str
  point: str
  seed: int | None                    # None: a fixed evaluation (--baseline_eval), no training seed
  swept: dict[str, str]
  state: str
  status: dict[str, Any] | None
  greedy: dict[str, Any] | None       # the greedy held-out evaluation
  sampled: dict[str, Any] | None      # the sampled avg@k held-out evaluation
  metrics: dict[int, dict[str, Any]]  # step -> metrics

  @property
  def counted(self) -> bool:
    """Whether its held-out figures count (module docstring)."""
    return self.state not in NO_RESULT_STATES

  def evaluation(self, kind: str) -> dict[str, Any] | None:
    """Its counted evaluation of `kind` ("greedy" | "sampled"); None where it has none or it does not count."""
    return (self.greedy if kind == "greedy" else self.sampled) if self.counted else None


# ---------------------------------------------------------------------------------------------------------- reading


def _read_json(path) -> dict[str, Any] | None:
  """A JSON object from `path`; None where the file is absent or unreadable (a partial copy)."""
  try:
    if not path.exists():
      return None
    data = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  return data if isinstance(data, dict) else None


def load_sweep(root: paths.PathLike) -> dict[str, Any]:
  """ROOT/sweep.json. Raises FileNotFoundError without one, ValueError where it lists no jobs."""
  path = paths.as_path(root) / SWEEP_FILE
  if not path.exists():
    raise FileNotFoundError(f"{path}: no sweep here (launch.sweep writes sweep.json when it starts)")
  spec = json.loads(path.read_text())
  if not spec.get("jobs"):
    raise ValueError(f"{path} lists no jobs")
  return spec


def parse_metrics(text: str) -> dict[int, dict[str, Any]]:
  """metrics.jsonl's text as step -> metrics, steps in increasing order. A step on several lines takes the values of
  the later lines (a resumed run writes its steps again), key by key. Blank lines, a partial last line and lines
  without a step are skipped."""
  by_step: dict[int, dict[str, Any]] = {}
  for line in text.splitlines():
    line = line.strip()
    if not line:
      continue
    try:
      row = json.loads(line)
    except ValueError:
      continue
    if not isinstance(row, dict) or not isinstance(row.get("step"), (int, float)):
      continue
    step = int(row["step"])
    by_step.setdefault(step, {}).update({k: v for k, v in row.items() if k != "step"})
  return dict(sorted(by_step.items()))


def read_metrics(path: paths.PathLike) -> dict[int, dict[str, Any]]:
  """`parse_metrics` of the file at `path` ({} where there is none)."""
  path = paths.as_path(path)
  try:
    return parse_metrics(path.read_text()) if path.exists() else {}
  except OSError:
    return {}


def is_greedy(results: Mapping[str, Any]) -> bool:
  """Whether an evaluation is greedy: one sample per task at temperature 0."""
  return int(results.get("num_samples", 1)) == 1 and float(results.get("temperature", 0.0)) == 0.0


def split_kinds(evals: Sequence[Mapping[str, Any]]) -> tuple[Any, Any]:
  """(greedy, sampled) of an eval_results.json and an eval_samples.json as read (absent ones left out, in that
  order): the first greedy evaluation, and the last sampled one (eval_samples.json, else a sampled
  eval_results.json); None for a kind there is none of."""
  greedy = next((e for e in evals if is_greedy(e)), None)
  sampled = next((e for e in reversed(evals) if not is_greedy(e)), None)
  return greedy, sampled


def job_state(status: Mapping[str, Any] | None, has_metrics: bool, has_eval: bool) -> str:
  """The job's state: job_status.json's; without one (a job a scheduler ran from its bare `launch.train` line)
  "done" where it wrote its held-out evaluation (a run writes it at its end), "incomplete" where it wrote only
  metrics, else "missing" (it has not run)."""
  if status is not None:
    state = str(status.get("state", ""))
    return state if state in STATES else "incomplete"
  return "done" if has_eval else "incomplete" if has_metrics else "missing"


def read_job(root: paths.PathLike, job: Mapping[str, Any], policy: str = "selected") -> JobRecord:
  """One job's record from ROOT/<job name>. Of its evaluations (of `policy`: POLICY_FILES), the greedy one is the
  greedy figures' source and the sampled one (eval_samples.json, else a sampled eval_results.json) the avg@k
  source."""
  job_dir = paths.as_path(root) / job["name"]
  status = _read_json(job_dir / STATUS_FILE)
  evals = [e for e in (_read_json(job_dir / name) for name in POLICY_FILES[policy]) if e is not None]
  greedy, sampled = split_kinds(evals)
  metrics = read_metrics(job_dir / METRICS_FILE)
  state = job_state(status, bool(metrics), bool(evals))
  return JobRecord(name=job["name"], point=job["point"], seed=int(job["seed"]),
                   swept={str(k): str(v) for k, v in job.get("swept", {}).items()}, state=state, status=status,
                   greedy=greedy, sampled=sampled, metrics=metrics)


def read_jobs(root: paths.PathLike, spec: Mapping[str, Any], policy: str = "selected") -> list[JobRecord]:
  """Every job of the sweep, in sweep.json's order."""
  return [read_job(root, job, policy) for job in spec["jobs"]]


def baseline_eval_label(path: str) -> str:
  """The --baseline_eval row's name: "baseline_eval: DIR", DIR as given (a relative path stays relative)."""
  return f"{BASELINE_EVAL}: {path}"


def read_baseline_eval(path: str) -> JobRecord:
  """A fixed policy's evaluation outside the sweep as a job record of one "seed" (seed None, state "done", no
  metrics): `path` is a directory holding eval_results.json and/or eval_samples.json (`split_kinds`), or a results
  file. Its name and point are `baseline_eval_label(path)`.

  Raises:
    FileNotFoundError: no readable evaluation there.
  """
  target = paths.as_path(path)
  files = [target / EVAL_FILE, target / SAMPLES_FILE] if target.is_dir() else [target]
  greedy, sampled = split_kinds([e for e in map(_read_json, files) if e is not None])
  if greedy is None and sampled is None:
    raise FileNotFoundError(f"--baseline_eval {path}: no evaluation there (a directory with {EVAL_FILE} and/or "
                            f"{SAMPLES_FILE}, as `launch.eval --with_greedy --out DIR` writes, or a results file)")
  label = baseline_eval_label(path)
  return JobRecord(name=label, point=label, seed=None, swept={}, state="done", status=None, greedy=greedy,
                   sampled=sampled, metrics={})


def _first_seen(items) -> list:
  seen: dict = {}
  for item in items:
    seen.setdefault(item, None)
  return list(seen)


def swept_names(records: Sequence[JobRecord]) -> list[str]:
  """The swept names (short display names), in the order the jobs first show them."""
  return _first_seen(name for r in records for name in r.swept)


def env_names(records: Sequence[JobRecord]) -> list[str]:
  """The evaluated envs, in the order the evaluations first list them."""
  return _first_seen(env for r in records for e in (r.greedy, r.sampled) if e for env in e.get("envs", {}))


# ------------------------------------------------------------------------------------------------------------- rows


def csv_columns(names: Sequence[str], envs: Sequence[str]) -> list[str]:
  """results.csv's columns: the point, each swept name's value, the seed and state, the greedy held-out success per
  env and overall, the sampled evaluation's k and overall avg@k success, the evaluated policy's step and how it was
  selected, the job's wall time (seconds) and its peak resident memory (GB, the max over metrics rows)."""
  return ["point", *names, "seed", "state", *[f"success_{env}" for env in envs], "success_overall", "k",
          "avg@k_overall", "policy_step", "selected_on", "wall_s", "peak_rss_gb"]


def _number(value) -> float | None:
  return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def job_row(record: JobRecord, names: Sequence[str], envs: Sequence[str]) -> dict[str, Any]:
  """One job's results.csv row (`csv_columns`): None where nothing is recorded, never 0."""
  greedy = record.greedy if record.counted else None
  sampled = record.sampled if record.counted else None
  either = greedy or sampled or {}
  row: dict[str, Any] = {"point": record.point, **{n: record.swept.get(n) for n in names}, "seed": record.seed,
                         "state": record.state}
  for env in envs:
    row[f"success_{env}"] = _number(greedy.get("envs", {}).get(env, {}).get("success")) if greedy else None
  row["success_overall"] = _number(greedy.get("overall", {}).get("success")) if greedy else None
  row["k"] = int(sampled["num_samples"]) if sampled else None
  row["avg@k_overall"] = _number(sampled.get("overall", {}).get("success")) if sampled else None
  row["policy_step"] = either.get("policy_step")
  row["selected_on"] = either.get("selected_on")
  row["wall_s"] = _number((record.status or {}).get("wall_s"))
  rss = [v for m in record.metrics.values() if (v := _number(m.get("memory/peak_rss_gb"))) is not None]
  row["peak_rss_gb"] = max(rss) if rss else None
  return row


def csv_text(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
  """The rows as CSV text with a header; None as an empty cell."""
  out = io.StringIO()
  writer = csv.DictWriter(out, fieldnames=list(columns), lineterminator="\n")
  writer.writeheader()
  for row in rows:
    writer.writerow({c: "" if row.get(c) is None else row[c] for c in columns})
  return out.getvalue()


# ------------------------------------------------------------------------------------------------------- statistics


def mean_std(values: Sequence[float]) -> tuple[float | None, float | None]:
  """The mean and sample standard deviation (ddof=1) of `values`; std None for fewer than 2, both None for none."""
  if not values:
    return None, None
  mean = float(np.mean(values))
  return mean, (float(np.std(values, ddof=1)) if len(values) > 1 else None)


def _resampled_means(diffs: np.ndarray, groups: np.ndarray, num_resamples: int,
                     rng: np.random.Generator) -> np.ndarray:
  """[num_resamples] float64: per resample, the mean difference over the pairs of G groups drawn with replacement
  (`rng.integers(0, G, size=(num_resamples, G))`, drawn in chunks of rows: the same numbers); NaN for a resample of
  group ids without pairs alone. `diffs` [P] float64, `groups` [P] int64 in [0, G), P >= 1."""
  num_groups = int(groups.max()) + 1
  sums = np.bincount(groups, weights=diffs, minlength=num_groups)
  counts = np.bincount(groups, minlength=num_groups).astype(np.float64)
  stats = np.empty(num_resamples)
  chunk = max(1, min(num_resamples, 2_000_000 // num_groups))  # bounded memory for many tasks
  for start in range(0, num_resamples, chunk):
    draws = rng.integers(0, num_groups, size=(min(chunk, num_resamples - start), num_groups))
    total = counts[draws].sum(axis=1)
    # (A group id without pairs adds nothing; a resample of such ids alone has no statistic and is left out.)
    with np.errstate(invalid="ignore", divide="ignore"):
      stats[start:start + len(draws)] = sums[draws].sum(axis=1) / total
  return stats


def _percentile_interval(stats: np.ndarray, level: float) -> tuple[float, float]:
  """The (1 - level) / 2 and (1 + level) / 2 percentiles of the finite `stats`."""
  stats = stats[np.isfinite(stats)]
  tail = (1.0 - level) / 2 * 100
  lo, hi = np.percentile(stats, [tail, 100 - tail])
  return float(lo), float(hi)


def paired_bootstrap(diffs: np.ndarray, groups: np.ndarray, num_resamples: int = NUM_RESAMPLES,
                     seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> tuple[float, float, float] | None:
  """The mean of paired differences `diffs` and its bootstrap percentile interval, resampling the groups (tasks).

  Args:
    diffs: one difference per pair (e.g. point minus baseline success of one episode, in [-1, 1]).
    groups: each pair's group as an integer in [0, G): G groups are drawn with replacement per resample (numpy
      `default_rng(seed).integers(0, G, size=(num_resamples, G))`, drawn in chunks of rows: the same numbers), and
      a resample's statistic is the mean difference over all pairs of the groups drawn.
    num_resamples: resamples.
    seed: the Generator's seed.
    level: the interval's coverage (0.95: the 2.5th and 97.5th percentiles).

  Returns:
    (mean difference over all pairs, lo, hi), or None without pairs.
  """
  diffs = np.asarray(diffs, dtype=np.float64)
  groups = np.asarray(groups, dtype=np.int64)
  if diffs.size == 0:
    return None
  stats = _resampled_means(diffs, groups, num_resamples, np.random.default_rng(seed))
  return (float(diffs.mean()), *_percentile_interval(stats, level))


def env_mean_bootstrap(by_env: Sequence[tuple[np.ndarray, np.ndarray]], num_resamples: int = NUM_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED, level: float = 0.95) -> tuple[float, float, float] | None:
  """The mean over envs of each env's mean paired difference, and its bootstrap percentile interval.

  Each env counts the same, as in an evaluation's `overall` success (the unweighted mean over envs), whatever its
  number of pairs. A resample draws each env's tasks with replacement, independently (the envs in the order given,
  from one `default_rng(seed)`; a single env gives `paired_bootstrap`'s numbers), and its statistic is the mean
  over envs of the mean difference over the pairs of that env's tasks drawn.

  Args:
    by_env: per env, its (diffs [P_e] float, groups [P_e] int in [0, G_e)) as `paired_bootstrap` takes them; an
      env without pairs is left out.
    num_resamples, seed, level: as `paired_bootstrap`'s.

  Returns:
    (mean over envs of the mean difference, lo, hi), or None without pairs.
  """
  present = [(np.asarray(d, dtype=np.float64), np.asarray(g, dtype=np.int64)) for d, g in by_env if np.size(d)]
  if not present:
    return None
  rng = np.random.default_rng(seed)
  stats = np.mean([_resampled_means(d, g, num_resamples, rng) for d, g in present], axis=0)
  return (float(np.mean([d.mean() for d, _ in present])), *_percentile_interval(stats, level))


# ---------------------------------------------------------------------------------------------------------- pairing


def evaluation_kind(results: Mapping[str, Any]) -> str:
  """"greedy" or "sampled" (avg@k): `is_greedy`."""
  return "greedy" if is_greedy(results) else "sampled"


def kind_label(results: Mapping[str, Any]) -> str:
  """"greedy" or "avg@k" with its k, for tables."""
  return "greedy" if is_greedy(results) else f"avg@{int(results.get('num_samples', 1))}"


def evaluation_successes(results: Mapping[str, Any]) -> dict[tuple[str, int, int], float]:
  """(env, index, sample) -> success (0 or 1) of each episode of an evaluation's "episodes" that ran (not
  `failed`)."""
  out = {}
  for e in results.get("episodes") or []:
    if e.get("failed") or e.get("success") is None:
      continue
    out[(str(e["env"]), int(e["index"]), int(e.get("sample", 0)))] = float(e["success"])
  return out


def pairing_mismatch(results: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
  """The settings in which two evaluations differ so that their episodes are not paired, as 'name a vs b': the
  split, num_samples and temperature, and where sampled (temperature > 0) top_p and the seed (the sampling
  randomness; a greedy episode draws nothing, so greedy evaluations pair whatever their seed). [] where paired."""
  names = ["split", "num_samples", "temperature"]
  if float(results.get("temperature", 0.0)) > 0 or float(baseline.get("temperature", 0.0)) > 0:
    names += ["top_p", "seed"]
  setting = lambda r, n: r.get(n, SETTING_DEFAULTS.get(n))
  return [f"{n} {setting(results, n)!r} vs {setting(baseline, n)!r}" for n in names
          if setting(results, n) != setting(baseline, n)]


def protocol_differences(results: Mapping[str, Any], baseline: Mapping[str, Any]) -> list[str]:
  """Limits in which two paired evaluations differ (max_new_tokens, max_rounds), as 'name a vs b': their episodes
  pair, but part of a difference may be the limits'."""
  return [f"{n} {results.get(n)!r} vs {baseline.get(n)!r}" for n in PROTOCOL_SETTINGS
          if results.get(n) != baseline.get(n)]


def paired_differences(this: Mapping[tuple, float], baseline: Mapping[tuple, float],
                       env: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """One env's episodes present in both, in sorted key order: this [P] and baseline [P] success, their difference
  [P] and each pair's task (its index) as an integer in [0, tasks) (tasks in sorted order), for `paired_bootstrap`.

  Args:
    this, baseline: episode key -> success; a key is (env, index, ...), its task (env, index).
    env: the env.
  """
  keys = sorted(k for k in this.keys() & baseline.keys() if k[0] == env)
  task_id = {index: i for i, index in enumerate(sorted({k[1] for k in keys}))}
  a = np.array([this[k] for k in keys], dtype=np.float64)
  b = np.array([baseline[k] for k in keys], dtype=np.float64)
  groups = np.array([task_id[k[1]] for k in keys], dtype=np.int64)
  return a, b, a - b, groups


def paired_summary(this: Mapping[tuple, float], baseline: Mapping[tuple, float]) -> dict[str, Any] | None:
  """This minus baseline success, per env and overall, over the episodes present in both.

  Args:
    this, baseline: episode key -> success (0 or 1); a key is (env, index, ...), its task (env, index): the
      episodes of one key are a pair.

  Returns:
    {"envs": {env: entry}, "overall": entry}, envs in the order `this` first lists them, where an entry is
    {"this", "baseline": mean success over the paired episodes, "diff": this - baseline, "lo", "hi": its paired
    bootstrap 95% interval resampling the tasks (`paired_bootstrap`), "pairs", "tasks"}. "overall" weights envs
    equally, as an evaluation's overall success does: its figures are the mean over envs of each env's, and its
    interval resamples each env's tasks and averages the env means (`env_mean_bootstrap`); its pairs and tasks
    are the sums. None where no key is in both.
  """
  shared = this.keys() & baseline.keys()
  if not shared:
    return None
  envs = _first_seen(k[0] for k in this if k in shared)
  out: dict[str, Any] = {"envs": {}}
  columns = []
  for env in envs:
    a, b, diffs, groups = paired_differences(this, baseline, env)
    mean, lo, hi = paired_bootstrap(diffs, groups)
    out["envs"][env] = {"this": float(a.mean()), "baseline": float(b.mean()), "diff": mean, "lo": lo, "hi": hi,
                        "pairs": int(diffs.size), "tasks": int(groups.max()) + 1}
    columns.append((diffs, groups))
  mean, lo, hi = env_mean_bootstrap(columns)
  entries = out["envs"].values()
  out["overall"] = {"this": float(np.mean([e["this"] for e in entries])),
                    "baseline": float(np.mean([e["baseline"] for e in entries])), "diff": mean, "lo": lo, "hi": hi,
                    "pairs": sum(e["pairs"] for e in entries), "tasks": sum(e["tasks"] for e in entries)}
  return out


def paired_comparison(results: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
  """This evaluation minus `baseline` (the same kind: both greedy, or both sampled at the same k, temperature and
  seed), per env and overall, over the episodes present in both, paired by (env, index, sample) (`paired_summary`:
  the overall difference is the mean over envs, as the overall success is).

  Returns:
    `paired_summary`'s {"envs", "overall"}, plus "kind" ("greedy" or "avg@k"), "settings" (split, num_samples,
    temperature, top_p, seed of `results`), "unpaired" ({"this", "baseline"}: episodes that ran in one only, left
    out) and "protocol" (`protocol_differences`).

  Raises:
    ValueError: the two differ in a setting that pairs their episodes (`pairing_mismatch`), or share no episode.
  """
  mismatch = pairing_mismatch(results, baseline)
  if mismatch:
    raise ValueError(f"the evaluations are not paired: they differ in {', '.join(mismatch)} (evaluate with the "
                     "baseline's --split, --num_samples, --temperature, --top_p and --seed)")
  a, b = evaluation_successes(results), evaluation_successes(baseline)
  summary = paired_summary(a, b)
  if summary is None:
    raise ValueError(f"the evaluations share no episode (this: {len(a)} episodes of "
                     f"{sorted({k[0] for k in a})}, baseline: {len(b)} of {sorted({k[0] for k in b})}; pairs are "
                     "keyed by (env, index, sample), so evaluate the same envs and task indices)")
  settings = {n: results.get(n, SETTING_DEFAULTS.get(n)) for n in PAIRING_SETTINGS}
  return {"kind": kind_label(results), "settings": settings, **summary,
          "unpaired": {"this": len(a.keys() - b.keys()), "baseline": len(b.keys() - a.keys())},
          "protocol": protocol_differences(results, baseline)}


def paired_job_episodes(point: Sequence[JobRecord], baseline: Sequence[JobRecord],
                        kind: str) -> tuple[dict[tuple, float], dict[tuple, float]]:
  """The successes of a point's and of the baseline point's `kind` ("greedy" | "sampled") episodes, keyed (env,
  index, seed, sample) for `paired_summary`, each job paired with one baseline job: the baseline's job of the same
  seed or, where the baseline point has a single job (a shared start evaluated once, compared with several seeds),
  that job, whatever its seed. Counted jobs only; a pair of jobs whose evaluations are not paired
  (`pairing_mismatch`) adds nothing."""
  this, base = {}, {}
  for r in point:
    b = baseline[0] if len(baseline) == 1 else next((b for b in baseline if b.seed == r.seed), None)
    mine, theirs = r.evaluation(kind), b.evaluation(kind) if b is not None else None
    if mine is None or theirs is None or pairing_mismatch(mine, theirs):
      continue
    for source, target in ((mine, this), (theirs, base)):
      for (env, index, sample), success in evaluation_successes(source).items():
        target[(env, index, r.seed, sample)] = success
  return this, base


def baseline_eval_mismatches(records: Sequence[JobRecord], reference: JobRecord) -> list[str]:
  """The counted jobs' evaluations that are not paired with the fixed baseline evaluation (`reference`) of the same
  kind, as 'POINT/seed=S (greedy|avg@k): name a vs b, ...' (`pairing_mismatch`: the job's value vs the baseline's);
  [] where every one pairs. A kind either lacks is not compared."""
  out = []
  for r in records:
    for kind in KINDS:
      mine, theirs = r.evaluation(kind), reference.evaluation(kind)
      if mine is not None and theirs is not None and (mismatch := pairing_mismatch(mine, theirs)):
        out.append(f"{r.name} ({kind_label(mine)}): {', '.join(mismatch)}")
  return out


def check_baseline_eval(records: Sequence[JobRecord], reference: JobRecord) -> None:
  """Refuses a fixed baseline evaluation that some job's evaluation does not pair with (`baseline_eval_mismatches`).

  Raises:
    ValueError: naming each such job, its kind and the settings that differ (the first 5, and how many more).
  """
  mismatches = baseline_eval_mismatches(records, reference)
  if mismatches:
    more = f"; and {len(mismatches) - 5} more" if len(mismatches) > 5 else ""
    raise ValueError(f"{reference.point}: not paired with the sweep's evaluations, which differ from it (the job's "
                     f"value vs the baseline's) in: {'; '.join(mismatches[:5])}{more} (evaluate the baseline with "
                     "the jobs' --split, --num_samples, --temperature, --top_p and --seed)")


def baseline_eval_protocol(records: Sequence[JobRecord], reference: JobRecord) -> list[str]:
  """The limits in which the counted jobs' evaluations differ from the fixed baseline evaluation of the same kind
  (`protocol_differences`: 'name a vs b', the job's vs the baseline's), each difference once: the episodes pair, but
  part of a difference may be the limits'."""
  pairs = [(r.evaluation(kind), reference.evaluation(kind)) for r in records for kind in KINDS]
  return _first_seen(d for mine, theirs in pairs if mine is not None and theirs is not None
                     for d in protocol_differences(mine, theirs))


# ------------------------------------------------------------------------------------------------------------ table


def _no_result_label(states: Sequence[str]) -> str:
  """What a point or seed without a result shows: the most telling state of its jobs."""
  for state in ("failed", "interrupted", "incomplete", "missing"):
    if state in states:
      return state
  return "no eval"  # done, without a held-out evaluation


def overall_difference(summary: Mapping[str, Any] | None) -> dict[str, Any] | None:
  """A point's table figure from `paired_summary`: its overall {"mean" (the difference), "lo", "hi", "pairs",
  "tasks"}; None without one."""
  if summary is None:
    return None
  o = summary["overall"]
  return {"mean": o["diff"], "lo": o["lo"], "hi": o["hi"], "pairs": o["pairs"], "tasks": o["tasks"]}


def summarize_points(records: Sequence[JobRecord], envs: Sequence[str], baseline: str | None = None,
                     reference: JobRecord | None = None) -> list[dict[str, Any]]:
  """Per grid point (in the order sweep.json first lists them): its swept values, seeds and their states, the
  greedy success per seed ("overall" and each env: fraction, None without a result), its mean and std over the
  seeds with a result (`mean_std`), the avg@k mean/std and k, and with a baseline the paired bootstrap of point
  minus baseline overall success, greedy (`diff`) and avg@k (`avg_k_diff`): {"mean", "lo", "hi", "pairs",
  "tasks"} (`paired_job_episodes`, `paired_summary`: the mean over envs, as the overall success), None without
  paired episodes.

  With `reference` (a fixed evaluation outside the sweep, `read_baseline_eval`) instead of `baseline`, it is the
  baseline: the first entry, of one "seed" (None), with "fixed" True, and every seed of every point is paired with
  it."""
  points = _first_seen(r.point for r in records)
  by_point = {p: [r for r in records if r.point == p] for p in points}
  if baseline is not None and reference is not None:
    raise ValueError(BOTH_BASELINES)
  if baseline is not None and baseline not in by_point:
    raise ValueError(f"--baseline {baseline!r} is not a point of this sweep; its points: {', '.join(points)}")
  if reference is not None:
    baseline = reference.point
    points, by_point = [baseline, *points], {baseline: [reference], **by_point}
  out = []
  for p in points:
    jobs = by_point[p]
    per_seed: dict[str, dict[int, float | None]] = {}
    for key in ("overall", *envs):
      per_seed[key] = {}
      for r in jobs:
        source = (r.greedy.get("overall") if key == "overall" else r.greedy.get("envs", {}).get(key)) \
            if (r.counted and r.greedy) else None
        per_seed[key][r.seed] = _number((source or {}).get("success"))
    mean, std, n = {}, {}, {}
    for key, values in per_seed.items():
      present = [v for v in values.values() if v is not None]
      mean[key], std[key] = mean_std(present)
      n[key] = len(present)
    sampled = [r.sampled for r in jobs if r.counted and r.sampled]
    avg_k = None
    if sampled:
      ks = sorted({int(s["num_samples"]) for s in sampled})
      values = [v for s in sampled if (v := _number(s.get("overall", {}).get("success"))) is not None]
      m, s = mean_std(values)
      avg_k = {"k": ks[0] if len(ks) == 1 else ks, "mean": m, "std": s, "n": len(values)}
    diff = avg_k_diff = None
    if baseline is not None and p != baseline:
      diff, avg_k_diff = (overall_difference(paired_summary(*paired_job_episodes(jobs, by_point[baseline], kind)))
                          for kind in KINDS)
    out.append({"point": p, "swept": dict(jobs[0].swept), "seeds": [r.seed for r in jobs],
                "states": {r.seed: r.state for r in jobs}, "per_seed": per_seed, "mean": mean, "std": std, "n": n,
                "avg_k": avg_k, "diff": diff, "avg_k_diff": avg_k_diff, "best": False,
                "fixed": reference is not None and p == baseline})
  return out


def choose_best(points: list[dict[str, Any]], baseline: str | None) -> tuple[str | None, str]:
  """The point to mark and the sentence that says what the mark means (or why nothing is marked).

  The best point is the one with the highest mean overall success; it is marked only where its gain over the
  baseline's mean is larger than the seed spread (the larger of the two points' std over seeds, which needs 2 or
  more seeds with a result in each; against a fixed baseline evaluation, "fixed" in its entry, the point's own)
  and its paired bootstrap 95% interval lies above 0 (lo > 0). Sets "best" on the marked point's entry."""
  scored = [p for p in points if p["mean"]["overall"] is not None]
  if not scored:
    return None, "Nothing is marked: no point has a held-out result."
  best = max(scored, key=lambda p: p["mean"]["overall"])  # the first in grid order among equals
  if baseline is None:
    return None, f"Nothing is marked: no baseline given (the highest mean overall success is {best['point']})."
  base = next(p for p in points if p["point"] == baseline)
  fixed = bool(base.get("fixed"))
  spread_of = ("the point's std over seeds: the baseline is one evaluation" if fixed
               else "the larger std over seeds of the two points")
  meaning = (f"{BEST_MARK} marks the best point (highest mean overall success) where its gain over the baseline "
             f"is larger than the seed spread ({spread_of}) and its paired bootstrap 95% interval lies above 0.")
  why = None
  if best["point"] == baseline:
    why = "the baseline itself has the highest mean overall success"
  elif base["mean"]["overall"] is None:
    why = "the baseline has no held-out result"
  elif best["std"]["overall"] is None or (base["std"]["overall"] is None and not fixed):
    why = (f"{best['point']} is best, but with fewer than 2 seeds " + ("of it" if fixed else "per point")
           + " there is no seed spread to beat")
  else:
    gain = best["mean"]["overall"] - base["mean"]["overall"]
    spread = best["std"]["overall"] if fixed else max(best["std"]["overall"], base["std"]["overall"])
    if gain <= spread:
      why = f"the best point's gain ({_f(gain, True)}) is not larger than the seed spread ({_f(spread)})"
    elif best["diff"] is None:
      why = "the best point has no episodes paired with the baseline's"
    elif best["diff"]["lo"] <= 0:
      why = f"the best point's 95% interval is not above 0 (lo = {_f(best['diff']['lo'], True)})"
  if why:
    return None, f"{meaning} Nothing is marked: {why}."
  best["best"] = True
  return best["point"], meaning


def _f(x: float | None, signed: bool = False) -> str:
  """A fraction as '.610' ('1.000', '-.030'; '+.030' when `signed`); '-' for None."""
  if x is None:
    return "-"
  text = f"{x:+.3f}" if signed else f"{x:.3f}"
  return text.replace("0.", ".", 1) if re.match(r"^[+-]?0\.", text) else text


def _cell(mean: float | None, std: float | None, n: int, seeds: int, empty: str) -> str:
  """'mean +- std', with '(n=…)' where fewer seeds than the point's have a result; one value shows 'v (n=1)'."""
  if mean is None:
    return empty
  if n == 1:
    return f"{_f(mean)} (n=1)"
  return f"{_f(mean)} +- {_f(std)}" + (f" (n={n})" if n < seeds else "")


def _diff_cell(diff: Mapping[str, Any] | None, is_baseline: bool) -> str:
  """'+.550 [+.300, +.800]' (`overall_difference`), 'baseline', or 'no paired episodes'."""
  if is_baseline:
    return "baseline"
  if diff is None:
    return "no paired episodes"
  return f"{_f(diff['mean'], True)} [{_f(diff['lo'], True)}, {_f(diff['hi'], True)}]"


def markdown(root: str, spec: Mapping[str, Any], records: Sequence[JobRecord], points: Sequence[Mapping[str, Any]],
             envs: Sequence[str], baseline: str | None, note: str, protocol: Sequence[str] = (),
             policy: str = "selected") -> str:
  """results.md: a headline (seeds, eval tasks per env, job counts) and the per-point table (`summarize_points`);
  `policy` (POLICY_FILES) names which of each job's policies the figures are of.

  `records` are the sweep's jobs; a fixed baseline evaluation is the entry of `points` with "fixed" (its name is
  `baseline`, its path as given), and `protocol` the limits in which the jobs' evaluations differ from it
  (`baseline_eval_protocol`)."""
  fixed = any(p.get("fixed") for p in points)
  seeds = spec.get("seeds") or _first_seen(r.seed for r in records)
  tasks = {env: _first_seen(int(e["envs"][env]["num_tasks"]) for r in records for e in (r.greedy, r.sampled)
                            if e and r.counted and "num_tasks" in e.get("envs", {}).get(env, {}))
           for env in envs}
  counts = {s: sum(r.state == s for r in records) for s in STATES}
  lines = [f"# Sweep {str(root).rstrip('/').rsplit('/', 1)[-1]}", ""]  # (no machine path in committed records)
  if policy == "last":
    lines[0] += ": the last policy of each job"
    lines.append("- policy: each job's last step, held out beside the policy selected on val (LoopConfig.eval_last); "
                 "reported, never selected on")
  if spec.get("root"):
    lines.append(f"- run in: {spec['root']}")
  lines.append(f"- seeds: {', '.join(str(s) for s in seeds)}")
  lines.append("- eval tasks per env: " + (", ".join(f"{env} {'/'.join(str(t) for t in tasks[env]) or '?'}"
                                                     for env in envs) or "none recorded"))
  shown = [s for s in STATES if counts[s] or s in ("done", "failed", "missing")]
  lines.append("- jobs: " + ", ".join(f"{counts[s]} {s}" for s in shown) + f" ({len(records)} in all)")
  if baseline is not None:
    lines.append(f"- baseline: {baseline}" + (" (one evaluation outside the sweep: every seed of every point is "
                                              "paired with it)" if fixed else ""))
  if protocol:
    lines.append(f"- limits differing from the baseline evaluation (job vs baseline; the episodes pair, but part of "
                 f"a difference may be the limits'): {', '.join(protocol)}")
  if spec.get("gin_files"):
    lines.append(f"- gin files: {' '.join(spec['gin_files'])}")
  if spec.get("gin_bindings"):
    lines.append(f"- gin bindings: {' '.join(spec['gin_bindings'])}")
  lines.append("- success: fraction of held-out episodes solved, greedy; mean +- sample std over the seeds with a "
               "result")
  lines.append("")
  ks = _first_seen(str(p["avg_k"]["k"]) for p in points if p["avg_k"])
  avg_head = f"avg@{ks[0]}" if len(ks) == 1 else "avg@k"
  head = ["point", *envs, "overall", "overall per seed (" + " ".join(f"s{s}" for s in seeds) + ")"]
  if ks:
    head.append(avg_head)
  if baseline is not None:
    head.append("overall - baseline [95% CI]")
    if ks:
      head.append(f"{avg_head} - baseline [95% CI]")
  lines.append("| " + " | ".join(head) + " |")
  lines.append("|" + "|".join("---" for _ in head) + "|")
  for p in points:
    total = len(p["seeds"])
    no_result = _no_result_label(list(p["states"].values()))
    cells = [p["point"] + (f" {BEST_MARK}" if p["best"] else "")]
    for key in (*envs, "overall"):
      cells.append(_cell(p["mean"][key], p["std"][key], p["n"][key], total, no_result))
    per_seed = []
    for s in ([None] if p.get("fixed") else seeds):  # a fixed evaluation: its one figure
      v, state = p["per_seed"]["overall"].get(s), p["states"].get(s, "")
      per_seed.append(_f(v) if v is not None else state if state in NO_RESULT_STATES + ("incomplete", "missing")
                      else "-")
    cells.append(" ".join(per_seed) + (" (one evaluation)" if p.get("fixed") else ""))
    if ks:
      a = p["avg_k"]
      cells.append("-" if a is None or a["mean"] is None else
                   _cell(a["mean"], a["std"], a["n"], total, "-") + ("" if len(ks) == 1 else f" (k={a['k']})"))
    if baseline is not None:
      cells.append(_diff_cell(p["diff"], p["point"] == baseline))
      if ks:
        cells.append("-" if p["avg_k"] is None else _diff_cell(p["avg_k_diff"], p["point"] == baseline))
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  if baseline is not None:
    pairing = ("each seed's episodes paired with the baseline evaluation's by (env, index, sample)" if fixed else
               "paired by (seed, env, index, sample), or, where the baseline has a single job, each seed's episodes "
               "with that job's")
    lines.append(f"The interval: point minus {baseline} success over the episodes present in both (greedy; avg@k: "
                 f"the sampled ones, at the same k, temperature and seed), {pairing}; the mean over envs of "
                 "each env's mean difference (each env counts the same, as in the overall success), and the "
                 f"2.5th-97.5th percentiles of {NUM_RESAMPLES:,} resamples of each env's tasks "
                 f"(numpy default_rng({BOOTSTRAP_SEED})).")
    lines.append("")
  lines.append(note)
  return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------------------ plots


def safe_name(metric: str) -> str:
  """`metric` as a file name: runs of characters other than letters, digits, '_', '.' and '-' become '_'."""
  return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric).strip("_") or "metric"


def _as_numbers(values: Sequence[str]) -> list[float] | None:
  try:
    numbers = [float(v) for v in values]
  except ValueError:
    return None
  return numbers if all(math.isfinite(x) for x in numbers) else None


def _png(fig) -> bytes:
  out = io.BytesIO()
  fig.savefig(out, format="png", dpi=100, bbox_inches="tight")
  return out.getvalue()


def plot_success(points: Sequence[Mapping[str, Any]], names: Sequence[str], key: str,
                 reference: Mapping[str, Any] | None = None) -> bytes | None:
  """PNG of `key`'s ("overall" or an env's) mean success against the first swept name's values (numbers where
  they all parse, else categories, in grid order), one line per combination of the other swept names' values,
  error bars the std over seeds (none with one seed), and `reference`'s (a fixed baseline evaluation's entry) as a
  dashed horizontal line where it has one; None where no point has a result."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  scored = [p for p in points if p["mean"][key] is not None]
  if not scored:
    return None
  x_name = names[0] if names else "point"
  x_text = (lambda p: p["swept"].get(x_name, "")) if names else (lambda p: p["point"])
  x_values = _first_seen(x_text(p) for p in points)
  numbers = _as_numbers(x_values)
  position = dict(zip(x_values, numbers if numbers is not None else range(len(x_values))))
  line_of = lambda p: ",".join(f"{n}={p['swept'].get(n, '')}" for n in names[1:])
  fig, ax = plt.subplots(figsize=(6.4, 4.2))
  for line in _first_seen(line_of(p) for p in points):
    members = sorted((p for p in scored if line_of(p) == line), key=lambda p: position[x_text(p)])
    if not members:
      continue
    xs = [position[x_text(p)] for p in members]
    ys = [p["mean"][key] for p in members]
    errs = [p["std"][key] or 0.0 for p in members]
    ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=4, label=line or None)
  if reference is not None and reference["mean"][key] is not None:
    ax.axhline(reference["mean"][key], color="gray", linestyle="--", label=reference["point"])
  if numbers is None:
    ax.set_xticks(range(len(x_values)), x_values, rotation=30 if len(x_values) > 4 else 0)
  ax.set_xlabel(x_name)
  ax.set_ylabel(f"held-out success ({key})")
  ax.set_title(f"{key} success: mean +- std over seeds")
  ax.grid(alpha=0.3)
  if len(names) > 1 or (reference is not None and reference["mean"][key] is not None):
    ax.legend(fontsize=8)
  data = _png(fig)
  plt.close(fig)
  return data


def plot_curve(records: Sequence[JobRecord], metric: str) -> bytes | None:
  """PNG of `metric` against the training step, one line per job that recorded it (legend: the job name); None
  where none did."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  curves = []
  for r in records:
    points = [(step, v) for step, m in r.metrics.items() if (v := _number(m.get(metric))) is not None]
    if points:
      curves.append((r.name, points))
  if not curves:
    return None
  fig, ax = plt.subplots(figsize=(7.5, 4.2))
  for name, points in curves:
    ax.plot([s for s, _ in points], [v for _, v in points], label=name, linewidth=1.2)
  ax.set_xlabel("step")
  ax.set_ylabel(metric)
  ax.set_title(f"{metric} per job")
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
  data = _png(fig)
  plt.close(fig)
  return data


# ----------------------------------------------------------------------------------------------------------- report


def report(root: paths.PathLike, baseline: str | None = None, baseline_eval: str | None = None,
           policy: str = "selected") -> dict[str, Any]:
  """Reads the sweep under `root` and writes results.csv, results.md and plots/*.png there (module docstring); with
  `policy="last"`, of each job's last policy instead (`LoopConfig.eval_last`'s eval_results_last.json and
  eval_samples_last.json: what the updates ended at, where val kept an earlier policy), into results_last.csv and
  results_last.md (no plots; a job that kept no such evaluation shows none).

  Args:
    root: the sweep's directory (local or a URI).
    baseline: a point's name (as in sweep.json's `point`): the other points' paired bootstrap intervals are against
      it, and the best point can be marked only against it.
    baseline_eval: instead of `baseline`, a fixed policy's evaluation outside the sweep (a directory with
      eval_results.json and/or eval_samples.json, `launch.eval --with_greedy --out DIR`, or a results file): the
      first row of results.csv and results.md, labelled "baseline_eval: DIR" with DIR as given, and the baseline
      every seed of every point is paired with (`read_baseline_eval`, `check_baseline_eval`).

  Returns:
    {"columns": results.csv's columns, "rows": its rows (dicts, None where empty), "envs", "swept": the swept names,
     "points": `summarize_points` (means, stds, per-seed values, intervals), "best": the marked point or None,
     "note": the line under the table, "markdown": results.md's text, "files": the files written}.

  Raises:
    FileNotFoundError: no sweep.json under `root`, or no evaluation at `baseline_eval`.
    ValueError: `baseline` is not a point of the sweep; both `baseline` and `baseline_eval` given; a job's
      evaluation is not paired with `baseline_eval`'s (`check_baseline_eval`).
  """
  if baseline is not None and baseline_eval is not None:
    raise ValueError(BOTH_BASELINES)
  if policy not in REPORT_POLICIES:
    raise ValueError(f"policy must be one of {REPORT_POLICIES}, got {policy!r}")
  root_path = paths.as_path(root)
  spec = load_sweep(root_path)
  records = read_jobs(root_path, spec, policy)
  reference = read_baseline_eval(baseline_eval) if baseline_eval is not None else None
  if reference is not None:
    check_baseline_eval(records, reference)
  extra = [reference] if reference is not None else []
  names = swept_names(records)
  envs = env_names([*records, *extra])
  columns = csv_columns(names, envs)
  rows = [job_row(r, names, envs) for r in (*extra, *records)]
  points = summarize_points(records, envs, baseline, reference)
  compared_to = reference.point if reference is not None else baseline
  best, note = choose_best(points, compared_to)
  protocol = baseline_eval_protocol(records, reference) if reference is not None else []
  text = markdown(str(root), spec, records, points, envs, compared_to, note, protocol=protocol, policy=policy)
  csv_file, md_file = REPORT_FILES[policy]
  files = [paths.write_text(root_path / csv_file, csv_text(rows, columns)), paths.write_text(root_path / md_file, text)]
  if policy == "last":
    return {"columns": columns, "rows": rows, "envs": envs, "swept": names, "points": points, "best": best,
            "note": note, "markdown": text, "files": [str(f) for f in files]}
  plots = root_path / "plots"
  fixed = next((p for p in points if p["fixed"]), None)
  for key in ("overall", *envs):
    data = plot_success([p for p in points if not p["fixed"]], names, key, reference=fixed)
    if data is not None:
      files.append(paths.write_bytes(plots / f"success_{safe_name(key)}.png", data))
  for metric in CURVE_METRICS:
    data = plot_curve(records, metric)
    if data is not None:
      files.append(paths.write_bytes(plots / f"curve_{safe_name(metric)}.png", data))
  return {"columns": columns, "rows": rows, "envs": envs, "swept": names, "points": points, "best": best,
          "note": note, "markdown": text, "files": [str(f) for f in files]}
