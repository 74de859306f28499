"""Behaviour cloning on expert ReAct trajectories (AgentEvol's first stage).

  python -m launch.train --gin_file=gin_configs/runs/bc.gin --gin_bindings="MODEL_DIR='runs/bc'" \
      --gin_bindings="TRAIN_STEPS=40"

Trains on the expert slice of each env's `train` split, evaluates on the `val` slice (other `train` indices)
every `eval_every` steps and keeps the best policy, then reports that policy on the held-out `eval` split
(`MODEL_DIR/eval_results.json`).
"""

import os
from collections.abc import Sequence
from typing import Any

import gin
import jax
import numpy as np
from tqdm.auto import tqdm

from evolver.data import batching
from evolver.models import tokenizer as tokenizer_lib
from evolver.models.sampler import Sampler
from evolver.train import checkpoints as ckpt_lib
from evolver.train import evaluation
from evolver.train import optimizer as optimizer_lib
from evolver.train import step as step_lib
from evolver.train import trainer as trainer_lib

STEP_KEYS = ("input_ids", "loss_mask")


@gin.configurable
def train_bc(*, model_dir: str = gin.REQUIRED, train_steps: int = gin.REQUIRED,
             envs: Sequence[str] = ("maze", "wordle", "textcraft", "babyai", "sql", "tools"),
             expert_start: int = 0, expert_count: int = 200, val_start: int = 400, val_count: int = 16,
             batch_size: int = 8, buckets: Sequence[int] = (512, 768, 1024, 1536), seed: int = 0,
             eval_every: int = 0, eval_tasks: int = 0, eval_max_new_tokens: int = 96,
             curriculum_steps: int = 0, window_turns: int = 2, window_batch_size: int = 32,
             window_buckets: Sequence[int] = (256, 512), curriculum_loss: str = "all",
             context_loss_weight: float = 0.0, tokenizer_path: str | None = None,
             data_dir: str | None = None) -> dict[str, Any]:
  """Runs (or resumes) BC. Returns the final `eval` results (empty when eval_tasks is 0).

  Args:
    envs: env names; expert data and val/eval tasks are per env.
    expert_start, expert_count: the expert slice of each env's train split (D_s).
    val_start, val_count: the val slice (model selection), disjoint from the expert slice.
    eval_every: steps between val evaluations (0 = none; the last policy is then the one reported).
    eval_tasks: held-out `eval` tasks per env for the final report (0 = skip).
    curriculum_steps: the first steps train on short windows of the expert episodes (`turn_windows`: the task
      statement and `window_turns` consecutive turns, `window_batch_size` rows on `window_buckets`) before the
      whole episodes; 0 = off.
    curriculum_loss: "all" trains the windows' every token (the observations too: the environment's text as a
      language model), "assistant" only the actions.
    context_loss_weight: after the curriculum, the episodes' other tokens (instruction, observations) train
      too, at this weight relative to the actions (`batching.with_context_loss`); 0 = actions only.
  """
  if not (expert_start + expert_count <= val_start or val_start + val_count <= expert_start):
    raise ValueError(f"the val slice [{val_start}, {val_start + val_count}) overlaps the expert slice "
                     f"[{expert_start}, {expert_start + expert_count})")
  batching.check_curriculum_loss(curriculum_loss)
  batching.check_context_loss_weight(context_loss_weight)
  tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
  model = trainer_lib.init_policy(seed=seed)
  if model.config.vocab_size < len(tokenizer):
    raise ValueError(f"the model's vocabulary ({model.config.vocab_size}) is smaller than the tokenizer's "
                     f"({len(tokenizer)})")
  data = batching.expert_batch_iterator(list(envs), expert_start, expert_count, batch_size, tokenizer=tokenizer,
                                        data_dir=data_dir, buckets=tuple(buckets), seed=seed)
  windows = None
  if curriculum_steps:
    windows = batching.window_batch_iterator(list(envs), expert_start, expert_count, window_batch_size,
                                             turns=window_turns, tokenizer=tokenizer, data_dir=data_dir,
                                             buckets=tuple(window_buckets), seed=seed)
  optimizer = optimizer_lib.make_optimizer(train_steps)
  trainer = trainer_lib.Trainer(model_dir, model, optimizer, step_lib.sft_loss_fn, seed=seed)
  trainer_lib.write_gin_config(model_dir)
  extra = trainer.restore_latest() or {}
  if "data" in extra:
    data.set_state(extra["data"])
  if windows is not None and "windows" in extra:
    windows.set_state(extra["windows"])
  best = extra.get("best_val")
  writer = trainer.open_metrics()
  val_indices = list(range(val_start, val_start + val_count))
  print(f"[bc] {len(envs)} envs, {data.num_examples} expert trajectories ({data.num_dropped} too long, "
        f"{data.num_filtered} filtered), batch {batch_size}; resuming at step {trainer.step}" if trainer.step else
        f"[bc] {len(envs)} envs, {data.num_examples} expert trajectories ({data.num_dropped} too long, "
        f"{data.num_filtered} filtered), batch {batch_size}; starting")
  wrote_operative = False
  sampler = None  # one Sampler for every val evaluation: its compiled programs are reused, weights swapped in
  bar = tqdm(total=train_steps, initial=trainer.step, desc="bc", unit="step", dynamic_ncols=True)
  try:
    while trainer.step < train_steps:
      batch = batching.next_training_batch(data, windows, trainer.step < curriculum_steps, curriculum_loss,
                                           context_loss_weight)
      metrics = trainer.train_step({k: batch[k] for k in STEP_KEYS})
      step = trainer.step
      if not wrote_operative:
        trainer_lib.write_gin_config(model_dir, "operative_config.gin", operative=True)
        wrote_operative = True
      row = {k: float(v) for k, v in jax.device_get(metrics).items()}
      row.update(epoch=data.epoch, dropped_too_long=data.num_dropped, curriculum=float(step <= curriculum_steps))
      if eval_every and (step % eval_every == 0 or step == train_steps):
        if sampler is None:
          sampler = Sampler(trainer.policy())
        else:
          sampler.update_params(trainer.state.params)
        results = evaluation.evaluate(sampler, tokenizer, envs, split="train",
                                      indices=val_indices, max_new_tokens=eval_max_new_tokens, keep_episodes=False)
        row.update(evaluation.flatten_metrics(results, "val"))
        score = results["overall"]["success"]
        if best is None or score > best:
          best = score
          trainer.save_best(score, {"step": step})
        row["val/best_success"] = best
      if step % trainer.config.log_every == 0 or step == train_steps:
        writer.write(step, row)
      if step % trainer.config.checkpoint_every == 0 or step == train_steps:
        trainer.save({"data": data.get_state(), "best_val": best,
                      **({"windows": windows.get_state()} if windows is not None else {})})
      bar.update(1)
      bar.set_postfix(loss=f"{row['loss']:.3f}")
  finally:
    bar.close()
    trainer.checkpointer.wait()
  results: dict[str, Any] = {}
  if eval_tasks:
    if eval_every and os.path.isdir(ckpt_lib.checkpoint_dir(model_dir, ckpt_lib.BEST_SUBDIR)):
      policy, policy_step = ckpt_lib.restore_model(model_dir, best=True)
    else:
      policy, policy_step = trainer.policy(), trainer.step
    results = evaluation.evaluate(Sampler(policy), tokenizer, envs, split="eval", num_tasks=eval_tasks,
                                  max_new_tokens=eval_max_new_tokens)
    results["policy_step"] = policy_step
    results["selected_on"] = "val" if eval_every else "last step"
    evaluation.write_eval_results(os.path.join(model_dir, "eval_results.json"), results)
    final = evaluation.flatten_metrics(results, "eval")
    writer.write(trainer.step, final)
    print_success_table(results)
  trainer.close()
  return results


def print_success_table(results: dict[str, Any]) -> None:
  print(f"\n{'env':>10}  {'success':>8}  {'reward':>7}  {'turns':>6}  {'tasks':>6}")
  for name, r in results["envs"].items():
    print(f"{name:>10}  {r['success']:8.3f}  {r['reward']:7.3f}  {r['turns']:6.2f}  {r['num_tasks']:6d}")
  o = results["overall"]
  print(f"{'overall':>10}  {o['success']:8.3f}  {o['reward']:7.3f}")
