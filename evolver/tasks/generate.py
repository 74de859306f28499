"""Self-questioning without training: explore, propose, filter, save a synthetic task set.

  python -m launch.train --gin_file=gin_configs/tasks/selfq.gin --gin_bindings="MODEL_DIR='runs/selfq'"

writes MODEL_DIR/synthetic_tasks.jsonl (`evolver.tasks.taskset`), MODEL_DIR/generate_stats.json (what each part
yielded per env: episodes, outcomes, proposals, every filter's drops, kept tasks; and the seconds each part took:
exploration, proposing, and the filters' parts: preparing eval keys and originals' texts, held-out keys, resets,
near-duplicate checks, feasibility replays) and, with the LLM proposer, MODEL_DIR/proposer_replies.jsonl (each reply
with its episode and what became of it: parsed or not, items, malformed ones, ones reaching nothing, proposals).

Worlds are drawn from [world_start, world_start + world_count) of each env's train split, by default base.gin's
exploration slice [80, 400) (`TaskSlices`, which lives in `evolver.train` and so is not imported here: keep
the two in step), and the near-duplicate check compares against that slice's original tasks.

The policy explorer needs a policy. Loading one is the training code's (`evolver.train.trainer.init_policy`:
an evolver checkpoint, `INIT_CHECKPOINT`, or a transformers one, `HF_CHECKPOINT`); this module sits below
`evolver.train` and does not import it, so the loader is an argument, `load_policy(init_checkpoint=...,
hf_checkpoint=...) -> Decoder`, that selfq.gin binds to `@init_policy` (gin resolves it by name when
launch.train has registered the training code). The LLM proposer's `generate(prompts) -> texts` is an argument
too, an adapter of `evolver.models.generate`: `@OpenAIGenerate()` (an OpenAI-compatible endpoint) or
`@CheckpointGenerate()` (a saved policy, sampled in process; `CheckpointGenerate.load_policy = @init_policy`).
"""

from __future__ import annotations

import collections
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import Any

import gin
import numpy as np

from evolver import envs as envs_lib
from evolver import paths
from evolver.models.generate import Generate
from evolver.models.tokenizer import load_tokenizer
from evolver.tasks import explore as explore_lib
from evolver.tasks import filters as filters_lib
from evolver.tasks import propose as propose_lib
from evolver.tasks import taskset as taskset_lib

EXPLORERS = ("random", "policy")
ENVS = ("maze", "wordle", "textcraft", "babyai", "sql", "tools")
STATS_FILE = "generate_stats.json"
TASKSET_FILE = "synthetic_tasks.jsonl"
REPLIES_FILE = "proposer_replies.jsonl"


def choose_worlds(env_factory: Callable[[str], Any], envs: Sequence[str], start: int, count: int, per_env: int,
                  seed: int) -> list[explore_lib.World]:
  """`per_env` distinct train worlds of each env from [start, start + count), drawn with `seed`, sorted."""
  if per_env < 1 or count < per_env or start < 0:
    raise ValueError(f"need 1 <= worlds_per_env <= world_count and world_start >= 0, got worlds_per_env {per_env}, "
                     f"world_count {count}, world_start {start}")
  worlds = []
  for name in envs:
    env = env_factory(name)
    try:
      available = env.num_tasks("train")
    finally:
      getattr(env, "close", lambda: None)()
    if start + count > available:
      raise ValueError(f"the world slice [{start}, {start + count}) does not fit {name}'s {available} train tasks")
    rng = np.random.default_rng([seed, 2])
    chosen = sorted(int(i) for i in rng.choice(np.arange(start, start + count), size=per_env, replace=False))
    worlds.extend(explore_lib.World(name, index) for index in chosen)
  return worlds


@gin.configurable
def generate_tasks(*, model_dir: str = gin.REQUIRED, envs: Sequence[str] = ENVS, world_start: int = 80,
                   world_count: int = 320, worlds_per_env: int = 16, episodes_per_world: int = 2,
                   max_steps: int | None = None, explorer: str = "random", proposer: str = "hindsight",
                   jaccard_threshold: float = filters_lib.JACCARD_THRESHOLD, near_duplicates: str = "model_written",
                   decontaminate: bool = True,
                   drop_too_easy: bool = False, max_actions: int | None = None,
                   dedup_against_originals: bool = True, out: str | None = None, seed: int = 0,
                   load_policy: Callable[..., Any] | None = None, init_checkpoint: str | None = None,
                   hf_checkpoint: str | None = None, tokenizer_path: str | None = None, temperature: float = 1.0,
                   top_p: float = 1.0, max_new_tokens: int = 96, batch_size: int = 64,
                   llm: Generate | None = None,
                   env_factory: Callable[[str], Any] = envs_lib.make, progress: bool = True) -> dict[str, Any]:
  """Explores, proposes, filters and saves a synthetic task set (module docstring). Returns the stats written to
  MODEL_DIR/generate_stats.json.

  Args:
    model_dir: where the task set (unless `out`) and the stats go.
    envs: the built-in envs to generate tasks for.
    world_start, world_count: the train slice worlds come from (and the originals that near-duplicates are
      checked against, with `dedup_against_originals`).
    worlds_per_env, episodes_per_world, max_steps: the exploration budget (max_steps None: each env's limit).
    explorer: "random" (`env.sample_action`) or "policy" (needs `load_policy` and a checkpoint).
    proposer: "hindsight" (the env's outcomes) or "llm" (needs `llm`).
    jaccard_threshold, near_duplicates, decontaminate, drop_too_easy, max_actions: the filters (`FilterConfig`).
    dedup_against_originals: the duplicate checks compare against the slice's original tasks too.
    out: the task set's path (default MODEL_DIR/synthetic_tasks.jsonl).
    seed: the worlds drawn, the random explorer's actions, the policy's sampling.
    load_policy: `(init_checkpoint=, hf_checkpoint=) -> Decoder` (selfq.gin: `@init_policy`).
    init_checkpoint, hf_checkpoint: the policy explorer's policy (one of them).
    tokenizer_path: its tokenizer (None: the shipped tiny one).
    temperature, top_p, max_new_tokens, batch_size: the policy explorer's sampling and batch.
    llm: the LLM proposer's `generate(prompts) -> texts` (`evolver.models.generate`: `@OpenAIGenerate()`,
      `@CheckpointGenerate()`).
    env_factory: env name -> a fresh env (tests give fakes).
    progress: progress bars.
  """
  if explorer not in EXPLORERS:
    raise ValueError(f"unknown explorer {explorer!r}; use one of {list(EXPLORERS)}")
  if proposer not in propose_lib.PROPOSERS:
    raise ValueError(f"unknown proposer {proposer!r}; use one of {list(propose_lib.PROPOSERS)}")
  if proposer == "llm" and llm is None:
    raise ValueError("the llm proposer needs `llm`, a generate(prompts) -> texts callable: bind "
                     "generate_tasks.llm = @OpenAIGenerate() or @CheckpointGenerate() (evolver.models.generate)")
  if explorer == "policy":
    if load_policy is None:
      raise ValueError("the policy explorer needs `load_policy`: bind generate_tasks.load_policy = @init_policy "
                       "(gin_configs/tasks/selfq.gin does)")
    if not init_checkpoint and not hf_checkpoint:
      raise ValueError("the policy explorer explores with a trained policy: set INIT_CHECKPOINT to a run's MODEL_DIR "
                       "or HF_CHECKPOINT to a transformers checkpoint directory")
  filter_config = filters_lib.FilterConfig(jaccard_threshold=jaccard_threshold, near_duplicates=near_duplicates,
                                           decontaminate=decontaminate, drop_too_easy=drop_too_easy,
                                           max_actions=max_actions)
  model_dir = paths.as_path(model_dir)
  out = out or model_dir / TASKSET_FILE
  paths.write_text(model_dir / "config.gin", gin.config_str())
  started = time.perf_counter()
  seconds: dict[str, Any] = {}

  worlds = choose_worlds(env_factory, envs, world_start, world_count, worlds_per_env, seed)
  t0 = time.perf_counter()
  if explorer == "random":
    episodes = explore_lib.explore_random(env_factory, worlds, episodes_per_world=episodes_per_world,
                                          max_steps=max_steps, seed=seed, progress=progress)
  else:
    model = load_policy(init_checkpoint=init_checkpoint, hf_checkpoint=hf_checkpoint)
    tokenizer = load_tokenizer(tokenizer_path)
    episodes = explore_lib.explore_policy(model, tokenizer, env_factory, worlds,
                                          episodes_per_world=episodes_per_world, max_steps=max_steps,
                                          temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens,
                                          batch_size=batch_size, seed=seed, progress=progress)
    del model
  seconds["exploration"] = time.perf_counter() - t0

  t0 = time.perf_counter()
  llm_counts = None
  if proposer == "hindsight":
    proposals = propose_lib.propose_hindsight(episodes)
  else:
    proposals, llm_counts, replies = propose_lib.propose_llm(episodes, llm, env_factory)
    paths.write_text(model_dir / REPLIES_FILE, "".join(json.dumps(r) + "\n" for r in replies))
  seconds["proposing"] = time.perf_counter() - t0

  t0 = time.perf_counter()
  originals = {name: range(world_start, world_start + world_count) for name in envs} if dedup_against_originals else {}
  task_filter = filters_lib.TaskFilter(env_factory, filter_config, originals=originals, progress=progress)
  try:
    result = task_filter([p.candidate() for p in proposals])
  finally:
    task_filter.close()
  seconds["filtering"] = time.perf_counter() - t0
  seconds["filters"] = result.seconds

  records = []
  for kept in result.kept:
    proposal = proposals[kept.index]
    records.append(taskset_lib.SyntheticTask(
        spec=proposal.spec, actions=tuple(kept.actions), description=proposal.description,
        source={"proposer": proposal.proposer, "world": proposal.world, "episode": proposal.episode}))
  taskset_lib.save_taskset(out, records)
  seconds["total"] = time.perf_counter() - started

  stats = _stats(envs, episodes, proposals, result, llm_counts)
  stats.update(
      out=os.path.relpath(out) if paths.is_local(out) else str(out), explorer=explorer, proposer=proposer,
      seed=seed,
      worlds_per_env=worlds_per_env,
      episodes_per_world=episodes_per_world, max_steps=max_steps, world_slice=[world_start, world_count],
      filter_config={"jaccard_threshold": jaccard_threshold, "near_duplicates": near_duplicates,
                     "decontaminate": decontaminate,
                     "drop_too_easy": drop_too_easy, "max_actions": max_actions,
                     "dedup_against_originals": dedup_against_originals},
      seconds={k: (round(v, 4) if isinstance(v, float) else v) for k, v in seconds.items()})
  paths.write_json(model_dir / STATS_FILE, stats, sort_keys=True)
  paths.write_text(model_dir / "operative_config.gin", gin.operative_config_str())
  return stats


def _stats(envs: Sequence[str], episodes: Sequence[explore_lib.Exploration],
           proposals: Sequence[propose_lib.Proposal], result: filters_lib.FilterResult,
           llm_counts: dict[str, int] | None) -> dict[str, Any]:
  """Per env: episodes, failed ones, actions, hindsight outcomes, proposals, each filter's drops, kept; and
  the totals."""
  per_env: dict[str, dict[str, int]] = {}
  for name in envs:
    mine = [e for e in episodes if e.env == name]
    row = {"episodes": len(mine), "failed_episodes": sum(e.failed for e in mine),
           "actions": sum(len(e.actions) for e in mine),
           "outcomes": sum(len(e.hindsight) for e in mine if not e.failed),
           "proposals": sum(p.spec.env == name for p in proposals)}
    row.update(result.counts.get(name, dict.fromkeys(filters_lib.COUNTS, 0)))
    del row["proposed"]  # = proposals
    per_env[name] = row
  totals = collections.Counter()
  for row in per_env.values():
    totals.update(row)
  errors = [f"{e.env}[{e.world}] episode {e.episode}: {e.error}" for e in episodes if e.failed][:10]
  out = {"per_env": per_env, "totals": dict(totals), "kept": totals["kept"], "episode_errors": errors}
  if llm_counts is not None:
    out["llm"] = llm_counts
  return out
