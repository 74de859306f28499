"""launch.sweep_report on fabricated sweep directories: results.csv's rows, results.md's cells, the paired bootstrap,
the best mark's conditions, the plots, metrics.jsonl read robustly and avg@k from eval_samples.json."""

import csv
import json
import os

import numpy as np
import pytest

from launch import sweep, sweep_report

ENVS = ("maze", "babyai")
P00 = "rollout_ratio=0.0,train_sample_mode=allkeep"
P01 = "rollout_ratio=0.0,train_sample_mode=hybrid"
P10 = "rollout_ratio=0.5,train_sample_mode=allkeep"
P11 = "rollout_ratio=0.5,train_sample_mode=hybrid"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def eval_results(successes: dict[str, list[list[int]]], *, num_samples: int = 1, temperature: float = 0.0,
                 policy_step: int = 20, selected_on: str = "val") -> dict:
  """An evaluation as write_eval_results writes it: successes[env][task] lists one 0/1 per sample."""
  envs, episodes = {}, []
  for env, tasks in successes.items():
    flat = [s for task in tasks for s in task]
    envs[env] = {"num_tasks": len(tasks), "num_episodes": len(flat), "num_failed": 0, "num_truncated": 0,
                 "success": float(np.mean(flat)), "reward": float(np.mean(flat)), "turns": 5.0, "errors": []}
    episodes += [{"env": env, "index": i, "sample": j, "success": bool(s), "reward": float(s), "turns": 5,
                  "failed": False, "error": None} for i, task in enumerate(tasks) for j, s in enumerate(task)]
  overall = {"success": float(np.mean([e["success"] for e in envs.values()])),
             "reward": float(np.mean([e["reward"] for e in envs.values()])),
             "num_tasks": sum(e["num_tasks"] for e in envs.values())}
  return {"split": "eval", "num_samples": num_samples, "temperature": temperature, "envs": envs,
          "overall": overall, "episodes": episodes, "policy_step": policy_step, "selected_on": selected_on}


def greedy(maze: list[int], babyai: list[int], **kwargs) -> dict:
  return eval_results({"maze": [[s] for s in maze], "babyai": [[s] for s in babyai]}, **kwargs)


def write(path: str, data) -> None:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "w") as f:
    f.write(data if isinstance(data, str) else json.dumps(data))


def make_sweep(root: str, points: list[str], seeds: list[int]) -> None:
  jobs = []
  for point in points:
    for seed in seeds:
      swept = dict(item.split("=") for item in point.split(","))
      jobs.append({"name": f"{point}/seed={seed}", "point": point, "seed": seed, "swept": swept,
                   "gin_bindings": [], "command": ["python", "-m", "launch.train"]})
  write(os.path.join(root, "sweep.json"), {
      "version": 1, "gin_files": ["gin_configs/runs/grpo.gin"], "gin_bindings": ["TRAIN_STEPS=20"], "seeds": seeds,
      "axes": [{"names": ["rollout_ratio"], "values": [["0.0"], ["0.5"]]},
               {"names": ["train_sample_mode"], "values": [["'allkeep'"], ["'hybrid'"]]}],
      "jobs": jobs})


def make_job(root: str, point: str, seed: int, *, state: str | None = "done", result: dict | None = None,
             samples: dict | None = None, metrics: list[dict] | None = None, wall_s: float = 100.0) -> None:
  job_dir = os.path.join(root, point, f"seed={seed}")
  os.makedirs(job_dir, exist_ok=True)
  if state is not None:
    write(os.path.join(job_dir, "job_status.json"),
          {"state": state, "returncode": 0 if state == "done" else 1, "wall_s": wall_s, "log_tail": ""})
  if result is not None:
    write(os.path.join(job_dir, "eval_results.json"), result)
  if samples is not None:
    write(os.path.join(job_dir, "eval_samples.json"), samples)
  if metrics is not None:
    write(os.path.join(job_dir, "metrics.jsonl"), "".join(json.dumps(m) + "\n" for m in metrics))


def curve(peak: float) -> list[dict]:
  return [{"step": s, "loss": 1.0 / s, "rollout/success": s / 20, "rollout/reward": s / 10,
           "memory/peak_rss_gb": peak - 1 + s / 10} for s in (1, 5, 10)]


@pytest.fixture(name="grid")
def fixture_grid(tmp_path):
  """A 2x2 grid x 2 seeds: P01 seed 1 failed, P10 seed 1 never ran; P11 is clearly best, with avg@4 recorded."""
  root = str(tmp_path / "sweep")
  make_sweep(root, [P00, P01, P10, P11], [0, 1])
  make_job(root, P00, 0, result=greedy([1, 0, 0, 0, 0], [0, 0, 0, 0, 0]), metrics=curve(3.0), wall_s=120.5)
  make_job(root, P00, 1, result=greedy([1, 1, 0, 0, 0], [1, 0, 0, 0, 0]), metrics=curve(3.2))
  make_job(root, P01, 0, result=greedy([1, 1, 0, 0, 0], [1, 0, 0, 0, 0], policy_step=15), metrics=curve(2.0))
  make_job(root, P01, 1, state="failed", metrics=curve(2.5)[:1], wall_s=7.0)
  make_job(root, P10, 0, result=greedy([1, 0, 1, 0, 0], [1, 0, 0, 0, 0], selected_on="last step"))
  make_job(root, P11, 0, result=greedy([1, 1, 1, 1, 1], [1, 1, 0, 1, 0]), metrics=curve(4.0),
           samples=eval_results({"maze": [[1, 1, 0, 1]] * 5, "babyai": [[1, 0, 0, 0]] * 5}, num_samples=4,
                                temperature=1.0))
  make_job(root, P11, 1, result=greedy([1, 1, 1, 1, 0], [1, 1, 1, 0, 0]), metrics=curve(4.5),
           samples=eval_results({"maze": [[1, 1, 1, 1]] * 5, "babyai": [[1, 0, 0, 0]] * 5}, num_samples=4,
                                temperature=1.0))
  return root


def read_csv(root: str) -> list[list[str]]:
  with open(os.path.join(root, "results.csv"), newline="") as f:
    return list(csv.reader(f))


def table_rows(text: str) -> dict[str, list[str]]:
  """results.md's table: the first cell (point, best mark removed) -> the other cells."""
  rows = {}
  for line in text.splitlines():
    if line.startswith("| ") and not line.startswith("| point"):
      cells = [c.strip() for c in line.strip("|").split("|")]
      rows[cells[0].replace(sweep_report.BEST_MARK, "").strip()] = cells[1:]
  return rows


def test_csv_rows_and_columns(grid):
  out = sweep_report.report(grid)
  rows = read_csv(grid)
  assert rows[0] == ["point", "rollout_ratio", "train_sample_mode", "seed", "state", "success_maze",
                     "success_babyai", "success_overall", "k", "avg@k_overall", "policy_step", "selected_on",
                     "wall_s", "peak_rss_gb"]
  assert rows[0] == out["columns"]
  assert rows[1:] == [
      [P00, "0.0", "allkeep", "0", "done", "0.2", "0.0", "0.1", "", "", "20", "val", "120.5", "3.0"],
      [P00, "0.0", "allkeep", "1", "done", "0.4", "0.2", "0.30000000000000004", "", "", "20", "val", "100.0",
       "3.2"],
      [P01, "0.0", "hybrid", "0", "done", "0.4", "0.2", "0.30000000000000004", "", "", "15", "val", "100.0", "2.0"],
      [P01, "0.0", "hybrid", "1", "failed", "", "", "", "", "", "", "", "7.0", "1.6"],
      [P10, "0.5", "allkeep", "0", "done", "0.4", "0.2", "0.30000000000000004", "", "", "20", "last step",
       "100.0", ""],
      [P10, "0.5", "allkeep", "1", "missing", "", "", "", "", "", "", "", "", ""],
      [P11, "0.5", "hybrid", "0", "done", "1.0", "0.6", "0.8", "4", "0.5", "20", "val", "100.0", "4.0"],
      [P11, "0.5", "hybrid", "1", "done", "0.8", "0.6", "0.7", "4", "0.625", "20", "val", "100.0", "4.5"],
  ]
  assert out["rows"][3]["success_overall"] is None and out["rows"][5]["wall_s"] is None  # not 0


def test_markdown_cells(grid):
  out = sweep_report.report(grid, baseline=P00)
  with open(os.path.join(grid, "results.md")) as f:
    text = f.read()
  assert text == out["markdown"]
  assert "- seeds: 0, 1" in text
  assert "- eval tasks per env: maze 5, babyai 5" in text
  assert "- jobs: 6 done, 1 failed, 1 missing (8 in all)" in text
  rows = table_rows(text)
  assert list(rows) == [P00, P01, P10, P11]
  # maze .2/.4: mean .3, std .141; babyai 0/.2: .1 +- .141; overall .1/.3: .2 +- .141.
  assert rows[P00][:4] == [".300 +- .141", ".100 +- .141", ".200 +- .141", ".100 .300"]
  assert rows[P00][5] == "baseline"
  assert rows[P01][:4] == [".400 (n=1)", ".200 (n=1)", ".300 (n=1)", ".300 failed"]
  assert rows[P10][:4] == [".400 (n=1)", ".200 (n=1)", ".300 (n=1)", ".300 missing"]
  assert rows[P11][:5] == [".900 +- .141", ".600 +- .000", ".750 +- .071", ".800 .700", ".562 +- .088"]
  assert "| point | maze | babyai | overall | overall per seed (s0 s1) | avg@4 |" in text
  points = {p["point"]: p for p in out["points"]}
  assert points[P11]["mean"]["overall"] == pytest.approx(0.75)
  assert points[P11]["std"]["overall"] == pytest.approx(np.std([0.8, 0.7], ddof=1))
  assert points[P01]["std"]["overall"] is None and points[P01]["n"]["overall"] == 1
  assert points[P01]["per_seed"]["overall"] == {0: pytest.approx(0.3), 1: None}
  assert points[P00]["diff"] is None and points[P00]["avg_k"] is None
  assert points[P11]["avg_k"] == {"k": 4, "mean": pytest.approx(0.5625), "std": pytest.approx(np.std([.5, .625],
                                                                                                     ddof=1)), "n": 2}
  # P11 vs P00, paired over both seeds: 20 pairs, mean (15 - 4) / 20 = .55.
  d = points[P11]["diff"]
  assert (d["pairs"], d["tasks"], d["mean"]) == (20, 10, pytest.approx(0.55))
  assert rows[P11][5] == f"+.550 [{sweep_report._f(d['lo'], True)}, {sweep_report._f(d['hi'], True)}]"
  assert 0 < d["lo"] < 0.55 < d["hi"]
  assert points[P01]["diff"]["pairs"] == 10  # seed 0 only: seed 1 failed


def test_no_result_is_never_zero(tmp_path):
  root = str(tmp_path / "sweep")
  make_sweep(root, [P00, P01, P10, P11], [0, 1])
  make_job(root, P00, 0, result=greedy([1, 0], [0, 0]))
  make_job(root, P00, 1, result=greedy([1, 1], [0, 0]))
  make_job(root, P01, 0, state="failed")
  make_job(root, P01, 1, state="failed", result=greedy([1, 1], [1, 1]))  # stale: an earlier attempt's
  make_job(root, P11, 0, state=None, metrics=curve(1.0))  # running, or cut off before writing its status
  make_job(root, P11, 1, state="interrupted")
  out = sweep_report.report(root, baseline=P00)
  rows = table_rows(out["markdown"])
  assert rows[P01][:4] == ["failed", "failed", "failed", "failed failed"]
  assert rows[P01][4] == "no paired episodes"  # (no avg@k column: none recorded)
  assert rows[P10][:4] == ["missing", "missing", "missing", "missing missing"]
  assert rows[P11][:4] == ["interrupted", "interrupted", "interrupted", "incomplete interrupted"]
  assert [r["state"] for r in out["rows"]] == ["done", "done", "failed", "failed", "missing", "missing",
                                                "incomplete", "interrupted"]
  assert all(r["success_overall"] is None for r in out["rows"][2:])
  assert "- jobs: 2 done, 2 failed, 1 interrupted, 1 incomplete, 2 missing (8 in all)" in out["markdown"]
  assert out["best"] is None and "Nothing is marked: the baseline itself" in out["note"]


def test_paired_bootstrap():
  groups = np.repeat(np.arange(6), 3)
  assert sweep_report.paired_bootstrap(np.zeros(18), groups) == (0.0, 0.0, 0.0)
  mean, lo, hi = sweep_report.paired_bootstrap(np.ones(18), groups)
  assert (mean, lo, hi) == (1.0, 1.0, 1.0)
  assert sweep_report.paired_bootstrap(np.zeros(0), np.zeros(0, int)) is None

  rng = np.random.default_rng(123)
  diffs = rng.choice([-1.0, 0.0, 1.0], size=40, p=[0.2, 0.5, 0.3])
  groups = rng.integers(0, 15, size=40)
  groups[:15] = np.arange(15)  # every task has a pair
  mean, lo, hi = sweep_report.paired_bootstrap(diffs, groups)
  # Directly: the tasks drawn with replacement, 10,000 times, the mean over their pairs; percentile interval.
  draws = np.random.default_rng(0).integers(0, 15, size=(10_000, 15))
  sums = np.array([diffs[groups == g].sum() for g in range(15)])
  counts = np.array([(groups == g).sum() for g in range(15)])
  stats = sums[draws].sum(1) / counts[draws].sum(1)
  assert mean == pytest.approx(diffs.mean())
  assert (lo, hi) == pytest.approx(tuple(np.percentile(stats, [2.5, 97.5])), abs=1e-12)
  assert lo < mean < hi
  # Same seed, same interval; a mostly better point has a positive lower end.
  assert sweep_report.paired_bootstrap(diffs, groups) == (mean, lo, hi)
  better = np.where(np.arange(40) % 8 == 0, 0.0, 1.0)
  assert sweep_report.paired_bootstrap(better, groups)[1] > 0


def test_best_mark_conditions(grid, tmp_path):
  out = sweep_report.report(grid, baseline=P00)
  assert out["best"] == P11
  assert [p["best"] for p in out["points"]] == [False, False, False, True]
  assert f"| {P11} {sweep_report.BEST_MARK} |" in out["markdown"]
  assert out["markdown"].rstrip().endswith(out["note"]) and "Nothing is marked" not in out["note"]

  # Without a baseline: nothing is marked, and the note says why.
  out = sweep_report.report(grid)
  assert out["best"] is None and "no baseline given" in out["note"] and sweep_report.BEST_MARK + " |" not in \
      out["markdown"]

  # One seed: no spread to beat, so no mark, however large the gain.
  root = str(tmp_path / "one_seed")
  make_sweep(root, [P00, P11], [0])
  make_job(root, P00, 0, result=greedy([0, 0, 0, 0], [0, 0, 0, 0]))
  make_job(root, P11, 0, result=greedy([1, 1, 1, 1], [1, 1, 1, 1]))
  out = sweep_report.report(root, baseline=P00)
  assert out["points"][1]["diff"]["lo"] > 0
  assert out["best"] is None and "no seed spread" in out["note"]
  assert table_rows(out["markdown"])[P11][:3] == ["1.000 (n=1)", "1.000 (n=1)", "1.000 (n=1)"]

  # A gain within the seed spread: no mark.
  root = str(tmp_path / "noisy")
  make_sweep(root, [P00, P11], [0, 1])
  make_job(root, P00, 0, result=greedy([0, 0, 0, 0], [0, 0, 0, 0]))
  make_job(root, P00, 1, result=greedy([1, 1, 0, 0], [1, 1, 0, 0]))
  make_job(root, P11, 0, result=greedy([1, 0, 0, 0], [1, 0, 0, 0]))
  make_job(root, P11, 1, result=greedy([1, 1, 1, 0], [1, 1, 1, 0]))
  out = sweep_report.report(root, baseline=P00)
  assert out["best"] is None and "not larger than the seed spread" in out["note"]

  # A gain beyond the spread whose interval reaches 0: no mark.
  root = str(tmp_path / "wide")
  make_sweep(root, [P00, P11], [0, 1])
  make_job(root, P00, 0, result=greedy([0, 1, 0, 1], [0, 0, 0, 0]))
  make_job(root, P00, 1, result=greedy([0, 1, 0, 1], [0, 0, 0, 0]))
  make_job(root, P11, 0, result=greedy([1, 0, 1, 1], [1, 0, 0, 0]))
  make_job(root, P11, 1, result=greedy([1, 0, 1, 1], [0, 1, 0, 0]))
  out = sweep_report.report(root, baseline=P00)
  assert out["points"][1]["diff"]["lo"] <= 0
  assert out["best"] is None and "interval is not above 0" in out["note"]

  with pytest.raises(ValueError, match="not a point of this sweep"):
    sweep_report.report(root, baseline="rollout_ratio=9")


def test_plots_are_png(grid):
  out = sweep_report.report(grid, baseline=P00)
  plots = os.path.join(grid, "plots")
  names = sorted(os.listdir(plots))
  assert names == ["curve_rollout_reward.png", "curve_rollout_success.png", "success_babyai.png",
                   "success_maze.png", "success_overall.png"]
  assert sorted(os.path.basename(f) for f in out["files"] if f.endswith(".png")) == names
  for name in names:
    with open(os.path.join(plots, name), "rb") as f:
      data = f.read()
    assert data.startswith(PNG_SIGNATURE) and len(data) > 5_000, name
  assert {os.path.basename(f) for f in out["files"]} >= {"results.csv", "results.md"}


def test_metrics_last_line_wins_and_partial_line():
  text = "\n".join([json.dumps({"step": 1, "loss": 2.0, "memory/peak_rss_gb": 9.0}),
                    json.dumps({"step": 2, "loss": 1.5}),
                    "",
                    json.dumps({"step": 1, "loss": 1.9, "memory/peak_rss_gb": 3.0}),  # resumed: step 1 again
                    json.dumps({"step": 2, "eval/overall/success": 0.4}),
                    '{"step": 3, "loss": 1.'])  # cut off mid-write
  assert sweep_report.parse_metrics(text) == {1: {"loss": 1.9, "memory/peak_rss_gb": 3.0},
                                              2: {"loss": 1.5, "eval/overall/success": 0.4}}


def test_resumed_metrics_in_row(tmp_path):
  root = str(tmp_path / "sweep")
  make_sweep(root, [P00], [0])
  make_job(root, P00, 0, result=greedy([1, 0], [1, 1]))
  with open(os.path.join(root, P00, "seed=0", "metrics.jsonl"), "w") as f:
    f.write('{"step": 1, "memory/peak_rss_gb": 8.0}\n{"step": 2, "memory/peak_rss_gb": 2.0}\n'
            '{"step": 1, "memory/peak_rss_gb": 1.5}\n{"step": 2, "memo')
  assert sweep_report.report(root)["rows"][0]["peak_rss_gb"] == 2.0


def test_avg_k_from_eval_samples(tmp_path):
  root = str(tmp_path / "sweep")
  make_sweep(root, [P00, P01], [0])
  # P00: a greedy evaluation and avg@3 beside it; P01: its only evaluation is sampled (avg@2): no greedy figures.
  make_job(root, P00, 0, result=greedy([1, 0], [1, 1]),
           samples=eval_results({"maze": [[1, 0, 0], [1, 1, 1]], "babyai": [[0, 0, 0], [1, 0, 0]]}, num_samples=3,
                                temperature=1.0))
  make_job(root, P01, 0, result=eval_results({"maze": [[1, 0], [0, 0]], "babyai": [[1, 1], [0, 0]]},
                                             num_samples=2, temperature=0.8))
  out = sweep_report.report(root)
  a, b = out["rows"]
  assert (a["success_overall"], a["k"], a["avg@k_overall"]) == (0.75, 3, pytest.approx((4 / 6 + 1 / 6) / 2))
  assert (b["success_overall"], b["success_maze"], b["k"], b["avg@k_overall"]) == (None, None, 2, 0.375)
  assert "| point | maze | babyai | overall | overall per seed (s0) | avg@k |" in out["markdown"]
  rows = table_rows(out["markdown"])
  assert rows[P00][4] == ".417 (n=1) (k=3)" and rows[P01][4] == ".375 (n=1) (k=2)"
  assert rows[P01][:4] == ["no eval", "no eval", "no eval", "-"]


def test_no_sweep(tmp_path):
  with pytest.raises(FileNotFoundError, match="no sweep here"):
    sweep_report.report(str(tmp_path))


def test_real_evaluation_file(tmp_path):
  """An evaluation the train loop wrote (results/shared_bc): the figures as recorded, 400 episodes paired."""
  source = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "results",
                        "shared_bc", "eval_results.json")
  with open(source) as f:
    recorded = json.load(f)
  root = str(tmp_path / "sweep")
  make_sweep(root, [P00, P11], [0])
  make_job(root, P00, 0, result=recorded)
  make_job(root, P11, 0, result=recorded)
  out = sweep_report.report(root, baseline=P00)
  row = out["rows"][0]
  assert out["envs"] == list(recorded["envs"])
  assert row["success_overall"] == recorded["overall"]["success"]
  assert [row[f"success_{env}"] for env in out["envs"]] == [e["success"] for e in recorded["envs"].values()]
  assert out["points"][1]["diff"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "pairs": 400, "tasks": 400}
  assert "- eval tasks per env: maze 100, babyai 100, sql 100, textcraft 100" in out["markdown"]


def test_one_string_axis(tmp_path):
  """One swept name with text values: the success plot has categories on x and a single line."""
  root = str(tmp_path / "sweep")
  points = ["mode=allkeep", "mode=hybrid", "mode=discard"]
  make_sweep(root, points, [0, 1])
  for i, point in enumerate(points):
    for seed in (0, 1):
      make_job(root, point, seed, result=greedy([1] * (i + seed) + [0] * (4 - i - seed), [0, 0, 0, 1]))
  out = sweep_report.report(root, baseline="mode=allkeep")
  assert out["swept"] == ["mode"] and out["columns"][:3] == ["point", "mode", "seed"]
  assert [p["mean"]["maze"] for p in out["points"]] == [0.125, 0.375, 0.625]
  with open(os.path.join(root, "plots", "success_overall.png"), "rb") as f:
    assert f.read(8) == PNG_SIGNATURE
  assert not any("curve_" in f for f in out["files"])  # no job recorded metrics


def test_a_job_without_a_status_is_done_when_it_wrote_its_evaluation():
  # (a job run by a scheduler from its bare launch.train line writes no job_status.json)
  assert sweep_report.job_state(None, has_metrics=True, has_eval=True) == "done"
  assert sweep_report.job_state(None, has_metrics=True, has_eval=False) == "incomplete"
  assert sweep_report.job_state(None, has_metrics=False, has_eval=False) == "missing"
  assert sweep_report.job_state({"state": "failed"}, has_metrics=True, has_eval=True) == "failed"


# ---------------------------------------------------------------------------------------- --baseline_eval DIR


def sampled(maze: list[list[int]], babyai: list[list[int]], **kwargs) -> dict:
  """An avg@k evaluation (k = samples per task) at temperature 1, seed 0, as `launch.eval --with_greedy` writes."""
  return {**eval_results({"maze": maze, "babyai": babyai}, num_samples=len(maze[0]), temperature=1.0), "seed": 0,
          **kwargs}


BASE_GREEDY = ([1, 0, 0, 1, 0], [0, 1, 0, 0, 0])
BASE_SAMPLED = ([[1, 0, 0, 0]] * 5, [[0, 0, 1, 0]] * 5)


@pytest.fixture(name="fixed_start")
def fixture_fixed_start(tmp_path, monkeypatch):
  """A sweep of P00 (identical to the baseline evaluation, both seeds) and P11 (better on every episode, seed 1 one
  episode less), and the baseline's evaluation in evals/bc (relative to the working directory, as given)."""
  monkeypatch.chdir(tmp_path)
  root = "sweep"
  make_sweep(root, [P00, P11], [0, 1])
  for seed in (0, 1):
    make_job(root, P00, seed, result=greedy(*BASE_GREEDY), samples=sampled(*BASE_SAMPLED))
  make_job(root, P11, 0, result=greedy([1] * 5, [1] * 5), samples=sampled([[1] * 4] * 5, [[1] * 4] * 5))
  make_job(root, P11, 1, result=greedy([1] * 5, [1, 1, 1, 1, 0]), samples=sampled([[1] * 4] * 5, [[1] * 4] * 5))
  write("evals/bc/eval_results.json", greedy(*BASE_GREEDY, policy_step=None, selected_on=None))
  write("evals/bc/eval_samples.json", sampled(*BASE_SAMPLED))
  return root


def test_baseline_eval_row_and_differences(fixed_start, tmp_path):
  out = sweep_report.report(fixed_start, baseline_eval="evals/bc")
  label = "baseline_eval: evals/bc"
  points = {p["point"]: p for p in out["points"]}
  assert list(points) == [label, P00, P11] and points[label]["fixed"]
  # The baseline row: first in results.md and results.csv, its figures as one "seed".
  rows = table_rows(out["markdown"])
  assert list(rows) == [label, P00, P11]
  assert rows[label][:5] == [".400 (n=1)", ".200 (n=1)", ".300 (n=1)", ".300 (one evaluation)", ".250 (n=1)"]
  assert rows[label][5:] == ["baseline", "baseline"]
  assert read_csv(fixed_start)[1] == [label, "", "", "", "done", "0.4", "0.2", "0.30000000000000004", "4", "0.25",
                                      "", "", "", ""]
  assert out["rows"][0]["point"] == label and [r["point"] for r in out["rows"][1:]] == [P00, P00, P11, P11]
  assert f"- baseline: {label} (one evaluation outside the sweep" in out["markdown"]
  assert str(tmp_path) not in out["markdown"] and str(tmp_path) not in "".join(map(str, read_csv(fixed_start)))
  # A point identical to the baseline: 0 [0, 0], greedy and avg@k, every seed paired with the one evaluation.
  assert points[P00]["diff"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "pairs": 20, "tasks": 10}
  assert points[P00]["avg_k_diff"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0, "pairs": 80, "tasks": 10}
  assert rows[P00][5:] == ["+.000 [+.000, +.000]", "+.000 [+.000, +.000]"]
  # A point better on every episode (seed 1: all but one): a positive difference, its interval above 0.
  d, a = points[P11]["diff"], points[P11]["avg_k_diff"]
  assert (d["pairs"], d["mean"]) == (20, pytest.approx(((1 - .4) * 2 + (1 - .2) + (.8 - .2)) / 4))
  assert 0 < d["lo"] <= d["mean"] <= d["hi"] and a["lo"] > 0 and a["mean"] == pytest.approx(((1 - .25) * 2) / 2)
  # Marked: the gain (.65) beyond P11's own seed spread (.071; the baseline is one evaluation) and the interval.
  assert out["best"] == P11 and "the baseline is one evaluation" in out["note"]
  assert "each seed's episodes paired with the baseline evaluation's by (env, index, sample)" in out["markdown"]
  with open(os.path.join(fixed_start, "plots", "success_overall.png"), "rb") as f:
    assert f.read(8) == PNG_SIGNATURE


def test_baseline_eval_one_seed_is_not_marked(tmp_path):
  root = str(tmp_path / "sweep")
  make_sweep(root, [P11], [0])
  make_job(root, P11, 0, result=greedy([1] * 4, [1] * 4))
  write(str(tmp_path / "bc" / "eval_results.json"), greedy([0] * 4, [0] * 4))
  out = sweep_report.report(root, baseline_eval=str(tmp_path / "bc"))
  assert out["points"][1]["diff"]["lo"] > 0
  assert out["best"] is None and "fewer than 2 seeds of it" in out["note"]


@pytest.mark.parametrize("kind, setting, message", [
    ("eval_samples.json", {"temperature": 0.8}, "temperature 1.0 vs 0.8"),
    ("eval_samples.json", {"seed": 3}, "seed 0 vs 3"),
    ("eval_samples.json", {"num_samples": 8}, "num_samples 4 vs 8"),
    ("eval_results.json", {"split": "train"}, "split 'eval' vs 'train'"),
])
def test_baseline_eval_not_paired_is_refused(fixed_start, kind, setting, message):
  path = os.path.join("evals/bc", kind)
  with open(path) as f:
    data = json.load(f)
  write(path, {**data, **setting})
  with pytest.raises(ValueError, match="baseline_eval: evals/bc: not paired") as error:
    sweep_report.report(fixed_start, baseline_eval="evals/bc")
  assert f"{P00}/seed=0 (" in str(error.value) and message in str(error.value)
  assert not os.path.exists(os.path.join(fixed_start, "results.md"))


def test_baseline_eval_missing_and_both_baselines_refused(fixed_start):
  with pytest.raises(FileNotFoundError, match="--baseline_eval evals/none: no evaluation there"):
    sweep_report.report(fixed_start, baseline_eval="evals/none")
  with pytest.raises(ValueError, match="mutually exclusive"):
    sweep_report.report(fixed_start, baseline=P00, baseline_eval="evals/bc")
  with pytest.raises(SystemExit) as error:
    sweep.main(["--root", fixed_start, "--report", "--baseline", P00, "--baseline_eval", "evals/bc"])
  assert error.value.code == 2  # argparse: not allowed with argument --baseline


def test_baseline_eval_flag_reaches_report(fixed_start, monkeypatch):
  calls = []
  with monkeypatch.context() as patch:
    patch.setattr(sweep_report, "report", lambda root, **kwargs: calls.append((root, kwargs)))
    assert sweep.main(["--root", fixed_start, "--report", "--baseline_eval", "evals/bc"]) == 0
  assert calls == [(fixed_start, {"baseline": None, "baseline_eval": "evals/bc", "policy": "selected"})]
  # A refusal exits with its message.
  write("evals/bc/eval_results.json", {**greedy(*BASE_GREEDY), "split": "train"})
  with pytest.raises(SystemExit, match=r"launch.sweep --report: baseline_eval: evals/bc: not paired"):
    sweep.main(["--root", fixed_start, "--report", "--baseline_eval", "evals/bc"])


def test_the_last_policy_s_report_reads_its_own_files(fixed_start, monkeypatch):
  # P11's val kept its start (its selected evaluation equals the baseline); its last policy is better on every
  # episode. P00 kept no last-policy evaluation (a run without LoopConfig.eval_last): no figures, not zeros.
  for seed in (0, 1):
    write(os.path.join(fixed_start, P11, f"seed={seed}", "eval_results.json"), greedy(*BASE_GREEDY))
    write(os.path.join(fixed_start, P11, f"seed={seed}", "eval_samples.json"), sampled(*BASE_SAMPLED))
    last = os.path.join(fixed_start, P11, f"seed={seed}")
    write(os.path.join(last, "eval_results_last.json"), greedy([1] * 5, [1] * 5, selected_on="last step (eval_last)"))
    write(os.path.join(last, "eval_samples_last.json"), sampled([[1] * 4] * 5, [[1] * 4] * 5))
  selected = sweep_report.report(fixed_start, baseline_eval="evals/bc")
  assert {p["point"]: p["diff"]["mean"] for p in selected["points"] if not p["fixed"]} == {P00: 0.0, P11: 0.0}
  last = sweep_report.report(fixed_start, baseline_eval="evals/bc", policy="last")
  points = {p["point"]: p for p in last["points"]}
  assert points[P11]["diff"]["mean"] == pytest.approx(((1 - .4) + (1 - .2)) / 2) and points[P11]["diff"]["lo"] > 0
  rows = table_rows(last["markdown"])
  assert rows[P00][:3] == ["no eval", "no eval", "no eval"]
  assert last["markdown"].startswith("# Sweep sweep: the last policy of each job")
  assert "LoopConfig.eval_last" in last["markdown"]
  assert sorted(os.path.basename(f) for f in last["files"]) == ["results_last.csv", "results_last.md"]
  with open(os.path.join(fixed_start, "results.md")) as f:
    assert f.read() == selected["markdown"]  # the selected policy's report is left as it was
  with pytest.raises(ValueError, match="policy must be one of"):
    sweep_report.report(fixed_start, policy="best")
  calls = []
  monkeypatch.setattr(sweep_report, "report", lambda root, **kw: calls.append(kw) or {})
  sweep.main(["--root", fixed_start, "--report", "--policy", "last"])
  assert calls[-1]["policy"] == "last"
