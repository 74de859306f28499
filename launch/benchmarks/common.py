"""Helpers shared by benchmark suites: timing, subprocess workers, the pinned model shape, tables."""

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence

# DESIGN.md section 4: the pinned "~20M" Qwen2 shape.
PINNED_20M = dict(vocab_size=32000, hidden_size=384, num_hidden_layers=6, num_attention_heads=6,
                  num_key_value_heads=2, intermediate_size=1024, tie_word_embeddings=True,
                  max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=1000000.0)


def median_time(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 5) -> tuple[float, list[float]]:
  """Median wall time in seconds of `fn` after `warmup` untimed calls."""
  for _ in range(warmup):
    fn()
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times), times


# JAX's side of a suite, each in its own worker process: name -> how many of this process's CPUs the worker may
# run on (None: all of them).
# XLA:CPU sizes its thread pool from the process's CPU affinity; XLA_FLAGS such as
# `--xla_cpu_multi_thread_eigen=false` leave its dot and fusion threads as they are (measured: the same matmul
# GFLOP/s with and without them, half under `taskset -c 0`), so one core is set by affinity.
JAX_CORE_SETTINGS: dict[str, int | None] = {"all cores": None, "1 core": 1}


def check_jax_settings(names: Sequence[str]) -> None:
  for name in names:
    if name not in JAX_CORE_SETTINGS:
      raise ValueError(f"unknown jax setting {name!r}; choose from {list(JAX_CORE_SETTINGS)}")


@contextlib.contextmanager
def pinned_to(cores: int | None) -> Iterator[None]:
  """Within the block, the calling thread runs on the first `cores` of the CPUs it may use (None: unchanged), and
  so does every process it starts (a child inherits its parent thread's affinity); restored afterwards. No
  `preexec_fn`: that forks a process that may be running JAX's threads."""
  if cores is None:
    yield
    return
  before = os.sched_getaffinity(0)
  os.sched_setaffinity(0, sorted(before)[:cores])
  try:
    yield
  finally:
    os.sched_setaffinity(0, before)


def run_worker(module: str, args: Sequence[str], env: dict[str, str] | None = None, timeout: float = 1800,
               cores: int | None = None) -> dict:
  """Runs `python -m module args` in a fresh process (so thread settings apply), on `cores` CPUs (None: all),
  and parses its last JSON line."""
  full_env = dict(os.environ)
  full_env.update(env or {})
  with pinned_to(cores):
    proc = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout)
  if proc.returncode != 0:
    raise RuntimeError(f"worker {module} {' '.join(args)} failed:\n{proc.stderr[-4000:]}")
  return json.loads(proc.stdout.strip().splitlines()[-1])


def make_reference_checkpoint(path: str, seed: int = 0) -> str:
  """A random transformers Qwen2 checkpoint of the pinned shape at `path` (created once)."""
  if os.path.exists(os.path.join(path, "config.json")):
    return path
  import torch
  import transformers
  torch.manual_seed(seed)
  model = transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**PINNED_20M))
  model.save_pretrained(path)
  return path


def print_table(title: str, header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
  widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
  line = lambda cells: "  ".join(str(c).rjust(w) for c, w in zip(cells, widths))
  print(f"\n{title}")
  print(line(header))
  print(line(["-" * w for w in widths]))
  for row in rows:
    print(line(row))
  sys.stdout.flush()
