"""Behaviour cloning on expert ReAct trajectories (AgentEvol's first stage).

  python -m launch.train --gin_file=gin_configs/runs/bc.gin --gin_bindings="MODEL_DIR='runs/bc'" \
      --gin_bindings="TRAIN_STEPS=40"

Trains on the expert slice of each env's `train` split (`TaskSlices`), optionally starting with a context-length
curriculum on short windows of the episodes. The shared loop (`evolver.train.loop`) evaluates on the `val` slice,
keeps the best policy, checkpoints, resumes, and reports the selected policy on the held-out `eval` split.
"""

from collections.abc import Sequence
from typing import Any

import gin

from evolver.data import batching
from evolver.models import tokenizer as tokenizer_lib
from evolver.train import optimizer as optimizer_lib
from evolver.train import step as step_lib
from evolver.train import trainer as trainer_lib
from evolver.train.loop import Loop, scalar_metrics
from evolver.train.slices import TaskSlices

STEP_KEYS = ("input_ids", "loss_mask")


@gin.configurable
def train_bc(*, model_dir: str = gin.REQUIRED, train_steps: int = gin.REQUIRED,
             envs: Sequence[str] = ("maze", "wordle", "textcraft", "babyai", "sql", "tools"), batch_size: int = 8,
             buckets: Sequence[int] = (512, 768, 1024, 1536), seed: int = 0, curriculum_steps: int = 0,
             window_turns: int = 2, window_batch_size: int = 32, window_buckets: Sequence[int] = (256, 512),
             curriculum_loss: str = "all", context_loss_weight: float = 0.0, tokenizer_path: str | None = None,
             data_dir: str | None = None) -> dict[str, Any]:
  """Runs (or resumes) BC. Returns the final `eval` results (empty when LoopConfig.eval_tasks is 0).

  Args:
    envs: env names; expert data and val/eval tasks are per env (the slices are `TaskSlices`'s).
    curriculum_steps: the first steps train on short windows of the expert episodes (`turn_windows`: the task
      statement and `window_turns` consecutive turns, `window_batch_size` rows on `window_buckets`) before the
      whole episodes; 0 = off.
    curriculum_loss: "all" trains the windows' every token (the observations too: the environment's text as a
      language model), "assistant" only the actions.
    context_loss_weight: after the curriculum, the episodes' other tokens (instruction, observations) train
      too, at this weight relative to the actions (`batching.with_context_loss`); 0 = actions only.
  """
  slices = TaskSlices()
  slices.check_disjoint("expert", "val")
  batching.check_curriculum_loss(curriculum_loss)
  batching.check_context_loss_weight(context_loss_weight)
  tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
  model = trainer_lib.init_policy(seed=seed, tokenizer=tokenizer)
  trainer_lib.check_vocabulary(model, tokenizer)
  data = batching.expert_batch_iterator(list(envs), slices.expert_start, slices.expert_count, batch_size,
                                        tokenizer=tokenizer, data_dir=data_dir, buckets=tuple(buckets), seed=seed)
  windows = None
  if curriculum_steps:
    windows = batching.window_batch_iterator(list(envs), slices.expert_start, slices.expert_count,
                                             window_batch_size, turns=window_turns, tokenizer=tokenizer,
                                             data_dir=data_dir, buckets=tuple(window_buckets), seed=seed)
  trainer = trainer_lib.Trainer(model_dir, model, optimizer_lib.make_optimizer(train_steps), step_lib.sft_loss_fn,
                                seed=seed)
  loop = Loop("bc", model_dir, trainer, tokenizer, envs=envs, val_indices=slices.val_indices)
  extra = loop.resume()
  if "data" in extra:
    data.set_state(extra["data"])
  if windows is not None and "windows" in extra:
    windows.set_state(extra["windows"])
  print(f"[bc] {len(envs)} envs, {data.num_examples} expert trajectories ({data.num_dropped} too long, "
        f"{data.num_filtered} filtered), batch {batch_size}", flush=True)

  def bc_step() -> dict[str, Any]:
    in_curriculum = trainer.step < curriculum_steps
    batch = batching.next_training_batch(data, windows, in_curriculum, curriculum_loss, context_loss_weight)
    row = scalar_metrics(trainer.train_step({k: batch[k] for k in STEP_KEYS}))
    row.update(epoch=data.epoch, dropped_too_long=data.num_dropped, curriculum=float(in_curriculum))
    return row

  loop.run(bc_step, until=train_steps,
           extras=lambda: {"data": data.get_state(), **({"windows": windows.get_state()} if windows else {})})
  return loop.finish()
