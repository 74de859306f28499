"""Step-level credit as the RL step's advantage function (evolver.train.credit): rollouts laid out as step arrays
and back, the judges wired in (oracle / env from the recorded measures, llm through a batched generate), the skip
rule and prm_steps, and anchor-state ids. The advantage arithmetic itself is checked by hand in
tests/rl/test_step_credit.py."""

import numpy as np
import pytest

from evolver.data.trajectory import Message
from evolver.rl import step_credit
from evolver.rollout import Rollout
from evolver.train import advantages, credit


def measures(costs, progress=None):
  """step_measures of a rollout whose cost to go runs through `costs` (len turns + 1)."""
  progress = progress or [None] * len(costs)
  return [{"before": {"cost_to_go": costs[i], "progress": progress[i]},
           "after": {"cost_to_go": costs[i + 1], "progress": progress[i + 1]}} for i in range(len(costs) - 1)]


def rollout(group, sample, reward, *, costs=None, progress=None, keys=None, scores=None, turns=None):
  turns = turns if turns is not None else len(costs) - 1
  messages = [Message("user", "rules"), Message("assistant", "Ok."), Message("user", f"Task of group {group}.")]
  for turn in range(turns):
    messages += [Message("assistant", f"Action: a{turn}"), Message("user", f"o{turn}")]
  return Rollout(item_id=f"maze/train/{group}", messages=messages, env="maze", reward=reward, group=group,
                 sample=sample, turns=turns, opening_len=3,
                 step_rewards=scores if scores is not None else [0.0] * (turns - 1) + [reward],
                 state_keys=keys if keys is not None else [f"s{group}.{sample}.{t}" for t in range(turns)],
                 step_measures=measures(costs, progress) if costs is not None else None)


def test_step_layout_pads_to_a_power_of_two_and_densifies_groups():
  rollouts = [rollout(7, 0, 1.0, turns=3), rollout(7, 1, 0.0, turns=9), rollout(2, 0, 0.0, turns=1)]
  layout = credit.step_layout(rollouts)
  assert layout.step_mask.shape == (3, 16) and layout.step_mask.sum(1).tolist() == [3, 9, 1]
  assert layout.group.tolist() == [1, 1, 0] and layout.num_groups == 3
  assert credit.step_layout(rollouts[:1]).step_mask.shape == (1, 8)  # at least 8
  back = credit.unpad_steps(credit.pad_steps([np.arange(r.turns) for r in rollouts], layout), rollouts)
  assert [b.tolist() for b in back] == [[0, 1, 2], list(range(9)), [0]]


def test_score_gains_are_the_increase_of_the_recorded_score():
  np.testing.assert_allclose(credit.score_gains(rollout(0, 0, 1.0, turns=4, scores=[0.0, 0.5, 0.5, 1.0])),
                             [0.0, 0.5, 0.0, 0.5])
  with pytest.raises(ValueError, match="recorded 2 step rewards for 3 sampled turns"):
    credit.score_gains(rollout(0, 0, 1.0, turns=3, scores=[0.0, 1.0]))


def test_anchor_state_ids_join_repeats_inside_and_across_episodes_of_one_task_only():
  rollouts = [rollout(0, 0, 1.0, turns=3, keys=["a", "b", "a"]), rollout(0, 1, 0.0, turns=2, keys=["a", "c"]),
              rollout(1, 0, 0.0, turns=2, keys=["a", "b"])]  # another task: its "a" is another state
  layout = credit.step_layout(rollouts)
  ids, count = credit.anchor_state_ids(rollouts, layout)
  assert ids[0, :3].tolist() == [0, 1, 0] and ids[1, :2].tolist() == [0, 2] and ids[2, :2].tolist() == [3, 4]
  assert count == ids.size
  with pytest.raises(ValueError, match="recorded 1 state keys for 2 sampled turns"):
    credit.anchor_state_ids([rollout(0, 0, 0.0, turns=2, keys=["a"])], layout)


def test_oracle_adca_labels_steps_by_the_cost_to_go_and_matches_the_pure_function():
  # Task 0: a success that wastes a step (cost 2 -> 2), a failure moving away then back; task 1: both fail
  # (equal outcomes: skipped by skip_small_adv, so unjudged and labelled by their outcome).
  rollouts = [rollout(0, 0, 1.0, costs=[2, 2, 1, 0]), rollout(0, 1, 0.0, costs=[2, 3, 2]),
              rollout(1, 0, 0.0, costs=[4, 3]), rollout(1, 1, 0.0, costs=[4, 5, 4])]
  fn = credit.AdcaAdvantages(judge="oracle")
  assert fn.rollout_records == ("record_measures",)
  out = fn(rollouts, step=0)
  labels = np.zeros([4, 8], bool)
  labels[0, :3] = [False, True, True]
  labels[1, :2] = [False, True]          # 2 -> 3 away (BAD), 3 -> 2 back (GOOD)
  layout = credit.step_layout(rollouts)
  expected = step_credit.adca_decouple(labels, layout.step_mask, np.asarray([1.0, 0.0, 0.0, 0.0], np.float32),
                                       layout.group, 4, alpha=0.1, fix_base=0.2)
  for values, row in zip(out.advantages, np.asarray(expected)):
    np.testing.assert_allclose(values, row[:len(values)], rtol=1e-6, atol=1e-7)
  assert out.metrics["skipped_fraction"] == 0.5 and out.metrics["judged_steps"] == 5
  assert out.metrics["good_fraction"] == pytest.approx(3 / 8) and out.metrics["judge_fallbacks"] == 0
  assert np.all(out.advantages[2] == 0) and np.all(out.advantages[3] == 0)  # an all-equal group gets nothing
  # Without the skip rule the failing group is judged: its GOOD step (4 -> 3) and its BAD one differ.
  unskipped = credit.AdcaAdvantages(judge="oracle", skip_type=None)(rollouts, step=0)
  assert unskipped.metrics["judged_steps"] == 8 and unskipped.advantages[2][0] > unskipped.advantages[3][0]


def test_after_prm_steps_adca_gives_grpo_outcome_advantages():
  rollouts = [rollout(0, 0, 1.0, costs=[2, 1, 0]), rollout(0, 1, 0.0, costs=[2, 3])]
  fn = credit.AdcaAdvantages(judge="oracle", prm_steps=2, cosine=True, alpha=0.2)
  assert fn(rollouts, step=1).metrics["adca_alpha"] == pytest.approx(0.1)  # half way down the cosine
  late = fn(rollouts, step=2)
  grpo = advantages.grpo_turn_advantages(rollouts)
  assert late.metrics == {"adca_active": 0.0}
  for a, b in zip(late.advantages, grpo.advantages):
    np.testing.assert_array_equal(a, b)


def test_env_judge_reads_progress_and_unmeasured_steps_fall_back_to_the_outcome():
  rollouts = [rollout(0, 0, 1.0, costs=[None, None, None], progress=[0.0, 0.5, 1.0]),
              rollout(0, 1, 0.0, costs=[None, None, None], progress=[0.0, 0.0, None])]
  labels, fallbacks = credit.judge_steps(rollouts, "env", credit.judge_scores(np.asarray([1.0, 0.0])))
  assert [l.tolist() for l in labels] == [[True, True], [False, False]] and fallbacks == 1
  oracle, oracle_fallbacks = credit.judge_steps(rollouts, "oracle", credit.judge_scores(np.asarray([1.0, 0.0])))
  assert [l.tolist() for l in oracle] == [[True, True], [False, False]] and oracle_fallbacks == 4  # outcome labels
  with pytest.raises(ValueError, match="RolloutConfig.record_measures is off"):
    credit.judge_steps([rollout(0, 0, 1.0, turns=2)], "oracle", np.asarray([1.0]))


def test_the_llm_judge_sees_each_trajectory_with_its_rescaled_reward():
  rollouts = [rollout(0, 0, 1.0, turns=2), rollout(0, 1, 0.0, turns=2)]
  seen = []

  def generate(prompts):
    seen.extend(prompts)
    return ["Step 0 Judgment: BAD\nStep 1 Judgment: GOOD", "unparseable"]

  fn = credit.AdcaAdvantages(judge="llm", generate=generate)
  assert fn.rollout_records == ()
  out = fn(rollouts, step=0)
  assert len(seen) == 2 and "Task of group 0." in seen[0] and "Action: a0" not in seen[0]
  assert "ACTION:\na0" in seen[0] and "SCORE +1.0000 (positive)" in seen[0] and "SCORE -1.0000 (negative)" in seen[1]
  assert out.metrics["judge_fallbacks"] == 2  # the second reply's two steps took the outcome's label (BAD)
  assert out.advantages[0][1] > out.advantages[0][0]
  with pytest.raises(ValueError, match="the llm judge needs a `generate`"):
    credit.AdcaAdvantages(judge="llm")
  with pytest.raises(ValueError, match="unknown step judge 'gpt'"):
    credit.AdcaAdvantages(judge="gpt")
  with pytest.raises(ValueError, match="unknown skip_type"):
    credit.AdcaAdvantages(skip_type="skip_everything")


def test_anchor_state_advantages_wire_state_keys_and_score_gains():
  rollouts = [rollout(0, 0, 1.0, turns=2, keys=["a", "b"], scores=[0.0, 1.0]),
              rollout(0, 1, 0.0, turns=2, keys=["a", "c"], scores=[0.0, 0.0])]
  out = credit.AnchorStateAdvantages(gamma=0.5, omega=1.0)(rollouts, step=3)
  # GiGPO mean_norm: episode part R - mean(R) over step rows (both have 2): +-0.5. Returns: [0.5, 1.0], [0, 0];
  # step group "a" holds 0.5 and 0 (mean 0.25); "b" and "c" are singletons (step part 0).
  np.testing.assert_allclose(out.advantages[0], [0.5 + 0.25, 0.5], atol=1e-6)
  np.testing.assert_allclose(out.advantages[1], [-0.5 - 0.25, -0.5], atol=1e-6)
  assert out.metrics["shared_step_fraction"] == pytest.approx(0.5)
  checked = advantages.check_turn_advantages(rollouts, out)
  assert [c.shape for c in checked] == [(2,), (2,)]


def test_the_credit_switches_and_agentevolver_gin_parse():
  import json
  import os
  import subprocess
  import sys
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  # Parsed as launch.train parses them, in a fresh process (in pytest's, `tests/models` shadows gin's includes):
  # one process for every case, the config cleared between them.
  script = ("import json, sys, gin\nfrom evolver.train import gin_config\n"
            "for files in json.loads(sys.argv[1]):\n"
            "  gin.clear_config()\n"
            "  gin_config.parse(files, [\"MODEL_DIR = 'x'\"])\n"
            "  print(gin.query_parameter('train_grpo.advantage_fn').selector, "
            "[e.selector for e in gin.query_parameter('train_grpo.extensions')])\n")
  cases = {("gin_configs/runs/agentevolver.gin",): "AdcaAdvantages ['SyntheticTasks', 'ExperienceManager']",
           ("gin_configs/experience/no_pool.gin", "gin_configs/credit/adca_llm.gin"): "AdcaAdvantages []",
           ("gin_configs/experience/no_pool.gin", "gin_configs/credit/anchor_state.gin"): "AnchorStateAdvantages []"}
  proc = subprocess.run([sys.executable, "-c", script, json.dumps([list(files) for files in cases])], cwd=root,
                        capture_output=True, text=True)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert proc.stdout.strip().split("\n")[-len(cases):] == list(cases.values()), proc.stdout
