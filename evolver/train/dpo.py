"""DPO on success/failure pairs from exploration (AgentGym's comparison with AgentEvol), continuing a BC run.

  python -m launch.train --gin_file=gin_configs/runs/dpo.gin --gin_bindings="MODEL_DIR='runs/dpo'" --gin_bindings="INIT_CHECKPOINT='runs/bc'" --gin_bindings="TRAIN_STEPS=100"

The BC policy (`INIT_CHECKPOINT`: its val-selected policy when the run kept one, else its latest) samples K
trajectories per instruction of the exploration slice of `train` at temperature T; the environment rewards them.
Per instruction, every successful trajectory with reward >= `min_winner_reward` (0.7) is paired with every
failure whose reward is at least `min_reward_gap` (0.01) lower (identical trajectories counted once). The loss
is DPO's, -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), beta 0.5, on sequence log-probabilities:
sums of the token log-probabilities over each trajectory's response tokens (the rollout's `loss_mask`, i.e. the
sampled tokens). The reference is the BC model, frozen: its sequence log-probabilities are computed once, before
training, and travel in the batches. Then val evaluation and the held-out `eval` report as in BC.

A batch holds `pairs_per_batch` pairs as rows [chosen_0, rejected_0, chosen_1, rejected_1, ...] (padding pairs
have all-zero masks), with per row `ref_logp` (the reference's sequence log-prob) and `pair_mask` (1 on the
chosen row of each real pair: its sum, the pair count, is the step's normalizer, so microbatches that keep
pairs whole add up to the full-batch loss).

The exploration is saved with the run (`MODEL_DIR/explore/iter_1.{json,npz}`, `evolver.train.explorations`) and
reused when the run restarts; val, metrics, checkpoints, resume and the held-out report are the shared loop's.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Sequence
from typing import Any

import gin
import jax
import numpy as np
from flax import nnx

from evolver import distributed
from evolver import paths
from evolver.data import batching
from evolver.data.tokenize import TokenizedExample, tokenize_trajectory
from evolver.data.trajectory import Trajectory
from evolver.models import tokenizer as tokenizer_lib
from evolver.models.decoder import Decoder
from evolver.models.sampler import Sampler
from evolver.rl import losses
from evolver.rollout import RolloutConfig, RolloutEngine
from evolver.train import explorations
from evolver.train import optimizer as optimizer_lib
from evolver.train import step as step_lib
from evolver.train import trainer as trainer_lib
from evolver.train.loop import Loop, scalar_metrics
from evolver.train.slices import TaskSlices, slice_tasks

STEP_KEYS = ("input_ids", "loss_mask", "ref_logp", "pair_mask")
REWARD_EPS = 1e-9  # rewards are float32 in datasets: 0.7 - 0.69 must still count as a gap of 0.01


# ----------------------------------------------------------------------------------------------------------
# Pairs (pure).
# ----------------------------------------------------------------------------------------------------------


def build_pairs(trajectories: Sequence[Trajectory], *, min_winner_reward: float = 0.7,
                min_reward_gap: float = 0.01, max_pairs_per_task: int | None = None) -> list[tuple[int, int]]:
  """Success/failure pairs per instruction, as (chosen index, rejected index) into `trajectories`.

  Winners succeeded with reward >= `min_winner_reward`; losers failed (success False); a pair needs
  reward(winner) - reward(loser) >= `min_reward_gap`. Rollouts that errored (`failed`) never pair, and identical
  trajectories (same assistant texts) count once. Pairs come task by task in order of first appearance; within
  a task the "diagonal" pairs (i-th winner, i-th loser) come first, so a `max_pairs_per_task` cap keeps as many
  distinct trajectories as it can.
  """
  by_task: dict[tuple, list[int]] = {}
  for index, trajectory in enumerate(trajectories):
    if not trajectory.failed:
      by_task.setdefault((trajectory.env, trajectory.split, trajectory.task_index), []).append(index)

  def unique(indices: list[int]) -> list[int]:
    seen, out = set(), []
    for i in indices:
      key = explorations.trajectory_key(trajectories[i])
      if key not in seen:
        seen.add(key)
        out.append(i)
    return out

  pairs: list[tuple[int, int]] = []
  for indices in by_task.values():
    winners = unique([i for i in indices if trajectories[i].success
                      and trajectories[i].reward >= min_winner_reward - REWARD_EPS])
    losers = unique([i for i in indices if not trajectories[i].success])
    task_pairs = [(wi, li) for wi, w in enumerate(winners) for li, l in enumerate(losers)
                  if trajectories[w].reward - trajectories[l].reward >= min_reward_gap - REWARD_EPS]
    task_pairs.sort(key=lambda p: (p[0] != p[1], p))
    if max_pairs_per_task is not None:
      task_pairs = task_pairs[:max_pairs_per_task]
    pairs.extend((winners[wi], losers[li]) for wi, li in task_pairs)
  return pairs


# ----------------------------------------------------------------------------------------------------------
# Loss.
# ----------------------------------------------------------------------------------------------------------


def dpo_loss_fn(model: Decoder, batch: step_lib.Batch, normalizers: step_lib.Normalizers, *,
                beta: float = 0.5) -> tuple[jax.Array, dict]:
  """A `step_lib.LossFn` over pair batches: rows [chosen_0, rejected_0, ...] (module docstring), normalised by
  the whole batch's pair count (`normalizers["pairs"]`)."""
  seq = losses.sequence_logprobs(step_lib.policy_logprobs(model, batch["input_ids"]), batch["loss_mask"])
  policy, reference = seq.reshape(-1, 2), batch["ref_logp"].reshape(-1, 2)
  return losses.dpo_loss(policy[:, 0], policy[:, 1], reference[:, 0], reference[:, 1], beta=beta,
                         pair_mask=batch["pair_mask"].reshape(-1, 2)[:, 0], normalizer=normalizers["pairs"])


def reference_logprobs(model: Decoder, examples: Sequence[TokenizedExample], *, buckets: Sequence[int],
                       pad_id: int, batch_rows: int) -> np.ndarray:
  """`[N]` float32 sequence log-probabilities of `examples` under `model` (NaN for those too long)."""
  graphdef, params = nnx.split(model)

  @jax.jit
  def forward(params, input_ids, loss_mask):
    return losses.sequence_logprobs(step_lib.policy_logprobs(nnx.merge(graphdef, params), input_ids), loss_mask)

  out = np.full([len(examples)], np.nan, np.float32)
  bucket_of = np.asarray([batching.bucket_index(len(e), buckets) for e in examples])
  for bucket in np.unique(bucket_of[bucket_of >= 0]):
    members = np.flatnonzero(bucket_of == bucket)
    for first in range(0, len(members), batch_rows):
      chunk = members[first:first + batch_rows]
      batch = batching.make_batch([examples[i] for i in chunk], buckets[bucket], pad_id, batch_rows)
      values = distributed.to_host(forward(params, batch["input_ids"], batch["loss_mask"]))
      out[chunk] = values[:len(chunk)]
  return out


# ----------------------------------------------------------------------------------------------------------
# Pair batches.
# ----------------------------------------------------------------------------------------------------------


class PairBatchIterator:
  """Fixed-shape pair batches for any number of epochs, exactly resumable (plans as `batching.BatchIterator`:
  a pair's bucket is the smaller one that holds both its trajectories; pairs that fit none are dropped)."""

  def __init__(self, examples: Sequence[TokenizedExample], pairs: Sequence[tuple[int, int]], ref_logp: np.ndarray,
               *, pairs_per_batch: int, pad_id: int, buckets: Sequence[int], seed: int = 0):
    self.examples, self.pairs, self.ref_logp = examples, list(pairs), np.asarray(ref_logp, np.float32)
    self.pairs_per_batch, self.pad_id, self.buckets, self.seed = pairs_per_batch, pad_id, tuple(buckets), seed
    lengths = [max(len(examples[c]), len(examples[r])) for c, r in self.pairs]
    self.bucket_of = np.asarray([batching.bucket_index(n, self.buckets) for n in lengths], np.int64)
    self.num_pairs = int(np.sum(self.bucket_of >= 0))
    self.num_dropped = len(self.pairs) - self.num_pairs
    if not self.num_pairs:
      raise ValueError(f"all {len(self.pairs)} pairs are longer than the largest bucket {self.buckets[-1]}")
    self.fingerprint = zlib.crc32(self.bucket_of.tobytes() + repr((pairs_per_batch, self.buckets)).encode())
    self.epoch, self.position = 0, 0
    self._plan: tuple[int, list] | None = None

  def plan(self, epoch: int) -> list[tuple[int, np.ndarray]]:
    if self._plan is None or self._plan[0] != epoch:
      self._plan = (epoch, batching.plan_epoch(self.bucket_of, self.pairs_per_batch, self.seed, epoch))
    return self._plan[1]

  def __iter__(self) -> PairBatchIterator:
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    if self.position >= len(self.plan(self.epoch)):
      self.epoch, self.position = self.epoch + 1, 0
    bucket, members = self.plan(self.epoch)[self.position]
    self.position += 1
    rows = [index for p in members for index in self.pairs[int(p)]]
    batch = batching.make_batch([self.examples[i] for i in rows], self.buckets[bucket], self.pad_id,
                                2 * self.pairs_per_batch)
    batch["ref_logp"] = np.zeros([2 * self.pairs_per_batch], np.float32)
    batch["ref_logp"][:len(rows)] = self.ref_logp[rows]
    batch["pair_mask"] = np.zeros([2 * self.pairs_per_batch], np.float32)
    batch["pair_mask"][0:len(rows):2] = 1.0
    return batch

  def get_state(self) -> dict[str, Any]:
    return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "fingerprint": self.fingerprint}

  def set_state(self, state: dict[str, Any]) -> None:
    if int(state["fingerprint"]) != self.fingerprint:
      raise ValueError("this pair-iterator state comes from other pairs, buckets or batch size; it cannot resume")
    self.seed, self.epoch, self.position = int(state["seed"]), int(state["epoch"]), int(state["position"])


# ----------------------------------------------------------------------------------------------------------
# The loop.
# ----------------------------------------------------------------------------------------------------------


@gin.configurable
def train_dpo(*, model_dir: str = gin.REQUIRED, train_steps: int = gin.REQUIRED,
              init_checkpoint: str | None = None,
              envs: Sequence[str] = ("maze", "wordle", "textcraft", "babyai", "sql", "tools"),
              samples_per_task: int = 4, temperature: float = 1.0, min_winner_reward: float = 0.7,
              min_reward_gap: float = 0.01, max_pairs_per_task: int | None = None, beta: float = 0.5,
              pairs_per_batch: int = 4, buckets: Sequence[int] = (512, 768, 1024, 1536), seed: int = 0,
              max_new_tokens: int = 96, max_rounds: int | None = None, rollout_batch_size: int = 64,
              tokenizer_path: str | None = None) -> dict[str, Any]:
  """Runs (or resumes) DPO from a BC run. Returns the final `eval` results (empty when LoopConfig.eval_tasks is 0).

  The exploration and val slices of each env's train split are `TaskSlices`'s (keep the BC run's expert slice
  disjoint from them).

  Args:
    init_checkpoint: the BC run's MODEL_DIR (the `INIT_CHECKPOINT` macro); required.
    samples_per_task, temperature: K and T of the exploration.
    min_winner_reward, min_reward_gap, max_pairs_per_task: pairing (`build_pairs`).
    beta: DPO's inverse temperature.
    pairs_per_batch: pairs per step (2x rows).
    max_new_tokens, max_rounds, rollout_batch_size: per turn, per episode and in flight, in the exploration.
  """
  if not init_checkpoint:
    raise ValueError("DPO continues a BC run: set INIT_CHECKPOINT to its MODEL_DIR, e.g. "
                     "--gin_bindings=\"INIT_CHECKPOINT='runs/bc'\"")
  if not paths.as_path(init_checkpoint).is_dir():
    raise FileNotFoundError(f"INIT_CHECKPOINT {init_checkpoint!r} is not a directory (expected a BC run's MODEL_DIR)")
  slices = TaskSlices()
  slices.check_disjoint("val", "explore")
  envs = list(envs)
  tokenizer = tokenizer_lib.load_tokenizer(tokenizer_path)
  pad_id = batching.pad_id_of(tokenizer)
  model = trainer_lib.init_policy(init_checkpoint=init_checkpoint, tokenizer=tokenizer)
  trainer_lib.check_vocabulary(model, tokenizer)

  # Explore with the BC policy and pair; the reference log-probs are the BC model's, before any update.
  tasks = slice_tasks(envs, slices.explore_start, slices.explore_count)
  config = RolloutConfig(max_new_tokens=max_new_tokens, temperature=temperature, max_rounds=max_rounds,
                         num_samples=samples_per_task, batch_size=rollout_batch_size, seed=seed * 1000 + 1)
  with RolloutEngine(Sampler(model), tokenizer) as engine:
    trajectories = explorations.explore_or_load(model_dir, 1, engine, tasks, config, policy_step=0, tag="dpo")
  stats = explorations.exploration_stats(trajectories)
  pairs = build_pairs(trajectories, min_winner_reward=min_winner_reward, min_reward_gap=min_reward_gap,
                      max_pairs_per_task=max_pairs_per_task)
  print(f"[dpo] exploration success {stats['success']:.3f} over {stats['episodes']} episodes; {len(pairs)} pairs "
        f"from {len({trajectories[c].item_id for c, _ in pairs})} tasks", flush=True)
  if not pairs:
    raise ValueError(f"no success/failure pairs in the exploration ({stats['successes']} successes in "
                     f"{stats['episodes']} episodes; a pair needs a success with reward >= {min_winner_reward} and "
                     f"a failure on the same task): raise samples_per_task or TaskSlices.explore_count, or start "
                     "from a stronger BC policy")
  used = sorted({i for pair in pairs for i in pair})
  position = {index: k for k, index in enumerate(used)}
  examples = [tokenize_trajectory(trajectories[i], tokenizer) for i in used]
  pairs = [(position[c], position[r]) for c, r in pairs]
  ref_logp = reference_logprobs(model, examples, buckets=buckets, pad_id=pad_id, batch_rows=2 * pairs_per_batch)
  data = PairBatchIterator(examples, pairs, ref_logp, pairs_per_batch=pairs_per_batch, pad_id=pad_id,
                           buckets=buckets, seed=seed)

  trainer = trainer_lib.Trainer(model_dir, model, optimizer_lib.make_optimizer(train_steps),
                                functools.partial(dpo_loss_fn, beta=beta), seed=seed)
  del model  # its arrays may be the trainer's, which the first step donates
  loop = Loop("dpo", model_dir, trainer, tokenizer, envs=envs, val_indices=slices.val_indices)
  extra = loop.resume()
  if "data" in extra:
    data.set_state(extra["data"])
  print(f"[dpo] {data.num_pairs} pairs ({data.num_dropped} too long), {pairs_per_batch} per step, beta {beta}",
        flush=True)

  def dpo_step() -> dict[str, Any]:
    batch = next(data)
    row = scalar_metrics(trainer.train_step({k: batch[k] for k in STEP_KEYS}))
    row.update(epoch=data.epoch)
    return row

  loop.run(dpo_step, until=train_steps, extras=lambda: {"data": data.get_state(), "num_pairs": data.num_pairs},
           first_row=dict({f"explore/{k}": float(v) for k, v in stats.items()}, pairs=data.num_pairs,
                          pairs_dropped_too_long=data.num_dropped))
  return loop.finish(extra_results=dict(init_checkpoint=str(paths.as_path(init_checkpoint)), num_pairs=data.num_pairs,
                                        beta=beta, exploration=stats))
