"""The RL step's extension points: openings changed per sample and stripped for training (exp_mask), the
advantage function swapped and broadcast per turn, extension state kept in every checkpoint across a kill.

  python -m pytest tests/train/test_rl_extensions.py -q
"""

import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from evolver.data import batching
from evolver.data.trajectory import Message
from evolver.models import ModelConfig, make_model
from evolver.models.sampler import Sampler
from evolver.models.tokenizer import load_tokenizer
from evolver.rollout import EpisodeOpening, OpeningChange, RolloutConfig, RolloutEngine, Task
from evolver.train import advantages, checkpoints as ckpt_lib, credit, metrics as metrics_lib
from evolver.train.extensions import RLExtension, chain_openings
from evolver.train.trainer import KILL_DURING_SAVE_ENV
from tests.train import rl_extension_run  # the extension and advantage function the subprocess runs use
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Tag(RLExtension):
  def __init__(self, name, text):
    self.name, self.text, self.added_keys = name, text, (name,)

  def transform_openings(self, step, openings, *, validating=False):
    return [None if o.sample == 1 else
            OpeningChange(o.messages[:-1] + [Message("user", o.messages[-1].content + self.text)], {self.name: step})
            for o in openings]


def test_openings_chain_in_order_and_keys_must_not_clash():
  opening = [Message("user", "rules"), Message("assistant", "Ok."), Message("user", "task")]
  openings = [EpisodeOpening(Task("maze", 0), 0, opening), EpisodeOpening(Task("maze", 0), 1, opening)]
  changed, kept = chain_openings([Tag("a", " +a"), Tag("b", " +b")], step=7)(openings)
  assert changed.messages[-1].content == "task +a +b" and changed.added == {"a": 7, "b": 7}
  assert opening[-1].content == "task"  # the engine's opening is not changed in place
  assert kept is None  # nothing added to this sample
  assert chain_openings([], step=0) is None
  with pytest.raises(ValueError, match="both declare 'a' in added_keys"):
    chain_openings([Tag("a", " +a"), Tag("a", " +again")], step=0)(openings)
  undeclared = Tag("b", " +b")
  undeclared.added_keys = ()
  with pytest.raises(ValueError, match="records \\['b'\\] in the opening's `added` but declares added_keys"):
    chain_openings([undeclared], step=0)(openings)


@pytest.fixture(scope="module")
def hinted_rollouts():
  """Two samples of one task by a tiny random policy: sample 0 with the test hint in its opening, sample 1 without."""
  tokenizer = load_tokenizer()
  model = make_model(ModelConfig(vocab_size=2432, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                 intermediate_size=64, max_position_embeddings=2048), seed=3)
  extension = rl_extension_run.HintExtension()
  with RolloutEngine(Sampler(model, max_length=2048), tokenizer) as engine:
    rolled = engine.run([Task("maze", 5)], RolloutConfig(max_new_tokens=12, max_rounds=3, temperature=1.0,
                                                         num_samples=2, seed=11),
                        transform_openings=chain_openings([extension], step=0))
  return tokenizer, extension, rolled.trajectories


def test_what_an_extension_added_is_stripped_for_training_and_marks_exp_mask(hinted_rollouts):
  tokenizer, extension, rollouts = hinted_rollouts
  with_hint, without = rollouts
  assert with_hint.added == {"hint": rl_extension_run.HINT} and without.added == {}
  assert rl_extension_run.HINT in with_hint.messages[with_hint.opening_len - 1].content
  trained = extension.training_rollouts(0, list(rollouts), tokenizer)
  assert trained[1] is without  # nothing added: trains as rolled out, on-policy
  stripped = trained[0]
  assert all(rl_extension_run.HINT not in m.content for m in stripped.messages)
  assert stripped.prompt_len < with_hint.prompt_len
  sampled = lambda r: [r.token_ids[a:b].tolist() for a, b in r.turn_spans]  # noqa: E731
  assert sampled(stripped) == sampled(with_hint)
  batch = batching.batch_trajectories(trained, tokenizer, buckets=(1024, 2048))
  np.testing.assert_array_equal(batch["exp_mask"][0], batch["loss_mask"][0])
  assert batch["exp_mask"][0].sum() > 0 and not batch["exp_mask"][1].any()


def test_the_advantage_function_decides_each_turns_value(hinted_rollouts):
  tokenizer, _, rollouts = hinted_rollouts
  rollouts = [dataclasses.replace(r, reward=reward) for r, reward in zip(rollouts, (1.0, 0.0))]  # outcomes differ
  per_turn = advantages.check_turn_advantages(rollouts, rl_extension_run.first_turn_advantages(rollouts, step=0))
  assert [len(v) for v in per_turn] == [r.turns for r in rollouts] and min(r.turns for r in rollouts) >= 2
  batch = batching.batch_trajectories(rollouts, tokenizer, buckets=(1024, 2048), advantages=per_turn)
  for row, (rollout, values) in enumerate(zip(rollouts, per_turn)):
    assert values[0] != 0 and not values[1:].any()
    expected = np.zeros(batch["advantages"].shape[1], np.float32)
    for (start, stop), value in zip(rollout.turn_spans, values):
      expected[start:stop] = value  # each turn's value on that turn's sampled tokens, nowhere else
    np.testing.assert_array_equal(batch["advantages"][row], expected)
  with pytest.raises(ValueError, match="advantage function gave shape"):
    advantages.check_turn_advantages(rollouts, advantages.TurnCredit([np.zeros(1), np.zeros(1)], {}))
  with pytest.raises(ValueError, match="returned 1 arrays for 2 rollouts"):
    advantages.check_turn_advantages(rollouts, advantages.TurnCredit([np.zeros(1)], {}))
  with pytest.raises(TypeError, match="must return a TurnCredit"):
    advantages.check_turn_advantages(rollouts, [np.zeros(r.turns) for r in rollouts])


def test_step_credit_puts_each_steps_advantage_on_that_steps_tokens(hinted_rollouts):
  tokenizer, _, rollouts = hinted_rollouts
  rollouts = [dataclasses.replace(r, reward=reward, step_rewards=[0.0] * (r.turns - 1) + [reward])
              for r, reward in zip(rollouts, (1.0, 0.0))]
  per_turn = advantages.check_turn_advantages(rollouts, credit.AnchorStateAdvantages(gamma=0.5)(rollouts, step=0))
  assert any(len(set(v.tolist())) > 1 for v in per_turn)  # the steps of an episode differ
  batch = batching.batch_trajectories(rollouts, tokenizer, buckets=(1024, 2048), advantages=per_turn)
  for row, (rollout, values) in enumerate(zip(rollouts, per_turn)):
    expected = np.zeros(batch["advantages"].shape[1], np.float32)
    for (start, stop), value in zip(rollout.turn_spans, values):
      expected[start:stop] = value
    np.testing.assert_array_equal(batch["advantages"][row], expected)


# ----------------------------------------------------------------------------------------------------------
# A GRPO run with the extension, killed while saving and resumed.
# ----------------------------------------------------------------------------------------------------------

SMALL = ["ModelConfig.hidden_size = 64", "ModelConfig.num_layers = 2", "ModelConfig.intermediate_size = 128",
         "TaskSlices.val_count = 0"]


def launch_env(extra=None):
  env = one_device_env()  # one CPU device, as users run it
  return dict(env, **(extra or {}))


def grpo(run_dir, bc_dir, out, steps, env=None, check=True):
  bindings = [*SMALL, f"MODEL_DIR = '{run_dir}'", f"TRAIN_STEPS = {steps}", f"INIT_CHECKPOINT = '{bc_dir}'",
              "train_grpo.envs = ['sql', 'maze']", "train_grpo.tasks_per_step = 2", "train_grpo.group_size = 2",
              "train_grpo.max_new_tokens = 16", "train_grpo.max_rounds = 2", "train_grpo.num_minibatches = 2",
              "train_grpo.buckets = (512, 1024)", "TrainerConfig.checkpoint_every = 1",
              "train_grpo.precompile = False"]
  cmd = [sys.executable, os.path.join("tests", "train", "rl_extension_run.py"), str(out),
         "--gin_file=gin_configs/runs/grpo.gin", *[f"--gin_bindings={b}" for b in bindings]]
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=launch_env(env), timeout=600)
  if check and proc.returncode != 0:
    raise AssertionError(f"the GRPO run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
  return proc


@pytest.mark.slow
def test_extension_state_is_kept_with_each_checkpoint_across_a_kill(bc_checkpoint, tmp_path):
  bc_dir = bc_checkpoint  # some tiny BC checkpoint to start from: the session's (tests/train/conftest.py)
  run_dir, out = tmp_path / "run", tmp_path / "record.json"
  # Killed while saving RL step 2 (update 4: two minibatches a step), after both steps logged their metrics.
  proc = grpo(run_dir, bc_dir, out, 2, env={KILL_DURING_SAVE_ENV: "4"}, check=False)
  assert proc.returncode == -9, proc.stderr[-2000:]
  complete = ckpt_lib.Checkpointer(str(run_dir), async_save=False).latest_step()
  assert complete in (2, 4)  # the in-flight save of update 4 rarely lands before the kill
  unbroken = [r for r in metrics_lib.read_metrics(str(run_dir)) if "loss" in r]
  assert [r["step"] for r in unbroken] == [1, 2]
  assert all(r["rollout/with_additions"] == 2 and r["hints/with_hint"] == 2 and r["exp_tokens"] > 0
             for r in unbroken)
  assert [r["credit/first_step"] for r in unbroken] == [0, 1]  # the advantage function's metrics, by 0-based step

  # Resumed: the record is the one kept with the checkpoint it resumes from (RL step 1's), so no step is seen
  # twice or lost, and step 2 is redone as the killed process did it.
  proc = grpo(run_dir, bc_dir, out, 2)
  assert "resuming at step" in proc.stdout
  record = json.loads(out.read_text())
  assert record == {"steps": [0, 1], "with_hint": [2, 2], "advantage_calls": 2}  # sample 0 of each of 2 tasks
  kept = ckpt_lib.Checkpointer(str(run_dir), async_save=False).restore_state_files(4)  # after RL step 2
  assert json.loads(kept["hints"]["record.json"]) == record
  step_2 = [r for r in metrics_lib.read_metrics(str(run_dir)) if "loss" in r and r["step"] == 2]
  if complete == 2:  # step 2 redone by the resumed process: its row replaced the killed one's, and equals it
    assert "resuming at step 1" in proc.stdout and len(step_2) == 1
    assert step_2[-1]["loss"] == pytest.approx(unbroken[1]["loss"], rel=1e-5, abs=1e-6)
