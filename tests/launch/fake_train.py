"""A stand-in for `launch.train` in the sweep's tests: the same command line, a few fast steps.

Reads MODEL_DIR and the bindings `STEPS = N` (default 3), `FAIL = True` (exits 1 at once) and `STEP_S = x`
(seconds per step, default 0.05). Resumes after the last step in MODEL_DIR/metrics.jsonl, appends one row per step,
counts its starts in MODEL_DIR/starts.txt, exits 143 on SIGTERM after the step in flight (as the train loop does),
and writes eval_results.json at the end.

  python tests/launch/fake_train.py --gin_file=X.gin --gin_bindings="MODEL_DIR = 'DIR'" --gin_bindings="STEPS = 2"
"""

import json
import os
import signal
import sys
import time


def main(argv):
  bindings = {}
  for arg in argv:
    if arg.startswith("--gin_bindings="):
      name, _, value = arg[len("--gin_bindings="):].partition("=")
      bindings[name.strip()] = value.strip().strip("'")
  model_dir = bindings["MODEL_DIR"]
  os.makedirs(model_dir, exist_ok=True)
  with open(os.path.join(model_dir, "starts.txt"), "a") as f:
    f.write("start\n")
  if bindings.get("FAIL") == "True":
    print("ValueError: a bad binding (FAIL = True)", flush=True)
    return 1
  stopping = []
  signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
  metrics = os.path.join(model_dir, "metrics.jsonl")
  done = 0
  if os.path.exists(metrics):
    with open(metrics) as f:
      done = max([json.loads(line)["step"] for line in f if line.strip()] or [0])
  steps = int(bindings.get("STEPS", 3))
  for step in range(done + 1, steps + 1):
    time.sleep(float(bindings.get("STEP_S", 0.05)))
    with open(metrics, "a") as f:
      f.write(json.dumps({"step": step, "loss": 1.0 / step, "rollout/success": step / steps}) + "\n")
    print(f"step {step}", flush=True)
    if stopping:
      print(f"preempted (SIGTERM) at step {step}", flush=True)
      return 143
  seed = int(bindings.get("SEED", 0))
  with open(os.path.join(model_dir, "eval_results.json"), "w") as f:
    json.dump({"split": "eval", "num_samples": 1, "temperature": 0.0, "policy_step": steps, "selected_on": "val",
               "envs": {"maze": {"num_tasks": 2, "success": 0.5 + 0.1 * seed}},
               "overall": {"success": 0.5 + 0.1 * seed}, "episodes": []}, f)
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
