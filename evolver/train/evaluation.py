"""Evaluation: roll the policy out on an env split and report per-env success, reward and turns.

  python -m launch.eval --hf_checkpoint DIR --envs maze,wordle --split eval --num_tasks 100 --out eval_results.json

From code (the training loop does this on `val`, a fixed slice of `train` indices, every N steps):

  sampler = Sampler(model)                 # keep one; after each train step: sampler.update_params(params)
  results = evaluate(sampler, tok, ["maze", "wordle"], split="train", indices=range(0, 50))
  metrics.update(flatten_metrics(results, "val"))   # {"val/maze/success": ..., "val/overall/success": ...}

A model behind an OpenAI-compatible endpoint plays the same episodes (`evolver.rollout.api`):

  with APIRolloutEngine(OpenAIChat("http://127.0.0.1:8000/v1", "qwen2.5-7b-instruct")) as engine:
    results = evaluate(engine, None, ["maze", "sql"], num_tasks=100)   # + results["endpoint"], ["api_stats"]

Greedy (`num_samples=1`) gives success@1. With k samples at temperature T, `success` is avg@k (the mean
over all samples) and `best_success` is best@k (the fraction of tasks solved by at least one sample).
Failed episodes (an env error) are counted in `num_failed` and left out of every rate; a task whose samples
all failed is left out of best@k. `overall` holds unweighted means over the envs (each env counts the same,
as AgentGym reports), plus the summed counts.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from evolver import envs as envs_lib
from evolver import paths
from evolver.models.decoder import Decoder
from evolver.models.sampler import Sampler
from evolver.rollout import APIRolloutEngine, OpeningTransform, Rollout, RolloutConfig, RolloutEngine, Task

# Per-env figures that `overall` averages.
MEAN_KEYS = ("success", "best_success", "reward", "best_reward", "turns")
COUNT_KEYS = ("num_tasks", "num_episodes", "num_failed", "num_truncated")


def summarize_env(trajectories: Sequence[Rollout]) -> dict[str, Any]:
  """Success and reward figures of one env's trajectories (k samples per task share a `group`)."""
  done = [t for t in trajectories if not t.failed]
  by_task: dict[int, list[Rollout]] = {}
  for t in done:
    by_task.setdefault(t.group, []).append(t)

  def mean(values) -> float:
    values = list(values)
    return float(np.mean(values)) if values else 0.0

  return {
      "num_tasks": len({t.group for t in trajectories}),
      "num_episodes": len(trajectories),
      "num_failed": len(trajectories) - len(done),
      "num_truncated": sum(t.truncated for t in done),
      "success": mean(t.success for t in done),
      "best_success": mean(any(t.success for t in ts) for ts in by_task.values()),
      "reward": mean(t.reward for t in done),
      "best_reward": mean(max(t.reward for t in ts) for ts in by_task.values()),
      "turns": mean(t.turns for t in done),
      "errors": sorted({t.error for t in trajectories if t.error})[:5],
  }


def summarize(trajectories: Sequence[Rollout], env_names: Sequence[str],
              versions: Mapping[str, str]) -> dict[str, Any]:
  """Per-env summaries and their unweighted means over envs."""
  per_env = {}
  for name in env_names:
    per_env[name] = summarize_env([t for t in trajectories if t.env == name])
    per_env[name]["version"] = versions.get(name, "")
  overall: dict[str, Any] = {k: float(np.mean([per_env[n][k] for n in env_names])) if env_names else 0.0
                             for k in MEAN_KEYS}
  overall.update({k: int(sum(per_env[n][k] for n in env_names)) for k in COUNT_KEYS})
  return {"envs": per_env, "overall": overall}


def env_versions(env_names: Sequence[str], env_factory: Callable[[str], Any] = envs_lib.make) -> dict[str, str]:
  """Each env's `version` (what its tasks and rules are), by name."""
  return _task_indices(env_names, "eval", None, 0, 0, env_factory)[1]


def _task_indices(env_names: Sequence[str], split: str, indices, start: int, num_tasks: int | None,
                  env_factory: Callable[[str], Any]) -> tuple[dict[str, list[int]], dict[str, str]]:
  """Resolves which task indices to run per env, and reads each env's version."""
  out, versions = {}, {}
  for name in env_names:
    env = env_factory(name)
    try:
      available = env.num_tasks(split)
      versions[name] = str(env.version)
    finally:
      close = getattr(env, "close", None)
      if close is not None:
        close()
    if isinstance(indices, Mapping):
      if name not in indices:
        raise ValueError(f"indices has no entry for env {name!r}")
      chosen = list(indices[name])
    elif indices is not None:
      chosen = list(indices)
    else:
      chosen = list(range(start, available if num_tasks is None else min(start + num_tasks, available)))
    bad = [i for i in chosen if not 0 <= i < available]
    if bad:
      raise ValueError(f"{name}: task indices {bad[:5]} out of range for split {split!r} ({available} tasks)")
    out[name] = chosen
  return out, versions


def evaluate(policy: RolloutEngine | APIRolloutEngine | Sampler | Decoder, tokenizer: PreTrainedTokenizerBase | None,
             env_names: Sequence[str], *,
             split: str = "eval", indices: Mapping[str, Sequence[int]] | Sequence[int] | None = None,
             start: int = 0, num_tasks: int | None = None, num_samples: int = 1, temperature: float | None = None,
             top_p: float = 1.0, max_new_tokens: int = 128, max_rounds: int | None = None,
             max_context_tokens: int | None = None, batch_size: int = 64, seed: int = 0,
             env_factory: Callable[[str], Any] = envs_lib.make, keep_episodes: bool = True,
             transform_openings: OpeningTransform | None = None,
             on_rollouts: Callable[[list[Rollout]], None] | None = None,
             progress: str | None = None) -> dict[str, Any]:
  """Rolls the policy out on `split` of each env and summarizes.

  Args:
    policy: a Sampler you keep (so repeated evaluations reuse its compiled programs), a Decoder (wrapped in a
      new Sampler), a RolloutEngine you keep (its envs are reused too; its env factory is used), or an
      APIRolloutEngine (a model behind an OpenAI-compatible endpoint; its env factory is used).
    tokenizer: ignored when `policy` is an engine (it has its own, or the endpoint applies the chat template).
    env_names: envs to evaluate (names `env_factory` understands).
    split: the env split, "train" or "eval" (`val` is a slice of "train" indices: pass them as `indices`).
    indices: task indices per env (a mapping) or the same for all envs; None: `num_tasks` tasks of each env
      from index `start` (to the end of the split when `num_tasks` is None).
    num_samples: 1 = one greedy episode per task; k > 1 = k episodes per task at `temperature` (default 1.0)
      for avg@k (`success`) and best@k (`best_success`).
    temperature: None = 0 (greedy) when num_samples is 1, else 1.0.
    keep_episodes: also return one small record per episode under "episodes".
    transform_openings: changes the openings of some episodes (`RolloutEngine.run`), e.g. experience.
    on_rollouts: called once with every episode's `Rollout` (failed ones included, in the order of "episodes"),
      e.g. to summarize them into experience (`launch.eval --summarize_into`).
    progress: a label: show a progress bar of the episodes ended (tqdm, on stderr) under it; None: no bar.

  Returns:
    {"split", "num_samples", "temperature", "seed", "max_new_tokens", "max_rounds", "envs": {name: {success,
    best_success, reward, best_reward, turns, num_tasks, num_episodes, num_failed, num_truncated, version,
    errors}}, "overall": {...}, "seconds", "episodes_per_s", "rollout_stats", ["episodes"]}; with an
    APIRolloutEngine also "endpoint" (base_url, model, ...) and "api_stats" (requests, retries, tokens) of this
    evaluation.

  Raises:
    evolver.models.openai_api.APIRequestError: an APIRolloutEngine's endpoint refused a request for good.
  """
  if temperature is None:
    temperature = 0.0 if num_samples == 1 else 1.0
  if num_samples > 1 and temperature == 0.0:
    raise ValueError("num_samples > 1 at temperature 0 repeats one greedy episode k times; set a temperature")
  env_names = list(env_names)
  engine = policy if isinstance(policy, (RolloutEngine, APIRolloutEngine)) else None
  if engine is not None:
    env_factory = engine.env_factory
  chosen, versions = _task_indices(env_names, split, indices, start, num_tasks, env_factory)
  tasks = [Task(name, i, split) for name in env_names for i in chosen[name]]
  config = RolloutConfig(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                         max_rounds=max_rounds, max_context_tokens=max_context_tokens, num_samples=num_samples,
                         batch_size=batch_size, seed=seed)
  start = time.perf_counter()
  api_before = engine.client.stats() if isinstance(engine, APIRolloutEngine) else None
  bar = tqdm(total=len(tasks) * num_samples, desc=progress, unit="episode", leave=False,
             disable=progress is None)
  run_kwargs: dict[str, Any] = {"transform_openings": transform_openings}
  if progress is not None:
    run_kwargs["progress"] = bar.update
  with bar:
    if engine is not None:
      batch = engine.run(tasks, config, **run_kwargs)
    else:
      with RolloutEngine(policy, tokenizer, env_factory=env_factory) as own:
        batch = own.run(tasks, config, **run_kwargs)
  seconds = time.perf_counter() - start
  if on_rollouts is not None:
    on_rollouts(list(batch.trajectories))
  results: dict[str, Any] = {
      "split": split, "num_samples": num_samples, "temperature": temperature, "top_p": top_p, "seed": seed,
      "max_new_tokens": max_new_tokens, "max_rounds": max_rounds,
  }
  results.update(summarize(batch.trajectories, env_names, versions))
  results["seconds"] = seconds
  results["episodes_per_s"] = len(batch.trajectories) / seconds if seconds else 0.0
  results["rollout_stats"] = batch.stats.as_dict()
  if api_before is not None:
    results["endpoint"] = engine.describe()
    results["api_stats"] = {k: v - api_before[k] for k, v in engine.client.stats().items()}
  if keep_episodes:
    results["episodes"] = [
        {"env": t.env, "index": t.task_index, "sample": t.sample, "reward": t.reward, "success": t.success,
         "turns": t.turns, "finish_reason": t.finish_reason, "failed": t.failed, "error": t.error}
        for t in batch.trajectories]
  return results


def params_digest(params: Any) -> str:
  """The identity of an evaluated policy: sha256 (16 hex digits) over its parameters' paths, dtypes, shapes and
  bytes, in path order. A model loaded from a checkpoint (`nnx.state(model, nnx.Param)`) and a trainer's policy
  copy of the same weights in the same dtype give the same digest; any changed weight or dtype changes it."""
  leaves = []
  for path, leaf in jax.tree_util.tree_leaves_with_path(params):
    name = jax.tree_util.keystr(path, simple=True, separator="/").removesuffix("/value")
    leaves.append((name, np.asarray(jax.device_get(leaf))))
  digest = hashlib.sha256()
  for name, array in sorted(leaves, key=lambda item: item[0]):
    digest.update(f"{name}|{array.dtype}|{array.shape}|".encode())
    digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()[:16]


# The settings that make two evaluations of one policy play the same episodes (with the envs, tasks and policy).
# Not recorded, so not compared: the context limit (`max_context_tokens`) and the episodes' openings.
EPISODE_SETTINGS = ("split", "num_samples", "temperature", "top_p", "seed", "max_new_tokens", "max_rounds")


def load_eval_results(path: paths.PathLike) -> dict[str, Any]:
  """A results file written by `write_eval_results`; raises ValueError naming the file where it is missing or
  not an evaluation."""
  target = paths.as_path(path)
  if not target.exists():
    raise ValueError(f"{target}: no such evaluation file")
  try:
    results = json.loads(target.read_text())
  except (UnicodeDecodeError, json.JSONDecodeError) as error:
    raise ValueError(f"{target}: not JSON ({error})") from None
  if not isinstance(results, dict) or not {"envs", "episodes", *EPISODE_SETTINGS} <= set(results):
    raise ValueError(f"{target}: not an evaluation with its episodes (want the keys of `evaluate`'s results)")
  return results


def reuse_problem(results: Mapping[str, Any], *, envs: Sequence[str], num_tasks: int,
                  versions: Mapping[str, str] | None = None, digest: str | None = None,
                  **settings: Any) -> str | None:
  """Why `results` (an evaluation's record) cannot stand for evaluating a policy on the first `num_tasks` tasks
  of each of `envs` with `settings` (`EPISODE_SETTINGS`), or None where it can: the same settings, envs, task
  indices and env versions (where `versions` is given), and the policy's `params_digest` (where `digest` is
  given; a record without one does not qualify)."""
  for key, want in settings.items():
    if key not in EPISODE_SETTINGS:
      raise ValueError(f"unknown evaluation setting {key!r}; known: {EPISODE_SETTINGS}")
    if results.get(key) != want:
      return f"{key} is {results.get(key)!r}, this evaluation's {want!r}"
  if sorted(results["envs"]) != sorted(envs):
    return f"envs are {sorted(results['envs'])}, this evaluation's {sorted(envs)}"
  for name in envs:
    indices = sorted({e["index"] for e in results["episodes"] if e["env"] == name})
    if indices != list(range(num_tasks)):
      return f"{name}'s tasks are not the first {num_tasks} ({len(indices)} tasks)"
    if versions is not None and results["envs"][name].get("version") != versions[name]:
      return f"{name} is version {results['envs'][name].get('version')!r}, now {versions[name]!r}"
  if digest is not None:
    recorded = (results.get("policy") or {}).get("params_digest")
    if recorded != digest:
      return (f"its policy's params_digest is {recorded!r}, this policy's {digest!r}" if recorded
              else "it names no params_digest of its policy (evaluate with `launch.eval`, which records it)")
  return None


def flatten_metrics(results: Mapping[str, Any], prefix: str = "eval") -> dict[str, float]:
  """Scalar metrics for logging: `{prefix}/{env}/{key}` and `{prefix}/overall/{key}` (numbers only)."""
  out = {}
  for group, values in [*results["envs"].items(), ("overall", results["overall"])]:
    for key, value in values.items():
      if isinstance(value, (int, float)) and not isinstance(value, bool):
        out[f"{prefix}/{group}/{key}"] = float(value)
  return out


def write_eval_results(path: paths.PathLike, results: Mapping[str, Any]) -> str:
  """Writes `results` as JSON to `path` (a file, or a directory that gets `eval_results.json`; local or a URI);
  returns the file. Through the path layer (`evolver.paths.write_json`): atomic, and by process 0 alone in a
  multi-host run."""
  target = paths.as_path(path)
  if os.fspath(path).endswith(("/", os.sep)) or target.is_dir():
    target = target / "eval_results.json"
  return str(paths.write_json(target, results))


def print_table(results: Mapping[str, Any]) -> None:
  """Per env and overall: version, tasks, success (avg@k), best@k, reward, turns and failed episodes."""
  k = results["num_samples"]
  head = (f"{'env':<12}{'version':<16}{'tasks':>6}{'success':>9}{'best@' + str(k):>9}{'reward':>8}{'turns':>7}"
          f"{'failed':>7}")
  print(head)
  print("-" * len(head))
  rows = [*results["envs"].items(), ("overall", results["overall"])]
  for name, r in rows:
    print(f"{name:<12}{r.get('version', ''):<16}{r['num_tasks']:>6}{r['success']:>9.3f}{r['best_success']:>9.3f}"
          f"{r['reward']:>8.3f}{r['turns']:>7.2f}{r['num_failed']:>7}")
  print(f"{sum(r['num_episodes'] for r in results['envs'].values())} episodes in {results['seconds']:.1f}s "
        f"({results['episodes_per_s']:.2f} episodes/s)")
