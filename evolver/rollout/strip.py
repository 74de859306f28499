"""Strip what an opening transform added from a rollout: the episode as if the policy had seen the base opening.

A rollout made with `RolloutEngine.run(..., transform_openings=...)` (e.g. experience injected into the first
user message) records the opening before the change (`base_opening`), what was added (`added`), and where its
first prompt ends (`prompt_len`, `opening_len`). `strip_added` renders the base opening's prompt through the
chat template (`turns.prompt_tokens`), puts it in front of the rollout's tokens after the old prompt, and shifts
`loss_mask`, `logprobs` and `turn_spans` to match: the sampled tokens and their behaviour logprobs stay exactly
as sampled, now behind a prompt that no longer contains the addition. The rollout is flagged
`experience["exp_mask"] = 1` (what `evolver.data.tokenize.tokenize_trajectory` turns into HET-PPO's `exp_mask`:
these tokens are off-policy for the stripped context) and keeps what was removed in `experience["stripped"]`.

Several transforms may have added to one opening (the RL loop's extensions, each under its own keys of `added`).
`keys` strips some of them: when the others stay, `remove` takes the stripped ones out of the opening's text (the
extension that added them knows how), and the rollout keeps its base opening for the rest.

  stripped = [strip_added(t, tokenizer) for t in batch.trajectories]
  hint_only = strip_added(t, tokenizer, keys=["hint"], remove=lambda messages, added: ...)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from evolver.data.trajectory import Message
from evolver.rollout import turns as turns_lib
from evolver.rollout.engine import Rollout

__all__ = ["strip_added"]


def strip_added(rollout: Rollout, tokenizer: PreTrainedTokenizerBase, *, keys: Sequence[str] | None = None,
                remove: Callable[[list[Message], Mapping[str, Any]], list[Message]] | None = None) -> Rollout:
  """The rollout with what was added to its opening stripped (a new Rollout; the input is not changed).

  Args:
    rollout: from `RolloutEngine.run`; one whose opening was not transformed (`base_opening` None) is returned
      as it is.
    tokenizer: the tokenizer (and chat template) the rollout was made with.
    keys: which of `rollout.added`'s keys to strip (None: all). Keys it does not hold are ignored; none held:
      the rollout is returned as it is.
    remove: `remove(opening, {key: added[key] for the stripped keys})` -> the opening without those additions;
      needed when some of `added` stays (else the base opening is used).

  Returns:
    A Rollout whose `token_ids` are the new opening's prompt tokens followed by the original tokens after
    `prompt_len`; `loss_mask` and `logprobs` are 0 on the new prompt and the original ones after it;
    `turn_spans` are shifted by the change in prompt length; `messages` are the new opening followed by the
    messages after the old one; `opening_len` and `prompt_len` describe the new opening; `added` keeps the keys
    not stripped (`base_opening` None once nothing is left); `experience` gains "stripped" (what was removed,
    merged with earlier strips) and "exp_mask" = 1.

  Raises:
    ValueError: the rollout's records are inconsistent (its prompt holds sampled tokens, or a turn starts inside
      it, or its opening is longer than its messages), or some of `added` stays and no `remove` is given.
  """
  if rollout.base_opening is None:
    return rollout
  what = f"{rollout.item_id} (sample {rollout.sample})"
  stripped = {k: v for k, v in rollout.added.items() if keys is None or k in keys}
  if not stripped and rollout.added:
    return rollout
  left = {k: v for k, v in rollout.added.items() if k not in stripped}
  if not rollout.base_opening or rollout.base_opening[-1].role != "user":
    raise ValueError(f"{what}: base_opening must be a non-empty list of messages ending with a user message")
  if not 0 < rollout.opening_len <= len(rollout.messages):
    raise ValueError(f"{what}: opening_len {rollout.opening_len} does not fit its {len(rollout.messages)} messages")
  if left:
    if remove is None:
      raise ValueError(f"{what}: stripping {sorted(stripped)} while {sorted(left)} stays needs `remove`")
    opening = list(remove(list(rollout.messages[:rollout.opening_len]), stripped))
    if not opening or opening[-1].role != "user":
      raise ValueError(f"{what}: removing {sorted(stripped)} left an opening that does not end with a user message")
  else:
    opening = list(rollout.base_opening)
  rolled_out = _with_opening(rollout, opening, tokenizer, what)
  experience = dict(rollout.experience)
  experience["stripped"] = {**experience.get("stripped", {}), **stripped}
  experience["exp_mask"] = 1
  return dataclasses.replace(rolled_out, added=left, base_opening=rollout.base_opening if left else None,
                             experience=experience)


def _with_opening(rollout: Rollout, opening: list[Message], tokenizer: PreTrainedTokenizerBase,
                  what: str) -> Rollout:
  """`rollout` with its opening replaced by `opening`: the prompt re-rendered, the sampled tokens, their masks and
  logprobs kept as they were behind it."""
  if rollout.token_ids is None or rollout.loss_mask is None or rollout.logprobs is None:
    raise ValueError(f"{what}: strip_added needs the rollout's token_ids, loss_mask and logprobs")
  token_ids = np.asarray(rollout.token_ids, np.int32)
  loss_mask = np.asarray(rollout.loss_mask, np.float32)
  logprobs = np.asarray(rollout.logprobs, np.float32)
  old = rollout.prompt_len
  (prompt,) = turns_lib.prompt_tokens(tokenizer, [[m.to_dict() for m in opening]])
  if len(token_ids):  # the first prompt reached the policy
    if not 0 < old <= len(token_ids):
      raise ValueError(f"{what}: prompt_len {old} does not fit its {len(token_ids)} tokens")
    if np.any(loss_mask[:old]):
      raise ValueError(f"{what}: the loss mask is set inside the first prompt (tokens [0, {old})); "
                       "only sampled tokens after it carry loss")
    if any(start < old for start, _ in rollout.turn_spans):
      raise ValueError(f"{what}: a turn span starts inside the first prompt ({rollout.turn_spans})")
    new_prompt = np.asarray(prompt, np.int32)
    token_ids = np.concatenate([new_prompt, token_ids[old:]])
    loss_mask = np.concatenate([np.zeros(len(new_prompt), np.float32), loss_mask[old:]])
    logprobs = np.concatenate([np.zeros(len(new_prompt), np.float32), logprobs[old:]])
  shift = len(prompt) - old
  return dataclasses.replace(
      rollout, messages=opening + list(rollout.messages[rollout.opening_len:]),
      token_ids=token_ids, loss_mask=loss_mask, logprobs=logprobs,
      turn_spans=[(start + shift, stop + shift) for start, stop in rollout.turn_spans],
      opening_len=len(opening), prompt_len=len(prompt))
