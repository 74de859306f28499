"""Rollout benchmark: episodes/s of evolver's rollout engine against an AgentGym-style controller.

  python -m launch.benchmark --suite rollout [--repeats 3] [--episodes_per_env 2] [--max_rounds 4] \
      [--max_new_tokens 48]
  python -m launch.benchmark --suite rollout --max_rounds 20 --max_new_tokens 96   # an RL step's limits

The policy is the tiny default (`gin_configs/models/tiny.gin`, random weights from a fixed seed, or
`--checkpoint` for a trained one), written once with `evolver.models.save_hf` plus the shipped tokenizer, so
both sides read the very same weights. Tasks: `--episodes_per_env` `eval` tasks of every built-in env, one
episode each, greedy, the same `max_rounds` and `max_new_tokens` per turn on both sides.

- ours: `RolloutEngine` with every episode in one batch, the KV cache kept across turns (`reuse_cache=True`),
  and again with the whole history re-prefilled every turn (`reuse_cache=False`, JSON `speedup_self`).
- peer: what AgentGym's `BaseTask` controller does, written here (it is not project code): transformers'
  PyTorch model (`AutoModelForCausalLM`) and `generate` with its KV cache, ONE episode at a time; every turn
  renders the whole conversation with the chat template, tokenizes it, generates up to `max_new_tokens` with
  the end-of-turn token as EOS, decodes, steps the env and appends the observation.

Each side runs in its own process per thread setting (JAX: all cores or 1 core; torch: 1 and 2 threads) and
reports at its best one (a later torch setting whose warm-up run alone takes 3x the best median is not
repeated: on a loaded 2-core machine two torch threads ran up to 30x slower than one). A run of the whole task list is timed: the first run is a warm-up (JAX compiles one
program per batch and cache bucket there), then the median of `--repeats`. Both sides run the same task list,
so episodes/s compare directly; turns and tokens generated per side are printed, and the greedy texts are
compared turn by turn (float differences and the peer's re-tokenization of decoded text can make them
diverge, so an agreement rate is reported rather than asserted). An extra run splits our time into prefill,
decode, row selection, host work inside `generate`, env steps and templating (the sampler's own
accounting, `SamplerStats`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence

from launch.benchmarks import common

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY_GIN = os.path.join(ROOT, "gin_configs", "models", "tiny.gin")
MODES = ("cached", "reprefill")
# A later torch thread setting whose warm-up run alone exceeds this many times the best median so far
# cannot win; its repeats are skipped.
GIVE_UP_FACTOR = 3.0
# The sampler's jitted pieces (`_extend`, `_extend_rows`: the leading pieces of a long prefill; `_gather_rows`,
# `_scatter_rows`: decode batches compacted within a call; `_begin`, `_decode_slots`, `_reset_rows`: continuous
# batching), whose compiled programs the suite counts.
_JITTED = ("_prefill", "_extend", "_extend_rows", "_decode", "_select", "_gather_rows", "_scatter_rows", "_begin",
           "_decode_slots", "_reset_rows")
_MODE_NAMES = {"cached": "cache kept across turns", "reprefill": "history re-prefilled every turn"}


@dataclasses.dataclass(frozen=True)
class Workload:
  """What both sides run: (env, index) tasks of `split`, greedy, `max_rounds` turns of `max_new_tokens`."""

  tasks: tuple[tuple[str, int], ...]
  max_rounds: int = 4
  max_new_tokens: int = 48
  split: str = "eval"

  def to_json(self) -> str:
    return json.dumps(dataclasses.asdict(self))

  @classmethod
  def from_json(cls, text: str) -> "Workload":
    d = json.loads(text)
    return cls(tasks=tuple((e, int(i)) for e, i in d["tasks"]), max_rounds=d["max_rounds"],
               max_new_tokens=d["max_new_tokens"], split=d["split"])


def make_workload(env_names: Sequence[str] | None = None, episodes_per_env: int = 2, max_rounds: int = 4,
                  max_new_tokens: int = 48) -> Workload:
  """`episodes_per_env` eval tasks (indices 0, 1, ...) of each env (default: all built-in envs)."""
  from evolver import envs
  names = list(env_names) if env_names else envs.names()
  tasks = tuple((name, index) for name in names for index in range(episodes_per_env))
  return Workload(tasks=tasks, max_rounds=max_rounds, max_new_tokens=max_new_tokens)


# ----------------------------------------------------------------------------------------------------------
# The shared checkpoint.
# ----------------------------------------------------------------------------------------------------------


def tiny_default_config():
  """`ModelConfig` of the tiny default, read from tiny.gin without touching gin's global state."""
  from evolver import models
  values = {}
  with open(TINY_GIN) as f:
    for line in f:
      m = re.match(r"\s*ModelConfig\.(\w+)\s*=\s*(.+?)\s*(#.*)?$", line)
      if m:
        values[m.group(1)] = ast.literal_eval(m.group(2))
  return models.ModelConfig(**values)


def make_checkpoint(path: str, seed: int = 0) -> str:
  """Writes the tiny default with random weights from `seed` and the shipped tokenizer to `path`."""
  from evolver import models
  from evolver.models.tokenizer import load_tokenizer
  model = models.make_model(tiny_default_config(), seed=seed)
  models.save_hf(model, path)
  load_tokenizer().save_pretrained(path)
  return path


# ----------------------------------------------------------------------------------------------------------
# Ours: the rollout engine (a worker process per thread setting).
# ----------------------------------------------------------------------------------------------------------


def _episodes_from_engine(batch) -> list[dict]:
  return [{"task": [t.env, t.task_index], "turns": t.turns,
           "tokens": int(sum(b - a for a, b in t.turn_spans)),
           "texts": [m.content for m in t.messages[3:] if m.role == "assistant"],
           "finish": t.finish_reason, "error": t.error} for t in batch.trajectories]


def _profile_engine(engine, tasks, config) -> dict:
  """One extra run, read through the sampler's own accounting (`SamplerStats`, in `RolloutStats`): where the time
  goes. Compilation is apart (`compile_s`); the warm-up run compiled this workload's programs already."""
  before = dataclasses.replace(engine.sampler.stats)
  batch = engine.run(tasks, config)
  work = engine.sampler.stats.minus(before)
  s = batch.stats
  inside = s.prefill_s + s.decode_s + s.select_s + s.compile_s
  return {
      "total_s": s.total_s,
      "prefill_s": s.prefill_s,
      "decode_s": s.decode_s,
      "select_s": s.select_s,
      "compile_s": s.compile_s,
      "generate_host_s": s.generate_s - inside,
      "env_s": s.env_s,
      "template_s": s.template_s,
      "other_s": s.total_s - s.generate_s - s.env_s - s.template_s,
      "generate_calls": s.generate_calls,
      "decode_calls": work.decode_calls,
      "decode_steps": s.decode_steps,
      "decode_rows_mean": s.decode_row_steps / max(s.decode_steps, 1),
      "idle_row_fraction": s.idle_row_fraction,
      "prefill_tokens": s.prefill_tokens,
      "prefill_slots": work.prefill_slots,
      "sampled_tokens": s.sampled_tokens,
      "rows_generated": s.rows_generated,
      "select_calls": s.select_calls,
  }


def measure_ours(checkpoint: str, workload: Workload, repeats: int, modes: Sequence[str] = MODES,
                 profile: bool = True) -> dict:
  """Episodes of the whole task list through one RolloutEngine (all in one batch), per mode."""
  from evolver import models
  from evolver.models.sampler import Sampler
  from evolver.models.tokenizer import load_tokenizer
  from evolver.rollout import RolloutConfig, RolloutEngine, Task
  model = models.load_hf(checkpoint)
  tokenizer = load_tokenizer(checkpoint)
  tasks = [Task(env, index, workload.split) for env, index in workload.tasks]
  out = {}
  with RolloutEngine(Sampler(model), tokenizer) as engine:
    for mode in modes:
      config = RolloutConfig(max_new_tokens=workload.max_new_tokens, temperature=0.0,
                             max_rounds=workload.max_rounds, batch_size=len(tasks),
                             reuse_cache=mode == "cached")
      start = time.perf_counter()
      first = engine.run(tasks, config)  # warm-up: compiles every batch x cache bucket this workload meets
      first_s = time.perf_counter() - start
      seconds, times = common.median_time(lambda: engine.run(tasks, config), warmup=0, repeats=repeats)
      episodes = _episodes_from_engine(first)
      out[mode] = {"seconds": seconds, "times": times, "first_s": first_s, "episodes": episodes,
                   "failed": sum(e["error"] is not None for e in episodes)}
      if profile:
        out[mode]["profile"] = _profile_engine(engine, tasks, config)
    sampler = engine.sampler
    out["compiled_programs"] = {name: getattr(sampler, name)._cache_size() for name in _JITTED
                                if hasattr(sampler, name)}
  return out


# ----------------------------------------------------------------------------------------------------------
# The peer: an AgentGym-style controller on transformers (a worker process per thread setting).
# ----------------------------------------------------------------------------------------------------------


class AgentGymController:
  """AgentGym's `BaseTask` loop: one episode at a time, the whole history re-encoded for every turn.

  Per turn: render the conversation with the chat template, tokenize it, `model.generate` (KV cache within
  the call, greedy, up to `max_new_tokens`, the end-of-turn token as EOS), decode the new tokens, `env.step`,
  append the observation. The conversation opens as AgentGym's (and the engine's): instruction, "Ok.", first
  observation. One env per name, reset per episode (AgentGym keeps one env client per task type).
  """

  def __init__(self, model, tokenizer, max_new_tokens: int, max_rounds: int):
    from evolver.data.chat import end_of_turn_ids
    self.model = model
    self.tokenizer = tokenizer
    self.max_new_tokens = max_new_tokens
    self.max_rounds = max_rounds
    self.stop_ids = list(end_of_turn_ids(tokenizer))
    self.envs = {}
    self.timers = {"template_s": 0.0, "generate_s": 0.0, "env_s": 0.0}
    self.inputs = None  # a list to record every turn's input ids in (for profiling), or None

  def _env(self, name: str):
    from evolver import envs
    if name not in self.envs:
      self.envs[name] = envs.make(name)
    return self.envs[name]

  def episode(self, env_name: str, index: int, split: str) -> dict:
    import torch
    from evolver.data.chat import render_chat
    tok, timers = self.tokenizer, self.timers
    env = self._env(env_name)
    t0 = time.perf_counter()
    messages = [{"role": "user", "content": env.instruction()}, {"role": "assistant", "content": "Ok."},
                {"role": "user", "content": env.reset(index, split)}]
    timers["env_s"] += time.perf_counter() - t0
    max_rounds = min(self.max_rounds, env.max_rounds)
    texts, tokens, finish = [], 0, "max_rounds"
    for _ in range(max_rounds):
      t0 = time.perf_counter()
      text = render_chat(tok, messages, add_generation_prompt=True)
      ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"]])
      if self.inputs is not None:
        self.inputs.append(ids)
      t1 = time.perf_counter()
      with torch.inference_mode():
        out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=self.max_new_tokens,
                                  do_sample=False, use_cache=True, eos_token_id=self.stop_ids,
                                  pad_token_id=tok.pad_token_id)
      t2 = time.perf_counter()
      new = out[0, ids.shape[1]:].tolist()
      content = new[:-1] if new and new[-1] in self.stop_ids else new
      reply = tok.decode(content, skip_special_tokens=False, clean_up_tokenization_spaces=False)
      t3 = time.perf_counter()
      observation, _, done, _ = env.step(reply)
      t4 = time.perf_counter()
      timers["template_s"] += (t1 - t0) + (t3 - t2)
      timers["generate_s"] += t2 - t1
      timers["env_s"] += t4 - t3
      messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": observation}]
      texts.append(reply)
      tokens += len(new)
      if done:
        finish = "done"
        break
    return {"task": [env_name, index], "turns": len(texts), "tokens": tokens, "texts": texts, "finish": finish,
            "error": None}

  def run(self, workload: Workload) -> list[dict]:
    return [self.episode(env, index, workload.split) for env, index in workload.tasks]


def measure_peer(checkpoint: str, workload: Workload, repeats: int, threads: int,
                 give_up_s: float | None = None) -> dict:
  """The AgentGym-style controller over the task list at `threads` torch threads. When the warm-up run
  alone takes longer than `give_up_s` (a setting that cannot be the best: two threads on a loaded 2-core
  machine ran ~10x slower than one), the repeats are skipped and the row is marked `abandoned`."""
  import torch
  import transformers
  from evolver.models.tokenizer import load_tokenizer
  torch.set_num_threads(threads)
  model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
  controller = AgentGymController(model, load_tokenizer(checkpoint), workload.max_new_tokens, workload.max_rounds)
  controller.inputs = inputs = []
  start = time.perf_counter()
  episodes = controller.run(workload)  # warm-up
  first_s = time.perf_counter() - start
  controller.inputs = None
  if give_up_s is not None and first_s > give_up_s:
    return {"seconds": first_s, "times": [first_s], "first_s": first_s, "episodes": episodes, "failed": 0,
            "abandoned": True, "profile": None}
  for key in controller.timers:
    controller.timers[key] = 0.0
  seconds, times = common.median_time(lambda: controller.run(workload), warmup=0, repeats=repeats)
  profile = {k: v / repeats for k, v in controller.timers.items()}
  profile["total_s"] = sum(times) / repeats
  profile["other_s"] = profile["total_s"] - sum(controller.timers.values()) / repeats
  # The prefill part of `generate`: one forward of every turn's input (last position's logits, as generate).
  start = time.perf_counter()
  with torch.inference_mode():
    for ids in inputs:
      model(ids, attention_mask=torch.ones_like(ids), use_cache=True, logits_to_keep=1)
  profile["prefill_s"] = time.perf_counter() - start
  profile["decode_s"] = profile["generate_s"] - profile["prefill_s"]
  profile["prefill_tokens"] = sum(int(ids.shape[1]) for ids in inputs)
  profile["decode_steps"] = sum(e["tokens"] for e in episodes) - len(inputs)
  return {"seconds": seconds, "times": times, "first_s": first_s, "episodes": episodes, "failed": 0,
          "profile": profile}


# ----------------------------------------------------------------------------------------------------------
# Comparison and the suite.
# ----------------------------------------------------------------------------------------------------------


def agreement(a: Sequence[dict], b: Sequence[dict]) -> dict:
  """How far two runs of the same task list took the same greedy turns."""
  same_episodes = same_counts = same_turns = turns = 0
  for x, y in zip(a, b, strict=True):
    same_episodes += x["texts"] == y["texts"]
    same_counts += (x["turns"], x["tokens"]) == (y["turns"], y["tokens"])
    turns += max(len(x["texts"]), len(y["texts"]))
    same_turns += sum(p == q for p, q in zip(x["texts"], y["texts"]))
  n = max(len(a), 1)
  return {"episodes_identical": same_episodes / n, "episodes_same_turns_and_tokens": same_counts / n,
          "turns_identical": same_turns / max(turns, 1)}


def _totals(episodes: Sequence[dict]) -> tuple[int, int]:
  return sum(e["turns"] for e in episodes), sum(e["tokens"] for e in episodes)


def _run_worker(args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 3600,
                cores: int | None = None) -> dict:
  """`python -m launch.benchmarks.rollout --worker ...` in a fresh process (so thread settings apply). The
  result comes back in a file rather than on stdout: the episodes' texts make it large, and whatever a
  library prints cannot garble it."""
  full_env = dict(os.environ)
  full_env.update(env or {})
  with tempfile.TemporaryDirectory(prefix="evolver_bench_rollout_worker_") as tmp:
    out = os.path.join(tmp, "result.json")
    with common.pinned_to(cores):
      proc = subprocess.run([sys.executable, "-m", "launch.benchmarks.rollout", "--worker", out, *args],
                            capture_output=True, text=True, env=full_env, timeout=timeout)
    if proc.returncode != 0 or not os.path.exists(out):
      raise RuntimeError(f"rollout worker {' '.join(args[:1])} (env {env}) exited with {proc.returncode} and "
                         f"{'a' if os.path.exists(out) else 'no'} result:\nstdout: {proc.stdout[-2000:]}\n"
                         f"stderr: {proc.stderr[-4000:]}")
    with open(out) as f:
      return json.load(f)


def _gather(checkpoint: str, workload: Workload, opts) -> tuple[list[dict], list[dict]]:
  """Runs every side x thread setting; returns (ours rows, peer rows) with a `setting` name each."""
  ours, peer = [], []
  for name in opts.jax_settings.split(","):
    if opts.inline:
      res = measure_ours(checkpoint, workload, opts.repeats)
    else:
      res = _run_worker(["jax", checkpoint, workload.to_json(), str(opts.repeats)], env={"JAX_PLATFORMS": "cpu"},
                        cores=common.JAX_CORE_SETTINGS[name])
    ours.append(dict(res, setting=name))
  for threads in opts.torch_threads.split(","):
    give_up = GIVE_UP_FACTOR * min(r["seconds"] for r in peer) if peer else None
    if opts.inline:
      res = measure_peer(checkpoint, workload, opts.repeats, int(threads), give_up)
    else:
      res = _run_worker(["torch", checkpoint, workload.to_json(), str(opts.repeats), threads, str(give_up)])
    peer.append(dict(res, setting=f"{threads} thread(s)"))
  return ours, peer


def summarize(workload: Workload, ours: Sequence[dict], peer: Sequence[dict], *, model_desc: str = "") -> dict:
  """Prints the tables and returns the suite's JSON dict (each side at its best thread setting)."""
  n = len(workload.tasks)
  rows = []
  for res in ours:
    for mode in MODES:
      r = res[mode]
      turns, tokens = _totals(r["episodes"])
      rows.append(["evolver RolloutEngine", _MODE_NAMES[mode], res["setting"], n, turns, tokens,
                   f"{r['first_s']:.2f}", f"{r['seconds']:.3f}", f"{n / r['seconds']:.2f}"])
  for res in peer:
    turns, tokens = _totals(res["episodes"])
    abandoned = res.get("abandoned")
    rows.append(["AgentGym-style (transformers)", "history re-encoded, 1 episode at a time", res["setting"], n,
                 turns, tokens, f"{res['first_s']:.2f}", "(warm-up only)" if abandoned else f"{res['seconds']:.3f}",
                 f"<{n / res['seconds']:.2f}" if abandoned else f"{n / res['seconds']:.2f}"])
  load = os.getloadavg()
  envs_used = sorted({env for env, _ in workload.tasks})
  common.print_table(
      f"Rollout: {model_desc}{n} episodes ({', '.join(envs_used)}; {workload.split} tasks), max_rounds "
      f"{workload.max_rounds}, max_new_tokens {workload.max_new_tokens}, greedy, float32, CPU; "
      f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {os.cpu_count()} cores",
      ["side", "mode", "threads", "episodes", "turns", "tokens", "warm-up s", "median s", "episodes/s"], rows)

  best_ours = {mode: min(ours, key=lambda res: res[mode]["seconds"]) for mode in MODES}
  best_peer = min(peer, key=lambda res: res["seconds"])
  ours_eps = n / best_ours["cached"]["cached"]["seconds"]
  reprefill_eps = n / best_ours["reprefill"]["reprefill"]["seconds"]
  peer_eps = n / best_peer["seconds"]
  ours_eps_list = best_ours["cached"]["cached"]["episodes"]
  agree_peer = agreement(ours_eps_list, best_peer["episodes"])
  agree_self = agreement(ours_eps_list, best_ours["reprefill"]["reprefill"]["episodes"])

  # Where the time goes, per run of the whole task list.
  brows = []
  keys = ("total_s", "prefill_s", "decode_s", "select_s", "generate_host_s", "env_s", "template_s", "other_s")
  for mode in MODES:
    p = best_ours[mode][mode].get("profile")
    if p:
      compile_s = best_ours[mode][mode]["first_s"] - best_ours[mode][mode]["seconds"]
      brows.append([f"evolver, {_MODE_NAMES[mode]}"] + [f"{p[k]:.3f}" for k in keys] + [f"{compile_s:.2f}"])
  pp = best_peer["profile"]
  brows.append(["AgentGym-style peer", f"{pp['total_s']:.3f}", f"{pp['prefill_s']:.3f}", f"{pp['decode_s']:.3f}",
                "-", "(in decode)", f"{pp['env_s']:.3f}", f"{pp['template_s']:.3f}", f"{pp['other_s']:.3f}",
                f"{best_peer['first_s'] - best_peer['seconds']:.2f}"])
  common.print_table("Where the time goes (seconds per run of the task list; ours from one more run, read from "
                     "the sampler's accounting; the peer's prefill is one forward of each turn's input timed "
                     "apart, its decode the rest of `generate`; compile ~ warm-up minus median)",
                     ["run", "total", "prefill", "decode", "select", "host in generate", "env",
                      "template", "other", "compile~"], brows)
  prof = {mode: best_ours[mode][mode].get("profile") for mode in MODES}
  for mode in MODES:
    p = prof[mode]
    if not p:
      continue
    print(f"ours, {_MODE_NAMES[mode]}: {p['generate_calls']} generate calls, "
          f"{p['decode_calls']} decode loops, "
          f"{p['decode_steps']} decode steps of {p['decode_rows_mean']:.1f} rows on average, "
          f"{p['idle_row_fraction']:.0%} of them idle ({1e3 * p['decode_s'] / max(p['decode_steps'], 1):.2f} ms/step); "
          f"{p['prefill_tokens']} tokens fed in {p['prefill_slots']} padded slots "
          f"({p['prefill_slots'] / max(p['prefill_s'], 1e-9):.0f} slots/s); {p['sampled_tokens']} sampled; "
          f"{p['select_calls']} batch shrinks")
  print(f"ours, compiled programs after both modes: {best_ours['cached'].get('compiled_programs')}")
  print(f"peer: {pp['prefill_tokens']} tokens re-encoded ({pp['prefill_tokens'] / max(pp['prefill_s'], 1e-9):.0f} "
        f"tokens/s), {pp['decode_steps']} decode steps of 1 row "
        f"({1e3 * pp['decode_s'] / max(pp['decode_steps'], 1):.2f} ms/step)")
  peer_turns, peer_tokens = _totals(best_peer["episodes"])
  ours_turns, ours_tokens = _totals(ours_eps_list)
  print(f"greedy agreement with the peer: {agree_peer['episodes_identical']:.0%} of episodes identical, "
        f"{agree_peer['turns_identical']:.0%} of turns identical, "
        f"{agree_peer['episodes_same_turns_and_tokens']:.0%} with the same turns and tokens "
        f"(turns {ours_turns} vs {peer_turns}, tokens {ours_tokens} vs {peer_tokens}); "
        f"cache kept vs re-prefill: {agree_self['episodes_identical']:.0%} of episodes identical")
  speedup, speedup_self = ours_eps / peer_eps, ours_eps / reprefill_eps
  print(f"ours {ours_eps:.2f} episodes/s ({best_ours['cached']['setting']}) vs AgentGym-style {peer_eps:.2f} "
        f"({best_peer['setting']}): {speedup:.1f}x (goal >= 10x); vs own re-prefill {reprefill_eps:.2f} "
        f"({best_ours['reprefill']['setting']}): {speedup_self:.2f}x (goal >= 2x)")
  return {
      "suite": "rollout", "unit": "episodes/s", "ours": ours_eps, "peer": peer_eps, "speedup": speedup,
      "speedup_self": speedup_self, "ours_reprefill": reprefill_eps,
      # The first (cold) run of the task list on each side's best setting: JAX compiles its programs there.
      "cold_s_ours": best_ours["cached"]["cached"]["first_s"], "cold_s_peer": best_peer["first_s"],
      "ours_setting": best_ours["cached"]["setting"], "peer_setting": best_peer["setting"],
      "episodes": n, "envs": envs_used, "max_rounds": workload.max_rounds,
      "max_new_tokens": workload.max_new_tokens,
      "turns_ours": ours_turns, "turns_peer": peer_turns, "tokens_ours": ours_tokens, "tokens_peer": peer_tokens,
      "agreement_peer": agree_peer, "agreement_self": agree_self,
      "failed_ours": best_ours["cached"]["cached"]["failed"],
      "profile_ours": prof["cached"], "profile_ours_reprefill": prof["reprefill"], "profile_peer": pp,
      "runs": [{"side": "ours", "mode": mode, "setting": res["setting"], "seconds": res[mode]["seconds"],
                "first_s": res[mode]["first_s"]} for res in ours for mode in MODES]
              + [{"side": "peer", "setting": res["setting"], "seconds": res["seconds"], "first_s": res["first_s"],
                  "abandoned": bool(res.get("abandoned"))} for res in peer],
      "load_avg": [round(x, 2) for x in load],
  }


def run(args: list[str]) -> dict:
  parser = argparse.ArgumentParser(prog="launch.benchmark --suite rollout")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--episodes_per_env", type=int, default=2)
  parser.add_argument("--envs", default="", help="comma-separated env names (default: all built-in envs)")
  parser.add_argument("--max_rounds", type=int, default=4)
  parser.add_argument("--max_new_tokens", type=int, default=48)
  parser.add_argument("--torch_threads", default="1,2")
  parser.add_argument("--jax_settings", default=",".join(common.JAX_CORE_SETTINGS),
                      help=f"comma-separated, of {list(common.JAX_CORE_SETTINGS)}")
  parser.add_argument("--checkpoint", default=None,
                      help="a transformers directory with model and tokenizer (default: the tiny default, random)")
  parser.add_argument("--seed", type=int, default=0, help="weights of the random tiny default")
  parser.add_argument("--inline", action="store_true",
                      help="run both sides in this process (thread settings then do not apply; for tests)")
  opts = parser.parse_args(args)
  for name in opts.jax_settings.split(","):
    if name not in common.JAX_CORE_SETTINGS:
      parser.error(f"unknown --jax_settings {name!r}; choose from {list(common.JAX_CORE_SETTINGS)}")
  workload = make_workload([e for e in opts.envs.split(",") if e], opts.episodes_per_env, opts.max_rounds,
                           opts.max_new_tokens)
  with tempfile.TemporaryDirectory(prefix="evolver_bench_rollout_") as tmp:
    if opts.checkpoint:
      checkpoint, desc = opts.checkpoint, f"{opts.checkpoint}, "
    else:
      checkpoint = make_checkpoint(os.path.join(tmp, "tiny"), seed=opts.seed)
      config = tiny_default_config()
      desc = f"tiny default ({config.num_params() / 1e6:.1f}M, random seed {opts.seed}), "
    ours, peer = _gather(checkpoint, workload, opts)
  return summarize(workload, ours, peer, model_desc=desc)


if __name__ == "__main__":
  if len(sys.argv) > 1 and sys.argv[1] == "--worker":
    # --worker OUT_JSON jax|torch CHECKPOINT WORKLOAD_JSON REPEATS [TORCH_THREADS GIVE_UP_S|None]
    out_path, kind, ckpt = sys.argv[2], sys.argv[3], sys.argv[4]
    work, reps = Workload.from_json(sys.argv[5]), int(sys.argv[6])
    if kind == "jax":
      result = measure_ours(ckpt, work, reps)
    else:
      result = measure_peer(ckpt, work, reps, int(sys.argv[7]), ast.literal_eval(sys.argv[8]))
    with open(out_path + ".tmp", "w") as f:
      json.dump(result, f)
    os.replace(out_path + ".tmp", out_path)
