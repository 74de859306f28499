"""A GRPO run through launch.train's gin plumbing, with a test extension and a test advantage function bound in:
run by test_rl_extensions.py in a subprocess (so that a fault-injected SIGKILL takes only this process).

  python tests/train/rl_extension_run.py OUT.json --gin_file=gin_configs/runs/grpo.gin --gin_bindings=...

The extension adds a hint to the opening of every even sample of a task (odd samples keep theirs), records the
RL steps it saw and how many of their rollouts had the hint, and keeps that record in every checkpoint. The
advantage function gives each rollout's first turn its GRPO advantage and every later turn 0, and counts its
calls in the extension's record. OUT.json gets the final record.
"""

import json
import sys

import gin
import numpy as np

from evolver.data.trajectory import Message
from evolver.rollout import OpeningChange
from evolver.train import advantages, gin_config
from evolver.train.extensions import RLExtension

HINT = "\n\nHint added by the test extension."


class HintExtension(RLExtension):
  name = "hints"
  added_keys = ("hint",)

  def __init__(self):
    self.record = {"steps": [], "with_hint": [], "advantage_calls": 0}

  def __deepcopy__(self, memo):
    return self  # gin copies bound values; the run must use this instance, which the advantage function counts on

  def transform_openings(self, step, openings, *, validating=False):
    return [None if o.sample % 2 else
            OpeningChange(o.messages[:-1] + [Message("user", o.messages[-1].content + HINT)], {"hint": HINT})
            for o in openings]

  def after_step(self, step, rollouts):
    self.record["steps"].append(step)
    self.record["with_hint"].append(sum(r.added.get("hint") == HINT for r in rollouts))
    return {"with_hint": self.record["with_hint"][-1]}

  def state_files(self):
    return {"record.json": json.dumps(self.record).encode()}

  def load_state_files(self, files):
    if files:
      self.record = json.loads(files["record.json"])


EXTENSION = HintExtension()


def first_turn_advantages(rollouts, *, step):
  EXTENSION.record["advantage_calls"] += 1
  outcome = advantages.grpo_turn_advantages(rollouts, step=step).advantages
  return advantages.TurnCredit(
      [np.where(np.arange(len(values)) == 0, values, 0.0).astype(np.float32) for values in outcome],
      {"first_step": step})


def main(argv):
  out, flags = argv[0], argv[1:]
  files = [f.split("=", 1)[1] for f in flags if f.startswith("--gin_file=")]
  bindings = [b.split("=", 1)[1] for b in flags if b.startswith("--gin_bindings=")]
  gin_config.parse(files, bindings)
  gin.bind_parameter("train_grpo.extensions", [EXTENSION])
  gin.bind_parameter("train_grpo.advantage_fn", first_turn_advantages)
  gin_config.run()
  with open(out, "w") as f:
    json.dump(EXTENSION.record, f)


if __name__ == "__main__":
  main(sys.argv[1:])
