"""GRPO with the heterogeneous PPO loss: the RL stage that continues a BC run.

  python -m launch.train --gin_file=gin_configs/runs/grpo.gin --gin_bindings="MODEL_DIR='runs/grpo'" \
      --gin_bindings="INIT_CHECKPOINT='runs/bc'" --gin_bindings="TRAIN_STEPS=20"

Each RL step: draw `tasks_per_step` tasks from the exploration slice of `train`, roll out `group_size`
episodes per task with the current policy (temperature T), score them with the environment, compute GRPO
group-normalised advantages (broadcast to each trajectory's sampled tokens), recompute the behaviour
log-probabilities with the training forward (`old_logp`) and the frozen reference's (`ref_logp`), then run
`ppo_epochs` x `num_minibatches` HET-PPO updates (+ kl_coef * k3 KL to the reference - entropy_coeff * H).
exp_mask stays 0 until an experience pool supplies experience-guided rollouts. The logged `step` is the RL
step; the optimizer takes `ppo_epochs * num_minibatches` updates per RL step.
"""

import dataclasses
import functools
import os
import time
from collections.abc import Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from evolver.data import batching
from evolver.models import tokenizer as tokenizer_lib
from evolver.models.decoder import Decoder
from evolver.models.sampler import Sampler
from evolver.rl import losses
from evolver.rollout import RolloutConfig, RolloutEngine, Task
from evolver.train import checkpoints as ckpt_lib
from evolver.train import evaluation
from evolver.train import optimizer as optimizer_lib
from evolver.train import step as step_lib
from evolver.train import trainer as trainer_lib

RL_KEYS = ("input_ids", "loss_mask", "exp_mask", "advantages", "old_logp", "ref_logp")


@gin.configurable
def het_ppo_loss_fn(model: Decoder, batch: step_lib.Batch, normalizer: jax.Array, *, clip_low: float = 0.2,
                    clip_high: float = 0.28, off_clip_high: float = 0.6, clip_c: float = 3.0,
                    agg_mode: str = "token-mean", norm_len: float | None = None, kl_coef: float = 0.001,
                    entropy_coeff: float = 0.0) -> tuple[jax.Array, dict]:
  """HET-PPO policy loss + kl_coef * KL_k3(policy || reference) - entropy_coeff * entropy, over `loss_mask`.

  batch: input_ids `[B, T]` int32; loss_mask, exp_mask, advantages, old_logp, ref_logp `[B, T]` float32.
  token-mean uses `normalizer` (the whole batch's token count) so microbatches add up exactly.
  """
  logits = model(batch["input_ids"])
  logp = losses.target_logprobs(logits, batch["input_ids"])
  mask = batch["loss_mask"]
  pg_loss, metrics = losses.het_ppo_loss(
      logp, batch["old_logp"], batch["advantages"], mask, batch["exp_mask"], clip_low=clip_low,
      clip_high=clip_high, off_clip_high=off_clip_high, clip_c=clip_c, agg_mode=agg_mode, norm_len=norm_len,
      normalizer=normalizer if agg_mode == "token-mean" else None)
  loss = pg_loss
  if kl_coef:
    kl = losses.masked_mean(losses.kl_low_var(logp, batch["ref_logp"]), mask, normalizer)
    loss = loss + kl_coef * kl
    metrics["kl_ref"] = kl
  if entropy_coeff:
    entropy = losses.masked_mean(losses.token_entropy(logits), mask, normalizer)
    loss = loss - entropy_coeff * entropy
    metrics["entropy"] = entropy
  metrics["num_tokens"] = jnp.sum(mask.astype(jnp.float32))
  return loss, metrics


@functools.partial(jax.jit, static_argnums=0)
def _logprobs(graphdef: nnx.GraphDef, params: nnx.State, input_ids: jax.Array) -> jax.Array:
  return losses.target_logprobs(nnx.merge(graphdef, params)(input_ids), input_ids)


def group_advantages(rewards: Sequence[float], groups: Sequence[int]) -> np.ndarray:
  """GRPO advantages per trajectory `[N]` (group ids renumbered densely)."""
  _, dense = np.unique(np.asarray(groups), return_inverse=True)
  return np.asarray(losses.grpo_advantages(jnp.asarray(rewards, jnp.float32), jnp.asarray(dense),
                                           int(dense.max()) + 1))


def step_tasks(envs: Sequence[str], start: int, count: int, per_step: int, seed: int, step: int) -> list[Task]:
  """The tasks of RL step `step`: a deterministic draw (so a resumed run draws the same ones)."""
  rng = np.random.default_rng([seed, step])
  names = rng.choice(list(envs), size=per_step)
  indices = rng.integers(start, start + count, size=per_step)
  return [Task(str(n), int(i), "train") for n, i in zip(names, indices)]


@gin.configurable
def train_grpo(*, model_dir: str = gin.REQUIRED, train_steps: int = gin.REQUIRED, init_checkpoint: str | None = None,
               envs: Sequence[str] = ("maze", "wordle", "textcraft", "babyai", "sql", "tools"),
               explore_start: int = 200, explore_count: int = 200, val_start: int = 400, val_count: int = 8,
               tasks_per_step: int = 8, group_size: int = 4, temperature: float = 1.0, max_new_tokens: int = 96,
               max_rounds: int | None = None, ppo_epochs: int = 1, num_minibatches: int = 1,
               buckets: Sequence[int] = (512, 768, 1024, 1536, 2048), seed: int = 0, eval_every: int = 0,
               eval_tasks: int = 0, tokenizer_path: str | None = None) -> dict[str, Any]:
  """Runs (or resumes) GRPO from a BC checkpoint. Returns the final `eval` results (empty if eval_tasks is 0)."""
  if not init_checkpoint:
    raise ValueError("GRPO continues a BC run: set INIT_CHECKPOINT to its MODEL_DIR, e.g. "
                     "--gin_bindings=\"INIT_CHECKPOINT='runs/bc'\"")
  tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
  model = trainer_lib.init_policy(init_checkpoint=init_checkpoint)
  graphdef, ref_params = nnx.split(model)
  ref_params = jax.tree.map(jnp.copy, ref_params)  # frozen reference; the trainer donates its own copy
  updates_per_step = ppo_epochs * num_minibatches
  optimizer = optimizer_lib.make_optimizer(train_steps * updates_per_step)
  trainer = trainer_lib.Trainer(model_dir, model, optimizer, het_ppo_loss_fn, seed=seed)
  trainer_lib.write_gin_config(model_dir)
  extra = trainer.restore_latest() or {}
  best = extra.get("best_val")
  rl_step = trainer.step // updates_per_step  # rows are logged per RL step, not per update
  writer = trainer.open_metrics(resume_step=rl_step)
  if rl_step:
    print(f"[grpo] resuming at step {rl_step}")
  sampler = Sampler(trainer.policy())
  config = RolloutConfig(max_new_tokens=max_new_tokens, temperature=temperature, max_rounds=max_rounds,
                         num_samples=group_size, batch_size=tasks_per_step * group_size)
  val_indices = list(range(val_start, val_start + val_count))
  bar = tqdm(total=train_steps, initial=rl_step, desc="grpo", unit="step", dynamic_ncols=True)
  wrote_operative = False
  with RolloutEngine(sampler, tokenizer) as engine:
    while rl_step < train_steps:
      sampler.update_params(trainer.state.params)
      tasks = step_tasks(envs, explore_start, explore_count, tasks_per_step, seed, rl_step)
      started = time.perf_counter()
      rolled = engine.run(tasks, dataclasses.replace(config, seed=seed * 100003 + rl_step))
      rollouts = rolled.trajectories
      rollout_s = time.perf_counter() - started
      # Every episode the environment scored counts, however long: its reward is in its group's baseline, and one
      # longer than the largest bucket trains on its first buckets[-1] tokens (its later actions are not trained).
      # Dropping long episodes instead would drop most failures (they run to the turn limit) and leave groups
      # whose only members are successes, with no advantage at all.
      kept = [t for t in rollouts if not t.failed]
      row: dict[str, Any] = {
          "rollout/success": float(np.mean([t.success for t in kept])) if kept else 0.0,
          "rollout/reward": float(np.mean([t.reward for t in kept])) if kept else 0.0,
          "rollout/turns": float(np.mean([t.turns for t in kept])) if kept else 0.0,
          "rollout/failed": sum(t.failed for t in rollouts),
          "rollout/truncated": sum(batching.bucket_index(len(t.token_ids), buckets) < 0 for t in kept),
          "rollout/sampled_tokens": rolled.stats.sampled_tokens,
          "time/rollout_s": rollout_s,  # wall seconds of this step's episodes (sampling and env steps)
      }
      started = time.perf_counter()
      rl_step += 1
      if kept:
        advantages = group_advantages([t.reward for t in kept], [t.group for t in kept])
        rows = len(kept) + (-len(kept)) % num_minibatches
        batch = batching.batch_trajectories(kept, tokenizer, buckets=buckets, batch_size=rows,
                                            advantages=list(advantages), truncate=True)
        # Every forward and update runs on its rows cut to their own longest bucket (right padding): the
        # logprob forwards on rows grouped by length, the updates on random minibatches.
        for key, params in (("old_logp", trainer.state.params), ("ref_logp", ref_params)):
          batch[key] = np.zeros_like(batch["loss_mask"])
          for chunk in np.array_split(np.argsort(batch["lengths"], kind="stable"), num_minibatches):
            ids = batching.take_rows(batch, chunk, buckets, keys=("input_ids",))["input_ids"]
            batch[key][chunk, :ids.shape[1]] = np.asarray(_logprobs(graphdef, params, ids))
        order = np.random.default_rng([seed, rl_step, 1])
        update_metrics = []
        for _ in range(ppo_epochs):
          perm = order.permutation(rows)
          for mb in np.array_split(perm, num_minibatches):
            update_metrics.append(trainer.train_step(batching.take_rows(batch, mb, buckets, keys=RL_KEYS)))
        for key, value in jax.device_get(update_metrics[-1]).items():
          row[key] = float(value)
        row["time/update_s"] = time.perf_counter() - started  # old/reference logprobs and the PPO updates
        row["behaviour_logp_gap"] = float(np.sum((batch["old_logp"] - batch["logprobs"]) * batch["loss_mask"])
                                          / max(float(batch["loss_mask"].sum()), 1.0))
      else:
        # Nothing to learn from this draw; keep the step count aligned with the optimizer's.
        trainer.state = trainer.state.replace(step=trainer.state.step + updates_per_step)
      if not wrote_operative:
        trainer_lib.write_gin_config(model_dir, "operative_config.gin", operative=True)
        wrote_operative = True
      if eval_every and (rl_step % eval_every == 0 or rl_step == train_steps):
        sampler.update_params(trainer.state.params)
        results = evaluation.evaluate(engine, tokenizer, envs, split="train", indices=val_indices,
                                      max_new_tokens=max_new_tokens, keep_episodes=False)
        row.update(evaluation.flatten_metrics(results, "val"))
        row["time/val_s"] = results["seconds"]
        score = results["overall"]["success"]
        if best is None or score > best:
          best = score
          trainer.save_best(score, {"step": rl_step})
        row["val/best_success"] = best
      row["loss"] = row.get("loss", float("nan"))
      writer.write(rl_step, row)
      if rl_step % trainer.config.checkpoint_every == 0 or rl_step == train_steps:
        trainer.save({"best_val": best})
      bar.update(1)
      bar.set_postfix(success=f"{row['rollout/success']:.2f}")
    bar.close()
    trainer.checkpointer.wait()
    results: dict[str, Any] = {}
    if eval_tasks:
      if eval_every and os.path.isdir(ckpt_lib.checkpoint_dir(model_dir, ckpt_lib.BEST_SUBDIR)):
        policy, policy_step = ckpt_lib.restore_model(model_dir, best=True)
        sampler.update_params(nnx.split(policy)[1])
      else:
        sampler.update_params(trainer.state.params)
        policy_step = rl_step
      results = evaluation.evaluate(engine, tokenizer, envs, split="eval", num_tasks=eval_tasks,
                                    max_new_tokens=max_new_tokens)
      results.update(policy_step=policy_step, selected_on="val" if eval_every else "last step")
      evaluation.write_eval_results(os.path.join(model_dir, "eval_results.json"), results)
      writer.write(rl_step, evaluation.flatten_metrics(results, "eval"))
  trainer.close()
  return results

