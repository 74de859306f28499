"""The RL step's extension points: what the AgentEvolver mechanisms (experience, self-questioning, step credit)
plug into, without touching the GRPO step itself.

Before the run resumes, `ext.start(model_dir=..., envs=..., seed=...)`. Then one RL step (`evolver.train.rl`) calls
the hooks of its extensions, in order, on the host (outside jit):

  tasks = ext.choose_tasks(step, tasks)                 originals and synthetic tasks, by the mixture
  engine.run(tasks, transform_openings=...)             every episode's opening, in one call (each sample of a
                                                        task separately): may change it (e.g. experience on k of a
                                                        task's n samples); the rollout records what was added
  rollouts = ext.training_rollouts(step, rollouts, tok) what trains: by default what *this* extension added is
                                                        stripped from the tokens (`strip_added`), which sets
                                                        exp_mask; what others added is theirs to keep or strip
  ext.before_update(step, rollouts)                     the step's scored rollouts, before the update: work that
                                                        can overlap the update starts here (the pool's summarizer)
  ... advantages (`train_grpo.advantage_fn`), old/reference log-probs, HET-PPO updates ...
  metrics |= ext.after_step(step, rollouts)             after the update: what `before_update` started is
                                                        collected here, so the step's outcome is a function of
                                                        the seed, not of timing

and with every checkpoint `ext.state_files()` / `ext.load_state_files(files)` (an experience workspace, a set of
synthetic tasks): kept atomically with the train state, so a resumed run sees the same pool and tasks.

`step` is the 0-based index of the RL step being taken (the metrics row of that step is logged as step + 1).

Composition is explicit: an extension declares the keys of `OpeningChange.added` it writes (`added_keys`; no key
belongs to two extensions) and strips only those. When another extension's addition stays in the same opening,
the extension's `remove_added` takes its own addition out of the opening text; when nothing else stays, the
rollout goes back to its base opening. So `[SyntheticTasks, ExperienceManager]` and the reverse train the same
samples with the same text: synthetic tasks add nothing to openings, and the pool keeps or strips its experience
per `train_sample_mode` whatever precedes it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from transformers import PreTrainedTokenizerBase

from evolver.data.trajectory import Message
from evolver.rollout import EpisodeOpening, OpeningChange, Rollout, Task, strip_added


class RLExtension:
  """Base class of RL-step extensions: every hook does nothing (or strips, for `training_rollouts`); a subclass
  overrides what it needs. `name` keys its state files and prefixes its metrics; `added_keys` are the keys of
  `OpeningChange.added` its `transform_openings` writes (none: it changes no opening)."""

  name: str = "extension"
  added_keys: tuple[str, ...] = ()

  def start(self, *, model_dir: str, envs: Sequence[str], seed: int,
            tokenizer: PreTrainedTokenizerBase | None = None) -> None:
    """Called once before the run resumes: where the run lives (e.g. a default place for a pool), its envs, its
    seed, the policy's tokenizer."""
    del model_dir, envs, seed, tokenizer

  def choose_tasks(self, step: int, tasks: list[Task]) -> list[Task]:
    """The tasks of RL step `step`, given those drawn so far."""
    del step
    return tasks

  def transform_openings(self, step: int, openings: list[EpisodeOpening], *, validating: bool = False
                         ) -> list[OpeningChange | None]:
    """Per episode (`EpisodeOpening`: task, sample, opening), a new opening (what was added goes in
    `OpeningChange.added`) or None; `validating` for the `val` episodes of the loop's model selection."""
    del step, validating
    return [None] * len(openings)

  def training_rollouts(self, step: int, rollouts: list[Rollout], tokenizer: PreTrainedTokenizerBase
                        ) -> list[Rollout]:
    """The rollouts as they train: what this extension added to an opening is stripped (the sampled tokens then
    train off-policy, exp_mask 1); other extensions' additions are left to them. An extension that keeps its
    additions for some samples (experience `allkeep`/`hybrid`) overrides, stripping with `strip_own`."""
    del step
    return [self.strip_own(r, tokenizer) for r in rollouts]

  def strip_own(self, rollout: Rollout, tokenizer: PreTrainedTokenizerBase) -> Rollout:
    """`rollout` without what this extension added to its opening (the rollout itself when it added nothing)."""
    own = [key for key in self.added_keys if key in rollout.added]
    if not own:
      return rollout
    return strip_added(rollout, tokenizer, keys=own, remove=self.remove_added)

  def remove_added(self, messages: list[Message], added: Mapping[str, Any]) -> list[Message]:
    """The opening `messages` without this extension's addition (`added`: its keys of the rollout's `added`).
    Needed only when another extension's addition stays in the same opening (else the rollout's base opening is
    used); an extension that adds to openings beside others defines it."""
    del messages, added
    raise NotImplementedError(f"extension {self.name!r} cannot take its addition out of an opening that keeps "
                              "another extension's addition: define remove_added")

  def before_update(self, step: int, rollouts: Sequence[Rollout]) -> None:
    """Called with the step's rollouts (all of them, errored ones included, as sampled: additions in place) once
    they are scored and before the update; work started here may run during the update and must be finished by
    `after_step`."""
    del step, rollouts

  def after_step(self, step: int, rollouts: Sequence[Rollout]) -> dict[str, Any]:
    """Called with the step's rollouts (all of them, errored ones included) after its updates; returns metrics."""
    del step, rollouts
    return {}

  def state_files(self) -> dict[str, bytes]:
    """A snapshot of what must survive a restart, as files ({} = nothing)."""
    return {}

  def load_state_files(self, files: Mapping[str, bytes]) -> None:
    """Restores `state_files`' snapshot from the checkpoint a run resumes from ({} for a fresh run)."""
    del files

  def close(self) -> None:
    """Releases what the extension holds (threads, files) at the end of the run."""


def check_added_keys(extensions: Sequence[RLExtension]) -> None:
  """Raises when two extensions declare the same `added_keys` (each key of `added` has one owner)."""
  owner: dict[str, str] = {}
  for ext in extensions:
    for key in ext.added_keys:
      if key in owner:
        raise ValueError(f"extensions {owner[key]!r} and {ext.name!r} both declare {key!r} in added_keys: each key "
                         "of an opening's `added` belongs to one extension")
      owner[key] = ext.name


def chain_openings(extensions: Sequence[RLExtension], step: int, *, validating: bool = False):
  """The engine's `transform_openings` for RL step `step`: each extension sees the openings as the previous left
  them; what they added is merged per episode, each key written by the one extension that declares it."""
  if not extensions:
    return None
  check_added_keys(extensions)

  def transform(openings: list[EpisodeOpening]) -> list[OpeningChange | None]:
    current = [list(o.messages) for o in openings]
    added: list[dict[str, Any]] = [{} for _ in openings]
    for ext in extensions:
      changes = ext.transform_openings(step, [o._replace(messages=m) for o, m in zip(openings, current)],
                                       validating=validating)
      if len(changes) != len(openings):
        raise ValueError(f"extension {ext.name!r} gave {len(changes)} openings for {len(openings)}")
      for i, change in enumerate(changes):
        if change is None:
          continue
        undeclared = sorted(set(change.added) - set(ext.added_keys))
        if undeclared:
          raise ValueError(f"extension {ext.name!r} records {undeclared} in the opening's `added` but declares "
                           f"added_keys {tuple(ext.added_keys)}")
        current[i] = list(change.messages)
        added[i].update(change.added)
    return [OpeningChange(messages=m, added=a) if a else None for m, a in zip(current, added)]

  return transform


def training_rollouts(extensions: Sequence[RLExtension], step: int, rollouts: list[Rollout],
                      tokenizer: PreTrainedTokenizerBase) -> list[Rollout]:
  """The step's rollouts as they train: each extension's `training_rollouts` in turn (each strips only its own
  additions, so the order does not matter)."""
  for ext in extensions:
    rollouts = ext.training_rollouts(step, rollouts, tokenizer)
  return rollouts
