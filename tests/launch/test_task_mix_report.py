"""launch.task_mix_report: a run's training-time success beside its step's task mix, from hand-made records."""

import json

import numpy as np
import pytest

from evolver.train.slices import draw_tasks
from launch import task_mix_report

CONFIG = """SEED = 3
train_grpo.envs = ['maze',
 'sql']
train_grpo.extensions = []
train_grpo.seed = %SEED
train_grpo.task_source = None
train_grpo.tasks_per_step = 6
TaskSlices.explore_count = 40
TaskSlices.explore_start = 80
"""


def make_run(path, config=CONFIG, steps=4):
  path.mkdir(parents=True)
  (path / "operative_config.gin").write_text(config)
  rows = [{"step": 0, "val/success": 0.5}] + [{"step": s, "rollout/success": 0.1 * s} for s in range(1, steps + 1)]
  (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  return path


def test_the_prediction_is_the_start_s_rate_over_each_step_s_draw(tmp_path):
  run = make_run(tmp_path / "run")
  rows = task_mix_report.task_mix(str(run), {"maze": 1.0, "sql": 0.0})
  assert [r["step"] for r in rows] == [1, 2, 3, 4] and [r["observed"] for r in rows] == pytest.approx([.1, .2, .3, .4])
  for r in rows:  # logged step s drew with index s - 1, from the run's seed, slice and tasks per step
    tasks = draw_tasks(["maze", "sql"], 80, 40, 6, 3, r["step"] - 1)
    maze = sum(t.env == "maze" for t in tasks)
    assert r["mix"] == {"maze": maze, "sql": 6 - maze} and r["predicted"] == pytest.approx(maze / 6)
  assert len({tuple(r["mix"].values()) for r in rows}) > 1  # the draws differ by step
  text = task_mix_report.report([str(run)], {"maze": 1.0, "sql": 0.0})
  predicted = " ".join(f"{r['predicted']:.2f}" for r in rows)
  assert f"| 0.10 0.20 0.30 0.40 | {predicted} |" in text
  assert f"{np.corrcoef([.1, .2, .3, .4], [r['predicted'] for r in rows])[0, 1]:+.2f}" in text


def test_runs_whose_tasks_are_not_the_uniform_draw_and_missing_rates_are_refused(tmp_path):
  with pytest.raises(ValueError, match="task source"):
    task_mix_report.task_mix(str(make_run(tmp_path / "a", CONFIG.replace("= None", "= @ShuffledTasks()"))), {})
  with pytest.raises(ValueError, match="self-questioning"):
    task_mix_report.task_mix(str(make_run(tmp_path / "b", CONFIG.replace("extensions = []",
                                                                         "extensions = [@SyntheticTasks()]"))), {})
  with pytest.raises(ValueError, match="no rate for \\['sql'\\]"):
    task_mix_report.task_mix(str(make_run(tmp_path / "c")), {"maze": 0.5})
  with pytest.raises(ValueError, match="ENV=RATE"):
    task_mix_report.parse_rates("maze:0.5")
