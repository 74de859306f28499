"""The comparisons `launch.compare` ran, as ready-made sweeps (gin_configs/sweeps/NAME_cpu.sh for compare, experience,
selfq, credit): each script's dry run has the jobs and bindings of the runs launch.compare made, each method's one
gin file (gin_configs/compare/cpu/METHOD.gin) sets what the method's files and the CPU recipe did, and each archive
under results/ is in the sweep's layout, counts as done for the script's --archive, and reproduces its measured
table. No training.

  python -m pytest tests/launch/test_compare_sweeps.py -q
"""

import json
import os
import shlex
import subprocess
import sys

import pytest

from launch import sweep, sweep_report
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENVS3 = ["maze", "babyai", "sql"]
ENVS4 = ["maze", "babyai", "sql", "textcraft"]
# Each comparison: its methods (points gin_file=METHOD, in order), envs and the seeds of its archived records.
COMPARISONS = {
    "compare_cpu": (["bc", "bc_x5", "grpo", "agentevol"], ENVS3, [0, 1, 2]),
    "experience_cpu": (["exp_woexp", "exp_discard", "exp_keep", "exp_hybrid"], ENVS4, [0]),
    "selfq_cpu": (["selfq_scarce", "selfq_mix", "selfq_full"], ENVS4, [0]),
    "credit_cpu": (["credit_adca_oracle", "credit_anchor", "credit_adca_env"], ENVS4, [0]),
}

# What `launch.compare --recipe cpu` ran for each method (its last version is in git history): the method's gin files,
# then the CPU recipe's settings, then `{loop}.envs`; GRPO also bound INIT_CHECKPOINT to the BC run of its seed.
_EXP = "gin_configs/experience/"
_BC_CPU = ("TRAIN_STEPS = 400", "train_bc.curriculum_steps = 100", "LoopConfig.eval_every = 200")
_RL_CPU = ("LoopConfig.eval_every = 4", "make_optimizer.learning_rate = 1e-4", "train_grpo.num_minibatches = 4",
           "TrainerConfig.checkpoint_every = 4")
_RL8 = ("TRAIN_STEPS = 8", *_RL_CPU)
OLD_COMPARE = {
    "bc": (["gin_configs/compare/bc.gin"], _BC_CPU, "train_bc"),
    "bc_x5": (["gin_configs/compare/bc_x5.gin"], _BC_CPU, "train_bc"),
    "grpo": (["gin_configs/runs/grpo.gin"], ("TRAIN_STEPS = 16", *_RL_CPU), "train_grpo"),
    "agentevol": (["gin_configs/runs/agentevol.gin"], ("TRAIN_STEPS = 400", "train_agentevol.curriculum_steps = 100",
                                                       "TaskSlices.explore_count = 40"), "train_agentevol"),
    **{f"exp_{m}": ([_EXP + "init_train_update.gin", _EXP + f"{m}.gin"], _RL8, "train_grpo")
       for m in ("woexp", "discard", "keep", "hybrid")},
    "selfq_scarce": ([_EXP + "no_pool.gin", "gin_configs/compare/selfq/scarce.gin"], _RL8, "train_grpo"),
    "selfq_mix": (["gin_configs/tasks/grpo_selfq.gin", "gin_configs/compare/selfq/scarce.gin",
                   "gin_configs/compare/selfq/mix.gin"], _RL8, "train_grpo"),
    "selfq_full": ([_EXP + "no_pool.gin"], _RL8, "train_grpo"),
    "credit_adca_oracle": ([_EXP + "no_pool.gin", "gin_configs/credit/adca.gin"], _RL8, "train_grpo"),
    "credit_adca_env": ([_EXP + "no_pool.gin", "gin_configs/credit/adca_env.gin"], _RL8, "train_grpo"),
    "credit_anchor": ([_EXP + "no_pool.gin", "gin_configs/credit/anchor_state.gin"], _RL8, "train_grpo"),
}

# The measured tables (README; launch.compare's compare.json before the move), as results.md writes their rows.
MEASURED_ROWS = {
    "compare_cpu": [
        "| gin_file=bc | .143 +- .038 | .110 +- .017 | .060 +- .010 | .104 +- .005 | .103 .110 .100 |",
        "| gin_file=bc_x5 | .243 +- .121 | .107 +- .051 | .027 +- .012 | .126 +- .053 | .080 .113 .183 |",
        "| gin_file=grpo | .213 +- .116 | .090 +- .010 | .057 +- .006 | .120 +- .037 | .127 .153 .080 |",
        "| gin_file=agentevol | .233 +- .327 | .087 +- .040 | .040 +- .017 | .120 +- .110 | .063 .247 .050 |"],
    "experience_cpu": [
        "| gin_file=exp_woexp | .660 (n=1) | .140 (n=1) | .040 (n=1) | .000 (n=1) | .210 (n=1) | .210 |",
        "| gin_file=exp_discard | .610 (n=1) | .160 (n=1) | .040 (n=1) | .000 (n=1) | .203 (n=1) | .203 |",
        "| gin_file=exp_keep | .660 (n=1) | .120 (n=1) | .040 (n=1) | .000 (n=1) | .205 (n=1) | .205 |",
        "| gin_file=exp_hybrid | .660 (n=1) | .160 (n=1) | .040 (n=1) | .000 (n=1) | .215 (n=1) | .215 |"],
    "selfq_cpu": [
        "| gin_file=selfq_scarce | .660 (n=1) | .170 (n=1) | .040 (n=1) | .000 (n=1) | .218 (n=1) | .218 |",
        "| gin_file=selfq_mix | .660 (n=1) | .130 (n=1) | .050 (n=1) | .000 (n=1) | .210 (n=1) | .210 |",
        "| gin_file=selfq_full | .660 (n=1) | .140 (n=1) | .040 (n=1) | .000 (n=1) | .210 (n=1) | .210 |"],
    "credit_cpu": [
        "| gin_file=credit_adca_oracle | .680 (n=1) | .110 (n=1) | .040 (n=1) | .000 (n=1) | .208 (n=1) | .208 |",
        "| gin_file=credit_anchor | .660 (n=1) | .140 (n=1) | .040 (n=1) | .000 (n=1) | .210 (n=1) | .210 |",
        "| gin_file=credit_adca_env | .730 (n=1) | .100 (n=1) | .040 (n=1) | .000 (n=1) | .217 (n=1) | .217 |"],
}


def script(name: str) -> str:
  return os.path.join(ROOT, "gin_configs", "sweeps", f"{name}.sh")


def run_script(name: str, *flags: str, cwd: str) -> list[list[str]]:
  """The script's --dry_run lines (run from `cwd`), each split into its words."""
  proc = subprocess.run(["bash", script(name), "--dry_run", *flags], cwd=cwd, capture_output=True, text=True,
                        env=dict(os.environ, PYTHON=sys.executable))
  assert proc.returncode == 0, proc.stderr[-2000:]
  return [shlex.split(line) for line in proc.stdout.splitlines()]


def files_and_bindings(words: list[str]) -> tuple[list[str], list[str]]:
  assert words[:3] == ["python", "-m", "launch.train"], words
  return ([w.split("=", 1)[1] for w in words if w.startswith("--gin_file=")],
          [w.split("=", 1)[1] for w in words if w.startswith("--gin_bindings=")])


@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_each_script_is_bash_and_starts_with_its_purpose_and_usage(name):
  assert subprocess.run(["bash", "-n", script(name)]).returncode == 0
  with open(script(name)) as f:
    head = f.read().split("\nset -euo pipefail")[0]
  assert f"bash gin_configs/sweeps/{name}.sh --dry_run" in head and f"--root results/{name} --report" in head
  assert os.access(script(name), os.X_OK)


@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_the_dry_run_has_the_runs_launch_compare_made(name, tmp_path):
  """Seeds 0-2 outer, methods in launch.compare's order; a job's one gin file, then its starting checkpoint (GRPO: the
  BC job of its seed; other methods of compare_cpu: None, a fresh init), its directory, seed and held-out tasks."""
  methods, _, _ = COMPARISONS[name]
  jobs = run_script(name, cwd=str(tmp_path))  # from anywhere
  assert len(jobs) == 3 * len(methods)
  for i, words in enumerate(jobs):
    seed, method = divmod(i, len(methods))
    method = methods[method]
    files, bindings = files_and_bindings(words)
    assert files == [f"gin_configs/compare/cpu/{method}.gin"]
    tail = [f"MODEL_DIR = 'runs/sweeps/{name}/gin_file={method}/seed={seed}'", f"SEED = {seed}",
            "LoopConfig.eval_tasks = 100"]
    if name != "compare_cpu":
      assert bindings == tail
    elif method == "grpo":
      assert bindings == [f"INIT_CHECKPOINT = 'runs/sweeps/compare_cpu/gin_file=bc/seed={seed}'", *tail]
    else:
      assert bindings[0].startswith("INIT_CHECKPOINT = None") and bindings[1:] == tail, bindings


def test_flags_after_the_script_win():
  jobs = run_script("compare_cpu", "--root", "/tmp/elsewhere", "--seeds", "1", "--gin_bindings=TRAIN_STEPS = 2",
                    cwd=ROOT)
  assert len(jobs) == 4
  for words, method in zip(jobs, COMPARISONS["compare_cpu"][0]):
    _, bindings = files_and_bindings(words)
    assert bindings[0] == "TRAIN_STEPS = 2"  # a sweep-wide binding: after the gin file, before the job's own
    assert f"MODEL_DIR = '/tmp/elsewhere/gin_file={method}/seed=1'" in bindings and "SEED = 1" in bindings
  assert "INIT_CHECKPOINT = '/tmp/elsewhere/gin_file=bc/seed=1'" in files_and_bindings(jobs[2])[1]


# In a fresh process (gin's state is global; in pytest's, `tests/models` would shadow gin's includes): for each job
# (a JSON line: method, new files, old files, old settings, shared bindings) the config parsed from the method's one
# gin file and from launch.compare's files and settings, and a few of its values.
PARSE = """
import json, sys
import gin
from evolver.train import gin_config
from evolver.train.slices import TaskSlices
for line in sys.stdin:
  job = json.loads(line)
  configs = []
  for files, bindings in ((job["new"], job["bindings"]), (job["old"], job["old_settings"] + job["bindings"])):
    gin.clear_config()
    gin_config.parse(files, bindings)
    configs.append(gin.config_str())
  slices = TaskSlices()
  print(json.dumps({"method": job["method"], "same": configs[0] == configs[1],
                    "steps": gin.query_parameter("%TRAIN_STEPS"), "expert": slices.expert_count,
                    "explore": slices.explore_count, "envs": gin.query_parameter(job["loop"] + ".envs")}))
"""


def test_each_method_file_sets_what_launch_compare_ran():
  lines = []
  for name, (methods, envs, _) in COMPARISONS.items():
    for words in run_script(name, "--seeds", "0", cwd=ROOT):
      files, bindings = files_and_bindings(words)
      method = files[0].split("/")[-1][:-len(".gin")]
      old_files, settings, loop = OLD_COMPARE[method]
      lines.append(json.dumps({"method": method, "new": files, "bindings": bindings, "old": old_files, "loop": loop,
                               "old_settings": [*settings, f"{loop}.envs = {envs!r}"]}))
  assert len(lines) == len(OLD_COMPARE)
  proc = subprocess.run([sys.executable, "-c", PARSE], cwd=ROOT, input="\n".join(lines) + "\n", capture_output=True,
                        text=True, env=one_device_env())
  assert proc.returncode == 0, proc.stderr[-3000:]
  got = {r["method"]: r for r in map(json.loads, proc.stdout.splitlines())}
  assert set(got) == set(OLD_COMPARE)
  assert [m for m, r in got.items() if not r["same"]] == []
  # The figures the old recipe test held: steps, the expert slice (BC x5: 400) and AgentEvol's 40 exploration tasks.
  assert {m: (r["steps"], r["expert"]) for m, r in got.items() if m in ("bc", "bc_x5", "grpo", "agentevol")} == {
      "bc": (400, 80), "bc_x5": (400, 400), "grpo": (16, 80), "agentevol": (400, 80)}
  assert got["agentevol"]["explore"] == 40 and got["selfq_scarce"]["explore"] == 16
  assert got["selfq_full"]["explore"] == got["credit_anchor"]["explore"] == 320
  assert all(r["steps"] == 8 and r["envs"] == ENVS4 for m, r in got.items() if m.startswith(("exp_", "selfq_", "cr")))
  assert all(got[m]["envs"] == ENVS3 for m in COMPARISONS["compare_cpu"][0])


@pytest.mark.parametrize("name", sorted(COMPARISONS))
def test_each_archive_is_its_sweep_and_reproduces_the_measured_table(name):
  methods, envs, seeds = COMPARISONS[name]
  archive = os.path.join(ROOT, "results", name)
  spec = sweep_report.load_sweep(archive)
  # The definition the script writes for its default root (what --archive keeps), at the seeds measured.
  assert spec["seeds"] == seeds
  dry_run = [shlex.join(words) for words in run_script(name, "--seeds", ",".join(map(str, seeds)), cwd=ROOT)]
  assert [job["command"] for job in spec["jobs"]] == dry_run and spec["root"] == f"runs/sweeps/{name}"
  assert [job["name"] for job in spec["jobs"]] == [f"gin_file={m}/seed={s}" for s in seeds for m in methods]
  for job in spec["jobs"]:
    directory = os.path.join(archive, job["name"])
    assert {"eval_results.json", "metrics.jsonl", "operative_config.gin"} <= set(os.listdir(directory))
    assert sweep.is_done(directory)  # the script's --archive counts it done: not trained again
  # Nothing left in launch.compare's layout (METHOD/seed_S); beside the points, only the report's plots and the
  # self-questioned task set that selfq_mix trains on.
  assert {d for d in os.listdir(archive) if os.path.isdir(os.path.join(archive, d))} - {"plots"} == {
      *[f"gin_file={m}" for m in methods], *(["taskset"] if name == "selfq_cpu" else [])}
  # The report's table, computed as `launch.sweep --root results/NAME --report` does, and the committed results.md.
  records = sweep_report.read_jobs(archive, spec)
  assert sweep_report.env_names(records) == envs
  points = sweep_report.summarize_points(records, envs)
  _, note = sweep_report.choose_best(points, None)
  text = sweep_report.markdown(f"results/{name}", spec, records, points, envs, None, note)
  for row in MEASURED_ROWS[name]:
    assert row in text.splitlines(), (row, text)
  with open(os.path.join(archive, "results.md")) as f:
    assert f.read() == text
