"""AgentEvol (AgentGym's self-evolution): behaviour cloning, then M rounds of explore and learn.

  python -m launch.train --gin_file=gin_configs/runs/agentevol.gin --gin_bindings="MODEL_DIR='runs/agentevol'" --gin_bindings="TRAIN_STEPS=1000"

The paper's algorithm (not AgentGym's code, which never sampled K per instruction):

  phase 0 (BC):     train the base model on the expert set D_s (expert slice of each env's `train` split),
                    its first `curriculum_steps` steps on short windows of D_s (BC's context-length curriculum).
  phase m = 1..M:   explore: the current policy (the last step of phase m-1) samples K trajectories per
                    instruction of the exploration slice at temperature T; the environment rewards them;
                    identical successful trajectories (same task, same assistant texts) are kept once.
                    learn: train **the base model again** (same base parameters, fresh optimizer state) for
                    TRAIN_STEPS steps on D_s merged with the explored trajectories, reward-weighted
                    (`binary_reward`: successes only, weight 1, AgentGym's filter; else weight = reward).
                    With a curriculum it starts from the train state kept at the curriculum's end
                    (`MODEL_DIR/base/`, where re-running the same curriculum would end) for the
                    TRAIN_STEPS - curriculum_steps steps after it.
  merge strategies: `expert+current` D_s + this iteration's (the paper), `accumulate` D_s + every iteration's
                    so far (AgentGym's code), `current` this iteration's only (ablation).

Every phase ends with a greedy evaluation on `val` (`TaskSlices`: disjoint from the expert and exploration
slices) that selects the policy reported on the held-out `eval` split at the end (`MODEL_DIR/eval_results.json`,
with the per-phase history); the shared loop (`evolver.train.loop`) runs val, metrics, checkpoints and that
report. Each phase's final policy is kept (`MODEL_DIR/phases/`); with `LoopConfig.eval_tasks` every one is
evaluated on `eval` too (BC's is the "before"). Explorations are kept with the run (`evolver.train.explorations`).

Checkpoints and resume. One Trainer and one orbax directory (`MODEL_DIR/checkpoints/`) serve every phase, with
*global* step numbers: phase p's local step s is global step p * TRAIN_STEPS + s, so the checkpoints, the
metrics rows and TensorBoard share one monotonic axis and `launch.eval`/`INIT_CHECKPOINT` see an ordinary run.
At a learning phase's start the Trainer's state is replaced by a fresh TrainState (base parameters,
`optimizer.init`, step counter p * TRAIN_STEPS), or with a curriculum by the state kept at its end (step counter
p * TRAIN_STEPS + curriculum_steps); the jitted step is reused, as shapes are unchanged. A checkpoint's extras record the
phase, TRAIN_STEPS, the phase's batch-iterator position, the best val score and the per-phase history; the last
step of a phase is always saved. On restart the latest complete checkpoint says where the run was: inside phase
p (restore it, resume p's data iterator) or at the end of p (go on with p + 1). Phase m always trains on the
exploration it reads back from `MODEL_DIR/explore/iter_{m}` (the sampled token arrays included): a restarted run
reuses a finished exploration and trains on exactly the same data.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence
from typing import Any

import gin
import jax.numpy as jnp
import optax
from flax import nnx
from transformers import PreTrainedTokenizerBase

from evolver import distributed
from evolver.data import batching
from evolver.data.tokenize import TokenizedExample, tokenize_trajectory
from evolver.data.trajectory import Trajectory
from evolver.models import tokenizer as tokenizer_lib
from evolver.rollout import RolloutConfig
from evolver.tasks.taskset import TaskMixture, load_taskset
from evolver.train import checkpoints as ckpt_lib
from evolver.train import explorations
from evolver.train import optimizer as optimizer_lib
from evolver.train import state as state_lib
from evolver.train import step as step_lib
from evolver.train import trainer as trainer_lib
from evolver.train.loop import Loop, scalar_metrics
from evolver.train.slices import TaskSlices, slice_tasks

STEP_KEYS = ("input_ids", "loss_mask", "weights")
MERGE_STRATEGIES = ("expert+current", "accumulate", "current")
BASE_SUBDIR = "base"  # the train state at the curriculum's end, where every learning phase restarts
PHASES_SUBDIR = "phases"  # the policy at each phase's end (params only): the held-out before/after table


# ----------------------------------------------------------------------------------------------------------
# Datasets: reward weights, merge (pure functions).
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass
class WeightedTrajectory(Trajectory):
  """A trajectory with its reward-weighted SFT weight (the expert set's plain Trajectories weigh 1)."""

  weight: float = 1.0


def with_weight(trajectory: Trajectory, weight: float) -> WeightedTrajectory:
  fields = {f.name: getattr(trajectory, f.name) for f in dataclasses.fields(Trajectory)}
  return WeightedTrajectory(**fields, weight=float(weight))


def reward_weighted(trajectories: Sequence[Trajectory], binary_reward: bool = True) -> list[WeightedTrajectory]:
  """The trajectories that train, with their weights: with `binary_reward` the successes, weight 1
  (AgentGym's filter); otherwise every trajectory with reward > 0, weight = reward. Failed rollouts (env
  errors) never train."""
  out = []
  for trajectory in trajectories:
    if trajectory.failed:
      continue
    weight = float(trajectory.success) if binary_reward else float(trajectory.reward)
    if weight > 0:
      out.append(with_weight(trajectory, weight))
  return out


def learning_sources(expert: Sequence[Trajectory], explored: Sequence[Sequence[Trajectory]], merge: str,
                     binary_reward: bool = True) -> tuple[list[Sequence[Trajectory]], dict[str, int]]:
  """The data of a learning phase: D_s and/or the explored trajectories, deduplicated and weighted.

  Args:
    expert: D_s (plain Trajectories; the expert's failures are left out later by the iterator's keep_fn).
    explored: the trajectories of iterations 1..m, in order (empty for phase 0, BC on D_s alone).
    merge: one of MERGE_STRATEGIES.
    binary_reward: see `reward_weighted`.

  Returns:
    (sources to concatenate, {"explored_examples": how many explored trajectories train,
     "explored_duplicates": successful duplicates removed from them}).
  """
  if merge not in MERGE_STRATEGIES:
    raise ValueError(f"merge must be one of {MERGE_STRATEGIES}, got {merge!r}")
  if not explored:
    return [expert], {"explored_examples": 0, "explored_duplicates": 0}
  if merge == "accumulate":
    new = [t for iteration in explored for t in iteration]
  else:
    new = list(explored[-1])
  unique, duplicates = explorations.dedup_successes(new)
  weighted = reward_weighted(unique, binary_reward)
  counts = {"explored_examples": len(weighted), "explored_duplicates": duplicates}
  if merge == "current":
    if not weighted:
      raise ValueError(f"iteration {len(explored)} kept no trajectory (no success among {len(new)}), and merge "
                       "'current' trains on this iteration's trajectories only: nothing to learn from. Use "
                       "'expert+current', more samples_per_task, or a stronger BC phase")
    return [weighted], counts
  return [expert, weighted], counts


# ----------------------------------------------------------------------------------------------------------
# Training phases.
# ----------------------------------------------------------------------------------------------------------


def tokenize_weighted(trajectory: Trajectory, tokenizer: PreTrainedTokenizerBase) -> TokenizedExample:
  return tokenize_trajectory(trajectory, tokenizer, weight=getattr(trajectory, "weight", 1.0))


def keep_for_training(trajectory: Trajectory) -> bool:
  """Explored trajectories were filtered by `reward_weighted`; of the expert's, successes only (as BC)."""
  return isinstance(trajectory, WeightedTrajectory) or trajectory.success


def reset_to_base(trainer: trainer_lib.Trainer, base: nnx.Module, optimizer: optax.GradientTransformation,
                  seed: int, step: int) -> None:
  """Gives the trainer a fresh TrainState: `base`'s parameters, a new optimizer state, step counter `step`."""
  _, params = nnx.split(base)
  state = state_lib.create_train_state(trainer_lib.cast_floats(params, jnp.float32), optimizer, seed)
  state = state.replace(step=jnp.asarray(step, jnp.int32))
  trainer.state = distributed.put_global(state, trainer.shardings)


def save_curriculum_end(trainer: trainer_lib.Trainer, base: ckpt_lib.Checkpointer) -> None:
  """Keeps the whole train state (parameters, optimizer state, rng) at the curriculum's end; a resumed run
  recomputing that step finds it kept already."""
  if trainer.step in base.all_steps():
    return
  base.save(trainer.step, trainer.state.params, trainer.train_part(trainer.state),
            {"model_config": ckpt_lib.model_config_to_json(trainer.model_config)}, force=True)


def restore_curriculum_end(trainer: trainer_lib.Trainer, base: ckpt_lib.Checkpointer, curriculum_steps: int,
                           step: int) -> None:
  """Puts the train state kept at the curriculum's end into the trainer, its step counter set to `step`: the
  state phase p would reach after re-running the (same, deterministic) curriculum from the base model."""
  saved = base.latest_step()
  if saved != curriculum_steps:
    raise FileNotFoundError(f"{base.directory} holds no train state of the curriculum's end (step "
                            f"{curriculum_steps}; found {saved}): the run cannot restart a learning phase")
  params, train, _ = base.restore(saved, ckpt_lib.abstract_of(trainer.state.params),
                                  ckpt_lib.abstract_of(trainer.train_part(trainer.state)))
  trainer.state = trainer.state.replace(params=params, opt_state=train["opt_state"], rng=train["rng"],
                                        step=jnp.asarray(step, jnp.int32))


def resume_position(step: int, extra: dict[str, Any], train_steps: int) -> tuple[int, int]:
  """(phase, local step) to continue from, given the restored global step and its checkpoint extras."""
  if not extra:
    return 0, 0
  if "phase" not in extra:
    raise ValueError(f"the checkpoint at step {step} does not come from an AgentEvol run (its extras record no "
                     "phase); use a new MODEL_DIR, or INIT_CHECKPOINT to start from it")
  if extra.get("train_steps") != train_steps:
    raise ValueError(f"this run's checkpoints were made with TRAIN_STEPS={extra.get('train_steps')} per phase; "
                     f"resuming with TRAIN_STEPS={train_steps} would renumber its phases. Use the same TRAIN_STEPS "
                     "or a new MODEL_DIR")
  phase = int(extra["phase"])
  local = step - phase * train_steps
  if not 0 < local <= train_steps:
    raise RuntimeError(f"checkpoint at step {step} says phase {phase}, outside it ({train_steps} steps per phase)")
  return (phase + 1, 0) if local == train_steps else (phase, local)


def phase_name(phase: int) -> str:
  return "bc" if phase == 0 else f"iteration {phase}"


def print_history(history: Sequence[dict[str, Any]]) -> None:
  """Per phase: val success per env and overall, and what its exploration found."""
  names = list(history[0]["val"]) if history else []
  print("\nval success by phase")
  print(f"{'phase':>12}  " + "  ".join(f"{n:>9}" for n in names)
        + f"  {'overall':>8}  {'explore':>8}  {'kept':>5}  {'dups':>5}")
  for h in history:
    e = h.get("explore") or {}
    explored = f"{e['success']:8.3f}  {e['kept']:5d}  {e['duplicates']:5d}" if e else f"{'-':>8}  {'-':>5}  {'-':>5}"
    print(f"{phase_name(h['phase']):>12}  " + "  ".join(f"{h['val'].get(n, 0.0):9.3f}" for n in names)
          + f"  {h['val_success']:8.3f}  {explored}")


@gin.configurable
def train_agentevol(*, model_dir: str = gin.REQUIRED, train_steps: int = gin.REQUIRED, num_iterations: int = 2,
                    envs: Sequence[str] = ("maze", "wordle", "textcraft", "babyai", "sql", "tools"),
                    samples_per_task: int = 4, temperature: float = 1.0, merge: str = "expert+current",
                    binary_reward: bool = True, batch_size: int = 8, buckets: Sequence[int] = (512, 768, 1024, 1536),
                    seed: int = 0, max_new_tokens: int = 96, max_rounds: int | None = None,
                    rollout_batch_size: int = 64, curriculum_steps: int = 0, window_turns: int = 2,
                    window_batch_size: int = 16, window_buckets: Sequence[int] = (256, 512),
                    curriculum_loss: str = "all", context_loss_weight: float = 0.0, tokenizer_path: str | None = None,
                    data_dir: str | None = None, taskset: str | None = None, use_original_tasks: bool = True,
                    synthetic_data_ratio: float = 1.0) -> dict[str, Any]:
  """Runs (or resumes) AgentEvol. Returns the final `eval` results (empty when LoopConfig.eval_tasks is 0).

  The expert (D_s), exploration and val slices of each env's train split are `TaskSlices`'s.

  Args:
    model_dir: the run directory (checkpoints, metrics, explorations, results).
    train_steps: steps of each phase (BC and every learning phase).
    num_iterations: M, explore-and-learn iterations after BC.
    envs: env names; expert data, exploration, val and eval tasks are per env.
    samples_per_task: K, trajectories sampled per exploration instruction.
    temperature: T, the exploration's sampling temperature.
    merge: what each learning phase trains on, one of MERGE_STRATEGIES.
    binary_reward: keep successes only with weight 1; False weighs every trajectory by its reward.
    batch_size, buckets: rows per batch and padded lengths.
    max_new_tokens, max_rounds: per assistant turn and per episode (None: each env's own limit) in exploration.
    rollout_batch_size: exploration episodes in flight at once.
    curriculum_steps: the first steps of the BC phase train on short windows of D_s (as `train_bc`'s
      curriculum: `window_turns`, `window_batch_size`, `window_buckets`, `curriculum_loss`). The train state at
      the curriculum's end is kept (`MODEL_DIR/base/`) and every learning phase restarts from it at local step
      `curriculum_steps + 1`: exactly where re-running the same curriculum from the base model would put it, so
      the learning phases' logged steps start there. 0 = off (every phase from the base model at step 1).
    context_loss_weight: outside the curriculum, every phase's episodes (expert and explored) also train on
      their other tokens (instruction, observations) at this weight relative to the actions, scaled by the
      trajectory's weight like its actions (as `train_bc`'s; `batching.with_context_loss`). 0 = actions only.
    taskset, use_original_tasks, synthetic_data_ratio: explore a mixture of the exploration slice and a
      self-questioned task set (`evolver.tasks.taskset.TaskMixture`) instead of the slice alone. A finished
      iteration's exploration is kept with the run, so a resumed run does not re-draw it.
  """
  slices = TaskSlices()
  slices.check_disjoint("expert", "val", "explore")
  if merge not in MERGE_STRATEGIES:
    raise ValueError(f"merge must be one of {MERGE_STRATEGIES}, got {merge!r}")
  if slices.val_count <= 0:
    raise ValueError("AgentEvol selects its policy on `val`: set TaskSlices.val_count > 0")
  if not 0 <= curriculum_steps < train_steps:
    raise ValueError(f"curriculum_steps ({curriculum_steps}) must be in [0, TRAIN_STEPS={train_steps}): every "
                     "phase needs steps on its own data after the curriculum")
  batching.check_curriculum_loss(curriculum_loss)
  batching.check_context_loss_weight(context_loss_weight)
  envs = list(envs)
  tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
  model = trainer_lib.init_policy(seed=seed, tokenizer=tokenizer)
  trainer_lib.check_vocabulary(model, tokenizer)
  explore_tasks = slice_tasks(envs, slices.explore_start, slices.explore_count) if num_iterations else []
  if taskset and num_iterations:
    synthetic = [r for r in load_taskset(taskset) if r.spec.env in envs]
    explore_tasks = TaskMixture(explore_tasks, synthetic, use_original_tasks=use_original_tasks,
                                synthetic_data_ratio=synthetic_data_ratio, seed=seed).pool
  optimizer = optimizer_lib.make_optimizer(train_steps)
  trainer = trainer_lib.Trainer(model_dir, model, optimizer, step_lib.sft_loss_fn, seed=seed)
  del model  # its arrays may be the trainer's, which the first step donates
  loop = Loop("agentevol", model_dir, trainer, tokenizer, envs=envs, val_indices=slices.val_indices)
  extra = loop.resume()
  if extra and extra.get("curriculum_steps", 0) != curriculum_steps:
    raise ValueError(f"this run's checkpoints were made with curriculum_steps={extra.get('curriculum_steps', 0)}; "
                     f"resuming with {curriculum_steps} would change its phases. Use the same value or a new MODEL_DIR")
  phase, local = resume_position(trainer.step, extra, train_steps)
  history = list(extra.get("history", []))
  from evolver.data import tfds_builders  # tensorflow_datasets only for the expert set
  expert = tfds_builders.load_expert_source(envs, slices.expert_start, slices.expert_count, data_dir)
  tokenize_fn = functools.partial(tokenize_weighted, tokenizer=tokenizer)
  base = None
  if curriculum_steps:
    base = ckpt_lib.Checkpointer(model_dir, max_to_keep=1, async_save=False, subdir=BASE_SUBDIR)
  phases = ckpt_lib.Checkpointer(model_dir, max_to_keep=None, async_save=False, subdir=PHASES_SUBDIR)
  windows = None
  if curriculum_steps and phase == 0 and local < curriculum_steps:
    windows = batching.window_batch_iterator(envs, slices.expert_start, slices.expert_count, window_batch_size,
                                             turns=window_turns, tokenizer=tokenizer, data_dir=data_dir,
                                             buckets=tuple(window_buckets), seed=seed)
    if "windows" in extra:
      windows.set_state(extra["windows"])
  print(f"[agentevol] {len(envs)} envs, {num_iterations} iterations x {train_steps} steps, merge {merge!r}; "
        + (f"step {trainer.step} is {phase_name(phase)}, local step {local}" if trainer.step else "starting"),
        flush=True)

  explored: list[list[Trajectory]] = []
  for p in range(phase, num_iterations + 1):
    resuming = p == phase and local > 0
    start = p * train_steps
    # --- explore (iterations 1..M), with the policy as phase p-1 left it -------------------------------------
    explore_row: dict[str, float] = {}
    explore_summary: dict[str, Any] | None = None
    if p > 0:
      explored = [explorations.load_finished(model_dir, m) for m in range(1, p)]
      if resuming:  # explored before this phase trained; the current weights are not the explorer's
        current = explorations.load_finished(model_dir, p)
        print(f"[agentevol] iteration {p}: reusing the saved exploration ({len(current)} trajectories)")
      else:
        trainer.checkpointer.wait()  # phase p-1's last checkpoint is complete before its exploration is kept
        config = RolloutConfig(max_new_tokens=max_new_tokens, temperature=temperature, max_rounds=max_rounds,
                               num_samples=samples_per_task, batch_size=rollout_batch_size, seed=seed * 1000 + p)
        current = explorations.explore_or_load(model_dir, p, loop.sync_policy(), explore_tasks, config,
                                               policy_step=start, tag="agentevol")
      explored.append(current)
      explore_summary = explorations.exploration_stats(current)
      explore_summary["kept"] = len(reward_weighted(explorations.dedup_successes(current)[0], binary_reward))
      explore_row = {f"explore/{k}": float(v) for k, v in explore_summary.items()}
      print(f"[agentevol] iteration {p}: exploration success {explore_summary['success']:.3f} (best@"
            f"{samples_per_task} {explore_summary['best_success']:.3f}), {explore_summary['kept']} kept, "
            f"{explore_summary['duplicates']} duplicate successes dropped", flush=True)
    # --- learn: from the base model, on the merged data -------------------------------------------------------
    sources, counts = learning_sources(expert, explored, merge, binary_reward)
    data = batching.BatchIterator(batching.ConcatSource(*sources), tokenize_fn, batch_size=batch_size,
                                  pad_id=batching.pad_id_of(tokenizer), buckets=tuple(buckets), seed=seed + p,
                                  keep_fn=keep_for_training)
    first = start + 1 if p == 0 else start + curriculum_steps + 1  # learning phases skip the curriculum
    start_norm = None
    if resuming:
      data.set_state(extra["data"])
    else:
      if p > 0 and curriculum_steps:
        restore_curriculum_end(trainer, base, curriculum_steps, first - 1)
      elif p > 0:
        reset_to_base(trainer, trainer_lib.init_policy(seed=seed, tokenizer=tokenizer), optimizer, seed, start)
      start_norm = float(optax.tree.norm(trainer.state.params))
    print(f"[agentevol] {phase_name(p)}: {data.num_examples} examples ({counts['explored_examples']} explored, "
          f"{data.num_dropped} too long), steps {first}-{start + train_steps}"
          + (f" (1-{curriculum_steps}: the curriculum)" if p == 0 and curriculum_steps else ""), flush=True)

    def learn_step(p=p, start=start, data=data) -> dict[str, Any]:
      in_curriculum = p == 0 and trainer.step - start < curriculum_steps
      batch = batching.next_training_batch(data, windows, in_curriculum, curriculum_loss, context_loss_weight)
      row = scalar_metrics(trainer.train_step({k: batch[k] for k in STEP_KEYS}))
      if in_curriculum and trainer.step - start == curriculum_steps:
        save_curriculum_end(trainer, base)
      row.update(phase=p, phase_step=trainer.step - start, epoch=data.epoch, dropped_too_long=data.num_dropped,
                 curriculum=float(in_curriculum))
      return row

    def checkpoint_extras(p=p, start=start, data=data) -> dict[str, Any]:
      in_curriculum = p == 0 and trainer.step - start <= curriculum_steps  # the step just taken
      return {"phase": p, "train_steps": train_steps, "curriculum_steps": curriculum_steps,
              "data": data.get_state(), "history": history,
              **({"windows": windows.get_state()} if in_curriculum and windows is not None else {})}

    def phase_end(results: dict[str, Any], p=p, counts=counts, explore_summary=explore_summary) -> None:
      save_phase_end(trainer, phases, p)
      history.append({"phase": p, "step": trainer.step, "val_success": results["overall"]["success"],
                      "val": {name: r["success"] for name, r in results["envs"].items()},
                      "explore": explore_summary, **counts})

    loop.run(learn_step, until=start + train_steps, origin=start, first=first, extras=checkpoint_extras,
             first_row=dict(explore_row, start_param_norm=start_norm, train_examples=data.num_examples, **counts),
             at_end=phase_end, desc=phase_name(p))
    local = 0
  if base is not None:
    base.close()
  if history:
    print_history(history)
  by_phase = evaluate_phase_ends(loop, phases, history) if loop.config.eval_tasks else {}
  phases.close()
  policy_step, _ = loop.selected_policy()
  results = loop.finish(
      extra_results=dict(policy_phase=(policy_step - 1) // train_steps if policy_step else 0, merge=merge,
                         num_iterations=num_iterations, phases=history,
                         by_phase={name: {k: r[k] for k in ("policy_step", "envs", "overall", "episodes") if k in r}
                                   for name, r in by_phase.items()}),
      reuse={r["policy_step"]: r for r in by_phase.values()})
  if by_phase:
    print_phase_table(by_phase, results)
  return results


def save_phase_end(trainer: trainer_lib.Trainer, phases: ckpt_lib.Checkpointer, phase: int) -> None:
  """Keeps the policy at phase `phase`'s end (a resumed run recomputing that step finds it kept already)."""
  if trainer.step in phases.all_steps():
    return
  phases.save(trainer.step, trainer.state.params, None,
              {"phase": phase, "model_config": ckpt_lib.model_config_to_json(trainer.model_config)}, force=True)


def evaluate_phase_ends(loop: Loop, phases: ckpt_lib.Checkpointer,
                        history: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
  """{phase name: held-out `eval` results of the policy at that phase's end}: BC's (before self-evolution)
  and every iteration's, the before/after table; each keeps its per-episode outcomes ("episodes"), so phases pair
  with each other and with other evaluations of the same tasks."""
  out = {}
  abstract = ckpt_lib.abstract_of(loop.trainer.state.params)
  kept = set(phases.all_steps())
  for h in history:
    if h["step"] not in kept:
      raise FileNotFoundError(f"the policy at the end of {phase_name(h['phase'])} (step {h['step']}) is missing "
                              f"from {phases.directory}")
    results = loop.evaluate(phases.restore_params(h["step"], abstract), split="eval",
                            num_tasks=loop.config.eval_tasks)
    results["policy_step"] = h["step"]
    out[phase_name(h["phase"])] = results
  return out


def print_phase_table(by_phase: dict[str, dict[str, Any]], selected: dict[str, Any]) -> None:
  """Held-out success per env at each phase's end (BC = before self-evolution) and of the val-selected policy."""
  names = list(selected["envs"])
  columns = list(by_phase) + ["selected"]
  print(f"\nheld-out success ({selected['split']} split, {selected['envs'][names[0]]['num_tasks']} tasks per env; "
        f"selected on val: step {selected['policy_step']})")
  print(f"{'env':>10}  " + "  ".join(f"{c:>12}" for c in columns))
  for name in names + ["overall"]:
    values = [(r["overall"] if name == "overall" else r["envs"][name])["success"]
              for r in [*by_phase.values(), selected]]
    print(f"{name:>10}  " + "  ".join(f"{v:12.3f}" for v in values))
