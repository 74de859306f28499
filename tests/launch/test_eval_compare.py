"""Held-out noise, paired: `sweep_report.paired_comparison` on evaluations built by hand, the sweep report's avg@k
interval and its single-seed baseline, and `launch.eval`'s refusals before any episode runs (no model needed).

  python -m pytest tests/launch/test_eval_compare.py -q
"""

import json
import os

import numpy as np
import pytest

from launch import eval as eval_cli
from launch import sweep_report

P00 = "rollout_ratio=0.0"
P11 = "rollout_ratio=0.5"


def evaluation(successes: dict[str, list[list[int]]], *, num_samples: int = 1, temperature: float = 0.0,
               seed: int = 0, split: str = "eval") -> dict:
  """An evaluation as `evaluation.evaluate` records it: successes[env][task] lists one 0/1 per sample."""
  envs, episodes = {}, []
  for env, tasks in successes.items():
    flat = [s for task in tasks for s in task]
    envs[env] = {"num_tasks": len(tasks), "num_episodes": len(flat), "success": float(np.mean(flat))}
    episodes += [{"env": env, "index": i, "sample": j, "success": bool(s), "failed": False}
                 for i, task in enumerate(tasks) for j, s in enumerate(task)]
  overall = {"success": float(np.mean([e["success"] for e in envs.values()]))}
  return {"split": split, "num_samples": num_samples, "temperature": temperature, "top_p": 1.0, "seed": seed,
          "max_new_tokens": 16, "max_rounds": 2, "envs": envs, "overall": overall, "episodes": episodes}


THIS = {"maze": [[1, 1], [0, 1], [1, 0]], "babyai": [[1, 0], [0, 0]]}
BASE = {"maze": [[0, 1], [0, 0], [1, 0]], "babyai": [[0, 0], [0, 0]]}


def test_paired_comparison_weights_envs_equally():
  this, base = evaluation(THIS, num_samples=2, temperature=1.0), evaluation(BASE, num_samples=2, temperature=1.0)
  c = sweep_report.paired_comparison(this, base)
  maze, babyai, overall = c["envs"]["maze"], c["envs"]["babyai"], c["overall"]
  assert c["kind"] == "avg@2" and c["unpaired"] == {"this": 0, "baseline": 0} and c["protocol"] == []
  assert (maze["this"], maze["baseline"], maze["diff"]) == pytest.approx((4 / 6, 2 / 6, 2 / 6))
  assert (babyai["this"], babyai["baseline"], babyai["diff"]) == pytest.approx((1 / 4, 0.0, 1 / 4))
  assert (maze["pairs"], maze["tasks"], babyai["pairs"], babyai["tasks"]) == (6, 3, 4, 2)
  # Each env counts the same, as the overall success does: (1/3 + 1/4) / 2, not the pooled 3/10.
  assert overall["diff"] == pytest.approx((2 / 6 + 1 / 4) / 2)
  assert overall["this"] - overall["baseline"] == pytest.approx(overall["diff"])
  assert this["overall"]["success"] - base["overall"]["success"] == pytest.approx(overall["diff"])
  assert (overall["pairs"], overall["tasks"]) == (10, 5)
  for e in (maze, babyai, overall):
    assert e["lo"] <= e["diff"] <= e["hi"] and e["lo"] < e["hi"]
  # The per-env interval is `paired_bootstrap` of that env's pairs (tasks as groups).
  diffs, groups = np.array([1, 0, 0, 1, 0, 0], float), np.array([0, 0, 1, 1, 2, 2])
  assert sweep_report.paired_bootstrap(diffs, groups) == pytest.approx((maze["diff"], maze["lo"], maze["hi"]))
  # The same inputs, the same interval (a fixed bootstrap seed).
  assert sweep_report.paired_comparison(this, base)["overall"] == overall


def test_env_mean_bootstrap():
  rng = np.random.default_rng(7)
  diffs, groups = rng.choice([-1.0, 0.0, 1.0], size=30), np.repeat(np.arange(10), 3)
  # One env: paired_bootstrap's numbers.
  assert sweep_report.env_mean_bootstrap([(diffs, groups)]) == sweep_report.paired_bootstrap(diffs, groups)
  # Two envs, one all +1 with 2 pairs and one all 0 with 20: the mean over envs is .5 whatever the counts.
  assert sweep_report.env_mean_bootstrap([(np.ones(2), np.arange(2)), (np.zeros(20), np.arange(20))]) == \
      (0.5, 0.5, 0.5)
  assert sweep_report.env_mean_bootstrap([(np.zeros(0), np.zeros(0, int))]) is None


def test_identical_evaluations_differ_by_zero():
  for kwargs in ({}, {"num_samples": 2, "temperature": 1.0}):
    results = evaluation(THIS if kwargs else {"maze": [[1], [0], [1]], "babyai": [[0], [1]]}, **kwargs)
    c = sweep_report.paired_comparison(results, json.loads(json.dumps(results)))
    for e in (*c["envs"].values(), c["overall"]):
      assert (e["diff"], e["lo"], e["hi"]) == (0.0, 0.0, 0.0)
    assert c["kind"] == ("avg@2" if kwargs else "greedy")


def test_unpaired_evaluations_are_refused():
  sampled = evaluation(THIS, num_samples=2, temperature=1.0)
  for other, says in [(evaluation(BASE, num_samples=3, temperature=1.0), "num_samples 2 vs 3"),
                      (evaluation(BASE, num_samples=2, temperature=0.7), "temperature 1.0 vs 0.7"),
                      (evaluation(BASE, num_samples=2, temperature=1.0, seed=1), "seed 0 vs 1"),
                      (evaluation(BASE, num_samples=2, temperature=1.0, split="train"), "split 'eval' vs 'train'")]:
    with pytest.raises(ValueError, match="not paired.*" + says):
      sweep_report.paired_comparison(sampled, other)
  with pytest.raises(ValueError, match="share no episode"):
    sweep_report.paired_comparison(sampled, evaluation({"sql": [[1, 0]]}, num_samples=2, temperature=1.0))
  # Greedy episodes draw nothing: greedy evaluations pair whatever their seed.
  greedy = evaluation({"maze": [[1], [0]]})
  assert sweep_report.paired_comparison(greedy, evaluation({"maze": [[0], [0]]}, seed=3))["overall"]["diff"] == 0.5
  # Episodes in one only are left out, and counted; differing limits are noted.
  fewer = evaluation({"maze": [[0]]}, seed=3) | {"max_new_tokens": 96}
  c = sweep_report.paired_comparison(greedy, fewer)
  assert c["unpaired"] == {"this": 1, "baseline": 0} and c["overall"]["pairs"] == 1
  assert c["protocol"] == ["max_new_tokens 16 vs 96"]


# ------------------------------------------------------------------------------------------------ the sweep report


def write(path: str, data: dict) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    json.dump(data, f)


def make_sweep(root: str, jobs: list[tuple[str, int, dict | None, dict | None]]) -> None:
  """ROOT/sweep.json listing `jobs` (point, seed, greedy, sampled) and each job's evaluations."""
  entries = []
  for point, seed, greedy, sampled in jobs:
    name = f"{point}/seed={seed}"
    entries.append({"name": name, "point": point, "seed": seed, "swept": dict([point.split("=")])})
    write(os.path.join(root, name, "job_status.json"), {"state": "done", "returncode": 0, "wall_s": 1.0})
    if greedy is not None:
      write(os.path.join(root, name, sweep_report.EVAL_FILE), greedy)
    if sampled is not None:
      write(os.path.join(root, name, sweep_report.SAMPLES_FILE), sampled)
  seeds = sorted({seed for _, seed, _, _ in jobs})
  write(os.path.join(root, "sweep.json"), {"version": 1, "seeds": seeds, "jobs": entries})


def table_rows(text: str) -> dict[str, list[str]]:
  return {cells[0]: cells[1:] for line in text.splitlines() if line.startswith("| ") and
          not line.startswith("| point") for cells in [[c.strip() for c in line.strip("|").split("|")]]}


def test_single_seed_baseline_pairs_every_seed(tmp_path):
  """A shared start evaluated once (one job) against two RL seeds: each seed's episodes pair with its one job."""
  root = str(tmp_path / "sweep")
  zeros = evaluation({"maze": [[0]] * 4, "babyai": [[0]] * 4})
  make_sweep(root, [(P00, 0, zeros, None),
                    (P11, 0, evaluation({"maze": [[1]] * 4, "babyai": [[1]] * 4}), None),
                    (P11, 1, evaluation({"maze": [[1], [1], [0], [0]], "babyai": [[1], [1], [0], [0]]}), None)])
  out = sweep_report.report(root, baseline=P00)
  d = out["points"][1]["diff"]
  assert (d["pairs"], d["tasks"], d["mean"]) == (16, 8, pytest.approx(0.75))  # both seeds paired, not seed 0 alone
  assert 0 < d["lo"] < 0.75 < d["hi"]
  assert "where the baseline has a single job" in out["markdown"]

  # A baseline of several jobs pairs seed by seed: P11's seed 1 has no partner when the baseline's seed 1 failed.
  root = str(tmp_path / "two_seeds")
  make_sweep(root, [(P00, 0, zeros, None), (P00, 1, None, None),
                    (P11, 0, evaluation({"maze": [[1]] * 4, "babyai": [[1]] * 4}), None),
                    (P11, 1, evaluation({"maze": [[0]] * 4, "babyai": [[0]] * 4}), None)])
  d = sweep_report.report(root, baseline=P00)["points"][1]["diff"]
  assert (d["pairs"], d["mean"]) == (8, 1.0)


def test_avg_k_column_gets_its_interval(tmp_path):
  root = str(tmp_path / "sweep")
  greedy = evaluation({"maze": [[0], [1]], "babyai": [[0], [0]]})
  sampled = lambda maze, babyai, k=2: evaluation({"maze": maze, "babyai": babyai}, num_samples=k, temperature=1.0)
  make_sweep(root, [(P00, 0, greedy, sampled([[0, 0], [1, 0], [0, 0]], [[0, 0], [0, 0], [1, 0]])),
                    (P11, 0, greedy, sampled([[1, 1], [1, 1], [0, 1]], [[1, 0], [0, 1], [1, 1]]))])
  out = sweep_report.report(root, baseline=P00)
  p = out["points"][1]
  a = p["avg_k_diff"]
  # maze 5/6 - 1/6, babyai 4/6 - 1/6: the mean over envs (4/6 + 3/6) / 2.
  assert (a["pairs"], a["tasks"], a["mean"]) == (12, 6, pytest.approx(7 / 12))
  assert 0 < a["lo"] < a["mean"] < a["hi"]
  assert p["diff"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "pairs": 4, "tasks": 4}
  assert "| point | maze | babyai | overall | overall per seed (s0) | avg@2 | overall - baseline [95% CI] | " \
         "avg@2 - baseline [95% CI] |" in out["markdown"]
  rows = table_rows(out["markdown"])
  assert rows[P00][-2:] == ["baseline", "baseline"]
  assert rows[P11][-1] == f"+.583 [{sweep_report._f(a['lo'], True)}, {sweep_report._f(a['hi'], True)}]"

  # The baseline's samples at another k are not paired with the point's.
  root = str(tmp_path / "other_k")
  make_sweep(root, [(P00, 0, greedy, sampled([[0, 0, 0]] * 3, [[0, 0, 0]] * 3, k=3)),
                    (P11, 0, greedy, sampled([[1, 1], [1, 1], [0, 1]], [[1, 0], [0, 1], [1, 1]]))])
  out = sweep_report.report(root, baseline=P00)
  assert out["points"][1]["avg_k_diff"] is None
  assert table_rows(out["markdown"])[P11][-1] == "no paired episodes"


# ----------------------------------------------------------------------------------------------------- launch.eval


def test_launch_eval_loads_a_baseline_and_refuses_before_running(tmp_path):
  run = tmp_path / "run"
  write(str(run / sweep_report.EVAL_FILE), evaluation({"maze": [[1], [0]]}))
  write(str(run / sweep_report.SAMPLES_FILE), evaluation({"maze": [[1, 0, 0, 1]] * 2}, num_samples=4,
                                                         temperature=1.0))
  loaded = eval_cli.load_evaluations(str(run))
  assert set(loaded) == {"greedy", "sampled"} and loaded["sampled"]["num_samples"] == 4
  assert set(eval_cli.load_evaluations(str(run / sweep_report.EVAL_FILE))) == {"greedy"}
  with pytest.raises(SystemExit, match="no evaluation there"):
    eval_cli.load_evaluations(str(tmp_path / "empty"))

  # (The checkpoint does not exist: each refusal comes before the policy is loaded.)
  common = ["--hf_checkpoint", str(tmp_path / "nowhere"), "--envs", "maze", "--num_tasks", "2"]
  with pytest.raises(SystemExit, match="num_samples 2 vs 4"):
    eval_cli.main(common + ["--num_samples", "2", "--with_greedy", "--baseline", str(run)])
  with pytest.raises(SystemExit, match="seed 1 vs 0"):
    eval_cli.main(common + ["--num_samples", "4", "--seed", "1", "--baseline", str(run)])
  only_greedy = tmp_path / "greedy.json"
  write(str(only_greedy), evaluation({"maze": [[1], [0]]}))
  with pytest.raises(SystemExit, match="nothing to compare"):
    eval_cli.main(common + ["--num_samples", "4", "--baseline", str(only_greedy)])
  with pytest.raises(SystemExit, match="give --num_samples k >= 2"):
    eval_cli.main(common + ["--with_greedy"])
  with pytest.raises(SystemExit, match="is their directory"):
    eval_cli.main(common + ["--num_samples", "2", "--with_greedy", "--out", str(tmp_path / "x.json")])
  assert eval_cli.with_greedy_paths(str(tmp_path), None) == {
      "greedy": str(tmp_path / "eval_results.json"), "sampled": str(tmp_path / "eval_samples.json")}


def test_indices_name_the_tasks_and_bad_ones_are_refused_before_running(tmp_path):
  model = ["--hf_checkpoint", str(tmp_path / "nowhere"), "--envs", "maze,babyai"]
  files = {"not_json": "{maze", "a_list": "[1, 2]", "no_babyai": '{"maze": [1]}',
           "not_ints": '{"maze": [1], "babyai": ["3"]}', "negative": '{"maze": [1], "babyai": [-1]}',
           "good": '{"maze": [3, 1], "babyai": [2]}'}
  for name, text in files.items():
    (tmp_path / f"{name}.json").write_text(text)
  cases = [("missing", "not a readable JSON file"), ("not_json", "not a readable JSON file"),
           ("a_list", "expected an object"), ("no_babyai", r"no task indices for \['babyai'\]"),
           ("not_ints", "'babyai' must be a list of task indices"), ("negative", "must be a list of task indices")]
  for name, message in cases:
    with pytest.raises(SystemExit, match=message):
      eval_cli.main([*model, "--indices", str(tmp_path / f"{name}.json")])
  with pytest.raises(SystemExit, match="without --start/--num_tasks"):
    eval_cli.main([*model, "--indices", str(tmp_path / "good.json"), "--num_tasks", "2"])
  assert eval_cli.load_indices(str(tmp_path / "good.json"), ["maze", "babyai"]) == {"maze": [3, 1], "babyai": [2]}
  # A GRPO run's directory: the train tasks its steps recorded (spec tasks left out), each once, sorted.
  run = tmp_path / "run"
  run.mkdir()
  with pytest.raises(SystemExit, match="recorded no trained tasks"):
    eval_cli.load_indices(str(run), ["maze"])
  rows = [{"step": 1, "train/tasks": ["maze/90", "babyai/81", "maze/spec"]},
          {"step": 2, "train/tasks": ["maze/84", "maze/90"]}]
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  assert eval_cli.load_indices(str(run), ["maze", "babyai"]) == {"maze": [84, 90], "babyai": [81]}
  with pytest.raises(SystemExit, match=r"no task indices for \['sql'\]"):
    eval_cli.load_indices(str(run), ["maze", "sql"])


def test_paired_table_lists_every_env_and_kind():
  c = {"greedy": sweep_report.paired_comparison(evaluation({"maze": [[1], [0]]}), evaluation({"maze": [[0], [0]]}))}
  lines = eval_cli.paired_table(c).splitlines()
  assert lines[0].split() == ["env", "kind", "this", "baseline", "diff", "95%", "CI", "tasks"]
  assert lines[2].split()[:5] == ["maze", "greedy", "0.500", "0.000", "+0.500"]
  assert lines[3].split()[0] == "overall" and lines[3].split()[-1] == "2"
