"""Messages and trajectories: what rollouts produce, what datasets store and what training consumes.

Roles follow the chat template ("user" = the environment / instruction, "assistant" = the agent, optionally
"system"); AgentGym's AgentTraj JSON calls them "human" and "gpt" (see `evolver.data.agenttraj`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

ROLES = ("system", "user", "assistant")

# AgentGym's conversations open with the instruction (user) and this fixed agent reply (assistant).
OPENING_REPLY = "Ok."


@dataclasses.dataclass
class Message:
  """One turn. `loss` is AgentTraj's per-turn flag: True/False forces whether an assistant turn is trained on,
  None means the default (every assistant turn is)."""

  role: str
  content: str
  loss: bool | None = None

  def __post_init__(self):
    if self.role not in ROLES:
      raise ValueError(f"message role must be one of {ROLES}, got {self.role!r}")
    if not isinstance(self.content, str):
      raise TypeError(f"message content must be a string, got {type(self.content).__name__}")

  def to_dict(self) -> dict[str, Any]:
    return {"role": self.role, "content": self.content}


@dataclasses.dataclass
class Trajectory:
  """An episode (or an expert demonstration) with its outcome and, after a rollout, its tokens.

  Token-level fields, when present, are aligned `[T]` arrays over the rendered conversation: `token_ids`
  int32, `loss_mask` float32 (1 on assistant tokens and their end-of-turn token), `logprobs` float32 (the
  sampler's log-probabilities of the sampled tokens, 0 elsewhere).
  """

  item_id: str
  messages: list[Message]
  env: str = ""
  task_index: int = -1
  split: str = ""
  env_version: str = ""
  reward: float = 0.0
  success: bool = False
  # The rollout could not finish (env error, server lost): excluded from training and from success rates.
  failed: bool = False
  error: str | None = None
  # Experience metadata (self-navigating): which experience was injected, whether it was stripped, ...
  experience: dict[str, Any] = dataclasses.field(default_factory=dict)
  token_ids: np.ndarray | None = None
  loss_mask: np.ndarray | None = None
  logprobs: np.ndarray | None = None

  @property
  def num_turns(self) -> int:
    """Assistant turns."""
    return sum(m.role == "assistant" for m in self.messages)

  def chat(self) -> list[dict[str, str]]:
    """Messages as the dicts a chat template takes."""
    return [m.to_dict() for m in self.messages]
