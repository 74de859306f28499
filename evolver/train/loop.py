"""The loop every training method shares, so that each algorithm file holds its algorithm only.

  trainer = Trainer(model_dir, model, optimizer, loss_fn)
  loop = Loop("bc", model_dir, trainer, tokenizer, envs=envs, val_indices=TaskSlices().val_indices)
  extras = loop.resume()                        # train state, state files and the algorithm's own extras
  data.set_state(extras["data"]) if "data" in extras else None
  loop.run(one_step, until=train_steps, extras=lambda: {"data": data.get_state()})
  results = loop.finish()                       # held-out `eval` figures of the policy selected on `val`

An algorithm gives `run` a function that takes one logged step (BC: one batch; GRPO: one RL step of several
updates) and returns its metrics row. The loop owns everything around it:
- the run's gin files (`config.gin` at the start, `operative_config.gin` once the first step has run) and its
  tokenizer (`MODEL_DIR/tokenizer/`, what evaluation and export read the run with);
- resume: the latest complete checkpoint's train state, the extras the algorithm saved with it, and the state
  files of every `StateOwner` (an experience workspace, a synthetic task set), restored together; metrics rows
  and best policies past the restored step are dropped (they are recomputed);
- per step: what XLA compiled during it, val included (`compile/*`, `evolver.runtime.CompileLog`, tagged
  "step N"), and the process's memory (`memory/*`); the `val` evaluation every `LoopConfig.eval_every` steps and at
  the end of every segment, keeping the best policy (`MODEL_DIR/best/`); the metrics row (JSONL + TensorBoard);
  the checkpoint every `TrainerConfig.checkpoint_every` steps and at the segment's end, with the algorithm's
  extras, the best val score and the owners' state files, atomically; the progress bar;
- the end: the held-out evaluation of the policy selected on `val` (the last one when the run has no `val`),
  written to `MODEL_DIR/eval_results.json`, logged and printed;
- preemption: SIGTERM during `run` lets the step in flight finish, then logs and checkpoints that step (off the
  cadences too), waits for the checkpoint to be complete and raises `Preempted`; running the same command again
  resumes from that step.

Everything the loop writes goes through the path layer (`evolver.paths`), so MODEL_DIR may be local or a URI
(`gs://...`); in a multi-host run process 0 alone writes the configs, metrics and eval results (the others compute
the same and skip the writes), and orbax coordinates the checkpoints.

A run may call `run` several times over consecutive segments of one monotonic step axis (AgentEvol's phases):
cadences count from each segment's `origin`.
"""

from __future__ import annotations

import dataclasses
import posixpath
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import gin
import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from evolver import distributed
from evolver import paths
from evolver import runtime
from evolver.models import sharding
from evolver.models.sampler import Sampler
from evolver.rollout import OpeningTransform, RolloutEngine
from evolver.train import checkpoints as ckpt_lib
from evolver.train import evaluation
from evolver.train.metrics import MetricsWriter
from evolver.train.trainer import Trainer

EVAL_RESULTS_FILE = "eval_results.json"
EVAL_SAMPLES_FILE = "eval_samples.json"  # the sampled held-out evaluation (LoopConfig.eval_samples)
# The last policy's held-out evaluations (LoopConfig.eval_last), beside the selected policy's.
EVAL_RESULTS_LAST_FILE = "eval_results_last.json"
EVAL_SAMPLES_LAST_FILE = "eval_samples_last.json"
VAL_SUBDIR = "val"  # MODEL_DIR/val/step_N.json: each val evaluation's episodes (per-task outcomes)


@gin.configurable
@dataclasses.dataclass(frozen=True)
class LoopConfig:
  """How every run validates and reports (gin: `LoopConfig.*`, stated once in gin_configs/base.gin).

  Attributes:
    eval_every: steps between `val` evaluations; `val` also runs at the end of every segment (0: only there).
    eval_tasks: held-out `eval` tasks per env evaluated at the end (0: no held-out report).
    eval_envs: the run's envs held out at the end (None: all of them), e.g. a BC run on four envs reported on the
      two a comparison's RL runs train on; val still covers every env.
    eval_max_new_tokens, eval_max_rounds, eval_batch_size: the greedy val and eval episodes' limits per turn,
      per episode (None: each env's own) and in flight at once.
    max_context_tokens: the most tokens an episode of the run's rollout engine may hold, val, eval and the
      algorithm's rollouts (its sampler's cache per row); None: the model's positions, at most
      `sampler.DEFAULT_MAX_LENGTH` (4,096). An episode that outgrows it ends, marked truncated.
    val_samples: episodes per val task: 1 is greedy; k > 1 samples k at `val_temperature` with the fixed seed
      `val_seed` (avg@k), the same tasks and sampling seeds at every evaluation, so two steps' val figures are
      paired and a change of one episode moves an env's figure by 1 / (tasks x k).
    val_temperature, val_seed: the sampled val's temperature and seed (val_samples > 1).
    val_start: also evaluate the starting policy on val before the first step, as a candidate (step 0): a run
      whose updates never beat its start reports its start.
    eval_samples: with eval_tasks, also a sampled held-out evaluation of the selected policy: eval_samples
      episodes per task at temperature 1 (seed 0), avg@k beside the greedy figure, written to
      `MODEL_DIR/eval_samples.json` (0: greedy only).
    eval_last: with eval_tasks, also the run's last policy held out alike (greedy, and sampled with eval_samples)
      into `MODEL_DIR/eval_results_last.json` (`eval_samples_last.json`), reported and never selected on: where
      val kept an earlier policy (the start, say), the selected policy's figures say nothing of what the updates
      did, and these do. When val selected the last policy they are the selected one's, not evaluated twice.
    start_eval: a directory with the starting policy's own held-out evaluations made with this run's settings
      (`eval_results.json`, and `eval_samples.json` with eval_samples; e.g. `launch.eval --hf_checkpoint START
      --num_samples K --with_greedy --out DIR`, which records the policy's `params_digest`): where val keeps the
      start (step 0), they are copied as the selected policy's (marked `reused_from`) instead of evaluated again,
      as every run from one start would repeat the same episodes. Read when the run is made (a file that is not
      an evaluation is refused) and used only where they match this run: the settings, the tasks, the envs'
      versions and the digest of this run's starting weights (else, or where a file is missing, a notice says
      what differs and the run evaluates as without it); nor where the held-out episodes get openings of their
      own (experience at eval). The context limit is not recorded: the user's to keep equal.
  """

  eval_every: int = 0
  eval_tasks: int = 0
  eval_envs: tuple[str, ...] | None = None
  eval_max_new_tokens: int = 96
  eval_max_rounds: int | None = None
  eval_batch_size: int = 64
  max_context_tokens: int | None = None
  val_samples: int = 1
  val_temperature: float = 1.0
  val_seed: int = 0
  val_start: bool = False
  eval_samples: int = 0
  eval_last: bool = False
  start_eval: str | None = None

  def __post_init__(self):
    if self.eval_every < 0 or self.eval_tasks < 0:
      raise ValueError(f"eval_every ({self.eval_every}) and eval_tasks ({self.eval_tasks}) must be >= 0")
    if self.val_samples < 1 or self.eval_samples < 0 or self.eval_samples == 1:
      raise ValueError(f"val_samples ({self.val_samples}) must be >= 1 and eval_samples ({self.eval_samples}) 0 "
                       "or >= 2 (a sampled avg@k beside the greedy figure)")
    if self.eval_envs is not None:
      object.__setattr__(self, "eval_envs", tuple(self.eval_envs))  # gin gives a list
      if not self.eval_envs:
        raise ValueError("eval_envs is empty: None holds out every env of the run")
    if self.val_samples > 1 and self.val_temperature <= 0:
      raise ValueError(f"sampled val (val_samples {self.val_samples}) needs val_temperature > 0")


class StateOwner(Protocol):
  """Something kept with every checkpoint beside the train state (an experience workspace, a task set).

  `state_files` is a snapshot taken when a checkpoint starts (the checkpoint writes it later, asynchronously);
  `load_state_files` gets the files of the checkpoint a run resumes from ({} for a fresh run).
  """

  name: str

  def state_files(self) -> dict[str, bytes]:
    ...

  def load_state_files(self, files: Mapping[str, bytes]) -> None:
    ...


class Preempted(Exception):
  """The run stopped on SIGTERM after checkpointing `step`; running it again resumes there."""

  def __init__(self, name: str, step: int):
    super().__init__(f"[{name}] preempted (SIGTERM): checkpoint of step {step} saved; run the same command again "
                     "to resume from it")
    self.step = step


def write_gin_config(model_dir: paths.PathLike, name: str = "config.gin", operative: bool = False) -> str:
  """Writes gin's config (every binding) or its operative config (what the run used) into the run directory
  (`evolver.paths.write_text`: atomic, process 0 alone). Returns the file's path."""
  text = gin.operative_config_str() if operative else gin.config_str()
  return str(paths.write_text(paths.as_path(model_dir) / name, text))


class Loop:
  """One run's bookkeeping around an algorithm's steps (module docstring)."""

  def __init__(self, name: str, model_dir: paths.PathLike, trainer: Trainer, tokenizer: PreTrainedTokenizerBase, *,
               envs: Sequence[str], val_indices: Sequence[int] = (), config: LoopConfig | None = None,
               updates_per_step: int = 1, state_owners: Sequence[StateOwner] = ()):
    """
    Args:
      name: the method, for messages and the progress bar.
      model_dir: the run directory (local or a URI, `evolver.paths`).
      trainer: owns the train state and its checkpoints.
      tokenizer: the policy's.
      envs: the envs that val and the held-out report run on.
      val_indices: the `val` task indices of every env (a slice of `train`); empty: no val, the last policy is
        the one reported.
      config: default `LoopConfig()` (from gin).
      updates_per_step: optimizer updates per logged step (GRPO: epochs x minibatches).
      state_owners: kept with every checkpoint (`StateOwner`); names must be distinct.
    """
    names = [owner.name for owner in state_owners]
    if len(set(names)) != len(names):
      raise ValueError(f"state owners need distinct names, got {names}")
    for owner_name in names:
      ckpt_lib.check_state_file_name(owner_name, "owner")
    self.name = name
    self.model_dir = paths.as_path(model_dir)
    self.trainer = trainer
    self.tokenizer = tokenizer
    self.envs = list(envs)
    self.val_indices = list(val_indices)
    self.config = config or LoopConfig()
    unknown = sorted(set(self.config.eval_envs or ()) - set(self.envs))
    if unknown:
      raise ValueError(f"LoopConfig.eval_envs names {unknown}, not envs of this run ({self.envs})")
    self.updates_per_step = updates_per_step
    self.state_owners = list(state_owners)
    self.best_val: float | None = None
    self.writer: MetricsWriter | None = None
    # Openings of the val and held-out episodes at a step (e.g. experience under `val_rollout_mode`), or None.
    self.eval_openings: Callable[[int], OpeningTransform | None] | None = None
    self._engine: RolloutEngine | None = None
    self._wrote_operative = False
    self._sigterm = False
    self.start_evaluations = (self._load_start_evaluations()
                              if self.config.start_eval and self.config.eval_tasks else None)
    write_gin_config(self.model_dir)
    ckpt_lib.save_run_tokenizer(self.model_dir, tokenizer)

  def _held_out_envs(self) -> list[str]:
    return [env for env in self.envs if self.config.eval_envs is None or env in self.config.eval_envs]

  def _held_out_settings(self, sampled: bool) -> dict[str, Any]:
    """The episode settings (`evaluation.EPISODE_SETTINGS`) of the held-out evaluations `finish` runs."""
    config = self.config
    samples = dict(num_samples=config.eval_samples, temperature=1.0, seed=0) if sampled else dict(
        num_samples=1, temperature=0.0, seed=0)
    return dict(split="eval", top_p=1.0, max_new_tokens=config.eval_max_new_tokens,
                max_rounds=config.eval_max_rounds, **samples)

  def _load_start_evaluations(self) -> dict[str, dict[str, Any]] | None:
    """`LoopConfig.start_eval`'s records ({"greedy": ..., ["sampled": ...]}) where they hold this run's start (the
    trainer's parameters before any update) held out with this run's settings; else None, after a notice naming
    what differs (or that a file is missing). Raises ValueError where a file is not an evaluation."""
    directory = paths.as_path(self.config.start_eval)
    envs = self._held_out_envs()
    versions = evaluation.env_versions(envs)
    digest = evaluation.params_digest(self._local_policy_params())
    files = {"greedy": EVAL_RESULTS_FILE, **({"sampled": EVAL_SAMPLES_FILE} if self.config.eval_samples else {})}
    records = {}
    for kind, file in files.items():
      if not (directory / file).exists():  # e.g. a shared recipe's binding, run from another working directory
        problem = "no such file"
      else:
        records[kind] = evaluation.load_eval_results(directory / file)
        problem = evaluation.reuse_problem(records[kind], envs=envs, num_tasks=self.config.eval_tasks,
                                           versions=versions, digest=digest,
                                           **self._held_out_settings(kind == "sampled"))
      if problem:
        print(f"[{self.name}] LoopConfig.start_eval: {directory / file} is not this run's start held out as this "
              f"run holds out ({problem}): the run evaluates its start itself if val keeps it", flush=True)
        return None
    return records

  def _reused_start(self, policy_step: int, kind: str) -> dict[str, Any] | None:
    """`LoopConfig.start_eval`'s `kind` record ("greedy" or "sampled") where it stands for the selected policy
    (the start, update step 0, and no openings of the held-out episodes' own), else None."""
    if self.start_evaluations is None or policy_step != 0 or kind not in self.start_evaluations:
      return None
    if self.eval_openings is not None and self.eval_openings(self.step) is not None:
      return None  # e.g. experience at eval: the start's record was played without it
    results = dict(self.start_evaluations[kind])
    # As configured (a records path relative to the run's working directory stays so in the results).
    results["reused_from"] = posixpath.join(self.config.start_eval,
                                            EVAL_RESULTS_FILE if kind == "greedy" else EVAL_SAMPLES_FILE)
    return results

  # -- state -------------------------------------------------------------------------------------------------

  @property
  def step(self) -> int:
    """The logged step: the trainer's update step / updates_per_step."""
    return self.trainer.step // self.updates_per_step

  @property
  def engine(self) -> RolloutEngine:
    """The run's rollout engine (one Sampler for every evaluation and the algorithm's rollouts, so compiled
    programs are reused). Its weights are whatever was put in last: call `sync_policy` first."""
    if self._engine is None:
      policy = nnx.merge(self.trainer.graphdef, self._local_policy_params())
      self._engine = RolloutEngine(Sampler(policy, max_length=self.config.max_context_tokens), self.tokenizer)
    return self._engine

  def sync_policy(self, params: nnx.State | None = None) -> RolloutEngine:
    """Puts the trainer's current weights (or `params`) into the engine's sampler, as a copy in
    `ModelConfig.param_dtype` (`Trainer.policy_params`; in a multi-process run, a whole copy on this process's
    devices, `distributed.local_copy`: each host samples its own episodes); returns the engine."""
    engine = self.engine
    engine.sampler.update_params(self._local_policy_params(params))
    return engine

  def _local_policy_params(self, params: nnx.State | None = None) -> nnx.State:
    return distributed.local_copy(self.trainer.policy_params(params), sharding.local_mesh())

  def resume(self) -> dict[str, Any]:
    """Restores the latest complete checkpoint (if any) with the state owners' files, and opens the metrics.

    Returns:
      The extras the algorithm saved with that checkpoint ({} for a fresh run).
    """
    restored = self.trainer.restore_latest()
    extras, files = restored if restored is not None else ({}, {})
    unknown = sorted(set(files) - {owner.name for owner in self.state_owners})
    if unknown:
      raise ValueError(f"the checkpoint at step {self.trainer.step} keeps state of {unknown}, which this run does "
                       "not have: configure the same extensions, or use a new MODEL_DIR")
    for owner in self.state_owners:
      owner.load_state_files(files.get(owner.name, {}))
    self.best_val = extras.get("best_val")
    self.writer = MetricsWriter(self.model_dir, resume_step=self.step if restored is not None else None)
    if self.step:
      print(f"[{self.name}] resuming at step {self.step}", flush=True)
    return {k: v for k, v in extras.items() if k not in ("best_val", "model_config")}

  def save(self, extras: Mapping[str, Any], *, force: bool = False) -> None:
    """Starts a checkpoint of the train state with the algorithm's `extras`, the best val score and the state
    owners' files; the metrics rows logged so far are flushed first (a resumed run keeps those up to its step)."""
    if self.writer is not None:
      self.writer.flush()
    files = {owner.name: owner.state_files() for owner in self.state_owners}
    self.trainer.save(dict(extras, best_val=self.best_val), state_files={k: v for k, v in files.items() if v},
                      force=force)

  # -- the loop ----------------------------------------------------------------------------------------------

  def run(self, step_fn: Callable[[], dict[str, Any]], *, until: int, origin: int = 0, first: int | None = None,
          extras: Callable[[], Mapping[str, Any]] = dict, first_row: Mapping[str, Any] | None = None,
          at_end: Callable[[dict[str, Any] | None], None] | None = None, postfix: str = "loss",
          desc: str | None = None) -> None:
    """Runs `step_fn` until the logged step reaches `until`, with val, metrics and checkpoints around it.

    SIGTERM (a preemption notice) while it runs lets the step in flight finish (its val included), then logs and
    checkpoints that step whatever the cadences say, closes the loop (the checkpoint complete, the metrics
    flushed) and raises `Preempted`; in a multi-host run a signal to any process stops all of them after the same
    step. The handler is installed for the call and the previous one restored after it (from the main thread
    only: Python delivers signals there; a loop run from another thread keeps the process's own handling).

    Args:
      step_fn: one logged step of the algorithm (its updates advance the trainer); returns the step's metrics.
      until: the last step of this segment.
      origin: the step cadences count from (AgentEvol: the phase's start); `(step - origin) % every == 0`.
      first: this segment's first step (default origin + 1): its row gets `first_row` and is always logged.
      extras: the algorithm's checkpoint extras (data-iterator positions, ...), called at each checkpoint.
      at_end: called at the segment's last step, after its val and before its checkpoint, with the val
        results (None without val): what the algorithm records there goes into that checkpoint.
      postfix: the row key shown on the progress bar.

    Raises:
      Preempted: after SIGTERM, once the step it interrupted is checkpointed.
    """
    if self.writer is None:
      raise RuntimeError("call Loop.resume() before Loop.run()")
    first = origin + 1 if first is None else first
    every_checkpoint, every_log = self.trainer.config.checkpoint_every, self.trainer.config.log_every
    bar = tqdm(total=until - first + 1, initial=max(self.step - first + 1, 0), desc=desc or self.name, unit="step",
               dynamic_ncols=True)
    restore_handler = self._note_sigterm()
    try:
      compiles = runtime.compile_log()
      if self.config.val_start and self.val_indices and self.step == origin == 0 and self.step < until:
        compiles.tag, mark = "start", compiles.mark()
        results = self.validate()  # the starting policy, a candidate at step 0
        self.writer.write(0, {**evaluation.flatten_metrics(results, "val"), "time/val_s": results["seconds"],
                              "val/best_success": self.best_val, **step_resources(compiles.since(mark))})
      while self.step < until:
        compiles.tag, mark = f"step {self.step + 1}", compiles.mark()
        row = dict(step_fn())
        step, local = self.step, self.step - origin
        if not self._wrote_operative:  # gin's operative config knows what the first step used
          write_gin_config(self.model_dir, "operative_config.gin", operative=True)
          self._wrote_operative = True
        if step == first and first_row:
          row.update(first_row)
        at_segment_end = step == until
        results = None
        if self.val_indices and (at_segment_end or (self.config.eval_every and local % self.config.eval_every == 0)):
          results = self.validate()
          row.update(evaluation.flatten_metrics(results, "val"), **{"time/val_s": results["seconds"]})
          row["val/best_success"] = self.best_val
        if at_segment_end and at_end is not None:
          at_end(results)
        runtime.return_free_memory()  # what the step's compilations and batches freed (the row's rss follows it)
        row.update(step_resources(compiles.since(mark)))
        # Read once, and agreed by every process (a signal to one host stops all at the same step): this step is
        # then logged, checkpointed and the last.
        stopping = any(distributed.allgather_objects(self._sigterm))
        if stopping or step == first or at_segment_end or results is not None or local % every_log == 0:
          self.writer.write(step, row)
        if stopping or at_segment_end or local % every_checkpoint == 0:
          self.save(extras(), force=stopping)
        bar.update(1)
        if isinstance(row.get(postfix), (int, float)):
          bar.set_postfix({postfix: f"{row[postfix]:.3f}"})
        if stopping:
          self.close()  # waits for the checkpoint; flushes and closes the metrics
          raise Preempted(self.name, step)
    finally:
      bar.close()
      restore_handler()
      self.trainer.checkpointer.wait()

  def _note_sigterm(self) -> Callable[[], None]:
    """Installs a SIGTERM handler that only notes the signal (`run`); returns what restores the previous one. From
    the main thread only (Python delivers signals there): elsewhere nothing is installed."""
    self._sigterm = False
    if threading.current_thread() is not threading.main_thread():
      return lambda: None

    def note(signum, frame):
      del signum, frame
      self._sigterm = True

    previous = signal.signal(signal.SIGTERM, note)
    if previous is None:  # a handler installed outside Python cannot be put back: the default, then
      previous = signal.SIG_DFL
    return lambda: signal.signal(signal.SIGTERM, previous)

  def validate(self) -> dict[str, Any]:
    """The `val` episodes of the current weights (greedy, or `LoopConfig.val_samples` sampled at fixed seeds);
    keeps the policy when it is the best so far (ties keep the earlier one). Each evaluation's episodes are
    written to `MODEL_DIR/val/step_N.json` (N: the logged step; 0 is the start)."""
    config = self.config
    sampled = dict(num_samples=config.val_samples, temperature=config.val_temperature,
                   seed=config.val_seed) if config.val_samples > 1 else {}
    results = self.evaluate(split="train", indices=self.val_indices, **sampled)
    paths.write_json(self.model_dir / VAL_SUBDIR / f"step_{self.step}.json",
                     {"step": self.step, "num_samples": results["num_samples"],
                      "temperature": results["temperature"], "seed": results["seed"],
                      "episodes": results.pop("episodes")})
    score = results["overall"]["success"]
    if self.best_val is None or score > self.best_val:
      self.best_val = score
      self.trainer.save_best(score, {"step": self.step})
    return results

  def evaluate(self, params: nnx.State | None = None, **kwargs: Any) -> dict[str, Any]:
    """`evaluation.evaluate` of the current weights (or `params`) on the run's envs with the loop's limits, with a
    progress bar ("val" or "held-out", greedy or avg@k)."""
    config = self.config
    kwargs = dict(dict(max_new_tokens=config.eval_max_new_tokens, max_rounds=config.eval_max_rounds,
                       batch_size=config.eval_batch_size), **kwargs)
    if self.eval_openings is not None:
      kwargs.setdefault("transform_openings", self.eval_openings(self.step))
    samples = kwargs.get("num_samples", 1)
    kwargs.setdefault("progress", f"{'val' if kwargs.get('split') == 'train' else 'held-out'}, "
                                  f"{f'avg@{samples}' if samples > 1 else 'greedy'}")
    envs = self._held_out_envs() if kwargs.get("split") == "eval" else self.envs
    return evaluation.evaluate(self.sync_policy(params), self.tokenizer, envs, **kwargs)

  # -- the end -----------------------------------------------------------------------------------------------

  def selected_policy(self) -> tuple[int, str]:
    """(step, "val" | "last step"): the policy the run reports, in the trainer's update steps."""
    best = self.trainer.best_step()
    return (best, "val") if best is not None else (self.trainer.step, "last step")

  def restore_params(self, model_dir: paths.PathLike, step: int, *,
                     subdir: str = ckpt_lib.BEST_SUBDIR) -> nnx.State:
    """The policy kept at `step` in `model_dir/subdir`, placed like the trainer's parameters."""
    checkpointer = ckpt_lib.Checkpointer(model_dir, async_save=False, subdir=subdir)
    try:
      return checkpointer.restore_params(step, ckpt_lib.abstract_of(self.trainer.state.params))
    finally:
      checkpointer.close()

  def finish(self, extra_results: Mapping[str, Any] | None = None,
             reuse: Mapping[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The held-out report and the end of the run: evaluates the selected policy on the first
    `LoopConfig.eval_tasks` tasks of each env's `eval` split, writes `MODEL_DIR/eval_results.json` (with
    `extra_results` merged in), logs it as a metrics row and prints the table. Closes the run.

    Args:
      reuse: held-out results already computed with the same settings, by policy step (not recomputed).

    Returns:
      The results ({} when `eval_tasks` is 0).
    """
    self.trainer.checkpointer.wait()
    results: dict[str, Any] = {}
    try:
      if self.config.eval_tasks:
        policy_step, selected_on = self.selected_policy()
        start_greedy, start_samples = self._reused_start(policy_step, "greedy"), self._reused_start(policy_step,
                                                                                                     "sampled")
        reused = start_greedy is not None or bool(reuse and policy_step in reuse)
        params = None
        if not reused or (self.config.eval_samples and start_samples is None):
          params = (self.restore_params(self.model_dir, policy_step) if selected_on == "val"
                    else self.trainer.state.params)
        if start_greedy is not None:
          results = start_greedy
        elif reused:
          results = dict(reuse[policy_step])
        else:
          results = self.evaluate(params, split="eval", num_tasks=self.config.eval_tasks)
        results.update(policy_step=policy_step // self.updates_per_step, selected_on=selected_on,
                       **(extra_results or {}))
        row = evaluation.flatten_metrics(results, "eval")
        if self.config.eval_samples:
          samples = start_samples if start_samples is not None else self.evaluate(
              params, split="eval", num_tasks=self.config.eval_tasks, num_samples=self.config.eval_samples,
              temperature=1.0, seed=0)
          samples.update(policy_step=results["policy_step"], selected_on=selected_on)
          evaluation.write_eval_results(self.model_dir / EVAL_SAMPLES_FILE, samples)
          row.update(evaluation.flatten_metrics(samples, "eval_sampled"))
        evaluation.write_eval_results(self.model_dir / EVAL_RESULTS_FILE, results)
        last = (self.evaluate_last(policy_step, results, samples if self.config.eval_samples else None, reuse)
                if self.config.eval_last else [])
        for kind, last_results in zip(("eval_last", "eval_last_sampled"), last):
          row.update(evaluation.flatten_metrics(last_results, kind))
        self.writer.write(self.step, row)
        print(f"\nheld-out {results['split']} split: the policy of step {results['policy_step']} (selected on "
              f"{results['selected_on']})")
        for record in (results, samples if self.config.eval_samples else {}):
          if "reused_from" in record:
            print(f"(the start's own evaluation, reused from {record['reused_from']}: LoopConfig.start_eval)")
        evaluation.print_table(results)
        if self.config.eval_samples:
          evaluation.print_table(samples)
        if last:
          print(f"\nheld-out {results['split']} split: the last policy, of step {last[0]['policy_step']} "
                "(reported, not selected)")
          for last_results in last:
            evaluation.print_table(last_results)
    finally:
      self.close()
    return results

  def evaluate_last(self, selected_step: int, selected: Mapping[str, Any],
                    selected_samples: Mapping[str, Any] | None,
                    reuse: Mapping[int, dict[str, Any]] | None) -> list[dict[str, Any]]:
    """`LoopConfig.eval_last`: the last policy (the trainer's parameters now) held out as the selected one was
    (`selected_step`, in update steps; `selected_samples` None where there is no sampled evaluation), written to
    EVAL_RESULTS_LAST_FILE (and EVAL_SAMPLES_LAST_FILE). Returns [greedy] or [greedy, sampled]. Where the selected
    policy is the last one its results are copied, not recomputed."""
    last_step = self.trainer.step
    params = self.trainer.state.params
    if selected_step == last_step:
      greedy = dict(selected)
      sampled = dict(selected_samples) if selected_samples is not None else None
    else:
      greedy = (dict(reuse[last_step]) if reuse and last_step in reuse
                else self.evaluate(params, split="eval", num_tasks=self.config.eval_tasks))
      sampled = (self.evaluate(params, split="eval", num_tasks=self.config.eval_tasks,
                               num_samples=self.config.eval_samples, temperature=1.0, seed=0)
                 if selected_samples is not None else None)
    out = []
    for results, file in ((greedy, EVAL_RESULTS_LAST_FILE), (sampled, EVAL_SAMPLES_LAST_FILE)):
      if results is not None:
        results.update(policy_step=last_step // self.updates_per_step, selected_on="last step (eval_last)")
        evaluation.write_eval_results(self.model_dir / file, results)
        out.append(results)
    return out

  def close(self) -> None:
    if self._engine is not None:
      self._engine.close()
      self._engine = None
    if self.writer is not None:
      self.writer.close()
      self.writer = None
    self.trainer.close()


def step_resources(compiles: Sequence[runtime.CompileEvent]) -> dict[str, float]:
  """A step's XLA compilations (`compile/compiles`, `compile/compile_s`, `compile/cache_hits`, `compile/trace_s`;
  `evolver.runtime.CompileLog`) and the process's memory (`memory/rss_gb` now, `memory/peak_rss_gb`)."""
  summary = runtime.CompileLog.summary(compiles)
  row = {f"compile/{k}": summary[k] for k in ("compiles", "compile_s", "cache_hits", "trace_s")}
  rss = runtime.resident_gb()
  if rss is not None:
    row["memory/rss_gb"] = rss
  row["memory/peak_rss_gb"] = runtime.peak_resident_gb()
  return row


def scalar_metrics(metrics: Mapping[str, Any]) -> dict[str, float]:
  """A train step's metrics (device arrays) as Python floats, for a metrics row."""
  return {k: float(v) for k, v in jax.device_get(dict(metrics)).items() if np.ndim(v) == 0}


def mean_metrics(updates: Sequence[Mapping[str, Any]]) -> dict[str, float]:
  """Several train steps' metrics as one row: counts (`num_*`) summed, everything else averaged over the steps
  (an RL step's updates: its last minibatch alone can be all zero-advantage groups, a loss of exactly 0)."""
  rows = [scalar_metrics(m) for m in updates]
  return {k: float(np.sum([r[k] for r in rows]) if k.startswith("num_") else np.mean([r[k] for r in rows]))
          for k in rows[0]} if rows else {}
