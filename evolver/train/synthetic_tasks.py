"""Self-questioned tasks in the RL loop: GRPO draws its tasks from a mixture of the original tasks and a synthetic
task set (`evolver.tasks`), kept in every checkpoint, and can grow the set from its own rollouts.

  python -m launch.train --gin_file=gin_configs/tasks/grpo_selfq.gin --gin_bindings="MODEL_DIR='runs/grpo_selfq'" \
      --gin_bindings="TASKSET='runs/selfq/synthetic_tasks.jsonl'"

- `choose_tasks`: the step's tasks are `TaskMixture.draw(step, n)` over the originals (the exploration slice of
  each env's `train` split, `TaskSlices`) and the synthetic tasks (`use_original_tasks`, `synthetic_data_ratio`:
  AgentEvolver's semantics, `evolver.tasks.taskset`).
- `state_files`: the synthetic set the mixture draws from, so a resumed run mixes the same tasks even if the file
  changed since.
- `after_step` (with `regenerate_every` k > 0): every k steps the policy's own rollouts become explorations: each
  rollout's actions are replayed in its world opened with the goal hidden (`reset_world`), the env describes what
  they reached (`hindsight_tasks`), and what passes the filters (held-out decontamination, duplicates, a feasibility
  replay in a fresh env) joins the synthetic set; the mixture is drawn again from the grown set. With
  `proposer="llm"` an LLM proposes the tasks from those explorations instead (`evolver.tasks.propose.propose_llm`:
  AgentEvolver's task-summarize prompt, each proposal replayed to an outcome the env checks), through `llm`, a
  generate adapter (`evolver.models.generate`): an endpoint, another checkpoint, or the policy being trained
  (`@proposer/LivePolicyGenerate()`: the weights that sampled the step).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import gin

from evolver import envs as envs_lib
from evolver.envs import base as envs_base
from evolver.models.generate import Generate
from evolver.rollout import Rollout, Task
from evolver.tasks import filters as filters_lib
from evolver.tasks.explore import Exploration
from evolver.tasks.propose import PROPOSERS, propose_hindsight, propose_llm
from evolver.tasks.taskset import SyntheticTask, TaskMixture, load_taskset
from evolver.train.extensions import RLExtension
from evolver.train.slices import TaskSlices, slice_tasks

def rollout_actions(rollout: Rollout) -> list[str]:
  """The actions a rollout took, as its env read them (the text after the last `Action:` of each sampled turn)."""
  turns = [m.content for m in rollout.messages[rollout.opening_len:] if m.role == "assistant"]
  return [envs_base.action_text(turn) for turn in turns]


def replay_as_exploration(env: Any, rollout: Rollout, episode: int) -> Exploration:
  """The rollout's actions replayed in its world with the goal hidden: what they reached, as hindsight tasks."""
  actions = rollout_actions(rollout)
  first = env.reset_world(rollout.task_index, "train", max_rounds=max(len(actions), 1))
  observations = [env.step(action)[0] for action in actions]
  return Exploration(env=rollout.env, world=rollout.task_index, episode=episode, explorer="policy",
                     first_observation=first, actions=actions, observations=observations,
                     hindsight=env.hindsight_tasks())


@gin.configurable
class SyntheticTasks(RLExtension):
  """The task mixture as an RL extension (module docstring)."""

  name = "synthetic_tasks"

  def __init__(self, *, taskset: str | None = None, use_original_tasks: bool = True,
               synthetic_data_ratio: float = 1.0, regenerate_every: int = 0, proposer: str = "hindsight",
               llm: Generate | None = None):
    """
    Args:
      taskset: a task set file (`evolver.tasks.generate`: MODEL_DIR/synthetic_tasks.jsonl); None: start from no
        synthetic task (then `regenerate_every` makes them).
      use_original_tasks, synthetic_data_ratio: the mixture (`evolver.tasks.taskset.TaskMixture`).
      regenerate_every: grow the set from the step's rollouts every this many steps (0: never).
      proposer: who turns the replayed rollouts into tasks: "hindsight" (the env's outcomes) or "llm" (`llm`).
      llm: the llm proposer's `generate(prompts) -> texts` (gin: `@proposer/LivePolicyGenerate()`,
        `@proposer/CheckpointGenerate()`, `@proposer/OpenAIGenerate()`).
    """
    if regenerate_every < 0:
      raise ValueError(f"regenerate_every must be >= 0, got {regenerate_every}")
    if proposer not in PROPOSERS:
      raise ValueError(f"unknown proposer {proposer!r}; use one of {list(PROPOSERS)}")
    if proposer == "llm" and llm is None:
      raise ValueError("SyntheticTasks.proposer='llm' needs `llm`, a generate(prompts) -> texts callable: bind "
                       "SyntheticTasks.llm = @proposer/LivePolicyGenerate() (the policy being trained), "
                       "@proposer/CheckpointGenerate() or @proposer/OpenAIGenerate() (evolver.models.generate)")
    self.taskset, self.use_original_tasks = taskset, use_original_tasks
    self.synthetic_data_ratio, self.regenerate_every = synthetic_data_ratio, regenerate_every
    self.proposer, self.llm = proposer, llm
    self.seed = 0  # the run's (start): the mixture, a pure function of the tasks and the seed, is the same on resume
    self.mixture: TaskMixture | None = None
    self._filter: filters_lib.TaskFilter | None = None
    self._replay_envs: dict[str, Any] = {}

  def start(self, *, model_dir: str, envs: Sequence[str], seed: int, tokenizer: Any = None) -> None:
    del model_dir, tokenizer
    self.seed = seed
    slices = TaskSlices()
    originals = slice_tasks(envs, slices.explore_start, slices.explore_count)
    records = [r for r in (load_taskset(self.taskset) if self.taskset else []) if r.spec.env in envs]
    self.mixture = TaskMixture(originals, records, use_original_tasks=self.use_original_tasks,
                               synthetic_data_ratio=self.synthetic_data_ratio, seed=self.seed)
    self._filter = filters_lib.TaskFilter(envs_lib.make, originals={
        name: list(range(slices.explore_start, slices.explore_start + slices.explore_count)) for name in envs})
    print(f"[synthetic_tasks] {self.mixture.stats()}", flush=True)

  def choose_tasks(self, step: int, tasks: list[Task]) -> list[Task]:
    return self.mixture.draw(step, len(tasks))

  def after_step(self, step: int, rollouts: Sequence[Rollout]) -> dict[str, Any]:
    row: dict[str, Any] = {"synthetic_in_step": sum(r.task_spec is not None for r in rollouts)}
    if not self.regenerate_every or (step + 1) % self.regenerate_every:
      return row
    started = time.perf_counter()
    explorations = []
    for number, rollout in enumerate(r for r in rollouts if not r.failed and r.split == "train"):
      if rollout.env not in self._replay_envs:
        self._replay_envs[rollout.env] = envs_lib.make(rollout.env)
      explorations.append(replay_as_exploration(self._replay_envs[rollout.env], rollout, number))
    if self.proposer == "llm":
      proposals, counts, _ = propose_llm(explorations, self.llm, envs_lib.make)
      row.update({f"llm_{name}": count for name, count in counts.items()})
    else:
      proposals = propose_hindsight(explorations)
    result = self._filter([p.candidate() for p in proposals])
    known = {r.spec.key() for r in self.mixture.records}
    source = "rollout" if self.proposer == "hindsight" else "rollout_llm"
    added = [SyntheticTask(spec=proposals[k.index].spec, actions=tuple(k.actions),
                           description=proposals[k.index].description,
                           source={"proposer": source, "world": proposals[k.index].world, "episode": step + 1})
             for k in result.kept if proposals[k.index].spec.key() not in known]
    if added:
      self.mixture = TaskMixture(self.mixture.originals, self.mixture.records + added,
                                 use_original_tasks=self.use_original_tasks,
                                 synthetic_data_ratio=self.synthetic_data_ratio, seed=self.seed)
    row.update(proposed=len(proposals), added=len(added), synthetic_available=len(self.mixture.records),
               **{"time/regenerate_s": time.perf_counter() - started})
    return row

  def state_files(self) -> dict[str, bytes]:
    return self.mixture.state_files() if self.mixture is not None else {}

  def load_state_files(self, files: Mapping[str, bytes]) -> None:
    if self.mixture is not None:
      self.mixture.load_state_files(files)

  def close(self) -> None:
    for env in self._replay_envs.values():
      env.close()
    if self._filter is not None:
      self._filter.close()
