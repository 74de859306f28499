"""launch.compare: the sweep's commands, bindings, ordering and table; and a two-method sweep end to end (tiny).

  python -m pytest tests/train/test_compare.py -q
"""

import json
import os
import subprocess
import sys

import pytest

from launch import compare
from tests.subprocess_env import subprocess_xla_flags

SMALL_MODEL = ["ModelConfig.hidden_size = 64", "ModelConfig.num_layers = 2", "ModelConfig.intermediate_size = 128"]


def test_grpo_and_dpo_run_after_the_bc_they_start_from():
  assert compare.ordered_methods(["grpo", "bc_x5"]) == ["bc", "grpo", "bc_x5"]
  assert compare.ordered_methods(["bc", "dpo", "grpo"]) == ["bc", "dpo", "grpo"]
  with pytest.raises(SystemExit, match="unknown method 'ppo'"):
    compare.ordered_methods(["ppo"])


def test_train_command_binds_seed_envs_dir_and_init_checkpoint(tmp_path):
  cmd = compare.train_command(str(tmp_path), "grpo", 2, ["maze", "sql"], ["TRAIN_STEPS = 5"])
  bindings = [a.split("=", 1)[1] for a in cmd if a.startswith("--gin_bindings=")]
  assert "--gin_file=gin_configs/runs/grpo.gin" in cmd
  assert f"MODEL_DIR = '{tmp_path}/grpo/seed_2'" in bindings and "SEED = 2" in bindings
  assert "train_grpo.envs = ['maze', 'sql']" in bindings
  assert f"INIT_CHECKPOINT = '{tmp_path}/bc/seed_2'" in bindings
  assert bindings[-1] == "TRAIN_STEPS = 5"  # the sweep's own bindings come last and win
  bc_x5 = compare.train_command(str(tmp_path), "bc_x5", 0, ["maze"], [], recipe="cpu")
  assert bc_x5[3:5] == ["--gin_file=gin_configs/compare/bc_x5.gin", "--gin_file=gin_configs/compare/cpu/bc_x5.gin"]
  assert not any("INIT_CHECKPOINT" in a for a in bc_x5)


def test_bindings_by_method():
  out = compare.parse_bindings(["all:TRAIN_STEPS = 3", "grpo:train_grpo.group_size = 2"], ["bc", "grpo"])
  assert out == {"bc": ["TRAIN_STEPS = 3"], "grpo": ["TRAIN_STEPS = 3", "train_grpo.group_size = 2"]}
  with pytest.raises(SystemExit, match="METHOD:BINDING"):
    compare.parse_bindings(["TRAIN_STEPS = 3"], ["bc"])
  with pytest.raises(SystemExit, match="unknown method 'sft'"):
    compare.parse_bindings(["sft:TRAIN_STEPS = 3"], ["bc"])


def test_recipes_and_method_files_are_gin_files_that_parse():
  assert compare.recipe_files("full", "bc") == [] and compare.recipe_files("cpu", "dpo") == []
  # Parsed as launch.train parses them, in a fresh process (in pytest's, `tests/models` shadows gin's includes):
  # one process for all methods, each parsed anew after gin.clear_config() (arguments: method, then its files).
  script = (
      "import sys, gin\n"
      "from evolver.train import gin_config\n"
      "from evolver.train.slices import TaskSlices\n"
      "for job in sys.argv[1:]:\n"
      "  method, *files = job.split(',')\n"
      "  gin.clear_config()\n"
      "  gin_config.parse(files, [\"MODEL_DIR = 'x'\"])\n"
      "  print(f'{method}:', gin.query_parameter('%TRAIN_STEPS'), TaskSlices().expert_count)\n")
  expected = {"bc": "400 80", "bc_x5": "400 400", "grpo": "16 80", "agentevol": "400 80", "exp_hybrid": "8 80",
              "credit_adca_env": "8 80", "credit_anchor": "8 80"}
  assert compare.recipe_files("cpu", "exp_keep") == ["gin_configs/compare/cpu/exp.gin"]
  assert compare.recipe_files("cpu", "credit_anchor") == ["gin_configs/compare/cpu/credit.gin"]
  jobs = []
  for method in expected:
    files = [*compare.METHODS[method].gin_files, *compare.recipe_files("cpu", method)]
    assert len(files) == 1 + len(compare.METHODS[method].gin_files), method
    assert not any("," in f for f in files), files
    jobs.append(",".join([method, *files]))
  proc = subprocess.run([sys.executable, "-c", script, *jobs], cwd=compare.ROOT, capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  got = dict(line.split(": ", 1) for line in proc.stdout.splitlines() if ": " in line)
  for method, want in expected.items():
    assert got.get(method) == want, (method, proc.stdout)


def test_summary_is_mean_and_sample_std_over_seeds():
  def result(maze, sql):
    return {"envs": {"maze": {"success": maze}, "sql": {"success": sql}}, "overall": {"success": (maze + sql) / 2}}

  table = compare.summarize({"bc": {0: result(0.2, 0.0), 1: result(0.4, 0.1), 2: result(0.6, 0.2)},
                             "one": {0: result(0.5, 0.5)}}, ["maze", "sql"])
  assert table["bc"]["maze"]["mean"] == pytest.approx(0.4)
  assert table["bc"]["maze"]["std"] == pytest.approx(0.2)  # ddof 1: sqrt((0.04 + 0 + 0.04) / 2)
  assert table["bc"]["sql"]["values"] == [0.0, 0.1, 0.2] and table["bc"]["sql"]["seeds"] == [0, 1, 2]
  assert table["bc"]["overall"]["mean"] == pytest.approx(0.25)
  assert table["one"]["maze"]["std"] == 0.0
  text = compare.format_table(table, ["maze", "sql"])
  assert "| bc | 0.400 +- 0.200 | 0.100 +- 0.100 | 0.250 +- 0.150 |" in text


def test_an_archived_evaluation_counts_as_done_unless_a_pending_run_starts_from_it(tmp_path):
  root, archive = str(tmp_path / "runs"), str(tmp_path / "archive")
  assert compare.needs_training(root, archive, "bc", 0, ["bc", "grpo"])  # nothing evaluated yet
  bc_run = compare.run_dir(root, "bc", 0)
  os.makedirs(bc_run)
  inside = os.path.join(compare.ROOT, "runs", "bc")
  for name, text in [(compare.EVAL_FILE, json.dumps({"model_dir": inside})), ("metrics.jsonl", "{}\n"),
                     ("big_checkpoint", "x")]:
    with open(os.path.join(bc_run, name), "w") as f:
      f.write(text)
  compare.archive_run(bc_run, compare.run_dir(archive, "bc", 0))
  assert sorted(os.listdir(compare.run_dir(archive, "bc", 0))) == [compare.EVAL_FILE, "metrics.jsonl"]
  with open(os.path.join(compare.run_dir(archive, "bc", 0), compare.EVAL_FILE)) as f:
    assert json.load(f) == {"model_dir": os.path.join("runs", "bc")}  # relative to the repository
  os.remove(os.path.join(bc_run, compare.EVAL_FILE))
  assert compare.evaluation_file(root, archive, "bc", 0) == os.path.join(archive, "bc", "seed_0", compare.EVAL_FILE)
  assert not compare.needs_training(root, archive, "bc", 0, ["bc", "bc_x5"])
  assert compare.needs_training(root, archive, "bc", 0, ["bc", "grpo"])  # GRPO still needs BC's checkpoint
  assert compare.needs_training(root, archive, "bc", 1, ["bc"])          # another seed is another run


def test_a_retrained_run_must_reproduce_its_archived_curve(tmp_path):
  def write(directory, losses):
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "metrics.jsonl"), "w") as f:
      for step, loss in enumerate(losses, 1):
        f.write(json.dumps({"step": step, "loss": loss, "val/overall/success": 0.5}) + "\n")

  write(tmp_path / "archived", [2.0, float("nan"), 1.25])  # a step with nothing to learn logs NaN
  write(tmp_path / "same", [2.0, float("nan"), 1.25])
  write(tmp_path / "other", [2.0, float("nan"), 1.2500001])
  compare.check_reproduced(str(tmp_path / "same"), str(tmp_path / "archived"))
  with pytest.raises(SystemExit, match="differ from row 2 on"):
    compare.check_reproduced(str(tmp_path / "other"), str(tmp_path / "archived"))
  compare.check_reproduced(str(tmp_path / "other"), str(tmp_path / "nothing_archived"))  # nothing to check


@pytest.mark.slow
def test_a_tiny_sweep_trains_evaluates_and_resumes(tmp_path, monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", subprocess_xla_flags())  # one CPU device, as users run it
  root = tmp_path / "sweep"
  tiny = [f"all:{b}" for b in SMALL_MODEL] + [
      "all:TRAIN_STEPS = 2", "all:TaskSlices.val_count = 0", "bc:TaskSlices.expert_count = 8",
      "bc:train_bc.batch_size = 4", "bc:train_bc.buckets = (512,)", "bc:train_bc.curriculum_steps = 0",
      "grpo:train_grpo.tasks_per_step = 2", "grpo:train_grpo.group_size = 2", "grpo:train_grpo.max_new_tokens = 16",
      "grpo:train_grpo.max_rounds = 2"]
  argv = ["--root", str(root), "--methods", "bc,grpo", "--envs", "sql", "--seeds", "0", "--eval_tasks", "2",
          "--max_new_tokens", "16", *[f"--bindings={b}" for b in tiny]]
  summary = compare.main(argv)
  assert set(summary["table"]) == {"bc", "grpo"}
  for method in ("bc", "grpo"):
    evaluated = json.loads((root / method / "seed_0" / compare.EVAL_FILE).read_text())
    assert evaluated["split"] == "eval" and evaluated["envs"]["sql"]["num_tasks"] == 2
    assert summary["table"][method]["sql"]["values"] == [evaluated["envs"]["sql"]["success"]]
  assert any("INIT_CHECKPOINT" in c and "grpo.gin" in c for c in summary["commands"])
  assert json.loads((root / "compare.json").read_text())["seeds"] == [0]
  # Started again: the runs are complete and the evaluations are read back, not redone.
  mtime = os.stat(root / "bc" / "seed_0" / compare.EVAL_FILE).st_mtime_ns
  again = compare.main(argv)
  assert again["table"] == summary["table"]
  assert os.stat(root / "bc" / "seed_0" / compare.EVAL_FILE).st_mtime_ns == mtime
  # With an archive: the records are kept there, and a new root with only the archive trains nothing.
  archive = tmp_path / "archive"
  compare.main(argv + ["--archive", str(archive)])
  assert sorted(os.listdir(archive / "grpo" / "seed_0")) == sorted(compare.RECORD_FILES)
  assert json.loads((archive / "compare.json").read_text())["table"] == summary["table"]
  new_root = tmp_path / "fresh"
  from_archive = compare.main(["--root", str(new_root), *argv[2:], "--archive", str(archive)])
  assert from_archive["table"] == summary["table"]
  assert not (new_root / "bc").exists() and not (new_root / "grpo").exists()
  # GRPO's record gone from the archive: BC is trained again for it, and must reproduce its archived curve.
  import shutil
  shutil.rmtree(archive / "grpo")
  again_root = tmp_path / "again"
  retrained = compare.main(["--root", str(again_root), *argv[2:], "--archive", str(archive)])
  assert retrained["table"]["bc"] == summary["table"]["bc"]  # read back, not evaluated again
  assert (again_root / "bc" / "seed_0" / "metrics.jsonl").exists()
  assert not (again_root / "bc" / "seed_0" / compare.EVAL_FILE).exists()
