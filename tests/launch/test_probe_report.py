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
