"""The `llm` step judge (evolver.credit.llm): the steps it reads from an episode's texts, the prompt it builds, the
replies it parses, and the outcome fallback (counted) for replies it cannot. It works on plain data: the rollouts
are read by evolver.train.credit (tests/train/test_credit.py)."""

import os
import subprocess
import sys

import pytest

from evolver.credit import llm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _texts(turns: int = 2, *, answered_last: bool = True) -> list[str]:
  """What follows an episode's opening: `turns` ReAct turns, each answered (the last one only if `answered_last`)."""
  texts = []
  for turn in range(turns):
    texts.append(f"Thought: step {turn}.\nAction: move east {turn}")
    if turn < turns - 1 or answered_last:
      texts.append(f"You are at ({turn + 1}, 0).")
  return texts


def test_trajectory_steps_pairs_each_sampled_action_with_its_answer():
  assert llm.trajectory_steps(_texts(2), 2) == [("move east 0", "You are at (1, 0)."),
                                                ("move east 1", "You are at (2, 0).")]
  assert llm.trajectory_steps(_texts(2, answered_last=False), 2)[-1] == ("move east 1", "")
  assert llm.trajectory_steps([], 0) == []
  with pytest.raises(ValueError, match="1 messages after the opening cannot hold 2 sampled turns"):
    llm.trajectory_steps(_texts(1, answered_last=False), 2)


def test_the_judge_imports_no_rollout_code():
  script = "import sys\nimport evolver.credit.llm\nprint('\\n'.join(sorted(sys.modules)))"
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
  modules = proc.stdout.split()
  assert "evolver.credit.llm" in modules
  assert not [m for m in modules if m.startswith(("evolver.rollout", "evolver.models", "evolver.train", "jax"))]


def test_the_prompt_numbers_the_steps_and_states_the_score_and_its_sign():
  steps = [("move east", "You are at (1, 0)."), ("move west", "x" * 1000)]
  prompt = llm.judge_prompt("Go to the goal.", steps, 0.5, max_step_chars=100)
  assert "### TASK DESCRIPTION\nGo to the goal." in prompt
  assert "total 2 steps" in prompt and ">>> EVAL-STEP 0 <<<" in prompt and ">>> EVAL-STEP 1 <<<" in prompt
  assert "OVERALL PERFORMANCE SCORE +0.5000 (positive)" in prompt
  assert "x" * 100 + "\n..." in prompt and "x" * 101 not in prompt  # long observations are trimmed
  assert "(negative)" in llm.judge_prompt("t", steps, 0.0) and "(negative)" in llm.judge_prompt("t", steps, -1.0)


@pytest.mark.parametrize("reply, expected", [
    ("Step 0 Analysis: moved closer.\nStep 0 Judgment: GOOD\nStep 1 Analysis: away.\nStep 1 Judgment: bad",
     [True, False]),
    ("Step 1 Judgment: GOOD\nStep 0 Judgment: BAD", [False, True]),          # order of the lines does not matter
    ("**Step 0 Judgment:** GOOD ... GOOD, BAD", [True, True]),                # no full numbering: first bare flags
    ("GOOD BAD GOOD", [True, False]),                                         # extra flags past num_steps ignored
    ("Step 0 Judgment: GOOD", None),                                          # one label for two steps
    ("I cannot judge this.", None),
])
def test_replies_are_parsed_as_agentevolver_does(reply, expected):
  assert llm.parse_judgments(reply, 2) == expected


def test_unparseable_replies_fall_back_to_the_outcome_and_are_counted():
  replies = {"p0": "Step 0 Judgment: BAD\nStep 1 Judgment: GOOD", "p1": "no idea", "p2": "nothing"}
  calls = []

  def generate(prompts):
    calls.append(list(prompts))
    return [replies[p] for p in prompts]

  labels, fallbacks = llm.llm_labels(generate, ["p0", "p1", "p2"], [2, 3, 1], [1.0, 0.7, -0.2])
  assert calls == [["p0", "p1", "p2"]]  # one batched call
  assert labels == [[False, True], [True, True, True], [False]] and fallbacks == [False, True, True]
  assert llm.llm_labels(generate, [], [], []) == ([], []) and len(calls) == 1
  with pytest.raises(ValueError, match="returned 1 replies for 2 prompts"):
    llm.llm_labels(lambda prompts: ["x"], ["a", "b"], [1, 1], [0.0, 0.0])
