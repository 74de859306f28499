"""launch.probe_report: each job's val against the start's, paired, from hand-made records."""

import json

from launch import probe_report


def val(step, successes):
  episodes = [{"env": env, "index": i, "sample": s, "success": successes[env], "reward": float(successes[env]),
               "failed": False} for env in ("maze", "babyai") for i in range(3) for s in range(2)]
  return {"step": step, "num_samples": 2, "temperature": 1.0, "seed": 0, "episodes": episodes}


def test_the_probe_table_pairs_each_val_with_the_start(tmp_path):
  (tmp_path / "start").mkdir()
  (tmp_path / "start" / "step_0.json").write_text(json.dumps(val(0, {"maze": 0, "babyai": 0})))
  job = tmp_path / "learning_rate=1e-4" / "seed=0"
  (job / "val").mkdir(parents=True)
  (job / "val" / "step_8.json").write_text(json.dumps(val(8, {"maze": 1, "babyai": 0})))
  (job / "metrics.jsonl").write_text(
      json.dumps({"step": 1, "rollout/episodes": 64}) + "\n" + json.dumps({"step": 0, "val/success": 0.0}) + "\n"
      + json.dumps({"step": 8, "kl_ref": 0.5, "update/param_change": 0.001, "rollout/episodes": 128}) + "\n")
  probe_report.main([str(tmp_path)])
  text = (tmp_path / "probe.md").read_text()
  assert "| start | 0 | 0 | 0.000 | 0.000 | 0.000 |" in text
  # maze +1 on every episode, babyai +0: the overall difference is the mean over envs, +0.5, with no spread.
  assert "| learning_rate=1e-4/seed=0 | 8 | 192 | 1.000 | 0.000 | 0.500 | +0.500 [+0.500, +0.500] | 0.500 | 0.0010 |" in text


def test_the_gain_by_the_start_s_passes(tmp_path):
  # 2 samples per task. maze: task 0 solved 0/2 at the start and 2/2 at step 8, task 1 1/2 -> 0/2, task 2 2/2 -> 2/2.
  def record(step, maze):
    episodes = [{"env": "maze", "index": i, "sample": s, "success": bool(v[s]), "reward": float(v[s]), "failed": False}
                for i, v in enumerate(maze) for s in range(2)]
    return {"step": step, "num_samples": 2, "temperature": 1.0, "seed": 0, "episodes": episodes}
  (tmp_path / "start").mkdir()
  (tmp_path / "start" / "step_0.json").write_text(json.dumps(record(0, [(0, 0), (1, 0), (1, 1)])))
  job = tmp_path / "lr" / "seed=0"
  (job / "val").mkdir(parents=True)
  (job / "val" / "step_4.json").write_text(json.dumps(record(4, [(1, 0), (0, 0), (1, 1)])))
  (job / "val" / "step_8.json").write_text(json.dumps(record(8, [(1, 1), (0, 0), (1, 1)])))
  text = probe_report.by_start_passes(str(tmp_path))
  assert "| job | step | maze: 0/2 | maze: 1/2 | maze: 2/2 |" in text
  assert "| lr/seed=0 | 8 | 1 tasks: 0.00 -> 1.00 | 1 tasks: 0.50 -> 0.00 | 1 tasks: 1.00 -> 1.00 |" in text
  # The start solved 3 of 6 samples; 2 of its 3 tasks at least once: the reachable success is 2/3.
  assert "maze 0.500 -> 0.667; overall 0.500 -> 0.667 (+0.167)" in probe_report.headroom(str(tmp_path))
