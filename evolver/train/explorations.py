"""Explorations: episodes a policy sampled on a task set, kept with the run and read back exactly.

AgentEvol explores before each learning phase and DPO before it pairs; both train on what they read back from
here, so a fresh and a resumed run train on the same data. Layout: `MODEL_DIR/explore/iter_{m}.npz` (the sampled
token arrays, concatenated, and the exploration's meta as JSON) then `iter_{m}.json` (AgentTraj with reward and
success), each written atomically through the path layer (`evolver.paths`: a local MODEL_DIR or a URI; process 0
alone in a multi-host run); the JSON file's presence marks a complete exploration. An `iter_{m}.json` without its
`.npz` (AgentTraj trajectories from elsewhere) loads without token arrays: training then tokenizes their text.

Identical successful episodes (same task, same assistant texts) are counted once (`dedup_successes`): with K
samples per task a solved easy task repeats the same episode, and duplicates would overweight it.
"""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from typing import Any

import numpy as np
from etils import epath

from evolver import paths
from evolver.data import agenttraj
from evolver.data.trajectory import Trajectory
from evolver.rollout import RolloutConfig, RolloutEngine, Task

EXPLORE_SUBDIR = "explore"


def trajectory_key(trajectory: Trajectory) -> tuple:
  """What makes two trajectories the same episode: the task and every assistant text."""
  texts = tuple(m.content for m in trajectory.messages if m.role == "assistant")
  return (trajectory.env, trajectory.split, trajectory.task_index, texts)


def dedup_successes(trajectories: Sequence[Trajectory]) -> tuple[list[Trajectory], int]:
  """Keeps the first of each group of identical successful trajectories (failures pass through untouched:
  with K samples per task a solved easy task repeats the same episode, and duplicates would overweight it).

  Returns:
    (the trajectories in order without the duplicates, the number of duplicates removed).
  """
  seen: set[tuple] = set()
  kept: list[Trajectory] = []
  for trajectory in trajectories:
    if trajectory.success and not trajectory.failed:
      key = trajectory_key(trajectory)
      if key in seen:
        continue
      seen.add(key)
    kept.append(trajectory)
  return kept, len(trajectories) - len(kept)


def exploration_stats(trajectories: Sequence[Trajectory]) -> dict[str, float]:
  """What one exploration found: success rate (avg over the K samples), tasks solved at least once (best@K),
  successes, and how many successes were duplicates of another."""
  done = [t for t in trajectories if not t.failed]
  tasks: dict[tuple, bool] = {}
  for t in done:
    key = (t.env, t.split, t.task_index)
    tasks[key] = tasks.get(key, False) or t.success
  _, duplicates = dedup_successes(trajectories)
  return {
      "episodes": len(trajectories),
      "failed": len(trajectories) - len(done),
      "success": float(np.mean([t.success for t in done])) if done else 0.0,
      "reward": float(np.mean([t.reward for t in done])) if done else 0.0,
      "best_success": float(np.mean(list(tasks.values()))) if tasks else 0.0,
      "successes": sum(t.success for t in done),
      "duplicates": duplicates,
  }


def exploration_paths(model_dir: paths.PathLike, iteration: int) -> tuple[epath.Path, epath.Path]:
  """(`MODEL_DIR/explore/iter_{m}.json`, its `.npz`)."""
  base = paths.as_path(model_dir) / EXPLORE_SUBDIR
  return base / f"iter_{iteration}.json", base / f"iter_{iteration}.npz"


def encode_exploration(trajectories: Sequence[Trajectory], meta: dict[str, Any]) -> tuple[str, bytes]:
  """The two files of an exploration: (AgentTraj JSON text with reward/success, the `.npz` bytes of the token
  arrays, concatenated, and `meta` as JSON)."""
  has_tokens = np.asarray([t.token_ids is not None for t in trajectories], bool)
  lengths = [len(t.token_ids) if t.token_ids is not None else 0 for t in trajectories]

  def concat(field: str, dtype) -> np.ndarray:
    parts = [np.asarray(getattr(t, field), dtype) for t in trajectories if t.token_ids is not None]
    return np.concatenate(parts) if parts else np.zeros([0], dtype)

  arrays = {
      "offsets": np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
      "has_tokens": has_tokens,
      "token_ids": concat("token_ids", np.int32),
      "loss_mask": concat("loss_mask", np.float32),
      "logprobs": concat("logprobs", np.float32),
      "meta": np.asarray(json.dumps(meta)),
  }
  buffer = io.BytesIO()
  np.savez(buffer, **arrays)
  return agenttraj.dumps_agenttraj(trajectories), buffer.getvalue()


def decode_exploration(text: bytes | str, npz: bytes | None, *, json_name: str = "<json>",
                       npz_name: str = "<npz>") -> tuple[list[Trajectory], dict[str, Any]]:
  """The trajectories (with their token arrays) and meta of `encode_exploration`'s files; without `npz`, the
  trajectories without token arrays and meta {}. The names are for errors."""
  trajectories = agenttraj.loads_agenttraj(text, json_name)
  if npz is None:
    return trajectories, {}
  with np.load(io.BytesIO(npz)) as data:
    offsets, has_tokens = data["offsets"], data["has_tokens"]
    if len(has_tokens) != len(trajectories):
      raise ValueError(f"{npz_name} holds token arrays of {len(has_tokens)} trajectories but {json_name} has "
                       f"{len(trajectories)}; delete both to explore again")
    token_ids, loss_mask, logprobs = data["token_ids"], data["loss_mask"], data["logprobs"]
    for index, trajectory in enumerate(trajectories):
      if has_tokens[index]:
        span = slice(int(offsets[index]), int(offsets[index + 1]))
        trajectory.token_ids, trajectory.loss_mask, trajectory.logprobs = (
            token_ids[span], loss_mask[span], logprobs[span])
    meta = json.loads(str(data["meta"]))
  return trajectories, meta


def write_exploration(model_dir: paths.PathLike, iteration: int, text: str, npz: bytes) -> str:
  """Writes `encode_exploration`'s files: the `.npz`, then the JSON file that marks the exploration complete.
  Returns the JSON file's path."""
  json_path, npz_path = exploration_paths(model_dir, iteration)
  paths.write_bytes(npz_path, npz)
  paths.write_text(json_path, text)
  return str(json_path)


def save_exploration(model_dir: paths.PathLike, iteration: int, trajectories: Sequence[Trajectory],
                     meta: dict[str, Any]) -> str:
  """Writes `explore/iter_{m}.npz` (token arrays, concatenated, and `meta` as JSON) then `iter_{m}.json`
  (AgentTraj with reward/success), each atomically; the JSON file's presence marks a complete exploration."""
  return write_exploration(model_dir, iteration, *encode_exploration(trajectories, meta))


def load_exploration(model_dir: paths.PathLike, iteration: int) -> tuple[list[Trajectory], dict[str, Any]] | None:
  """The trajectories of `save_exploration` with their token arrays and meta, or None when there is none.

  An `iter_{m}.json` without its `.npz` (AgentTraj trajectories from elsewhere) loads without token arrays:
  training then tokenizes their text.
  """
  json_path, npz_path = exploration_paths(model_dir, iteration)
  if not json_path.exists():
    return None
  npz = npz_path.read_bytes() if npz_path.exists() else None
  return decode_exploration(json_path.read_bytes(), npz, json_name=str(json_path), npz_name=str(npz_path))


def explore_or_load(model_dir: paths.PathLike, iteration: int, engine: RolloutEngine, tasks: Sequence[Task],
                    config: RolloutConfig, policy_step: int, tag: str) -> list[Trajectory]:
  """Reuses iteration `iteration`'s saved exploration, or explores with the engine's current weights
  (`config.num_samples` episodes per task, rewarded by the envs) and saves it.

  Either way the trajectories are decoded from the files' contents, so a fresh and a resumed run train on the
  same (a fresh run decodes what it writes rather than reading it back: in a multi-host run only process 0
  writes).
  `policy_step` (the step of the exploring policy) is recorded and checked: an exploration of another policy
  belongs to another run.
  """
  loaded = load_exploration(model_dir, iteration)
  if loaded is not None:
    trajectories, meta = loaded
    if meta and meta.get("policy_step") != policy_step:
      raise ValueError(f"{exploration_paths(model_dir, iteration)[0]} was explored by the policy of step "
                       f"{meta.get('policy_step')}, but iteration {iteration} explores with step {policy_step}'s; "
                       "it belongs to another run: delete it (and its .npz) to explore again")
    print(f"[{tag}] iteration {iteration}: reusing the saved exploration ({len(trajectories)} trajectories)")
    return trajectories
  print(f"[{tag}] iteration {iteration}: exploring {len(tasks)} tasks x {config.num_samples} samples at "
        f"temperature {config.temperature}", flush=True)
  rollouts = engine.run(tasks, config).trajectories
  meta = {"iteration": iteration, "policy_step": policy_step, "num_samples": config.num_samples,
          "temperature": config.temperature, "seed": config.seed, "num_tasks": len(tasks)}
  encoded = encode_exploration(rollouts, meta)
  json_name = write_exploration(model_dir, iteration, *encoded)
  return decode_exploration(*encoded, json_name=json_name)[0]


def load_finished(model_dir: paths.PathLike, iteration: int) -> list[Trajectory]:
  """The exploration of an iteration the run already finished; an error when it is missing."""
  loaded = load_exploration(model_dir, iteration)
  if loaded is None:
    raise FileNotFoundError(f"the exploration of finished iteration {iteration} is missing "
                            f"({exploration_paths(model_dir, iteration)[0]}); the run cannot rebuild its data")
  return loaded[0]
