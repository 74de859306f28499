"""GRPO with the heterogeneous PPO loss: the RL stage that continues a BC run.

  python -m launch.train --gin_file=gin_configs/runs/grpo.gin --gin_bindings="MODEL_DIR='runs/grpo'" \
      --gin_bindings="INIT_CHECKPOINT='runs/bc'" --gin_bindings="TRAIN_STEPS=20"

One RL step (`grpo_step`):
  1. tasks: `tasks_per_step` draws from the exploration slice of `train` (then `choose_tasks` of each extension);
  2. rollouts: `group_size` episodes per task with the current policy at temperature T; each episode's sampling
     randomness derives from (seed, step, task, sample), never from its row; extensions may change the opening of
     each episode (`transform_openings`, one call for all of them);
  3. score: the environment's rewards; errored episodes leave; what was added to an opening is stripped from the
     tokens that train and marks them off-policy (`exp_mask`, `training_rollouts`); then `before_update` of each
     extension with the step's rollouts (the pool's summarizer starts there and runs during steps 4-6);
  4. advantages: `advantage_fn` gives one value per sampled turn (GRPO: the episode's group-normalised reward on
     every turn), broadcast to that turn's sampled tokens;
     a group with fewer than two scored episodes has no baseline and trains nothing (`rollout/lone_groups`);
  5. log-probabilities: the behaviour policy's (`old_logp`: recomputed with the training forward, or, with
     `old_logp = "sampler"` and no off-policy token in the step, the sampler's own, which are the same numbers)
     and the frozen reference's (`ref_logp`, a `param_dtype` copy of the starting policy, sharded like it);
  6. updates: `ppo_epochs` x `num_minibatches` HET-PPO updates (+ kl_coef * k3 KL to the reference
     - entropy_coeff * H), each minibatch padded with zero-mask rows to split over the data-parallel devices;
  7. `after_step` of each extension with the step's rollouts (collecting what `before_update` started).
The shared loop (`evolver.train.loop`) runs val, metrics, checkpoints (with the extensions' state files), resume
and the held-out report. The logged `step` is the RL step; the optimizer takes `ppo_epochs * num_minibatches`
updates per RL step.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from typing import Any

import gin
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from transformers import PreTrainedTokenizerBase

from evolver import distributed
from evolver import runtime
from evolver.data import batching
from evolver.models import generate as generate_lib
from evolver.models import sharding
from evolver.models import tokenizer as tokenizer_lib
from evolver.models.decoder import Decoder
from evolver.rl import losses
from evolver.rollout import Rollout, RolloutBatch, RolloutConfig, Task
from evolver.train import advantages as advantages_lib
from evolver.train import curriculum as curriculum_lib
from evolver.train import extensions as extensions_lib
from evolver.train import optimizer as optimizer_lib
from evolver.train import step as step_lib
from evolver.train import trainer as trainer_lib
from evolver.train.extensions import RLExtension, chain_openings
from evolver.train.loop import Loop, mean_metrics
from evolver.train.slices import TaskSlices

RL_KEYS = ("input_ids", "loss_mask", "exp_mask", "advantages", "old_logp", "ref_logp")


@gin.configurable(denylist=["head_chunk_rows"])  # set by train_grpo.head_chunk_rows, which scoring shares
def het_ppo_loss_fn(model: Decoder, batch: step_lib.Batch, normalizers: step_lib.Normalizers, *,
                    clip_low: float = 0.2, clip_high: float = 0.28, off_clip_high: float = 0.6, clip_c: float = 3.0,
                    agg_mode: str = "token-mean", norm_len: float | None = None, kl_coef: float = 0.001,
                    entropy_coeff: float = 0.0, negative_weight: float = 1.0,
                    head_chunk_rows: int | None = None) -> tuple[jax.Array, dict]:
  """HET-PPO policy loss + kl_coef * KL_k3(policy || reference) - entropy_coeff * entropy, over `loss_mask`.

  batch: input_ids `[B, T]` int32; loss_mask, exp_mask, advantages, old_logp, ref_logp `[B, T]` float32.
  The whole batch's counts (`normalizers`: tokens for token means, sequences for the seq-mean modes) make
  microbatches add up exactly to the whole batch in every aggregation mode. `head_chunk_rows` computes the
  log-probabilities through the LM head that many tokens at a time instead of materialising `[B, T, V]` logits
  (the memory peak at a 152k vocabulary); the entropy bonus needs the full logits. With the full logits the
  policy's mean token entropy is logged (`entropy`) whether or not it is in the loss.
  `negative_weight` scales the advantages below zero (1: the plain loss; < 1 damps the push-down of failed
  episodes' tokens, a remedy for negative-dominated collapse, `evolver.rl.losses.weight_negative`).
  """
  if head_chunk_rows:
    if entropy_coeff:
      raise ValueError("het_ppo_loss_fn: the entropy bonus needs the full logits; set entropy_coeff = 0 or "
                       "head_chunk_rows = None")
    logits, logp = None, step_lib.policy_logprobs(model, batch["input_ids"], head_chunk_rows)
  else:
    logits = model(batch["input_ids"])
    logp = losses.target_logprobs(logits, batch["input_ids"])
  mask = batch["loss_mask"]
  tokens = normalizers["tokens"]
  advantages = losses.weight_negative(batch["advantages"], negative_weight)
  pg_loss, metrics = losses.het_ppo_loss(
      logp, batch["old_logp"], advantages, mask, batch["exp_mask"], clip_low=clip_low,
      clip_high=clip_high, off_clip_high=off_clip_high, clip_c=clip_c, agg_mode=agg_mode, norm_len=norm_len,
      normalizer=tokens if agg_mode == "token-mean" else normalizers["sequences"])
  loss = pg_loss
  if kl_coef:
    kl = losses.masked_mean(losses.kl_low_var(logp, batch["ref_logp"]), mask, tokens)
    loss = loss + kl_coef * kl
    metrics["kl_ref"] = kl
  if logits is not None:
    entropy = losses.masked_mean(losses.token_entropy(logits), mask, tokens)
    if entropy_coeff:
      loss = loss - entropy_coeff * entropy
    metrics["entropy"] = entropy if entropy_coeff else jax.lax.stop_gradient(entropy)
  metrics["num_tokens"] = jnp.sum(mask.astype(jnp.float32))
  return loss, metrics


@functools.partial(jax.jit, static_argnums=(0, 3, 4))
def _logprobs(graphdef: nnx.GraphDef, params: nnx.State, input_ids: jax.Array, head_chunk_rows: int | None = None,
              mesh: jax.sharding.Mesh | None = None) -> jax.Array:
  """`[B, T]` log-probabilities of `input_ids` `[B, T]` (host ids, the same on every process). With `mesh` (the
  trainer's), the rows are split over its data-parallel devices and activations constrained as in the train step:
  each device scores its share of the rows (replicated ids would make every device score the whole batch)."""
  with sharding.activate(mesh):
    if mesh is not None:
      input_ids = jax.lax.with_sharding_constraint(input_ids, sharding.named_sharding(mesh, ("batch", None),
                                                                                        input_ids.shape))
    return step_lib.policy_logprobs(nnx.merge(graphdef, params), input_ids, head_chunk_rows)


def prefixed(name: str, metrics: dict[str, Any]) -> dict[str, Any]:
  """`metrics` under `name/`, except timings (`time/...`), which join the step's own: what a run's timing decides
  stays apart from what its seed decides."""
  return {k if k.startswith("time/") else f"{name}/{k}": v for k, v in metrics.items()}


def rollout_metrics(rolled: RolloutBatch, kept: Sequence[Rollout], buckets: Sequence[int]) -> dict[str, Any]:
  """What a step's episodes did: success, reward and turns of the scored ones, errors, truncations, tokens."""
  def mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else 0.0

  return {
      "rollout/success": mean(t.success for t in kept),
      "rollout/reward": mean(t.reward for t in kept),
      "rollout/turns": mean(t.turns for t in kept),
      "rollout/failed": sum(t.failed for t in rolled.trajectories),
      "rollout/opening_too_long": rolled.stats.opening_too_long,  # of the failed: no room for a first turn
      "rollout/truncated": sum(batching.bucket_index(len(t.token_ids), buckets) < 0 for t in kept),
      "rollout/with_additions": sum(bool(t.added) for t in rolled.trajectories),
      "rollout/sampled_tokens": rolled.stats.sampled_tokens,
      "time/measure_s": rolled.stats.measure_s,  # env-thread seconds measuring for the step judges (summed)
      **rollout_time_metrics(rolled),
  }


def rollout_time_metrics(rolled: RolloutBatch) -> dict[str, float]:
  """Where a step's rollout time went, and its floor.

  `time/prefill_s`, `time/decode_s`, `time/select_s` (inside the sampler, waited for, compilation not
  included), `time/rollout_compile_s` (the sampler's tracing and compiling), `time/env_s` (env calls),
  `time/template_s` (rendering and tokenizing); `rollout/idle_row_fraction`: decode row-steps whose row
  sampled nothing (finished or waiting for the turn's longest row); `time/rollout_floor_s`: the step's decoded tokens
  (each turn's first token comes with its prefill) packed perfectly over the step's episodes (GRPO runs them all
  at once), at this step's mean seconds per decode step: what decoding would cost with no row ever idle;
  `time/rollout_sequential_floor_s`: the longest episode's decoded tokens at the same cost (an episode's tokens are
  decoded one after another, so no schedule finishes sooner; the step's real floor is the larger of the two)."""
  s = rolled.stats
  decode_step_s = s.decode_s / s.decode_steps if s.decode_steps else 0.0
  longest = max((sum(b - a for a, b in t.turn_spans) - t.turns for t in rolled.trajectories), default=0)
  packed_steps = math.ceil(s.decode_live_row_steps / max(s.episodes, 1))
  # As a fraction of the decode steps taken, so that a floor of every step is decode_s exactly (not one rounding
  # above it, as packed_steps * decode_step_s can be).
  floor_s = packed_steps / s.decode_steps * s.decode_s if s.decode_steps else 0.0
  return {"time/prefill_s": s.prefill_s, "time/decode_s": s.decode_s, "time/select_s": s.select_s,
          "time/rollout_compile_s": s.compile_s, "time/env_s": s.env_s, "time/template_s": s.template_s,
          "rollout/decode_steps": s.decode_steps,
          "rollout/idle_row_fraction": s.idle_row_fraction,
          "time/rollout_floor_s": floor_s,
          "time/rollout_sequential_floor_s": longest * decode_step_s}


def behaviour_logprobs(graphdef: nnx.GraphDef, params: nnx.State, batch: dict[str, np.ndarray],
                       buckets: Sequence[int], num_chunks: int, head_chunk_rows: int | None = None,
                       chunk_rows: int | None = None, mesh: jax.sharding.Mesh | None = None) -> np.ndarray:
  """`[B, T]` log-probabilities of a batch's tokens under `params`, computed on rows grouped by length, each
  chunk cut to its own longest bucket (right padding: every kept token's value is unchanged) and padded to
  `chunk_rows` rows (default: `row_bucket` of its own rows), its rows split over `mesh` (`_logprobs`)."""
  out = np.zeros_like(batch["loss_mask"])
  for chunk in np.array_split(np.argsort(batch["lengths"], kind="stable"), num_chunks):
    if not chunk.size:
      continue
    ids = batching.take_rows(batch, chunk, buckets, keys=("input_ids",))["input_ids"]
    rows = max(chunk_rows or 0, row_bucket(len(chunk)))
    ids = np.concatenate([ids, np.zeros((rows - len(chunk), ids.shape[1]), ids.dtype)])
    logp = _logprobs(graphdef, params, ids, head_chunk_rows, mesh)
    out[chunk, :ids.shape[1]] = distributed.to_host(logp)[:len(chunk)]
  return out


def row_bucket(rows: int, multiple: int = 1) -> int:
  """The rows a batch of `rows` is padded to: `multiple` x the next power of two. A step's row counts vary (lone
  groups and failed episodes leave), and each distinct count would compile its own scoring and update programs."""
  return multiple * (1 << max(0, math.ceil(math.log2(max(-(-rows // multiple), 1)))))


def ppo_updates(trainer: trainer_lib.Trainer, batch: dict[str, np.ndarray], buckets: Sequence[int], *,
                epochs: int, num_minibatches: int, rng: np.random.Generator,
                minibatch_order: str = "random", minibatch_rows: int | None = None) -> list[dict[str, jax.Array]]:
  """`epochs` passes over the batch's rows in `num_minibatches` minibatches, each cut to its longest bucket and
  padded with zero-mask rows to `minibatch_rows` (default: `row_bucket` of its own rows, a power of two times
  `minibatch_multiple(trainer)`: few programs).

  minibatch_order: "random" draws each pass's minibatches as a random partition of the rows (PPO's usual);
  "length" groups rows of similar length (sorted by length, ties broken at random) into the minibatches and runs
  them in a random order, so short episodes train at a short bucket instead of the longest row's of a random
  draw; each update then sees episodes of one length range (a bias random minibatches do not have).
  The minibatches are drawn over the real rows, so the updates do not depend on the number of devices or
  microbatches."""
  if minibatch_order not in ("random", "length"):
    raise ValueError(f"minibatch_order must be 'random' or 'length', got {minibatch_order!r}")
  rows = batch["input_ids"].shape[0]
  multiple = minibatch_multiple(trainer)
  if minibatch_rows is not None and minibatch_rows % multiple:
    raise ValueError(f"minibatch_rows {minibatch_rows} must be a multiple of {multiple} (devices x microbatches)")
  metrics = []
  for _ in range(epochs):
    order = rng.permutation(rows)
    if minibatch_order == "length":
      order = order[np.argsort(batch["lengths"][order], kind="stable")]
    minibatches = np.array_split(order, num_minibatches)
    if minibatch_order == "length":
      minibatches = [minibatches[i] for i in rng.permutation(len(minibatches))]
    for minibatch in minibatches:
      cut = batching.take_rows(batch, minibatch, buckets, keys=RL_KEYS)
      padded_rows = max(minibatch_rows or 0, row_bucket(len(minibatch), multiple))
      metrics.append(trainer.train_step(batching.pad_rows(cut, padded_rows)))
  return metrics


def update_rows(max_rows: int, num_minibatches: int, multiple: int = 1) -> int:
  """The rows every scoring chunk and update of a step is padded to when a step has at most `max_rows` rows:
  `row_bucket` of the largest minibatch. One row count whatever a step keeps (lone groups and failed episodes
  leave), so the programs compiled in the first step serve every later one."""
  return row_bucket(-(-max_rows // num_minibatches), multiple)


def precompile_updates(trainer: trainer_lib.Trainer, params: Sequence[nnx.State], buckets: Sequence[int], *,
                       rows: int, head_chunk_rows: int | None = None) -> int:
  """Compiles what `grpo_update` runs at every length bucket, for batches of `rows` rows: the log-probability
  forward (run once on padding for each of `params`: behaviour and reference, one program when they share
  dtypes and shardings) and the train step (ahead of time: the state is untouched). Returns the programs compiled
  or run."""
  empty = batching.make_batch([], 1, 0, 1)  # the dtypes of `batch_trajectories`' arrays
  dtypes = {k: empty.get(k, empty["loss_mask"]).dtype for k in RL_KEYS}  # (old_logp, ref_logp: as loss_mask)
  done = 0
  for length in buckets:
    ids = np.zeros((rows, length), dtypes["input_ids"])
    for p in params:
      jax.block_until_ready(_logprobs(trainer.graphdef, p, ids, head_chunk_rows, trainer.mesh))
      done += 1
    done += trainer.precompile_step({k: jax.ShapeDtypeStruct((rows, length), d) for k, d in dtypes.items()})
  runtime.return_free_memory()  # (what compiling them freed)
  return done


def minibatch_multiple(trainer: trainer_lib.Trainer) -> int:
  """The row count every update's batch must be a multiple of: it splits over the mesh's data-parallel devices
  and into the trainer's microbatches."""
  return math.lcm(trainer.mesh.shape["data"] * trainer.mesh.shape["fsdp"], trainer.config.num_microbatches)


@jax.jit
def relative_change(new: nnx.State, old: nnx.State) -> jax.Array:
  """||new - old|| / ||old|| over every leaf of two parameter trees of one structure (a scalar, float32)."""
  diff = jax.tree.map(lambda a, b: a.astype(jnp.float32) - b.astype(jnp.float32), new, old)
  return optax.tree.norm(diff) / jnp.maximum(optax.tree.norm(old), 1e-12)


def advantage_shares(batch: dict[str, np.ndarray], success: np.ndarray) -> dict[str, float]:
  """Where a step's advantage-weighted tokens are: the shares of sum(|A| over trained tokens) carried by the
  successful episodes' rows and by the failed ones' (`adv/success_share`, `adv/failure_share`), the share of
  trained tokens whose advantage is negative (`adv/negative_token_share`), and the share of sum(|A|) on them
  (`adv/negative_share`). batch: "advantages", "loss_mask" `[B, T]`, rows in the order of `success` `[B]` (0/1).
  With token-mean aggregation these shares are each part's share of the policy gradient's weight."""
  mask = batch["loss_mask"][:len(success)].astype(np.float64)
  advantages = batch["advantages"][:len(success)].astype(np.float64)
  weight = np.abs(advantages) * mask
  total = max(float(weight.sum()), 1e-12)
  per_row = weight.sum(axis=1)
  return {"adv/success_share": float(per_row[success > 0].sum() / total),
          "adv/failure_share": float(per_row[success <= 0].sum() / total),
          "adv/negative_token_share": float(((advantages < 0) * mask).sum() / max(float(mask.sum()), 1.0)),
          "adv/negative_share": float((weight * (advantages < 0)).sum() / total)}


def groups_with_signal(rollouts: Sequence[Rollout]) -> set[int]:
  """The groups whose scored episodes' rewards differ (a group of equal rewards has zero advantage everywhere: it
  trains nothing but the KL term)."""
  rewards: dict[int, set[float]] = collections.defaultdict(set)
  for r in rollouts:
    rewards[r.group].add(float(r.reward))
  return {group for group, values in rewards.items() if len(values) > 1}


def with_signal(rollouts: Sequence[Rollout]) -> list[Rollout]:
  """The rollouts of `groups_with_signal` (DAPO's dynamic sampling keeps these)."""
  groups = groups_with_signal(rollouts)
  return [r for r in rollouts if r.group in groups]


def signal_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
  """`rollout/groups`: the step's first draw's groups with a scored episode; `rollout/signal_fraction`: the share of
  them whose rewards differ (`groups_with_signal`)."""
  groups = {r.group for r in rollouts}
  return {"rollout/groups": len(groups),
          "rollout/signal_fraction": len(groups_with_signal(rollouts)) / len(groups) if groups else 0.0}


def round_seed(seed: int, step: int, round_index: int) -> int:
  """The rollout seed of RL step `step`'s round `round_index` (0: the step's draw; >= 1: dynamic sampling's
  refills, each with its own episodes even when a task is drawn again)."""
  return seed * 100003 + step + round_index * 7_919_000


TRAINED_TASKS_KEY = "train/tasks"


def trained_task_names(rollouts: Sequence[Rollout]) -> list[str]:
  """"ENV/INDEX" of each group that trains (one per group, in group order), for the step's metrics row
  (`TRAINED_TASKS_KEY`); a group of a task given as a spec (self-questioning's synthetic tasks) is "ENV/spec"."""
  first = {}
  for r in rollouts:
    first.setdefault(r.group, r)
  return [f"{r.env}/spec" if r.task_spec is not None else f"{r.env}/{r.task_index}"
          for _, r in sorted(first.items())]


def trained_tasks(metrics_rows: Sequence[dict[str, Any]]) -> dict[str, list[int]]:
  """{env: sorted task indices} of the `train` tasks a GRPO run trained on, from its metrics rows
  (`evolver.train.metrics.read_metrics(MODEL_DIR)`); spec tasks are left out. What `launch.eval --indices RUN_DIR`
  evaluates."""
  out: dict[str, set[int]] = {}
  for row in metrics_rows:
    for name in row.get(TRAINED_TASKS_KEY, ()):
      env, _, index = name.rpartition("/")
      if index != "spec":
        out.setdefault(env, set()).add(int(index))
  return {env: sorted(indices) for env, indices in sorted(out.items())}


def with_peers(rollouts: Sequence[Rollout]) -> tuple[list[Rollout], int]:
  """The rollouts whose group has at least two of them (a group of one has no baseline: its advantage would be
  its reward), and the number of groups left out. Errored episodes must be dropped before."""
  sizes = collections.Counter(r.group for r in rollouts)
  return [r for r in rollouts if sizes[r.group] >= 2], sum(n < 2 for n in sizes.values())


OLD_LOGP_SOURCES = ("recompute", "sampler")


def old_logp_from_sampler(old_logp: str, exp_mask: np.ndarray, param_dtype: Any) -> bool:
  """Whether a step's behaviour log-probabilities can be the sampler's (`grpo_update`): asked for ("sampler"), no
  off-policy token (`exp_mask` `[B, T]` all 0), and the sampler's copy of the policy in float32 (`param_dtype`:
  only a float32 copy is the master weights themselves)."""
  return old_logp == "sampler" and not np.any(exp_mask) and jnp.dtype(param_dtype) == jnp.float32


def grpo_update(trainer: trainer_lib.Trainer, ref_params: Any, rollouts: Sequence[Rollout],
                tokenizer: PreTrainedTokenizerBase, *, advantage_fn: advantages_lib.AdvantageFn,
                buckets: Sequence[int], ppo_epochs: int, num_minibatches: int, rng: np.random.Generator,
                head_chunk_rows: int | None = None, step: int = 0,
                minibatch_order: str = "random", max_rows: int | None = None,
                old_logp: str = "recompute") -> dict[str, Any]:
  """Steps 4-6 of an RL step on its scored rollouts: per-turn advantages, the behaviour and reference
  log-probabilities, and the HET-PPO updates (`ppo_epochs * num_minibatches` of them; when no group has two
  scored episodes, none, but the trainer's step still advances by that many). With `max_rows` (the most rollouts
  a step can have), every scoring chunk and update is padded to `update_rows` of it: the same programs each step.
  `old_logp` (`OLD_LOGP_SOURCES`): "recompute" scores the batch with the policy's parameters (verl's
  `old_log_prob`); "sampler" takes the log-probabilities the sampler recorded for the sampled tokens (under the raw
  distribution, the same policy: `behaviour_logp_gap` measured ~1e-8 per token on the tiny default), skipping that
  forward pass, unless a token of the step is off-policy (`exp_mask`: sampled with experience in its prompt and
  trained without it, whose old log-probability HET-PPO takes without it) or the sampler's copy of the policy is
  not float32 (a bf16 copy's numbers are not the master weights'), when the step recomputes.
  Returns the step's metrics."""
  trained, lone = with_peers(rollouts)
  row: dict[str, Any] = {"rollout/lone_groups": lone}
  if not trained:
    trainer.state = trainer.state.replace(step=trainer.state.step + ppo_epochs * num_minibatches)
    return row
  started = time.perf_counter()
  credit = advantage_fn(trained, step=step)
  per_turn = advantages_lib.check_turn_advantages(trained, credit)
  row.update(prefixed("credit", credit.metrics))
  row["time/credit_s"] = time.perf_counter() - started
  batch = batching.batch_trajectories(trained, tokenizer, buckets=buckets, advantages=per_turn, truncate=True)
  rows = None if max_rows is None else update_rows(max_rows, num_minibatches, minibatch_multiple(trainer))
  from_sampler = old_logp_from_sampler(old_logp, batch["exp_mask"], trainer.param_dtype)
  row["old_logp/from_sampler"] = float(from_sampler)
  if from_sampler:
    batch["old_logp"] = batch["logprobs"] * batch["loss_mask"]
  scored = [("old_logp", trainer.state.params)] if not from_sampler else []
  for key, params in scored + [("ref_logp", ref_params)]:
    started = time.perf_counter()
    batch[key] = behaviour_logprobs(trainer.graphdef, params, batch, buckets, num_minibatches, head_chunk_rows,
                                    chunk_rows=rows, mesh=trainer.mesh)
    row[f"time/{key}_s"] = time.perf_counter() - started
  row.update(advantage_shares(batch, np.array([r.success for r in trained], np.float32)))
  started = time.perf_counter()
  before = jax.tree.map(jnp.copy, trainer.state.params)  # (the updates donate the state's buffers)
  updates = ppo_updates(trainer, batch, buckets, epochs=ppo_epochs, num_minibatches=num_minibatches, rng=rng,
                        minibatch_order=minibatch_order, minibatch_rows=rows)
  row.update(mean_metrics(updates))  # the step's updates, averaged (waits for the last one)
  row["update/param_change"] = float(relative_change(trainer.state.params, before))
  del before
  row["time/ppo_s"] = time.perf_counter() - started
  if not from_sampler:  # (taken from the sampler, the gap is 0 by construction)
    row["behaviour_logp_gap"] = float(np.sum((batch["old_logp"] - batch["logprobs"]) * batch["loss_mask"])
                                      / max(float(batch["loss_mask"].sum()), 1.0))
  row["exp_tokens"] = float(batch["exp_mask"].sum())
  return row


@gin.configurable
def train_grpo(*, model_dir: str = gin.REQUIRED, train_steps: int = gin.REQUIRED, init_checkpoint: str | None = None,
               hf_checkpoint: str | None = None,
               envs: Sequence[str] = ("maze", "wordle", "textcraft", "babyai", "sql", "tools"),
               tasks_per_step: int = 8, group_size: int = 4, temperature: float = 1.0, max_new_tokens: int = 96,
               max_rounds: int | None = None, ppo_epochs: int = 1, num_minibatches: int = 1,
               buckets: Sequence[int] = (512, 768, 1024, 1536, 2048), seed: int = 0,
               advantage_fn: advantages_lib.AdvantageFn = advantages_lib.grpo_turn_advantages,
               extensions: Sequence[RLExtension] = (), record_expert_actions: bool = False,
               head_chunk_rows: int | None = None, minibatch_order: str = "random",
               task_source: curriculum_lib.UniformTasks | None = None, dynamic_sampling_rounds: int = 0,
               precompile: bool = True, old_logp: str = "recompute",
               tokenizer_path: str | None = None) -> dict[str, Any]:
  """Runs (or resumes) GRPO from a BC run or a transformers checkpoint. Returns the final `eval` results (empty
  when LoopConfig.eval_tasks is 0).

  Args:
    init_checkpoint: the BC run's MODEL_DIR (its val-selected policy, else its latest), or
    hf_checkpoint: a transformers checkpoint directory (gin_configs/real/); one of them is required.
    envs: the exploration slice (`TaskSlices`) of each env's train split is what the RL steps draw from.
    tasks_per_step, group_size: tasks drawn per RL step and episodes per task (one GRPO group).
    temperature, max_new_tokens, max_rounds: the rollouts' sampling, per-turn and per-episode limits.
    ppo_epochs, num_minibatches: passes over a step's rollouts and minibatches per pass.
    buckets: padded lengths; an episode longer than the largest trains on its first buckets[-1] tokens.
    advantage_fn: the step's rollouts -> per-turn advantages (`evolver.train.advantages`).
    extensions: `RLExtension`s (`evolver.train.extensions`), in order; their state is kept with checkpoints.
    record_expert_actions: rollouts record the scripted expert's action at every state (built-in envs).
    head_chunk_rows: log-probabilities (updates and behaviour/reference scoring) through the LM head this many
      tokens at a time instead of full `[B, T, V]` logits: the memory peak at a large vocabulary.
    minibatch_order: "random" or "length" (`ppo_updates`).
    task_source: how each step draws its tasks from the exploration slice (`evolver.train.curriculum`): None,
      uniformly (`UniformTasks`); `PassRateCurriculum()` favours tasks whose recent pass rate is in (0, 1).
      Drawn before the extensions' `choose_tasks`.
    dynamic_sampling_rounds: DAPO's dynamic sampling: 0 (off) trains every group; N > 0 leaves out the groups
      whose rewards are all equal and refills them from new draws of the task source (`tasks_per_step` tasks a
      round, the first groups with signal kept), up to N extra rounds (fewer groups train when the rounds run
      out). `rollout/episodes` counts what a step spent, `rollout/signal_groups` what trained.
    precompile: in the first step, compile every sampler program later steps can meet and the update's programs
      at every bucket, so that no later step compiles; False compiles each program when a step first meets it
      (a run of a few steps meets fewer of them).
    old_logp: where the behaviour log-probabilities come from (`grpo_update`): "recompute" (a scoring pass) or
      "sampler" (the rollout's own, where no token is off-policy: one forward pass of the batch less a step).
  """
  if old_logp not in OLD_LOGP_SOURCES:
    raise ValueError(f"old_logp must be one of {OLD_LOGP_SOURCES}, got {old_logp!r}")
  if not init_checkpoint and not hf_checkpoint:
    raise ValueError("GRPO continues a policy: set INIT_CHECKPOINT to a BC run's MODEL_DIR, e.g. "
                     "--gin_bindings=\"INIT_CHECKPOINT='runs/bc'\", or HF_CHECKPOINT to a transformers checkpoint "
                     "directory (gin_configs/real/)")
  if group_size < 2:
    raise ValueError(f"GRPO compares a task's episodes with each other: group_size must be >= 2, got {group_size}")
  if dynamic_sampling_rounds < 0:
    raise ValueError(f"dynamic_sampling_rounds must be >= 0, got {dynamic_sampling_rounds}")
  slices = TaskSlices()
  slices.check_disjoint("val", "explore")
  extensions = list(extensions)
  task_source = task_source if task_source is not None else curriculum_lib.UniformTasks()
  task_source.bind(envs, start=slices.explore_start, count=slices.explore_count, seed=seed)
  if hf_checkpoint:  # a missing start is named before its tokenizer (often the same directory) is read
    hf_checkpoint = trainer_lib.resolve_hf_checkpoint(hf_checkpoint)
  tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
  model = trainer_lib.init_policy(init_checkpoint=init_checkpoint, hf_checkpoint=hf_checkpoint, tokenizer=tokenizer)
  trainer_lib.check_vocabulary(model, tokenizer)
  updates_per_step = ppo_epochs * num_minibatches
  optimizer = optimizer_lib.make_optimizer(train_steps * updates_per_step)
  trainer = trainer_lib.Trainer(model_dir, model, optimizer,
                                functools.partial(het_ppo_loss_fn, head_chunk_rows=head_chunk_rows), seed=seed)
  del model
  ref_params = trainer.policy_params()  # the frozen reference: the starting policy, sharded like it
  loop = Loop("grpo", model_dir, trainer, tokenizer, envs=envs, val_indices=slices.val_indices,
              updates_per_step=updates_per_step, state_owners=[*extensions, task_source])
  loop.eval_openings = lambda step: chain_openings(extensions, step, validating=True)
  # LLM roles played by the live policy (`evolver.models.generate.LivePolicyGenerate`: a summarizer, a judge, a
  # proposer) sample with the weights that sampled the current step (`loop.engine`), never with weights mid-update.
  stop_serving = generate_lib.serve_live_policy(lambda: loop.engine)
  try:
    for ext in extensions:
      ext.start(model_dir=loop.model_dir, envs=envs, seed=seed, tokenizer=tokenizer)
    loop.resume()
  except BaseException:
    stop_serving()
    raise
  rollout_config = RolloutConfig(max_new_tokens=max_new_tokens, temperature=temperature, max_rounds=max_rounds,
                                 num_samples=group_size, batch_size=tasks_per_step * group_size,
                                 record_expert_actions=record_expert_actions)
  rollout_config = dataclasses.replace(rollout_config,
                                       **dict.fromkeys(advantages_lib.rollout_records(advantage_fn), True))

  precompiled: list[int] = []
  engine = loop.engine

  def roll(step: int, round_index: int, tasks: list[Task], group_offset: int) -> tuple[RolloutBatch, list[Rollout]]:
    """One round of the step's rollouts: the batch (groups numbered from `group_offset`) and what trains of it."""
    if precompile and not precompiled:  # the sampler's whole program set, once per process (first step's rollout)
      precompiled.append(engine.precompile(rollout_config, len(tasks)))
    rolled = engine.run(tasks, dataclasses.replace(rollout_config, seed=round_seed(seed, step, round_index)),
                        transform_openings=chain_openings(extensions, step))
    if group_offset:
      rolled.trajectories = [dataclasses.replace(t, group=t.group + group_offset) for t in rolled.trajectories]
    # Every episode the environment scored counts, however long: its reward is in its group's baseline, and one
    # longer than the largest bucket trains on its first buckets[-1] tokens (its later actions are not trained).
    # Dropping long episodes instead would drop most failures (they run to the turn limit) and leave groups
    # whose only members are successes, with no advantage at all.
    return rolled, extensions_lib.training_rollouts(extensions, step, [t for t in rolled.trajectories if not t.failed],
                                                    tokenizer)

  def grpo_step() -> dict[str, Any]:
    nonlocal engine
    step = loop.step  # 0-based index of this RL step; its row is logged as step + 1
    tasks = task_source.draw(step, 0, tasks_per_step)
    for ext in extensions:
      tasks = ext.choose_tasks(step, tasks)
    started = time.perf_counter()
    engine = loop.sync_policy()
    rolled, kept = roll(step, 0, tasks, 0)
    row: dict[str, Any] = rollout_metrics(rolled, kept, buckets)
    row.update(signal_metrics(kept))
    trajectories = list(rolled.trajectories)
    if dynamic_sampling_rounds:  # DAPO: only groups with signal train; refill the rest with new draws
      kept = with_signal(kept)
      round_index = 0
      while round_index < dynamic_sampling_rounds and len({r.group for r in kept}) < tasks_per_step:
        # A refill round draws a whole step's tasks (the sampler's programs are those of the first round) and
        # keeps as many groups with signal as are missing, in draw order; the rest of its episodes are spent.
        round_index += 1
        wanted = tasks_per_step - len({r.group for r in kept})
        more, more_kept = roll(step, round_index, task_source.draw(step, round_index, tasks_per_step),
                               len(trajectories))
        trajectories.extend(more.trajectories)
        fill = sorted(groups_with_signal(more_kept))[:wanted]
        kept.extend(r for r in more_kept if r.group in fill)
      row.update({"rollout/rounds": round_index + 1, "rollout/signal_groups": len({r.group for r in kept})})
    row["rollout/episodes"] = len(trajectories)  # what the step spent, every round
    row["time/rollout_s"] = time.perf_counter() - started  # sampling and env steps
    for ext in extensions:
      ext.before_update(step, trajectories)
    started = time.perf_counter()
    max_rows = tasks_per_step * group_size  # (a step with more rows pads them to their own power of two)
    if precompile and len(precompiled) == 1:  # and the updates' programs at every length bucket (its update time)
      rows = update_rows(max_rows, num_minibatches, minibatch_multiple(trainer))
      precompiled.append(precompile_updates(trainer, (trainer.state.params, ref_params), buckets, rows=rows,
                                            head_chunk_rows=head_chunk_rows))
    row[TRAINED_TASKS_KEY] = trained_task_names(with_peers(kept)[0])
    row.update(grpo_update(trainer, ref_params, kept, tokenizer, advantage_fn=advantage_fn, buckets=buckets,
                           ppo_epochs=ppo_epochs, num_minibatches=num_minibatches,
                           rng=np.random.default_rng([seed, step + 1, 1]), head_chunk_rows=head_chunk_rows,
                           step=step, minibatch_order=minibatch_order, max_rows=max_rows, old_logp=old_logp))
    row["time/update_s"] = time.perf_counter() - started  # advantages, old/reference logprobs, the PPO updates
    row["loss"] = row.get("loss", float("nan"))
    row.update(prefixed("curriculum", task_source.observe(trajectories)))
    for ext in extensions:
      row.update(prefixed(ext.name, ext.after_step(step, trajectories)))
    return row

  try:
    loop.run(grpo_step, until=train_steps, postfix="rollout/success")
    return loop.finish()
  finally:
    for ext in extensions:
      ext.close()
    stop_serving()
