"""The `llm` step judge: an LLM reads a trajectory and labels each of its steps GOOD or BAD.

AgentEvolver's semantic attribution (modelscope/AgentEvolver, `agentevolver/module/adv_processor/prompt.py`
`build_batch_reward_evaluation_prompt` and `semantic_attribution.py` `parse_batch_evaluation_result`): the judge
sees the task, the numbered steps (each an ACTION and the OBSERVATION it got) and the trajectory's overall score
(its reward rescaled to [-1, 1], 2R - 1, with AgentEvolver's default `overall_score_source` "token_level_rewards";
`evolver.train.credit.judge_scores`: > 0 is an advantageous outcome), and answers `Step N Judgment: GOOD|BAD` for
N = 0, 1, ...
Rules by the score's sign: in an advantageous trajectory a step is GOOD when it contributed to the outcome; in a
disadvantageous one only when it actively corrected an earlier error. A reply that cannot be parsed into one
label per step gives every step the outcome's label (GOOD iff the score is > 0), as AgentEvolver does, and is
counted.

  steps = trajectory_steps(texts_after_opening, turns)      # [(action, observation)] per sampled turn
  prompts = [judge_prompt(task_text, steps, score), ...]
  labels, fell_back = llm_labels(generate, prompts, num_steps, scores)

Everything here is plain data (texts, counts, scores): `evolver.train.credit` reads the rollouts. `generate(prompts)
-> texts` is a batched generator of `evolver.models.generate`: an OpenAI-compatible endpoint (`OpenAIGenerate`),
another checkpoint (`CheckpointGenerate`) or the policy being trained (`LivePolicyGenerate`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from evolver.envs.base import action_text

SCORE_THRESHOLD = 0.0  # AgentEvolver's THRESHOLD (candidate_prompt.py): a score above it is advantageous

_RULES = f"""You are an expert process reward evaluator, specialising in attributional analysis of multi-step \
solution trajectories.

The message has three sections: TASK DESCRIPTION (the user's request), SOLUTION TRAJECTORY (numbered steps, each \
an ACTION taken and the OBSERVATION it got) and OVERALL PERFORMANCE SCORE (> {SCORE_THRESHOLD:+.1f}: the outcome \
was advantageous; <= {SCORE_THRESHOLD:+.1f}: it was not).

Attribute each numbered step's contribution to the overall score.
- If the score is positive, a step is GOOD if its action (and result) contributed to the outcome: an incremental \
improvement towards the solution, a necessary sub-task done correctly, building on correct earlier steps. It is \
BAD if it was neutral, irrelevant or detrimental.
- If the score is not positive, a step is GOOD only if it actively tried to fix an earlier error or moved the \
solution back towards correctness. It is BAD if it was neutral, irrelevant, introduced an error, or failed to \
correct one (continuing a wrong plan, repeating the same failure).

Judge the technical effect of each step on the outcome, not its style. Reply in the required format only."""

_JUDGMENT = re.compile(r"Step\s+(\d+)\s+Judgment:\s*(GOOD|BAD)", re.IGNORECASE)
_FLAG = re.compile(r"\b(GOOD|BAD)\b")


def trajectory_steps(texts: Sequence[str], turns: int) -> list[tuple[str, str]]:
  """The (action, observation) of each of `turns` sampled turns.

  Args:
    texts: the contents of an episode's messages after its opening: each sampled assistant turn, then the user
      message that answered it (the last turn may have no answer).
    turns: how many sampled turns the episode has.

  Returns:
    Per turn, the action the env read from the assistant's text (`action_text`) and the answer ("" for a last
    turn the env did not answer).
  """
  if turns < 0 or len(texts) < 2 * turns - 1:
    raise ValueError(f"{len(texts)} messages after the opening cannot hold {turns} sampled turns")
  return [(action_text(texts[2 * turn]), texts[2 * turn + 1] if 2 * turn + 1 < len(texts) else "")
          for turn in range(turns)]


def judge_prompt(task: str, steps: Sequence[tuple[str, str]], score: float, *, max_step_chars: int = 600) -> str:
  """The judge's single user message: the rules, the task, the numbered steps (0-based) and the score."""

  def trim(text: str) -> str:
    return text if len(text) <= max_step_chars else text[:max_step_chars] + "\n..."

  polarity = "positive" if score > SCORE_THRESHOLD else "negative"
  parts = [_RULES, "", "### TASK DESCRIPTION", task, "", f"### SOLUTION TRAJECTORY (total {len(steps)} steps)"]
  for number, (action, observation) in enumerate(steps):
    parts += [f">>> EVAL-STEP {number} <<<", "ACTION:", trim(action)]
    if observation:
      parts += ["OBSERVATION:", trim(observation)]
  parts += ["", f"### OVERALL PERFORMANCE SCORE {score:+.4f} ({polarity})", "",
            "REQUIRED OUTPUT FORMAT, one pair per step:", "Step 0 Analysis: <your reasoning>",
            "Step 0 Judgment: GOOD/BAD", "", "Step 1 Analysis: <your reasoning>", "Step 1 Judgment: GOOD/BAD",
            "[... continue for all steps ...]"]
  return "\n".join(parts)


def parse_judgments(text: str, num_steps: int) -> list[bool] | None:
  """The GOOD (True) / BAD labels of `num_steps` steps in a judge's reply, or None if it has no label for some
  step: numbered `Step N Judgment:` lines for exactly steps 0..num_steps-1, else the first `num_steps` bare
  GOOD/BAD words (AgentEvolver's parse_batch_evaluation_result)."""
  numbered = {}
  for match in _JUDGMENT.finditer(text):
    numbered[int(match.group(1))] = match.group(2).upper() == "GOOD"
  if set(numbered) == set(range(num_steps)):
    return [numbered[i] for i in range(num_steps)]
  flags = _FLAG.findall(text.upper())
  if len(flags) >= num_steps:
    return [flag == "GOOD" for flag in flags[:num_steps]]
  return None


def llm_labels(generate: Callable[[list[str]], list[str]], prompts: Sequence[str], num_steps: Sequence[int],
               scores: Sequence[float]) -> tuple[list[list[bool]], list[bool]]:
  """Judges each trajectory with one batched `generate` call. Returns its per-step labels (the outcome's label,
  GOOD iff its score > SCORE_THRESHOLD, on every step where the reply did not parse) and, per trajectory, whether
  it fell back so."""
  replies = list(generate(list(prompts))) if prompts else []
  if len(replies) != len(prompts):
    raise ValueError(f"the judge's generate returned {len(replies)} replies for {len(prompts)} prompts")
  labels, fell_back = [], []
  for reply, steps, score in zip(replies, num_steps, scores):
    parsed = parse_judgments(reply or "", steps)
    fell_back.append(parsed is None)
    labels.append([score > SCORE_THRESHOLD] * steps if parsed is None else parsed)
  return labels, fell_back
