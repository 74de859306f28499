"""launch.quickstart without running a model: the commands it gives launch.eval and launch.train (the same tasks,
seeds and limits for the start and the evolved policy), the stages it skips on a second run, and its report (the
paired table and the learning curve) from records written here. The stages themselves run in CI's quickstart
smoke (`bash launch/quickstart.sh --smoke`)."""

import json
import os

import pytest

from launch import quickstart, sweep_report


def _evaluation(split: str, successes: dict[int, list[int]], num_samples: int) -> dict:
  """A results file as launch.eval writes it: maze episodes with the given successes per task index."""
  episodes = [{"env": "maze", "index": index, "sample": sample, "success": bool(s), "reward": float(s)}
              for index, outcome in successes.items() for sample, s in enumerate(outcome)]
  mean = sum(e["success"] for e in episodes) / len(episodes)
  return {"split": split, "num_samples": num_samples, "temperature": 1.0 if num_samples > 1 else 0.0,
          "top_p": 1.0, "seed": 0, "max_new_tokens": 96, "max_rounds": 12, "episodes": episodes,
          "envs": {"maze": {"success": mean}}, "overall": {"success": mean}}


def _write(directory: str, name: str, results: dict) -> None:
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, name), "w") as f:
    json.dump(results, f)


def _write_stage(model_dir: str, who: str, practised: dict[int, list[int]], held_out: dict[int, list[int]],
                 greedy: dict[int, list[int]]) -> None:
  dirs = quickstart.stage_dirs(model_dir)
  _write(dirs[f"{who}_practised"], sweep_report.SAMPLES_FILE, _evaluation("train", practised, 4))
  _write(dirs[f"{who}_held_out"], sweep_report.SAMPLES_FILE, _evaluation("eval", held_out, 4))
  _write(dirs[f"{who}_held_out"], sweep_report.EVAL_FILE, _evaluation("eval", greedy, 1))


def test_the_start_and_the_evolved_policy_are_evaluated_alike():
  plan = quickstart.PLAN
  start = quickstart.eval_args(plan, ["--hf_checkpoint", "ckpt"], "held_out", "runs/q/start/held_out")
  evolved = quickstart.eval_args(plan, ["--model_dir", "runs/q"], "held_out", "runs/q/evolved/held_out",
                                 baseline="runs/q/start/held_out")
  assert start[:2] == ["--hf_checkpoint", "ckpt"] and evolved[:2] == ["--model_dir", "runs/q"]
  # The same tasks, samples, seed and limits; only the policy, the output and the baseline differ.
  strip = lambda args: [a for a in args[2:] if "runs/q" not in a and a != "--baseline"]
  assert strip(start) == strip(evolved)
  assert ["--split", "eval"] == start[start.index("--split"):start.index("--split") + 2]
  assert "--with_greedy" in start and evolved[-2:] == ["--baseline", "runs/q/start/held_out"]
  practised = quickstart.eval_args(plan, ["--model_dir", "runs/q"], "practised", "runs/q/evolved/practised")
  assert practised[practised.index("--split") + 1] == "train" and "--with_greedy" not in practised
  assert practised[practised.index("--start") + 1] == str(plan.practised_start)
  assert practised[practised.index("--out") + 1] == os.path.join("runs/q/evolved/practised", sweep_report.SAMPLES_FILE)
  with pytest.raises(ValueError, match="unknown evaluation kind"):
    quickstart.eval_args(plan, [], "val", "x")


def test_the_training_run_practises_the_evaluated_tasks_under_the_same_limits():
  args = quickstart.train_args(quickstart.PLAN, "runs/q", smoke=False)
  assert args[0] == f"--gin_file={quickstart.GIN_FILE}" and not any(quickstart.SMOKE_GIN_FILE in a for a in args)
  plan = quickstart.PLAN
  for binding in (f"TaskSlices.explore_start = {plan.practised_start}",
                  f"TaskSlices.explore_count = {plan.practised_tasks}",
                  f"train_grpo.max_rounds = {plan.max_rounds}", f"train_grpo.max_new_tokens = {plan.max_new_tokens}",
                  "train_grpo.envs = ['maze']", "MODEL_DIR = 'runs/q'"):
    assert f"--gin_bindings={binding}" in args
  smoke = quickstart.train_args(quickstart.SMOKE_PLAN, "runs/s", smoke=True)
  assert f"--gin_file={quickstart.SMOKE_GIN_FILE}" in smoke
  assert "--gin_bindings=train_grpo.max_rounds = 4" in smoke
  for gin_file in (quickstart.GIN_FILE, quickstart.SMOKE_GIN_FILE):
    assert os.path.exists(os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), gin_file))


def test_report_pairs_the_evolved_policy_with_its_start(tmp_path):
  model_dir = str(tmp_path / "run")
  # 4 practised tasks: the start solves 1 of 4 samples of each, the evolved policy 4 of 4 on three of them.
  _write_stage(model_dir, "start", {i: [1, 0, 0, 0] for i in range(4)}, {0: [0, 0, 1, 0], 1: [1, 1, 0, 0]},
               {0: [0], 1: [1]})
  _write_stage(model_dir, "evolved", {0: [1, 1, 1, 1], 1: [1, 1, 1, 1], 2: [1, 1, 1, 1], 3: [1, 0, 0, 0]},
               {0: [0, 0, 1, 0], 1: [1, 1, 0, 0]}, {0: [1], 1: [1]})
  with open(os.path.join(model_dir, "metrics.jsonl"), "w") as f:
    for step, success in ((1, 0.25), (2, 0.5), (3, 0.7)):
      f.write(json.dumps({"step": step, "rollout/success": success}) + "\n")
  got = {(label, c["kind"]): c["overall"] for label, c in quickstart.comparisons(model_dir)}
  assert list(got) == [("practised tasks", "avg@4"), ("held-out tasks", "greedy"), ("held-out tasks", "avg@4")]
  practised = got[("practised tasks", "avg@4")]
  assert practised["baseline"] == 0.25 and practised["this"] == 13 / 16
  assert practised["diff"] == pytest.approx(9 / 16) and 0 < practised["lo"] <= practised["hi"] <= 0.75
  assert got[("held-out tasks", "avg@4")]["diff"] == 0.0
  assert got[("held-out tasks", "greedy")]["diff"] == 0.5 and got[("held-out tasks", "greedy")]["tasks"] == 2
  text = quickstart.report(model_dir, quickstart.PLAN, {"1/4 start": 12.0})
  assert "| practised tasks | avg@4 | maze | 0.250 | 0.812 | +0.562 [" in text and "- 1/4 start: 12 s" in text
  assert open(os.path.join(model_dir, quickstart.REPORT_FILE)).read() == text
  with open(os.path.join(model_dir, quickstart.CURVE_FILE), "rb") as f:
    assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_second_run_skips_the_stages_whose_records_exist(tmp_path, monkeypatch, capsys):
  model_dir = str(tmp_path / "run")
  ran = []

  def fake_run(module, args):  # a stage "runs" by writing what the real one writes
    ran.append(module)
    if module == "launch.eval":
      out = args[args.index("--out") + 1]
      out = os.path.dirname(out) if out.endswith(".json") else out
      who = "evolved" if "--model_dir" in args else "start"
      if "practised" in out:
        _write(out, sweep_report.SAMPLES_FILE, _evaluation("train", {0: [1, 0]}, 4))
      else:
        _write(out, sweep_report.SAMPLES_FILE, _evaluation("eval", {0: [1, 0]}, 4))
        _write(out, sweep_report.EVAL_FILE, _evaluation("eval", {0: [int(who == "evolved")]}, 1))

  monkeypatch.setattr(quickstart, "run", fake_run)
  quickstart.main(["--model_dir", model_dir])
  assert ran == ["launch.eval", "launch.eval", "launch.train", "launch.eval", "launch.eval"]
  times = json.load(open(os.path.join(model_dir, quickstart.TIMES_FILE)))
  assert sorted(times) == ["1/4 start", "2/4 evolve", "3/4 evolved"]
  out = capsys.readouterr().out
  assert "| held-out tasks | greedy | maze | 0.000 | 1.000 | +1.000" in out
  ran.clear()
  quickstart.main(["--model_dir", model_dir])  # everything on record: only the report again
  assert ran == [] and json.load(open(os.path.join(model_dir, quickstart.TIMES_FILE))) == times
  assert capsys.readouterr().out.count("done before: skipped") == 5
