"""launch.sweep: the grid (product, zip, gin files, seeds, names), chaining, the definition check, the commands
for schedulers, and the local runner (resume rule, failure isolation, Ctrl-C) with a fake job command
(tests/launch/fake_train.py); one real 2-job sweep of `launch.train` on the tiny default.

  python -m pytest tests/launch/test_sweep.py -q
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from launch import sweep
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FAKE = os.path.join(ROOT, "tests", "launch", "fake_train.py")
RATIO = "ExperienceManager.rollout_ratio=[0.0,0.25,0.5,0.75,1.0]"
MODE = "ExperienceManager.train_sample_mode=['alldiscard','allkeep','hybrid']"


def definition(root, sweeps=(), zips=(), seeds="0", gin_files=("gin_configs/runs/grpo.gin",), bindings=(),
               eval_tasks=20):
  args = sweep.parse_args(["--root", root, "--seeds", seeds, "--eval_tasks", str(eval_tasks),
                           *[f"--gin_file={f}" for f in gin_files], *[f"--gin_bindings={b}" for b in bindings],
                           *[f"--sweep={s}" for s in sweeps], *[f"--zip={z}" for z in zips]])
  return sweep.make_definition(args, root)


def fake_command(job):
  return [sys.executable, FAKE, *job.train_command()[3:]]


# -- the grid -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, values", [
    ("[0.0, 0.25,1]", ["0.0", "0.25", "1"]),
    ("['a,b', \"c]\", (1, 2), [3, [4]]]", ["'a,b'", "\"c]\"", "(1, 2)", "[3, [4]]"]),
    ("[@AdcaAdvantages(), None]", ["@AdcaAdvantages()", "None"]),
])
def test_values_split_at_top_level_commas_only(text, values):
  assert sweep.split_values(text) == values


@pytest.mark.parametrize("spec, message", [
    ("rollout_ratio", "NAME=\\[v1,v2"), ("x=0.5", "bracketed list"), ("x=[1,,2]", "empty value"),
    ("x=[(1,2]", "unclosed bracket"), ("x=['a]", "unclosed quote"), ("x y=[1]", "NAME"),
])
def test_a_malformed_sweep_is_refused_with_what_is_wrong(spec, message):
  with pytest.raises(ValueError, match=message):
    sweep.parse_axis_spec(spec)


def test_the_grid_is_the_product_of_the_axes_seeds_outer_with_readable_names():
  jobs = sweep.expand(definition("runs/s", [RATIO, MODE], seeds="0,1"))
  assert len(jobs) == 30
  assert [j.name for j in jobs[:4]] == [
      "rollout_ratio=0.0,train_sample_mode=alldiscard/seed=0", "rollout_ratio=0.0,train_sample_mode=allkeep/seed=0",
      "rollout_ratio=0.0,train_sample_mode=hybrid/seed=0", "rollout_ratio=0.25,train_sample_mode=alldiscard/seed=0"]
  assert [j.seed for j in jobs] == [0] * 15 + [1] * 15
  job = jobs[-1]
  assert job.name == "rollout_ratio=1.0,train_sample_mode=hybrid/seed=1" and job.directory == f"runs/s/{job.name}"
  assert job.bindings == ("ExperienceManager.rollout_ratio = 1.0", "ExperienceManager.train_sample_mode = 'hybrid'",
                          f"MODEL_DIR = 'runs/s/{job.name}'", "SEED = 1", "LoopConfig.eval_tasks = 20")
  assert dict(job.swept) == {"rollout_ratio": "1.0", "train_sample_mode": "hybrid"}
  assert job.train_command()[:4] == ["python", "-m", "launch.train", "--gin_file=gin_configs/runs/grpo.gin"]


def test_zipped_names_vary_together_and_gin_files_are_swept_after_the_shared_ones():
  jobs = sweep.expand(definition(
      "r", ["train_grpo.group_size=[4,8]"], seeds="3", gin_files=("gin_configs/experience/init_train_update.gin",),
      zips=["gin_file=[gin_configs/experience/keep.gin,gin_configs/experience/discard.gin]",
            "ExperienceManager.rollout_ratio=[1.0,0.5]"], bindings=["TRAIN_STEPS = 2"]))
  assert [j.point for j in jobs] == ["group_size=4,gin_file=keep", "group_size=4,gin_file=discard",
                                     "group_size=8,gin_file=keep", "group_size=8,gin_file=discard"]
  assert jobs[1].gin_files == ("gin_configs/experience/init_train_update.gin", "gin_configs/experience/discard.gin")
  assert jobs[1].bindings[:3] == ("TRAIN_STEPS = 2", "train_grpo.group_size = 4", "ExperienceManager.rollout_ratio = 0.5")
  with pytest.raises(ValueError, match="equal lengths"):
    definition("r", zips=["a=[1,2]", "b=[1]"])
  # A value twice: refused where it names the points (a --sweep, the first --zip), fine in a later --zip.
  with pytest.raises(ValueError, match="x lists a value twice"):
    definition("r", ["x=[1,1]"])
  with pytest.raises(ValueError, match="the first --zip"):
    definition("r", zips=["a=[1,1]", "b=[1,2]"])
  assert len(sweep.expand(definition("r", zips=["a=[1,2,3]", "b=[None,None,2]"]))) == 3


def test_names_stay_distinct_where_short_forms_would_collide():
  jobs = sweep.expand(definition("r", ["a/X.lr=[1]", "b/X.lr=[2]", "gin_file=[x/keep.gin,y/keep.gin]"]))
  assert [j.point for j in jobs] == ["a.X.lr=1,b.X.lr=2,gin_file=x.keep", "a.X.lr=1,b.X.lr=2,gin_file=y.keep"]
  assert sweep.expand(definition("r"))[0].name == "base/seed=0"  # no axes: one point
  with pytest.raises(ValueError, match="share a directory name"):
    sweep.expand(definition("r", ["x=['a b','a_b']"]))


def test_a_job_starts_from_the_job_of_the_same_seed_that_it_names():
  jobs = sweep.expand(definition(
      "runs/c", seeds="0,1", zips=["gin_file=[gin_configs/compare/bc.gin,gin_configs/runs/grpo.gin]",
                                   "INIT_CHECKPOINT=[None,'{job:gin_file=bc}']"]))
  grpo = [j for j in jobs if j.point == "gin_file=grpo"]
  assert [j.depends_on for j in grpo] == ["gin_file=bc/seed=0", "gin_file=bc/seed=1"]
  assert "INIT_CHECKPOINT = 'runs/c/gin_file=bc/seed=1'" in grpo[1].bindings
  assert all(j.depends_on is None for j in jobs if j.point == "gin_file=bc")
  other = sweep.expand(definition("runs/g", bindings=["INIT_CHECKPOINT = '{job:runs/bc_sweep/base}'"], seeds="2"))
  assert "INIT_CHECKPOINT = 'runs/bc_sweep/base/seed=2'" in other[0].bindings and other[0].depends_on is None
  with pytest.raises(ValueError, match="names no point"):
    sweep.expand(definition("r", ["x=[1,2]"], bindings=["INIT_CHECKPOINT = '{job:x=3}'"]))
  with pytest.raises(ValueError, match="names no point"):
    sweep.expand(definition("r", ["x=[1,2]"], bindings=["INIT_CHECKPOINT = '{job:y=1}'"]))
  # The other axes' values come from the referring point: each lr's grpo starts from the bc of its lr.
  chained = sweep.expand(definition("r", ["lr=[1,2]"], zips=["gin_file=[bc.gin,grpo.gin]",
                                                              "INIT_CHECKPOINT=[None,'{job:gin_file=bc}']"]))
  assert [j.depends_on for j in chained] == [None, "lr=1,gin_file=bc/seed=0", None, "lr=2,gin_file=bc/seed=0"]
  with pytest.raises(ValueError, match="starts from itself"):
    sweep.expand(definition("r", ["x=[1,2]"], bindings=["INIT_CHECKPOINT = '{job:x=1}'"]))


def test_only_selects_a_slice_with_the_jobs_it_starts_from_and_refuses_a_pattern_that_matches_nothing():
  jobs = sweep.expand(definition(
      "runs/c", seeds="0,1", zips=["gin_file=[gin_configs/compare/bc.gin,gin_configs/runs/grpo.gin]",
                                   "INIT_CHECKPOINT=[None,'{job:gin_file=bc}']"]))
  assert sweep.select_jobs(jobs, []) == jobs
  assert [j.name for j in sweep.select_jobs(jobs, ["*/seed=1"])] == ["gin_file=bc/seed=1", "gin_file=grpo/seed=1"]
  # grpo starts from bc: selecting grpo brings the bc of its seed, in the sweep's order.
  assert [j.name for j in sweep.select_jobs(jobs, ["gin_file=grpo/seed=0"])] == [
      "gin_file=bc/seed=0", "gin_file=grpo/seed=0"]
  with pytest.raises(ValueError, match="'gin_file=dpo/\\*' matches no job"):
    sweep.select_jobs(jobs, ["gin_file=grpo/*", "gin_file=dpo/*"])


# -- the command line and schedulers ------------------------------------------------------------------------------


def test_dry_run_prints_exactly_one_train_command_per_job(tmp_path, capsys):
  assert sweep.main(["--root", str(tmp_path / "s"), "--gin_file=gin_configs/experience/init_train_update.gin",
                     "--sweep", RATIO, "--sweep", MODE, "--seeds", "0,1", "--dry_run"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 30 and all(line.startswith("python -m launch.train --gin_file=") for line in lines)
  assert not (tmp_path / "s").exists()  # nothing written
  assert sweep.main(["--root", str(tmp_path / "s"), "--gin_file=gin_configs/experience/init_train_update.gin",
                     "--sweep", RATIO, "--sweep", MODE, "--seeds", "0,1", "--only", "rollout_ratio=0.5,*/seed=1",
                     "--dry_run"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 3 and all("rollout_ratio=0.5," in line and "SEED = 1" in line for line in lines)


def test_emit_slurm_writes_a_job_array_of_the_grid(tmp_path, capsys):
  root = tmp_path / "s"
  assert sweep.main(["--root", str(root), "--gin_file=gin_configs/experience/init_train_update.gin",
                     "--sweep", RATIO, "--sweep", MODE, "--seeds", "0,1", "--emit", "slurm"]) == 0
  script = (root / "sweep.slurm").read_text()
  assert "#SBATCH --array=0-29" in script
  subprocess.run(["bash", "-n", str(root / "sweep.slurm")], check=True)
  directories = script.split("JOBS=(\n")[1].split("\n)")[0].splitlines()
  assert len(directories) == 30
  job = root / "rollout_ratio=0.5,train_sample_mode=hybrid" / "seed=1"
  assert (job / "command.sh").exists() and json.loads((job / "job.json").read_text())["seed"] == 1
  subprocess.run(["bash", "-n", str(job / "command.sh")], check=True)
  assert json.loads((root / "sweep.json").read_text())["seeds"] == [0, 1]
  capsys.readouterr()


def test_emit_slurm_chains_the_stages_and_tpu_names_each_job_dir(tmp_path):
  root = tmp_path / "c"
  common = ["--root", str(root), "--gin_file=gin_configs/base.gin", "--zip",
            "gin_file=[gin_configs/compare/bc.gin,gin_configs/runs/grpo.gin]", "--zip",
            "INIT_CHECKPOINT=[None,'{job:gin_file=bc}']", "--seeds", "0,1"]
  sweep.main([*common, "--emit", "slurm"])
  assert "#SBATCH --array=0-1" in (root / "sweep_stage0.slurm").read_text()
  assert "gin_file=grpo/seed=0" in (root / "sweep_stage1.slurm").read_text()
  assert "--dependency=afterok" in (root / "submit.sh").read_text()
  for name in ("sweep_stage0.slurm", "sweep_stage1.slurm", "submit.sh"):
    subprocess.run(["bash", "-n", str(root / name)], check=True)
  sweep.main([*common, "--emit", "tpu"])
  lines = [line for line in (root / "tpu_jobs.sh").read_text().splitlines() if "tpu_pod.sh" in line]
  assert len(lines) == 4 and "gin_file=bc/seed=0" in lines[0] and "gin_file=grpo/seed=1" in lines[3]
  subprocess.run(["bash", "-n", str(root / "tpu_jobs.sh")], check=True)


def test_the_same_root_refuses_another_sweep(tmp_path):
  args = ["--root", str(tmp_path / "s"), "--gin_file=gin_configs/runs/grpo.gin", "--sweep", "x=[1,2]", "--emit",
          "slurm"]
  sweep.main(args)
  sweep.main(args)  # the same definition: fine
  with pytest.raises(SystemExit, match="defines another sweep:\n  axes"):
    sweep.main([*args[:3], "--sweep", "x=[1,3]", "--emit", "slurm"])


# -- running here -------------------------------------------------------------------------------------------------


def local_jobs(tmp_path, sweeps, bindings=(), seeds="0", zips=()):
  jobs = sweep.expand(definition(str(tmp_path / "s"), sweeps, zips=zips, seeds=seeds, bindings=bindings))
  return jobs


def starts(job):
  path = os.path.join(job.directory, "starts.txt")
  return len(open(path).read().splitlines()) if os.path.exists(path) else 0


def test_a_failed_job_is_reported_and_the_others_finish(tmp_path, capsys):
  jobs = local_jobs(tmp_path, ["FAIL=[False,True]", "STEPS=[2,3]"],
                    zips=["gin_file=[gin_configs/compare/bc.gin,gin_configs/runs/grpo.gin]",
                          "INIT_CHECKPOINT=[None,'{job:gin_file=bc}']"])
  states = sweep.run_local(jobs, max_jobs=2, command=fake_command, poll_s=0.05)
  failed = {j.name for j in jobs if j.point.startswith("FAIL=True") and j.point.endswith("bc")}
  assert {n for n, s in states.items() if s == "failed"} == failed
  # A grpo job whose bc job (same FAIL and STEPS) failed is not run; the rest finish.
  assert {n for n, s in states.items() if s == "skipped"} == {n.replace("bc/", "grpo/") for n in failed}
  assert sum(s == "done" for s in states.values()) == 4
  status = sweep.read_status(os.path.join(str(tmp_path / "s"), "FAIL=True,STEPS=3,gin_file=bc/seed=0"))
  assert status["state"] == "failed" and status["returncode"] == 1 and "a bad binding" in status["log_tail"]
  assert "FAIL=True,STEPS=3,gin_file=bc/seed=0 failed (exit 1)" in capsys.readouterr().err


def test_done_jobs_are_skipped_and_the_others_resume(tmp_path):
  jobs = local_jobs(tmp_path, ["STEPS=[2,4]"])
  assert set(sweep.run_local(jobs, max_jobs=1, command=fake_command, poll_s=0.05).values()) == {"done"}
  assert [starts(j) for j in jobs] == [1, 1]
  for name in (sweep.STATUS_FILE, "eval_results.json"):  # as if it had been killed before its end
    os.remove(os.path.join(jobs[1].directory, name))
  assert set(sweep.run_local(jobs, max_jobs=1, command=fake_command, poll_s=0.05).values()) == {"done"}
  assert [starts(j) for j in jobs] == [1, 2]  # the done one skipped, the other run again (and resumed)
  rows = [json.loads(line) for line in open(os.path.join(jobs[1].directory, "metrics.jsonl"))]
  assert [r["step"] for r in rows] == [1, 2, 3, 4]
  # Jobs done before a run with an archive (e.g. by a scheduler running their command.sh) are archived by it.
  archive = tmp_path / "archive"
  assert set(sweep.run_local(jobs, max_jobs=1, command=fake_command, poll_s=0.05, archive=str(archive)).values()) == {
      "done"}
  assert [starts(j) for j in jobs] == [1, 2]  # nothing ran again
  assert all(sweep.is_done(str(archive / j.name)) for j in jobs)


DRIVER = """
import sys
sys.path.insert(0, {root!r})
from launch import sweep
from tests.launch.test_sweep import fake_command
jobs = sweep.expand(sweep.make_definition(sweep.parse_args({args!r}), {sroot!r}))
states = sweep.run_local(jobs, max_jobs=2, command=fake_command, poll_s=0.05)
print(sorted(states.items()))
"""


def test_ctrl_c_stops_every_job_cleanly_and_a_second_run_finishes_only_what_is_missing(tmp_path):
  sroot = str(tmp_path / "s")
  args = ["--root", sroot, "--gin_file=x.gin", "--sweep", "STEPS=[40,41,42]", "--gin_bindings", "STEP_S = 0.05"]
  script = DRIVER.format(root=ROOT, args=args, sroot=sroot)
  proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
  jobs = sweep.expand(sweep.make_definition(sweep.parse_args(args), sroot))
  deadline = time.time() + 60
  while time.time() < deadline and sum(sweep.current_step(j.directory) or 0 for j in jobs[:2]) < 4:
    time.sleep(0.05)
  proc.send_signal(signal.SIGINT)
  out, err = proc.communicate(timeout=60)
  assert proc.returncode == 0, err
  assert "('STEPS=40/seed=0', 'interrupted')" in out and "('STEPS=42/seed=0', 'waiting')" in out
  for job in jobs[:2]:
    status = sweep.read_status(job.directory)
    assert status["state"] == "interrupted" and status["returncode"] == 143  # the job's own clean stop
    assert "preempted (SIGTERM)" in open(os.path.join(job.directory, sweep.LOG_FILE)).read()
  assert starts(jobs[2]) == 0
  steps_before = [sweep.current_step(j.directory) for j in jobs[:2]]
  assert all(0 < s < 40 for s in steps_before)
  second = subprocess.run([sys.executable, "-c", script.replace("STEP_S = 0.05", "STEP_S = 0.0")], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
  assert second.returncode == 0, second.stderr
  assert [starts(j) for j in jobs] == [2, 2, 1]  # the interrupted two resumed, the third ran once
  for job in jobs:
    steps = [json.loads(line)["step"] for line in open(os.path.join(job.directory, "metrics.jsonl"))]
    assert steps == list(range(1, len(steps) + 1)) and sweep.is_done(job.directory)


def test_the_archive_keeps_records_and_val_outcomes_not_checkpoints(tmp_path):
  run = tmp_path / "runs" / "lr=1" / "seed=0"
  (run / "val").mkdir(parents=True)
  (run / "checkpoints" / "4").mkdir(parents=True)
  (run / "checkpoints" / "4" / "state").write_text("weights")
  (run / "metrics.jsonl").write_text('{"step": 1}\n')
  (run / "operative_config.gin").write_text(f"MODEL_DIR = '{os.path.join(sweep.ROOT, 'runs', 'x')}'\n")
  for step in (0, 4):
    (run / "val" / f"step_{step}.json").write_text(json.dumps({"step": step, "episodes": [{"index": 400}]}))
  job = sweep.Job("lr=1/seed=0", "lr=1", 0, (), (), (), str(run), None)
  sweep.archive_job(job, str(tmp_path / "archive"))
  kept = tmp_path / "archive" / "lr=1" / "seed=0"
  assert sorted(str(p.relative_to(kept)) for p in kept.rglob("*") if p.is_file()) == [
      "metrics.jsonl", "operative_config.gin", "val/step_0.json", "val/step_4.json"]
  assert json.loads((kept / "val" / "step_4.json").read_text())["episodes"] == [{"index": 400}]
  assert (kept / "operative_config.gin").read_text() == "MODEL_DIR = 'runs/x'\n"  # no path of this machine


def test_the_default_job_count_follows_cores_and_memory():
  cores = len(os.sched_getaffinity(0))
  assert sweep.default_jobs(0.001) == cores
  assert sweep.default_jobs(1e9) == 1  # a job bigger than the machine: still one at a time


# -- the ready-made sweeps ------------------------------------------------------------------------------------------

SWEEPS = {"ratio_mode.sh": 5 * 3 * 3, "mechanisms.sh": 7 * 3}
# In a fresh process (gin's state is global): parse each job's gin files and bindings as launch.train would.
PARSE_JOBS = """
import json, sys
import gin
from evolver.train import gin_config
for line in sys.stdin:
  job = json.loads(line)
  gin.clear_config()
  gin_config.parse(job["gin_files"], job["bindings"])
  assert gin.query_parameter("run.loop") is not None, job
print("parsed")
"""


@pytest.mark.parametrize("script, jobs", sorted(SWEEPS.items()))
def test_each_ready_made_sweep_has_its_grid_and_every_job_parses(tmp_path, script, jobs):
  proc = subprocess.run(["bash", f"gin_configs/sweeps/{script}", "--root", str(tmp_path / "s"), "--emit", "slurm"],
                        cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, PYTHON=sys.executable))
  assert proc.returncode == 0, proc.stderr
  record = json.loads((tmp_path / "s" / "sweep.json").read_text())
  assert len(record["jobs"]) == jobs
  points = {job["point"]: json.loads((tmp_path / "s" / job["name"] / "job.json").read_text())
            for job in record["jobs"]}  # one job of each point
  lines = "".join(json.dumps({"gin_files": j["gin_files"], "bindings": j["bindings"]}) + "\n"
                  for j in points.values())
  parsed = subprocess.run([sys.executable, "-c", PARSE_JOBS], cwd=ROOT, input=lines, capture_output=True, text=True,
                          env=one_device_env())
  assert parsed.returncode == 0 and parsed.stdout.strip() == "parsed", parsed.stderr[-3000:]


@pytest.mark.slow
def test_a_real_two_job_sweep_on_the_tiny_default(tmp_path):
  root = tmp_path / "bc_sweep"
  small = ["ModelConfig.hidden_size = 64", "ModelConfig.num_layers = 2", "ModelConfig.intermediate_size = 128",
           "TRAIN_STEPS = 2", "train_bc.envs = ['maze']", "TaskSlices.expert_count = 4", "train_bc.batch_size = 2",
           "train_bc.buckets = (1024,)", "TaskSlices.val_count = 2", "train_bc.curriculum_steps = 0",
           "LoopConfig.eval_max_new_tokens = 8", "LoopConfig.eval_max_rounds = 2"]
  command = [sys.executable, "-m", "launch.sweep", "--root", str(root), "--gin_file=gin_configs/runs/bc.gin",
             *[f"--gin_bindings={b}" for b in small], "--sweep", "make_optimizer.learning_rate=[1e-4,3e-4]",
             "--eval_tasks", "2", "--jobs", "2"]
  proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=one_device_env(), timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "2 done" in proc.stderr
  for point in ("learning_rate=1e-4", "learning_rate=3e-4"):
    job = root / point / "seed=0"
    assert sweep.read_status(str(job))["state"] == "done"
    results = json.loads((job / "eval_results.json").read_text())
    assert results["split"] == "eval" and results["envs"]["maze"]["num_tasks"] == 2
    assert "make_optimizer.learning_rate = " in (job / "operative_config.gin").read_text()
  table = (root / "results.md").read_text()
  assert "| learning_rate=1e-4 |" in table and "| learning_rate=3e-4 |" in table and "2 done" in table
  assert (root / "results.csv").read_text().count("\n") == 3
  rerun = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, env=one_device_env(), timeout=300)
  assert rerun.returncode == 0 and "2 done" in rerun.stderr  # nothing left to run
  assert "running" not in rerun.stderr
