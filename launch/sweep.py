"""Sweeps: a grid of gin bindings (and gin files) x seeds, one `launch.train` job per point and seed, run here with
a bound on parallel jobs, resumably, or handed to a scheduler; then one report over every job.

  python -m launch.sweep --gin_file=gin_configs/experience/init_train_update.gin --root runs/sweeps/ratio_mode \\
      --sweep "ExperienceManager.rollout_ratio=[0.0,0.25,0.5,0.75,1.0]" \\
      --sweep "ExperienceManager.train_sample_mode=['alldiscard','allkeep','hybrid']" --seeds 0,1,2
  python -m launch.sweep ... --dry_run | xargs -P 4 -I{} sh -c {}     # one command line per job, for any scheduler
  python -m launch.sweep ... --emit slurm                              # ROOT/sweep.slurm: a Slurm job array
  python -m launch.sweep --root runs/sweeps/ratio_mode --report --baseline "rollout_ratio=0.5,train_sample_mode=hybrid"

The grid. `--sweep "NAME=[v1,v2,...]"` (repeatable) is one axis; the grid is the product of the axes, the first
outermost. Values are gin expressions, written as in a binding (`'hybrid'`, `0.5`, `['maze','sql']`,
`@AdcaAdvantages()`). `--zip "NAME=[...]"` flags form one more axis whose names vary together (equal lengths; the
point is named by the first): e.g. a method file with the starting checkpoint it needs. NAME `gin_file` sweeps gin
files: each point's file goes after every `--gin_file`. Seeds are the outer loop (`--seeds 0,1,2`: every point of
seed 0 first), and each job binds `MODEL_DIR`, `SEED` and `LoopConfig.eval_tasks` (`--eval_tasks`, the held-out
evaluation of the val-selected policy at the run's end, `eval_results.json`) after every other binding.

A job's directory is ROOT/POINT/seed=S, POINT named from its swept values (`rollout_ratio=0.5,train_sample_mode=hybrid`:
a binding by its last name unless two share it, a gin file by its stem, strings without quotes). It holds
`command.sh` (the job's command; it also writes `job_status.json`: state, return code, wall time), `job.json` (its
bindings), `train.log` and what the run writes (metrics.jsonl, operative_config.gin, eval_results.json,
checkpoints/). The sweep's definition is saved as ROOT/sweep.json; the same command run again checks it matches.

Chaining: `{job:NAME=VALUE,...}` in a binding's value is the directory of the job of the same seed at the point
with those values (and the referring job's values on the other axes), e.g.
`--zip "gin_file=[gin_configs/compare/cpu/bc.gin,gin_configs/compare/cpu/grpo.gin]" --zip "INIT_CHECKPOINT=[None,'{job:gin_file=bc}']"`
(GRPO from the BC job of its seed and grid values: that job runs first, and a failed one leaves its dependents
unrun);
`{job:DIR/POINT}` is a job of the sweep rooted at DIR (which must have finished).

Local runs (the default): at most `--jobs` at once. The default is the smaller of the CPU cores and
(80% of the memory available now) / `--job_memory_gb` (a job's peak; 3 GB is what a tiny-default GRPO job peaks at,
measured: `memory/peak_rss_gb`), at least 1. Each job's output goes to its `train.log`; the terminal shows one line
per job (waiting, running at step N, done, failed, interrupted). A job whose status says done is skipped; any other
resumes from its checkpoints. Ctrl-C (or SIGTERM) sends SIGTERM to every running job, which checkpoints the step in
flight and exits 143; the same command then finishes what is missing. A failed job is reported with the last lines
of its log and the others go on; the exit status is the number of failed jobs (0: all done), 130 when interrupted.
At the end `--report` runs. `--archive DIR` copies each finished job's records (no checkpoints) to DIR/POINT/seed=S
with the sweep's definition (and those of jobs found done here, e.g. run by a scheduler), and a job done there is
not run again (unless a job still to run starts from it). `--only GLOB` (repeatable) runs a slice of the grid, e.g.
`--only '*/seed=0'` (one seed of every point first) or `--only 'gin_file=selfq/*'`, with the jobs it starts from; the
definition, its check and the report stay those of the whole sweep.

Cluster runs: `--dry_run` prints exactly one shell command line per job of the grid (done or not) on stdout and
nothing else there (the `launch.train` command, to run in the repository root);
`--emit slurm` writes ROOT/sweep.slurm (a job array, one task per job, each running the job's command.sh; chained
sweeps get one array per stage, submitted with `--dependency=afterok`), `--emit tpu` writes ROOT/tpu_jobs.sh (one
`launch/tpu_pod.sh` command per job; ROOT should then be a gs:// directory the pod's workers share). `--report`
reads whatever those jobs wrote, local or gs://.
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository: jobs run here
VERSION = 1
DEFINITION_FILE = "sweep.json"
JOB_FILE = "job.json"
STATUS_FILE = "job_status.json"
COMMAND_FILE = "command.sh"
LOG_FILE = "train.log"
# What --archive keeps of a finished job: its held-out evaluations, learning curves, config, bindings and status,
# and every val's per-task outcomes (the loop's val/step_N.json).
# The last policy's held-out evaluations (greedy, sampled), where a run keeps them (LoopConfig.eval_last), and the
# policies `--report --policy` reads: the one selected on val, or the last.
LAST_EVAL_FILES = ("eval_results_last.json", "eval_samples_last.json")
REPORT_POLICIES = ("selected", "last")
RECORD_FILES = ("eval_results.json", "eval_samples.json", *LAST_EVAL_FILES, "metrics.jsonl", "operative_config.gin",
                JOB_FILE, STATUS_FILE, COMMAND_FILE)
RECORD_DIRS = ("val",)
DEFAULT_JOB_MEMORY_GB = 3.0
LOG_TAIL_LINES = 20
JOB_REF = re.compile(r"\{job:([^{}]+)\}")
GIN_FILE = "gin_file"


# -- the grid ------------------------------------------------------------------------------------------------------


def split_values(text: str) -> list[str]:
  """The items of a bracketed gin list, each as written: "[0.5, 'a,b', (1, 2)]" -> ["0.5", "'a,b'", "(1, 2)"].

  Commas split only at the top level (outside brackets and quotes). Raises ValueError for text that is not one
  bracketed list, or an empty item."""
  text = text.strip()
  if not (text.startswith("[") and text.endswith("]")):
    raise ValueError(f"values must be a bracketed list such as [1,2], got {text!r}")
  items, depth, quote, current = [], 0, None, []
  for char in text[1:-1]:
    if quote:
      quote = None if char == quote else quote
    elif char in "'\"":
      quote = char
    elif char in "([{":
      depth += 1
    elif char in ")]}":
      depth -= 1
      if depth < 0:
        raise ValueError(f"unbalanced brackets in {text!r}")
    elif char == "," and depth == 0:
      items.append("".join(current).strip())
      current = []
      continue
    current.append(char)
  if quote or depth:
    raise ValueError(f"unclosed {'quote' if quote else 'bracket'} in {text!r}")
  last = "".join(current).strip()
  if last or items:
    items.append(last)
  if not items or any(not item for item in items):
    raise ValueError(f"empty value in {text!r}")
  return items


def parse_axis_spec(spec: str) -> tuple[str, list[str]]:
  """"NAME=[v1,v2]" -> (NAME, [v1, v2]); a gin_file's values are paths (quotes optional, stripped)."""
  name, sep, values = spec.partition("=")
  name = name.strip()
  if not sep or not name or not re.fullmatch(r"[A-Za-z_][\w./]*", name):
    raise ValueError(f"a sweep is NAME=[v1,v2,...] with NAME a gin binding or 'gin_file', got {spec!r}")
  items = split_values(values)
  if name == GIN_FILE:
    items = [item.strip("'\"") for item in items]
  return name, items


@dataclasses.dataclass(frozen=True)
class Axis:
  """One axis of the grid: `names` that vary together (one for --sweep, the --zip names) and its `values`, one
  row per grid value, a value per name."""
  names: tuple[str, ...]
  values: tuple[tuple[str, ...], ...]


def build_axes(sweeps: Sequence[str], zips: Sequence[str]) -> list[Axis]:
  """The grid's axes: one per --sweep (in order), then one of all --zip specs together."""
  axes = [Axis((name,), tuple((v,) for v in values)) for name, values in map(parse_axis_spec, sweeps)]
  for axis in axes:
    values = [row[0] for row in axis.values]
    if len(set(values)) != len(values):
      raise ValueError(f"{axis.names[0]} lists a value twice: {values}")
  if zips:
    parsed = [parse_axis_spec(spec) for spec in zips]
    if len(set(parsed[0][1])) != len(parsed[0][1]):  # the first --zip names the points; the others may repeat
      raise ValueError(f"{parsed[0][0]} (the first --zip, which names the points) lists a value twice: "
                       f"{parsed[0][1]}")
    lengths = {len(values) for _, values in parsed}
    if len(lengths) != 1:
      raise ValueError(f"--zip lists vary together and need equal lengths, got "
                       f"{ {name: len(values) for name, values in parsed} }")
    axes.append(Axis(tuple(name for name, _ in parsed), tuple(zip(*(values for _, values in parsed)))))
  names = [name for axis in axes for name in axis.names]
  if len(set(names)) != len(names):
    raise ValueError(f"a name is swept twice: {names}")
  return axes


def display_names(names: Sequence[str]) -> dict[str, str]:
  """Each swept name's short form for directory names: a binding's last part (`ExperienceManager.rollout_ratio`
  -> `rollout_ratio`) unless two names share it (then the whole name)."""
  short = {name: re.split(r"[./]", name)[-1] for name in names}
  counts = {s: list(short.values()).count(s) for s in short.values()}
  return {name: (short[name] if counts[short[name]] == 1 else name.replace("/", ".")) for name in names}


def display_value(name: str, value: str, gin_files: Sequence[str] = ()) -> str:
  """A value as it appears in a directory name: a gin file by its stem (its path without `.gin` where two files
  share a stem), strings without quotes, anything outside [A-Za-z0-9._+-] as '_'."""
  if name == GIN_FILE:
    stem = os.path.splitext(os.path.basename(value))[0]
    stems = [os.path.splitext(os.path.basename(f))[0] for f in gin_files]
    if stems.count(stem) > 1:
      stem = os.path.splitext(value)[0].replace("gin_configs/", "").replace("/", ".")
    value = stem
  text = re.sub(r"[^A-Za-z0-9._+-]+", "_", value).strip("_")
  return text or "_"


@dataclasses.dataclass(frozen=True)
class Point:
  """One grid point: its name, its swept values ({display name: display value}), its bindings and gin files."""
  name: str
  swept: tuple[tuple[str, str], ...]
  bindings: tuple[str, ...]
  gin_files: tuple[str, ...]


def grid_points(axes: Sequence[Axis]) -> list[Point]:
  """The product of the axes in order (the first outermost), each point named "a=x,b=y" ("base" with no axes).
  Raises ValueError when two points would get one name."""
  short = display_names([name for axis in axes for name in axis.names])
  points = []
  for combo in itertools.product(*[axis.values for axis in axes]):
    swept, bindings, files = [], [], []
    for axis, row in zip(axes, combo):
      shown = [display_value(axis.names[0], row[0], [r[0] for r in axis.values])]
      swept.append((short[axis.names[0]], shown[0]))
      for name, value in zip(axis.names, row):
        if name == GIN_FILE:
          files.append(value)
        else:
          bindings.append(f"{name} = {value}")
    name = ",".join(f"{key}={value}" for key, value in swept) or "base"
    points.append(Point(name, tuple(swept), tuple(bindings), tuple(files)))
  names = [p.name for p in points]
  if len(set(names)) != len(names):
    twice = sorted({n for n in names if names.count(n) > 1})
    raise ValueError(f"two grid points would share a directory name: {twice}; give the values distinct names")
  return points


@dataclasses.dataclass(frozen=True)
class Job:
  """One `launch.train` run: a grid point at a seed, in `directory` (as its commands name it)."""
  name: str            # POINT/seed=S, also its directory under the sweep's root
  point: str
  seed: int
  swept: tuple[tuple[str, str], ...]
  gin_files: tuple[str, ...]
  bindings: tuple[str, ...]
  directory: str
  depends_on: str | None  # the job of this sweep whose directory a binding names ({job:POINT}); it runs first

  def train_command(self, python: str = "python") -> list[str]:
    return [python, "-m", "launch.train", *[f"--gin_file={f}" for f in self.gin_files],
            *[f"--gin_bindings={b}" for b in self.bindings]]


def select_jobs(jobs: Sequence[Job], patterns: Sequence[str]) -> list[Job]:
  """The jobs whose names (POINT/seed=S) match one of the shell-style `patterns` (`fnmatch`: `*/seed=0`,
  `gin_file=selfq/*`), with the jobs they start from, in the sweep's order; all of them when `patterns` is empty.
  Raises ValueError for a pattern that matches no job (a typo would otherwise run nothing and say done)."""
  if not patterns:
    return list(jobs)
  unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(job.name, p) for job in jobs)]
  if unmatched:
    raise ValueError(f"--only {', '.join(map(repr, unmatched))} matches no job of the sweep; its jobs are "
                     f"{', '.join(job.name for job in jobs)}")
  chosen = {job.name for job in jobs if any(fnmatch.fnmatchcase(job.name, p) for p in patterns)}
  chosen |= {job.depends_on for job in jobs if job.name in chosen and job.depends_on}
  return [job for job in jobs if job.name in chosen]


def job_name(point: str, seed: int) -> str:
  return f"{point}/seed={seed}"


def referenced_point(ref: str, point: Point, points: Sequence[Point]) -> Point | None:
  """The point `{job:REF}` names from `point`: REF's "name=value" pairs, the referring point's values elsewhere.
  None when REF is not such a list or no point has those values."""
  pairs = [item.partition("=") for item in ref.split(",")]
  if not all(sep and key and value for key, sep, value in pairs):
    return None
  wanted = dict(point.swept)
  if not set(key for key, _, _ in pairs) <= set(wanted):
    return None
  wanted.update({key: value for key, _, value in pairs})
  return next((p for p in points if dict(p.swept) == wanted), None)


def resolve_refs(binding: str, seed: int, root: str, point: Point,
                 points: Sequence[Point]) -> tuple[str, str | None]:
  """A binding of `point`'s job with each `{job:REF}` replaced by a job directory at `seed`; returns (binding, the
  job of this sweep it names or None). REF is "name=value,..." (a point of this sweep with those values and the
  referring point's values on the other axes) or "DIR/POINT" (a job of another sweep, rooted at DIR)."""
  depends = []

  def directory(match: re.Match) -> str:
    ref = match.group(1).strip()
    source = referenced_point(ref, point, points)
    if source is not None:
      depends.append(job_name(source.name, seed))
      return os.path.join(root, job_name(source.name, seed))
    if "/" in ref:
      return os.path.join(ref, f"seed={seed}")
    raise ValueError(f"{{job:{ref}}} in {point.name} names no point of this sweep (points: {[p.name for p in points]}); "
                     "another sweep's job is {job:ITS_ROOT/POINT}")

  text = JOB_REF.sub(directory, binding)
  if len(set(depends)) > 1:
    raise ValueError(f"a job may start from one other job; {binding!r} names {sorted(set(depends))}")
  return text, (depends[0] if depends else None)


def expand(definition: Mapping[str, Any]) -> list[Job]:
  """Every job of a sweep definition (`make_definition`), seeds outer, grid points inner.

  Raises ValueError for a dependency on a point of the sweep that itself depends on another or on itself."""
  axes = [Axis(tuple(a["names"]), tuple(tuple(v) for v in a["values"])) for a in definition["axes"]]
  points = grid_points(axes)
  root = definition["root"]
  jobs = []
  for seed in definition["seeds"]:
    for point in points:
      bindings, depends = [], None
      for binding in [*definition["gin_bindings"], *point.bindings]:
        text, dep = resolve_refs(binding, seed, root, point, points)
        bindings.append(text)
        depends = depends or dep
      name = job_name(point.name, seed)
      if depends == name:
        raise ValueError(f"job {name} starts from itself")
      directory = os.path.join(root, name)
      bindings += [f"MODEL_DIR = '{directory}'", f"SEED = {seed}"]
      if definition["eval_tasks"] is not None:
        bindings.append(f"LoopConfig.eval_tasks = {definition['eval_tasks']}")
      jobs.append(Job(name, point.name, seed, point.swept, (*definition["gin_files"], *point.gin_files),
                      tuple(bindings), directory, depends))
  by_name = {job.name: job for job in jobs}
  for job in jobs:
    if job.depends_on and by_name[job.depends_on].depends_on:
      raise ValueError(f"{job.name} starts from {job.depends_on}, which starts from another job: chains are one "
                       "link long (run the first link as its own sweep and name it as {job:DIR/POINT})")
  return jobs


def make_definition(args: argparse.Namespace, root: str) -> dict[str, Any]:
  """The sweep's definition (what sweep.json holds, apart from its job list) from the command line."""
  axes = build_axes(args.sweep, args.zip)
  return {"version": VERSION, "root": root, "gin_files": list(args.gin_file), "gin_bindings": list(args.gin_bindings),
          "axes": [{"names": list(a.names), "values": [list(v) for v in a.values]} for a in axes],
          "seeds": parse_seeds(args.seeds), "eval_tasks": args.eval_tasks}


def parse_seeds(text: str) -> list[int]:
  try:
    seeds = [int(s) for s in text.split(",") if s.strip()]
  except ValueError:
    raise ValueError(f"--seeds is a comma-separated list of integers, got {text!r}") from None
  if not seeds or len(set(seeds)) != len(seeds):
    raise ValueError(f"--seeds needs distinct seeds, got {text!r}")
  return seeds


def definition_record(definition: Mapping[str, Any], jobs: Sequence[Job]) -> dict[str, Any]:
  """sweep.json: the definition and every job (name, point, seed, swept values, its command)."""
  return {**definition, "jobs": [{"name": j.name, "point": j.point, "seed": j.seed, "swept": dict(j.swept),
                                  "depends_on": j.depends_on, "command": shlex.join(j.train_command())}
                                 for j in jobs]}


def check_definition(root: str, record: Mapping[str, Any]) -> None:
  """Writes ROOT/sweep.json, or checks that the one there defines the same sweep (SystemExit naming what differs)."""
  path = os.path.join(root, DEFINITION_FILE)
  if os.path.exists(path):
    with open(path) as f:
      saved = json.load(f)
    differ = [key for key in sorted(set(saved) | set(record)) if key != "jobs" and saved.get(key) != record.get(key)]
    if differ:
      lines = [f"  {key}: saved {saved.get(key)!r}, now {record.get(key)!r}" for key in differ]
      raise SystemExit(f"{path} defines another sweep:\n" + "\n".join(lines) +
                       "\nUse another --root, or delete that file to redefine the sweep (its jobs' directories stay).")
    return
  os.makedirs(root, exist_ok=True)
  write_json(path, record)


def write_json(path: str, payload: Any) -> None:
  temporary = f"{path}.tmp{os.getpid()}"
  with open(temporary, "w") as f:
    json.dump(payload, f, indent=2)
    f.write("\n")
  os.replace(temporary, path)


# -- a job's files ------------------------------------------------------------------------------------------------


def command_script(job: Job) -> str:
  """command.sh: runs the job's `launch.train` command in the repository root, its output appended to train.log,
  and records the outcome in job_status.json (what a scheduler's job leaves for `--report`)."""
  train = shlex.join(job.train_command())
  directory = shlex.quote(job.directory)
  return f"""#!/usr/bin/env bash
# Job {job.name} of the sweep in {os.path.dirname(os.path.dirname(job.directory))}: run from anywhere.
cd {shlex.quote(ROOT)}
start=$(date +%s.%N)
rc=0
{train} >> {directory}/{LOG_FILE} 2>&1 || rc=$?
python -m launch.sweep --record_status {directory} --returncode "$rc" --started "$start"
exit "$rc"
"""


def prepare_job(job: Job) -> None:
  """Creates the job's directory with command.sh and job.json."""
  os.makedirs(job.directory, exist_ok=True)
  with open(os.path.join(job.directory, COMMAND_FILE), "w") as f:
    f.write(command_script(job))
  os.chmod(os.path.join(job.directory, COMMAND_FILE), 0o755)
  write_json(os.path.join(job.directory, JOB_FILE), {
      "name": job.name, "point": job.point, "seed": job.seed, "swept": dict(job.swept), "gin_files": job.gin_files,
      "bindings": job.bindings, "depends_on": job.depends_on, "command": shlex.join(job.train_command())})


def log_tail(path: str, lines: int = LOG_TAIL_LINES) -> str:
  try:
    with open(path, "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 64 * 1024))
      return "\n".join(f.read().decode("utf-8", "replace").splitlines()[-lines:])
  except OSError:
    return ""


def record_status(directory: str, returncode: int, wall_s: float, interrupted: bool = False) -> dict[str, Any]:
  """Writes the job's job_status.json: done (return code 0), interrupted (stopped by SIGTERM/SIGINT: 143 or 130,
  or stopped by this sweep) or failed, with its wall time and its log's last lines when it did not finish."""
  state = ("done" if returncode == 0 else
           "interrupted" if interrupted or returncode in (130, 143, -signal.SIGTERM, -signal.SIGINT) else "failed")
  status = {"state": state, "returncode": returncode, "wall_s": round(wall_s, 3), "finished_at": time.time()}
  if state != "done":
    status["log_tail"] = log_tail(os.path.join(directory, LOG_FILE))
  write_json(os.path.join(directory, STATUS_FILE), status)
  return status


def read_status(directory: str) -> dict[str, Any] | None:
  try:
    with open(os.path.join(directory, STATUS_FILE)) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def is_done(directory: str) -> bool:
  """Its status says done; or it has none and wrote its held-out evaluation (a job a scheduler ran from its bare
  `launch.train` line: a run writes eval_results.json at its end), as `--report` counts it."""
  status = read_status(directory)
  if status is None:
    return os.path.exists(os.path.join(directory, "eval_results.json"))
  return status.get("state") == "done"


def current_step(directory: str) -> int | None:
  """The last step the job logged (metrics.jsonl's last complete line), None before its first."""
  try:
    with open(os.path.join(directory, "metrics.jsonl"), "rb") as f:
      f.seek(0, os.SEEK_END)
      f.seek(max(0, f.tell() - 16 * 1024))
      lines = f.read().decode("utf-8", "replace").splitlines()
  except OSError:
    return None
  for line in reversed(lines):
    try:
      return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
      continue
  return None


def archive_job(job: Job, archive_root: str) -> None:
  """Copies the job's RECORD_FILES and the files of its RECORD_DIRS into ARCHIVE/POINT/seed=S, the repository's path
  made relative."""
  destination = os.path.join(archive_root, job.name)
  names = list(RECORD_FILES)
  for folder in RECORD_DIRS:
    if os.path.isdir(os.path.join(job.directory, folder)):
      os.makedirs(os.path.join(destination, folder), exist_ok=True)
      names += sorted(os.path.join(folder, f) for f in os.listdir(os.path.join(job.directory, folder))
                      if os.path.isfile(os.path.join(job.directory, folder, f)))
  os.makedirs(destination, exist_ok=True)
  for name in names:
    source = os.path.join(job.directory, name)
    if os.path.exists(source):
      with open(source, encoding="utf-8", errors="replace") as f:
        text = f.read().replace(ROOT + os.sep, "").replace(ROOT, ".")  # records name no path of this machine
      with open(os.path.join(destination, name), "w", encoding="utf-8") as f:
        f.write(text)


# -- running here ---------------------------------------------------------------------------------------------------


def default_jobs(job_memory_gb: float) -> int:
  """The rule for --jobs: min(CPU cores, floor(0.8 x the memory available now / job_memory_gb)), at least 1."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
  available_gb = None
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          available_gb = int(line.split()[1]) / 2**20
  except OSError:
    pass
  by_memory = cores if available_gb is None else int(0.8 * available_gb // job_memory_gb)
  return max(1, min(cores, by_memory))


class Progress:
  """One line per job: tqdm bars on a terminal, else a line for each change of state."""

  def __init__(self, jobs: Sequence[Job], states: Mapping[str, str]):
    self.tty = sys.stderr.isatty()
    self.bars = {}
    if self.tty:
      from tqdm.auto import tqdm
      width = max(len(j.name) for j in jobs)
      self.bars = {j.name: tqdm(total=None, desc=j.name.ljust(width), position=i, leave=True, unit="step",
                                bar_format="{desc} {postfix}") for i, j in enumerate(jobs)}
    self.shown: dict[str, str] = {}
    for job in jobs:
      self.show(job.name, states[job.name])

  def show(self, name: str, text: str) -> None:
    if self.shown.get(name) == text:
      return
    self.shown[name] = text
    if self.tty:
      self.bars[name].set_postfix_str(text, refresh=True)
    else:
      print(f"[sweep] {name}: {text}", file=sys.stderr, flush=True)

  def close(self) -> None:
    for bar in self.bars.values():
      bar.close()


def done_jobs(jobs: Sequence[Job], archive: str | None = None) -> set[str]:
  """The names of the jobs that need not run: done in their directory (as seen from here) or in the archive, except
  a job done only in the archive that a job still to run starts from (its checkpoint is needed here again)."""
  by_name = {job.name: job for job in jobs}
  archived = {job.name for job in jobs if archive and is_done(os.path.join(archive, job.name))}
  done = {job.name for job in jobs if is_done(job.directory)} | archived
  needed = {job.depends_on for job in jobs if job.depends_on and job.name not in done}
  return done - {name for name in needed if not is_done(by_name[name].directory)}


def run_local(jobs: Sequence[Job], max_jobs: int, archive: str | None = None,
              command: Callable[[Job], list[str]] | None = None, poll_s: float = 1.0) -> dict[str, str]:
  """Runs the jobs not yet done, at most `max_jobs` at once, dependencies first (module docstring).

  Args:
    jobs: the sweep's jobs, their directories as seen from here.
    max_jobs: jobs running at once.
    archive: the archive root (a job done there counts as done; each job that finishes is copied there, and so is
      each job found done here that is not there yet).
    command: a job's command line (default its `launch.train` command with this Python).
    poll_s: seconds between looks at the running jobs.
  Returns:
    Each job's final state: done, failed, interrupted, skipped (a job it starts from failed) or waiting (not
    started: the sweep was interrupted).
  """
  command = command or (lambda job: job.train_command(sys.executable))
  by_name = {job.name: job for job in jobs}
  done = done_jobs(jobs, archive)
  for job in jobs:  # done before this run (by a scheduler, or a job's command.sh) and not archived yet
    if archive and is_done(job.directory) and not is_done(os.path.join(archive, job.name)):
      archive_job(job, archive)
  states = {job.name: ("done" if job.name in done else "waiting") for job in jobs}
  progress = Progress(jobs, states)
  running: dict[str, tuple[subprocess.Popen, float, Any]] = {}
  stopping = []

  def stop(signum, frame):
    del frame
    if not stopping:
      stopping.append(signum)
      for proc, _, _ in running.values():
        proc.send_signal(signal.SIGTERM)

  previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
  try:
    while True:
      for name, (proc, started, log) in list(running.items()):
        if proc.poll() is None:
          step = current_step(by_name[name].directory)
          progress.show(name, "running" + (f", step {step}" if step is not None else ""))
          continue
        log.close()
        del running[name]
        status = record_status(by_name[name].directory, proc.returncode, time.time() - started,
                               interrupted=bool(stopping))
        states[name] = status["state"]
        progress.show(name, f"{status['state']} ({status['wall_s']:.0f} s)")
        if status["state"] == "failed":
          print(f"\n[sweep] {name} failed (exit {proc.returncode}); the end of its log "
                f"({os.path.join(by_name[name].directory, LOG_FILE)}):\n{status['log_tail']}\n", file=sys.stderr)
        if archive and status["state"] in ("done", "failed"):
          archive_job(by_name[name], archive)  # a failed job's status and log tail too: the report says it failed
      if stopping:
        if not running:
          break
        time.sleep(poll_s / 4)
        continue
      for job in jobs:
        if states[job.name] != "waiting" or len(running) >= max_jobs:
          continue
        if job.depends_on and states[job.depends_on] in ("failed", "skipped"):
          states[job.name] = "skipped"
          progress.show(job.name, f"skipped ({job.depends_on} failed)")
          continue
        if job.depends_on and states[job.depends_on] != "done":
          continue
        prepare_job(job)
        log = open(os.path.join(job.directory, LOG_FILE), "a")
        # Its own session: a Ctrl-C reaches the sweep alone, which then stops each job with SIGTERM (a clean stop).
        proc = subprocess.Popen(command(job), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        running[job.name] = (proc, time.time(), log)
        states[job.name] = "running"
        progress.show(job.name, "running")
      if not running:
        break
      time.sleep(poll_s)
  finally:
    for sig, handler in previous.items():
      signal.signal(sig, handler)
    progress.close()
  return states


# -- handing jobs to a scheduler ------------------------------------------------------------------------------------


def stages(jobs: Sequence[Job]) -> list[list[Job]]:
  """The jobs in waves: those that start from no job of this sweep, then those that start from one."""
  first = [job for job in jobs if not job.depends_on]
  second = [job for job in jobs if job.depends_on]
  return [first, second] if second else [first]


def slurm_script(jobs: Sequence[Job], root: str, venv: str, stage: int | None = None) -> str:
  """A Slurm job-array script: task i runs job i's command.sh (its log in ROOT/slurm/)."""
  directories = "\n".join(f"  {shlex.quote(job.directory)}" for job in jobs)
  suffix = "" if stage is None else f"_{stage}"
  return f"""#!/usr/bin/env bash
#SBATCH --job-name=sweep{suffix}
#SBATCH --array=0-{len(jobs) - 1}
#SBATCH --output={root}/slurm/%A_%a.out
#SBATCH --cpus-per-task=2
# {len(jobs)} jobs of the sweep in {root}: sbatch this file (each task runs one job's command.sh).
set -euo pipefail
cd {shlex.quote(ROOT)}
source {shlex.quote(os.path.join(venv, 'bin', 'activate'))}
JOBS=(
{directories}
)
bash "${{JOBS[$SLURM_ARRAY_TASK_ID]}}/{COMMAND_FILE}"
"""


def emit_slurm(jobs: Sequence[Job], root: str, venv: str) -> list[str]:
  """Writes ROOT/sweep.slurm (or one script per stage, and ROOT/submit.sh chaining them); returns the paths."""
  os.makedirs(os.path.join(root, "slurm"), exist_ok=True)
  waves = stages(jobs)
  if len(waves) == 1:
    path = os.path.join(root, "sweep.slurm")
    with open(path, "w") as f:
      f.write(slurm_script(waves[0], root, venv))
    return [path]
  paths = []
  for i, wave in enumerate(waves):
    paths.append(os.path.join(root, f"sweep_stage{i}.slurm"))
    with open(paths[-1], "w") as f:
      f.write(slurm_script(wave, root, venv, stage=i))
  submit = os.path.join(root, "submit.sh")
  with open(submit, "w") as f:
    f.write(f"#!/usr/bin/env bash\n# The sweep's two stages: the second (jobs that start from a first-stage job) "
            f"after the first succeeded.\nset -euo pipefail\nfirst=$(sbatch --parsable {shlex.quote(paths[0])})\n"
            f"sbatch --dependency=afterok:\"${{first%%;*}}\" {shlex.quote(paths[1])}\n")
  return [*paths, submit]


def emit_tpu(jobs: Sequence[Job], root: str) -> str:
  """Writes ROOT/tpu_jobs.sh: one `launch/tpu_pod.sh` command per job, on the slice named by $TPU_NAME in
  $TPU_ZONE, each job's directory as its MODEL_DIR (a gs:// root is shared by the workers)."""
  lines = ["#!/usr/bin/env bash", f"# {len(jobs)} jobs of the sweep in {root}, one after another on one TPU slice.",
           "set -euo pipefail", ': "${TPU_NAME:?set TPU_NAME to the slice}" "${TPU_ZONE:?set TPU_ZONE}"',
           f"cd {shlex.quote(ROOT)}"]
  for wave in stages(jobs):
    for job in wave:
      bindings = [b for b in job.bindings if not b.startswith("MODEL_DIR = ")]
      command = ["bash", "launch/tpu_pod.sh", *[f"--gin_file={f}" for f in job.gin_files],
                 *[f"--gin_bindings={b}" for b in bindings], f"--model_dir={job.directory}"]
      lines.append(shlex.join(command) + ' --name="$TPU_NAME" --zone="$TPU_ZONE" --reuse')
  path = os.path.join(root, "tpu_jobs.sh")
  with open(path, "w") as f:
    f.write("\n".join(lines) + "\n")
  return path


# -- the command line -----------------------------------------------------------------------------------------------


def report(root: str, baseline: str | None = None, baseline_eval: str | None = None,
           policy: str = "selected") -> dict[str, Any]:
  """`sweep_report.report`; its refusals (a baseline that is not a point, or not paired) exit with their message."""
  from launch import sweep_report
  try:
    return sweep_report.report(root, baseline=baseline, baseline_eval=baseline_eval, policy=policy)
  except (ValueError, FileNotFoundError) as error:
    raise SystemExit(f"launch.sweep --report: {error}") from None


def command_root(root: str) -> str:
  """The root as jobs name it: relative to the repository (where they run) when inside it, else absolute."""
  if "://" in root:
    return root
  absolute = os.path.abspath(root)
  return os.path.relpath(absolute, ROOT) if absolute.startswith(ROOT + os.sep) else absolute


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--root", help="the sweep's directory (jobs in ROOT/POINT/seed=S); required")
  parser.add_argument("--gin_file", action="append", default=[], help="repeatable; every job's gin files")
  parser.add_argument("--gin_bindings", action="append", default=[], help="repeatable; every job's bindings")
  parser.add_argument("--sweep", action="append", default=[], help='"NAME=[v1,v2,...]": one axis (repeatable)')
  parser.add_argument("--zip", action="append", default=[], help='"NAME=[...]": names varying together, one axis')
  parser.add_argument("--seeds", default="0", help="comma-separated (default 0)")
  parser.add_argument("--eval_tasks", type=int, default=100,
                      help="held-out eval tasks per env at each job's end (LoopConfig.eval_tasks); -1: the config's")
  parser.add_argument("--jobs", type=int, default=None, help="jobs at once here (default: see the rule above)")
  parser.add_argument("--job_memory_gb", type=float, default=DEFAULT_JOB_MEMORY_GB, help="one job's peak memory")
  parser.add_argument("--only", action="append", default=[], metavar="GLOB",
                      help="repeatable: run only the jobs named so (POINT/seed=S, shell-style: '*/seed=0', "
                           "'gin_file=selfq/*') and those they start from; the sweep's definition stays whole")
  parser.add_argument("--dry_run", action="store_true", help="print one command line per job and run nothing")
  parser.add_argument("--emit", choices=("slurm", "tpu"), help="write a scheduler's script under ROOT, run nothing")
  parser.add_argument("--venv", default=".venv", help="with --emit slurm: the venv the tasks activate")
  parser.add_argument("--report", action="store_true", help="aggregate ROOT's jobs (alone: only that)")
  parser.add_argument("--policy", choices=REPORT_POLICIES, default="selected",
                      help="with --report alone: each job's val-selected policy (results.md) or its last one "
                           "(LoopConfig.eval_last; results_last.md)")
  baselines = parser.add_mutually_exclusive_group()
  baselines.add_argument("--baseline", default=None, help="with --report: the point the others are compared to")
  baselines.add_argument("--baseline_eval", default=None, metavar="DIR",
                         help="with --report, instead of --baseline: one evaluation outside the sweep (launch.eval "
                              "--with_greedy --out DIR) that every seed of every point is compared to")
  parser.add_argument("--archive", default=None, help="copy each finished job's records here (no checkpoints)")
  parser.add_argument("--record_status", default=None, help=argparse.SUPPRESS)  # command.sh's last line
  parser.add_argument("--returncode", type=int, default=0, help=argparse.SUPPRESS)
  parser.add_argument("--started", type=float, default=None, help=argparse.SUPPRESS)
  return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
  args = parse_args(argv)
  if args.record_status:
    record_status(args.record_status, args.returncode, time.time() - (args.started or time.time()))
    return 0
  if not args.root:
    raise SystemExit("launch.sweep: --root is required")
  defining = bool(args.sweep or args.zip or args.gin_file or args.gin_bindings)
  if args.report and not defining:
    report(args.root, args.baseline, args.baseline_eval, args.policy)
    return 0
  if not args.gin_file and not any(spec.partition("=")[0].strip() == GIN_FILE for spec in args.sweep + args.zip):
    raise SystemExit("launch.sweep: a sweep needs a --gin_file or a gin_file axis (the runs it varies)")
  root = command_root(args.root)
  args.eval_tasks = None if args.eval_tasks == -1 else args.eval_tasks
  try:
    definition = make_definition(args, root)
    all_jobs = expand(definition)
    jobs = select_jobs(all_jobs, args.only)
  except ValueError as error:
    raise SystemExit(f"launch.sweep: {error}") from None
  if args.dry_run:
    for job in jobs:
      print(shlex.join(job.train_command()))
    return 0
  local_root = os.path.join(ROOT, root) if "://" not in root and not os.path.isabs(root) else root
  if "://" not in root:
    check_definition(local_root, definition_record(definition, all_jobs))
    for job in all_jobs:
      prepare_job(dataclasses.replace(job, directory=os.path.join(ROOT, job.directory)))
  if args.emit == "slurm":
    print("\n".join(emit_slurm(jobs, root, args.venv)))
    return 0
  if args.emit == "tpu":
    print(emit_tpu(jobs, root))
    return 0
  if "://" in root:
    raise SystemExit("jobs run here need a local --root; an object-store root is for --emit tpu and --report")
  here = [dataclasses.replace(job, directory=os.path.join(ROOT, job.directory)) for job in jobs]
  max_jobs = args.jobs or default_jobs(args.job_memory_gb)
  chosen = f"{len(jobs)} of {len(all_jobs)}" if len(jobs) < len(all_jobs) else f"{len(jobs)}"
  print(f"[sweep] {chosen} jobs in {root}, at most {max_jobs} at once", file=sys.stderr)
  archive = os.path.abspath(args.archive) if args.archive else None
  if archive:
    os.makedirs(archive, exist_ok=True)
    shutil.copyfile(os.path.join(local_root, DEFINITION_FILE), os.path.join(archive, DEFINITION_FILE))
  states = run_local(here, max_jobs, archive)
  counts = {state: list(states.values()).count(state) for state in sorted(set(states.values()))}
  print(f"[sweep] {', '.join(f'{n} {s}' for s, n in counts.items())}", file=sys.stderr)
  if any(state == "done" for state in states.values()):
    for directory in [local_root] + ([archive] if archive else []):
      report(directory, args.baseline, args.baseline_eval)
  interrupted = any(state in ("interrupted", "waiting") for state in states.values())
  return 130 if interrupted else min(counts.get("failed", 0), 125)


if __name__ == "__main__":
  sys.exit(main())
