"""The experience pool in the RL loop: AgentEvolver's ExperienceManager as an `RLExtension` of GRPO.

  python -m launch.train --gin_file=gin_configs/experience/init_train_update.gin \
      --gin_file=gin_configs/experience/hybrid.gin --gin_bindings="MODEL_DIR='runs/exp_hybrid'"

Per RL step (DESIGN 3.6; the allocation, template and strip functions are `evolver.experience.manager`'s):
- openings (`transform_openings`, one batched retrieval per step): of each task's n samples, `train_rollout_mode`
  picks which get experience (woexp: none; all: every one; mixed: round(n * rollout_ratio), randomly placed);
  each of those retrieves the top `retrieve_top_k` memories for the task's own text (its first observation) and
  gets them appended, in the experience template, to its last initial user message. The query is always the
  task's text: AgentEvolver sends the JSON of the whole opening, which the service reduces to the same text
  (`manager.task_query`), since an embedding of the opening matches every task of an env alike (the rules
  dominate it). The injected text has a budget of `max_experience_tokens` (the policy's tokens): memories past it
  are dropped, worst first, and a first memory longer than the budget is cut; what is cut is counted
  (`cut_memories`, `cut_tokens`). Val and held-out episodes follow `val_rollout_mode` (woexp recommended).
- training samples (`training_rollouts`): of the step's tasks, `train_sample_mode` picks which keep the
  experience text (allkeep: all; alldiscard: none; hybrid: int(num_tasks * train_sample_keepratio), shuffled);
  the others' experience is stripped from the tokens (`strip_added`), and their sampled tokens train off-policy
  (exp_mask 1: HET-PPO's `off_clip_high`).
- before the update (`before_update`, once the step's rollouts are scored): the counters of the memories the
  step's training episodes ran with are bumped, then, every `updated_freq` steps, the step's scored rollouts
  (their experience stripped from the messages) go to the summarizer (`summarizer`, gin: extractive by default, or
  an LLM one), which distils them into memories and commits them stamped with the step. It runs during the update
  (AgentEvolver's order) and `after_step` waits for it, so the next step retrieves from a pool that is a function
  of the seed, never of timing. `blocking` summarizes before the update instead (no overlap: the same pool, the
  update waits).
- freq and utility (one definition, in-process and through the service alike: `ExperienceBackend.record`):
  a memory's `freq` counts the scored training episodes whose opening carried it, its `utility` those of them that
  succeeded (so utility / freq is the success rate of the episodes it was given to, what ReMe's deletion rule
  reads). Val and held-out episodes count nothing. Every change made while taking RL step s (0-based) is stamped
  with the store's step base + s + 1, the step the checkpoint after it is named by, so a run resumed from the
  checkpoint of step t undoes exactly the changes stamped after t.
- checkpoints (`state_files`): the step the pool was at (after waiting for summaries in flight) and a snapshot of
  the workspace's database (`Workspace.snapshot`). A run resumed from step t rewinds the pool to step t: the
  memories this run committed after t are set aside (kept, not retrieved), deletions and retrieval counts after t
  undone, so it retrieves what an unbroken run would have. Where the store lacks the workspace (a run resumed on
  another machine, MODEL_DIR on `gs://`), the checkpoint's snapshot is restored instead. The store counts steps
  across runs: a run's step s is the store's step base + s, base being the highest step in the workspace when the
  run first started (kept in MODEL_DIR/experience_run.json), so rewinding one run never touches what earlier runs
  put in an existing pool.
- where: the store is SQLite databases, so `store_dir` is a local directory (default MODEL_DIR/experience, which
  must then be local: with MODEL_DIR on an object store, give `store_dir`); everything else goes through the path
  layer (`evolver.paths`).
- multi-host (`evolver.distributed`): the processes share one pool through an experience service
  (`service_url`, required there; `service_token_env` names the environment variable holding its bearer token
  when it has one). Every host retrieves for its own episodes; process 0 alone initialises the pool, records
  freq/utility and submits summaries, and waits for the step's summary at the step's end, after which every host
  passes a barrier: each step's retrievals, on every host, see the same pool.
- a library to start from (`init_from` a JSONL file): the in-process pool reads it from this machine; a service
  reads it from its own library directory (`launch.serve_experience --library_dir`, default `<store>/libraries`),
  so the file is copied there on the service's host and `init_from` is its path relative to that directory.
Lifecycle (the seed's table; `gin_configs/experience/`): no pool; init only (`init_experience_pool`: build the
pool, train nothing); init + train (`init_from`, updated_freq 0); init + train + update (updated_freq k); exist +
train (an existing `workspace_id` in `store_dir`, `require_existing`); exist + train + update. Without training
(`launch.eval --summarize_into DIR` / `--experience DIR`): `open_pool` opens the same pool outside a run.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import gin
import numpy as np
from transformers import PreTrainedTokenizerBase

from evolver import distributed
from evolver import paths
from evolver.data.trajectory import Message
from evolver.experience import embedders as embedders_lib
from evolver.experience import manager as manager_lib
from evolver.experience import summarizer as summarizer_lib
from evolver.experience.pool import ExperiencePool
from evolver.experience.service import ExperienceBackend, ExperienceClient, LocalBackend
from evolver.experience.store import ExperienceStore
from evolver.rollout import EpisodeOpening, OpeningChange, Rollout
from evolver.train.extensions import RLExtension

STATE_FILE = "pool.json"
SNAPSHOT_FILE = "workspace.sqlite3"
RUN_FILE = "experience_run.json"


def task_groups(openings: Sequence[EpisodeOpening]) -> list[list[int]]:
  """The positions of each task's samples. The engine gives a task's samples together in sample order, but an
  episode whose env failed to reset has no opening: a group starts wherever the task changes or the sample index
  does not grow, so a missing sample 0 never merges two tasks (nor two draws of one task)."""
  groups: list[list[int]] = []
  for position, opening in enumerate(openings):
    previous = openings[position - 1] if position else None
    if previous is None or opening.task != previous.task or opening.sample <= previous.sample:
      groups.append([])
    groups[-1].append(position)
  return groups


@gin.configurable
class ExperienceManager(RLExtension):
  """The experience pool as an RL extension (module docstring). Gin names as DESIGN section 4."""

  name = "experience"
  added_keys = ("experience", "experience_text")  # the retrieved memory ids; the text injected

  def __init__(self, *, workspace_id: str = "default", train_rollout_mode: str = "woexp",
               val_rollout_mode: str = "woexp", rollout_ratio: float = 0.0, train_sample_mode: str = "alldiscard",
               train_sample_keepratio: float = 1.0, updated_freq: int = 0, blocking: bool = False,
               retrieve_top_k: int = 3, min_score: float = 0.0, max_experience_tokens: int | None = 512,
               embedder: str = "hashing", summarizer: summarizer_lib.Summarizer | None = None,
               store_dir: str | None = None, init_from: str | None = None, require_existing: bool = False,
               service_url: str | None = None, service_token_env: str | None = None, log_pool_digest: bool = False,
               seed: int = 0):
    """
    Args:
      workspace_id: the pool (a workspace of `store_dir`): an existing one is used as it is (exist modes).
      train_rollout_mode, val_rollout_mode, rollout_ratio: which rollouts get experience (module docstring).
      train_sample_mode, train_sample_keepratio: which tasks' samples keep it when they train.
      updated_freq: summarize the step's rollouts into the pool every this many steps (0: never).
      blocking: summarize before the update rather than during it (the pool is the same either way).
      retrieve_top_k, min_score: memories per retrieval and the least cosine a hit needs.
      max_experience_tokens: the most tokens of the policy's tokenizer the injected text may take (None: no
        budget); what is cut is counted in the metrics.
      embedder: `evolver.experience.embedders.make_embedder`'s name ("hashing", "minilm").
      summarizer: what distils rollouts into memories (`evolver.experience.summarizer`: `ExtractiveSummarizer()`
        by default; `LLMSummarizer(generate=...)` with an endpoint, another checkpoint or the live policy). With
        a service, the service's own summarizer runs instead.
      store_dir: where the pools live, a local directory (default MODEL_DIR/experience).
      init_from: fill an empty pool before training: "expert" (the expert slice's trajectories, summarized),
        "taskset:PATH" (a self-questioned task set's ground truths, replayed and summarized) or a path to a ReMe
        JSONL library; None: start from what the workspace holds (possibly nothing).
      require_existing: the workspace must exist and hold memories (the exist modes): an error otherwise.
      service_url: use a running experience service (`launch.serve_experience`, ReMe 0.2's API) instead of the
        in-process pool; the same calls go through `ExperienceBackend`. A resumed run cannot rewind a service's
        pool (it says so), so exact resumption needs the in-process pool.
      service_token_env: the name of the environment variable that holds the service's bearer token (the token
        itself never goes into a config).
      log_pool_digest: log `pool_digest`, a digest of every live memory (id, content, freq, utility, committed
        step) after each step: equal digests, equal pools (reads the whole pool: for tests and audits).
    """
    manager_lib.allocate_rollout_exp(1, train_rollout_mode, rollout_ratio, np.random.default_rng(0))  # validates
    manager_lib.allocate_rollout_exp(1, val_rollout_mode, rollout_ratio, np.random.default_rng(0))
    manager_lib.allocate_train_modes(1, train_sample_mode, train_sample_keepratio, np.random.default_rng(0))
    if updated_freq < 0 or retrieve_top_k < 1:
      raise ValueError(f"updated_freq ({updated_freq}) must be >= 0 and retrieve_top_k ({retrieve_top_k}) >= 1")
    if max_experience_tokens is not None and max_experience_tokens < 1:
      raise ValueError(f"max_experience_tokens must be >= 1 or None, got {max_experience_tokens}")
    self.workspace_id = workspace_id
    self.train_rollout_mode, self.val_rollout_mode = train_rollout_mode, val_rollout_mode
    self.rollout_ratio = rollout_ratio
    self.train_sample_mode, self.train_sample_keepratio = train_sample_mode, train_sample_keepratio
    self.updated_freq, self.blocking = updated_freq, blocking
    self.retrieve_top_k, self.min_score = retrieve_top_k, min_score
    self.max_experience_tokens = max_experience_tokens
    self.embedder_name, self.store_dir, self.init_from = embedder, store_dir, init_from
    self.require_existing, self.seed = require_existing, seed
    self.service_url, self.service_token_env = service_url, service_token_env
    self.log_pool_digest = log_pool_digest
    self.tokenizer: PreTrainedTokenizerBase | None = None  # the policy's: counts the experience budget
    self.pool: ExperiencePool | None = None  # the in-process pool (None with a service)
    self.backend: ExperienceBackend | None = None
    self.base = 0  # the store's step of this run's step 0 (module docstring)
    self.new_workspace = False  # the store lacked the workspace when the run started: a resume restores it
    self.step = 0  # the last logged step whose summary was submitted
    self._summarizer = summarizer if summarizer is not None else summarizer_lib.ExtractiveSummarizer()
    self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="summarizer")
    self._pending: list[concurrent.futures.Future] = []
    self._trained_with = 0  # the last step's samples whose experience stayed in their training tokens
    self._cut = {"cut_memories": 0, "cut_tokens": 0}  # what the budget cut from the step's training openings

  # -- set-up ------------------------------------------------------------------------------------------------

  def start(self, *, model_dir: paths.PathLike, envs: Sequence[str], seed: int,
            tokenizer: PreTrainedTokenizerBase | None = None) -> None:
    self.seed = seed
    self._set_tokenizer(tokenizer)
    model_dir = paths.as_path(model_dir)
    if distributed.process_count() > 1 and not self.service_url:
      raise ValueError("a multi-process run shares one experience pool through a service: start `python -m "
                       "launch.serve_experience --store DIR --host 0.0.0.0 --port P` where every host reaches it and "
                       "set ExperienceManager.service_url (the real configs: the macro EXPERIENCE_SERVICE) to its "
                       "URL (every host retrieves from it; process 0 alone writes)")
    if self.service_url:
      self.backend = ExperienceClient(self.service_url, self.workspace_id, token_env=self.service_token_env)
      self.backend.health()  # fails now, with the URL, rather than at the first step
    else:
      self._open_local(self.store_dir or model_dir / "experience")
      self.base = self._run_base(model_dir / RUN_FILE)
    if self.init_from and distributed.is_primary() and self.size == 0:
      self._initialise(envs)
    distributed.barrier("experience pool ready")

  def open_pool(self, store_dir: str, *, tokenizer: PreTrainedTokenizerBase | None = None) -> None:
    """Opens the in-process pool of `workspace_id` in `store_dir` outside an RL run, as `start` opens it but with
    no run file, no `init_from` and the store's step base 0: for `launch.eval`, which retrieves for its episodes
    (`transform_openings(0, openings, validating=True)`: `val_rollout_mode`) and summarizes them
    (`backend.summarize`).

    Raises:
      FileNotFoundError: `require_existing` and the workspace is missing or holds no memories.
      ValueError: `store_dir` is not local.
    """
    self._set_tokenizer(tokenizer)
    self._open_local(store_dir)

  def _set_tokenizer(self, tokenizer: PreTrainedTokenizerBase | None) -> None:
    """The policy's tokenizer counts the experience budget (a run passes its own; the default one otherwise)."""
    self.tokenizer = tokenizer
    if self.max_experience_tokens is not None and tokenizer is None:
      from evolver.models import tokenizer as tokenizer_lib
      self.tokenizer = tokenizer_lib.load_tokenizer()

  def _open_local(self, store_dir: paths.PathLike) -> None:
    """The in-process pool and its backend (the workspace is created unless `require_existing` refuses)."""
    store_dir = paths.local_dir(store_dir, "the experience store (SQLite databases: set ExperienceManager.store_dir)")
    store = ExperienceStore(store_dir)
    self.new_workspace = not store.exists(self.workspace_id)
    if self.require_existing and not (store.exists(self.workspace_id) and store.open(self.workspace_id).count()):
      raise FileNotFoundError(f"no memories in workspace {self.workspace_id!r} of {store_dir!r}: the exist modes "
                              "use a pool made before (e.g. by gin_configs/experience/init_only.gin)")
    self.pool = ExperiencePool(store, self.workspace_id, embedders_lib.make_embedder(self.embedder_name),
                               min_score=self.min_score)
    self.backend = LocalBackend(self.pool, self._summarizer)

  @property
  def size(self) -> int:
    """Memories in the pool (asked of the service when one holds it)."""
    return self.pool.size if self.pool is not None else self.backend.count()

  def _run_base(self, path: paths.PathLike) -> int:
    """The store's step of this run's step 0: read back on a restart, else the workspace's highest step now."""
    path = paths.as_path(path)
    if path.exists():
      record = json.loads(path.read_text())
      if record.get("workspace_id") != self.workspace_id:
        raise ValueError(f"{path} says this run used workspace {record.get('workspace_id')!r}, not "
                         f"{self.workspace_id!r}: use the same workspace_id or a new MODEL_DIR")
      return int(record["base"])
    steps = [m.metadata.get("committed_step") for m in self.pool.workspace.all()]
    base = max([s for s in steps if isinstance(s, int)], default=0)
    paths.write_json(path, {"workspace_id": self.workspace_id, "base": base}, indent=None)
    return base

  def _initialise(self, envs: Sequence[str]) -> None:
    """Fills the empty pool from the expert slice's trajectories or a JSONL library (at this run's step 0)."""
    if self.init_from == "expert":
      from evolver.data import tfds_builders
      from evolver.train.slices import TaskSlices
      slices = TaskSlices()
      source = tfds_builders.load_expert_source(list(envs), slices.expert_start, slices.expert_count)
      trajectories = [source[i] for i in range(len(source))]
      result = self.backend.summarize(trajectories, step=self.base)
      print(f"[experience] initialised {self.workspace_id!r} from {len(trajectories)} expert trajectories: "
            f"{len(result.memories)} memories", flush=True)
    elif self.init_from.startswith("taskset:"):
      from evolver import envs as envs_lib
      from evolver.tasks.taskset import ground_truth_trajectory, load_taskset
      records = [r for r in load_taskset(self.init_from.removeprefix("taskset:")) if r.spec.env in envs]
      made = {name: envs_lib.make(name) for name in {r.spec.env for r in records}}
      trajectories = [ground_truth_trajectory(r, made[r.spec.env]) for r in records]
      for env in made.values():
        env.close()
      result = self.backend.summarize(trajectories, step=self.base)
      print(f"[experience] initialised {self.workspace_id!r} from {len(trajectories)} synthetic tasks' ground "
            f"truths: {len(result.memories)} memories", flush=True)
    elif self.pool is None:  # the service reads the library from its own library directory
      count = self.backend.load_library(self.init_from)
      print(f"[experience] initialised {self.workspace_id!r} from the service's library {self.init_from}: {count} "
            "memories", flush=True)
    elif os.path.isfile(self.init_from):
      count = self.pool.workspace.import_jsonl(self.init_from)
      self.pool.reload()
      print(f"[experience] initialised {self.workspace_id!r} from {self.init_from}: {count} memories", flush=True)
    else:
      raise ValueError(f"init_from must be 'expert', 'taskset:PATH' or the path of a JSONL library, got "
                       f"{self.init_from!r} (no such file)")

  # -- the step's hooks --------------------------------------------------------------------------------------

  def transform_openings(self, step: int, openings: list[EpisodeOpening], *, validating: bool = False
                         ) -> list[OpeningChange | None]:
    mode = self.val_rollout_mode if validating else self.train_rollout_mode
    changes: list[OpeningChange | None] = [None] * len(openings)
    if mode == "woexp" or self.backend is None:
      return changes
    rng = np.random.default_rng([self.seed, step, int(validating)])
    chosen = [position for group in task_groups(openings)
              for position, add in zip(group, manager_lib.allocate_rollout_exp(len(group), mode, self.rollout_ratio,
                                                                               rng)) if add]
    queries = [manager_lib.task_query([m.to_dict() for m in openings[p].messages]) for p in chosen]
    hits = self.backend.retrieve(queries, self.retrieve_top_k) if queries else []
    for position, found in zip(chosen, hits):
      if not found:
        continue  # an empty or unrelated pool: the episode runs without experience
      memories, text, cut_tokens = self._within_budget([memory for memory, _ in found])
      if not validating:
        self._cut["cut_memories"] += len(found) - len(memories)
        self._cut["cut_tokens"] += cut_tokens
      if not memories:
        continue
      messages = list(openings[position].messages)
      messages[-1] = Message("user", manager_lib.inject_experience(messages[-1].content, text))
      changes[position] = OpeningChange(messages, {"experience": [m.memory_id for m in memories],
                                                   "experience_text": text})
    return changes

  def _within_budget(self, memories: list[Any]) -> tuple[list[Any], str, int]:
    """(the memories kept, their experience text, tokens cut): the best memories whose text fits
    `max_experience_tokens`; a first memory longer than the budget alone is cut to it (at a token boundary)."""
    text = manager_lib.format_experiences(memories)
    if self.max_experience_tokens is None:
      return memories, text, 0
    budget = self.max_experience_tokens
    full = self._tokens(text)
    kept = list(memories)
    while len(kept) > 1 and self._tokens(text) > budget:
      kept.pop()
      text = manager_lib.format_experiences(kept)
    tokens = self._tokens(text)
    if tokens > budget:
      ids = self.tokenizer.encode(text, add_special_tokens=False)[:budget]
      text = self.tokenizer.decode(ids)
      tokens = budget
    return kept, text, full - tokens

  def _tokens(self, text: str) -> int:
    return len(self.tokenizer.encode(text, add_special_tokens=False))

  def sample_modes(self, step: int, rollouts: Sequence[Rollout]) -> dict[int, str]:
    """{task group: "keep" | "discard"} for step `step`'s rollouts, by `train_sample_mode` (seeded per step)."""
    groups = sorted({r.group for r in rollouts})
    modes = manager_lib.allocate_train_modes(len(groups), self.train_sample_mode, self.train_sample_keepratio,
                                             np.random.default_rng([self.seed, step, 2]))
    return dict(zip(groups, modes))

  def training_rollouts(self, step: int, rollouts: list[Rollout], tokenizer: PreTrainedTokenizerBase
                        ) -> list[Rollout]:
    """Of the tasks whose mode is "discard", the samples' experience is stripped (exp_mask 1); "keep" trains with
    it. Other extensions' additions are left as they are."""
    mode_of = self.sample_modes(step, rollouts)
    trained = [self.strip_own(r, tokenizer) if mode_of[r.group] == "discard" else r for r in rollouts]
    self._trained_with = sum("experience" in r.added for r in trained)
    return trained

  def remove_added(self, messages: list[Message], added: Mapping[str, Any]) -> list[Message]:
    """The opening without the experience template (wherever other extensions put their additions)."""
    del added
    return [dataclasses.replace(m, content=manager_lib.strip_experience(m.content)[0]) if m.role == "user" else m
            for m in messages]

  def before_update(self, step: int, rollouts: Sequence[Rollout]) -> None:
    """Bumps the counters of the memories the step's scored training episodes ran with (module docstring), then
    submits the step's summary when it is due; both stamped with the store's step of this RL step."""
    stamp = self.base + step + 1
    writer = distributed.is_primary()  # (every process holds every rollout: one writes)
    scored = [r for r in rollouts if not r.failed]
    if self.backend is None or not writer:
      return
    given = [i for r in scored if not r.success for i in r.added.get("experience", [])]
    helped = [i for r in scored if r.success for i in r.added.get("experience", [])]
    if given:
      self.backend.record(given, update_utility=False, step=stamp)
    if helped:
      self.backend.record(helped, update_utility=True, step=stamp)
    if self.updated_freq and (step + 1) % self.updated_freq == 0:
      trajectories = [strip_added_messages(r) for r in scored]
      if self.blocking:
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(self._summarize(trajectories, stamp))
        self._pending.append(done)
      else:
        self._pending.append(self._executor.submit(self._summarize, trajectories, stamp))

  def after_step(self, step: int, rollouts: Sequence[Rollout]) -> dict[str, Any]:
    scored = [r for r in rollouts if not r.failed]
    with_exp = [r for r in scored if r.added.get("experience")]
    without = [r for r in scored if not r.added.get("experience")]
    retrieved = sorted(i for r in rollouts for i in r.added.get("experience", []))
    made_here = [m for m in (self.pool.workspace.get(sorted(set(retrieved))) if self.pool and retrieved else [])
                 if (m.metadata.get("committed_step") or 0) > self.base]
    row: dict[str, Any] = {
        "episodes_with": len(with_exp),
        "success_with": float(np.mean([r.success for r in with_exp])) if with_exp else float("nan"),
        "success_without": float(np.mean([r.success for r in without])) if without else float("nan"),
        "retrieved": len(retrieved),
        "retrieved_from_run": len(made_here),  # distinct memories this run committed (after its init)
        # Which memories the step retrieved: equal digests, equal retrievals (an unbroken vs a resumed run).
        "retrieved_digest": hashlib.blake2b(",".join(retrieved).encode(), digest_size=6).hexdigest(),
        "trained_with": self._trained_with,  # samples whose experience stayed in their training tokens
        **self._cut,
    }
    self._trained_with = 0
    self._cut = dict.fromkeys(self._cut, 0)
    self.step = step + 1
    row.update(self._wait())  # the summary `before_update` submitted: in the pool before the next step
    # Every host retrieves the next step's memories from the same pool: after process 0's summary is in.
    distributed.barrier(f"experience after step {step + 1}")
    row["pool_size"] = self.size
    if self.log_pool_digest and self.pool is not None:
      row["pool_digest"] = pool_digest(self.pool.workspace.all())
    return row

  def _summarize(self, trajectories: Sequence[Any], step: int) -> dict[str, Any]:
    """Summarizes and commits `trajectories` at the store's step `step`; returns the summary's metrics."""
    result = self.backend.summarize(trajectories, step=step)
    return {f"summary/{k}": v for k, v in result.stats.items()} | {"summary/committed": len(result.memories)}

  def _wait(self) -> dict[str, Any]:
    """Waits for the summaries in flight; returns the last one's stats."""
    stats: dict[str, Any] = {}
    for future in self._pending:
      stats = future.result()
    self._pending = []
    return stats

  # -- checkpoints -------------------------------------------------------------------------------------------

  def state_files(self) -> dict[str, bytes]:
    self._wait()  # the checkpoint of step t holds every summary of steps <= t
    if self.backend is None:
      return {}
    state = {"workspace_id": self.workspace_id, "step": self.step, "base": self.base, "size": self.size}
    files = {STATE_FILE: json.dumps(state).encode()}
    if self.pool is not None:
      files[SNAPSHOT_FILE] = self.pool.workspace.snapshot()
    return files

  def load_state_files(self, files: Mapping[str, bytes]) -> None:
    if self.pool is None:
      if STATE_FILE in files:
        print(f"[experience] resumed with the service at {self.service_url}: its pool is not rewound to the "
              "checkpoint's step (what the killed run committed after it stays)", flush=True)
      return
    step = json.loads(files[STATE_FILE])["step"] if STATE_FILE in files else 0
    if self.new_workspace and SNAPSHOT_FILE in files:
      self.pool.restore(files[SNAPSHOT_FILE])
      print(f"[experience] the store lacked workspace {self.workspace_id!r}: restored it as the checkpoint of step "
            f"{step} kept it ({self.size} memories)", flush=True)
    set_aside = self.pool.rewind(self.base + step)
    self.step = step
    if set_aside:
      print(f"[experience] resumed at step {step}: {set_aside} memories this run committed after it set aside",
            flush=True)

  def close(self) -> None:
    self._wait()
    self._executor.shutdown(wait=True)


def pool_digest(memories: Sequence[Any]) -> str:
  """A digest of memories' ids, contents, freq, utility and committed steps (not their timestamps), in id order:
  two pools with equal digests hold the same memories with the same counters."""
  rows = sorted((m.memory_id, m.when_to_use, m.content, m.metadata.get("freq"), m.metadata.get("utility"),
                 m.metadata.get("committed_step")) for m in memories)
  return hashlib.blake2b(json.dumps(rows).encode(), digest_size=8).hexdigest()


def strip_added_messages(rollout: Rollout) -> Rollout:
  """The rollout with what was added to its opening removed from its messages (what the summarizer reads)."""
  if rollout.base_opening is None:
    return rollout
  messages = list(rollout.base_opening) + list(rollout.messages[rollout.opening_len:])
  return dataclasses.replace(rollout, messages=messages)


@gin.configurable
def init_experience_pool(*, model_dir: str = gin.REQUIRED, envs: Sequence[str] = gin.REQUIRED,
                         seed: int = 0) -> dict[str, Any]:
  """The "Init Only" lifecycle: builds the pool `ExperienceManager` (gin) describes, from its `init_from`, and
  stops. Returns {"workspace_id", "size"}."""
  manager = ExperienceManager()
  if not manager.init_from:
    raise ValueError("init_experience_pool builds a pool from ExperienceManager.init_from: set it ('expert' or a "
                     "JSONL library)")
  manager.start(model_dir=model_dir, envs=envs, seed=seed)
  manager.close()
  print(f"[experience] {manager.workspace_id!r}: {manager.size} memories", flush=True)
  return {"workspace_id": manager.workspace_id, "size": manager.size}
