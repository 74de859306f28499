"""The matmul kernels' ceiling: what XLA:CPU's dot and PyTorch's give on a model's own shapes, without the model.

A compute-bound step (SmolLM2-135M's decode at batch 32, its train step at 4 x 512 tokens) spends nearly all its
time in the MLP and projection matmuls, so its end-to-end speedup over PyTorch is bounded by how much faster one
framework multiplies those shapes than the other. This times the same chain on both sides: `layers` residual MLP
blocks x + silu(x @ W1) @ W2 with x `[rows, hidden]`, W1 `[hidden, intermediate]`, W2 `[intermediate, hidden]`,
float32, random weights (seed 0), `steps` chains a run, the median of `repeats` runs after one warm-up; JAX jitted
on all cores, PyTorch eager (no grad) at each thread count, each side in its own process. The ratio (PyTorch's best
seconds / JAX's) is the kernels' speedup at that shape: an end-to-end figure near it leaves nothing above the
kernels to optimise.

  python -m launch.benchmark --suite dot_ceiling    # SmolLM2-135M's shapes: rows 32 (decode) and 2048 (train)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence

from launch.benchmarks import common

_MODULE = "launch.benchmarks.dot_ceiling"
# SmolLM2-135M: hidden 576, intermediate 1536, 30 layers; 32 rows = the decode at batch 32, 2048 = 4 x 512 tokens.
SMOLLM2 = dict(hidden=576, intermediate=1536, layers=30)
ROWS = (32, 2048)


def _flops(rows: int, hidden: int, intermediate: int, layers: int) -> float:
  """Multiply-adds x 2 of one chain."""
  return 2.0 * 2 * rows * hidden * intermediate * layers


def _steps_for(rows: int) -> int:
  """Chains per timed run: about 0.7 TFLOP a run at SmolLM2's shapes (a few seconds on a 2-core CPU)."""
  return max(1, round(200 * 32 / rows))


def _worker_jax(rows: int, hidden: int, intermediate: int, layers: int, steps: int, repeats: int) -> dict:
  import jax
  import jax.numpy as jnp
  keys = jax.random.split(jax.random.PRNGKey(0), 2 * layers + 1)
  w1 = [jax.random.normal(keys[i], (hidden, intermediate), jnp.float32) * 0.02 for i in range(layers)]
  w2 = [jax.random.normal(keys[layers + i], (intermediate, hidden), jnp.float32) * 0.02 for i in range(layers)]
  x0 = jax.random.normal(keys[-1], (rows, hidden), jnp.float32)

  @jax.jit
  def chain(x, w1, w2):
    for a, b in zip(w1, w2):
      x = x + jax.nn.silu(x @ a) @ b
    return x

  def run():
    x = x0
    for _ in range(steps):
      x = chain(x, w1, w2)
    x.block_until_ready()

  median, _ = common.median_time(run, warmup=1, repeats=repeats)
  return {"seconds": median}


def _worker_torch(rows: int, hidden: int, intermediate: int, layers: int, steps: int, repeats: int,
                  threads: int) -> dict:
  import torch
  torch.set_num_threads(threads)
  gen = torch.Generator().manual_seed(0)
  w1 = [torch.randn(hidden, intermediate, generator=gen) * 0.02 for _ in range(layers)]
  w2 = [torch.randn(intermediate, hidden, generator=gen) * 0.02 for _ in range(layers)]
  x0 = torch.randn(rows, hidden, generator=gen)

  def run():
    with torch.no_grad():
      x = x0
      for _ in range(steps):
        for a, b in zip(w1, w2):
          x = x + torch.nn.functional.silu(x @ a) @ b

  median, _ = common.median_time(run, warmup=1, repeats=repeats)
  return {"seconds": median}


def compare(rows: Sequence[int] = ROWS, *, hidden: int, intermediate: int, layers: int, repeats: int = 3,
            torch_threads: Sequence[int] = (1, 2), title: str = "SmolLM2-135M") -> dict:
  """Times the chain at each row count on both sides; prints a table and returns {f"dot_ratio_{rows}": PyTorch's
  best seconds / JAX's, f"dot_gflops_ours_{rows}", f"dot_gflops_peer_{rows}"}."""
  result, table = {}, []
  for r in rows:
    steps = _steps_for(r)
    shape = [str(v) for v in (r, hidden, intermediate, layers, steps, repeats)]
    flops = steps * _flops(r, hidden, intermediate, layers)
    ours = common.run_worker(_MODULE, ["--worker", "jax", *shape])["seconds"]
    peers = {t: common.run_worker(_MODULE, ["--worker", "torch", *shape, str(t)])["seconds"] for t in torch_threads}
    best = min(peers, key=peers.get)
    table.append([r, "evolver (jax)", "all cores", f"{ours:.3f}", f"{flops / ours / 1e9:.0f}"])
    table += [[r, "pytorch", f"{t} thread(s)", f"{s:.3f}", f"{flops / s / 1e9:.0f}"] for t, s in peers.items()]
    result.update({f"dot_ratio_{r}": peers[best] / ours, f"dot_gflops_ours_{r}": flops / ours / 1e9,
                   f"dot_gflops_peer_{r}": flops / peers[best] / 1e9})
  common.print_table(f"Matmul ceiling ({title} MLP chain: {layers} x [rows, {hidden}] @ [{hidden}, {intermediate}] "
                     f"@ [{intermediate}, {hidden}], float32)", ["rows", "side", "threads", "median s", "GFLOP/s"],
                     table)
  for r in rows:
    print(f"rows {r}: the kernels' speedup {result[f'dot_ratio_{r}']:.2f}x (pytorch's best / ours)")
  return result


def run(args: Sequence[str]) -> dict:
  parser = argparse.ArgumentParser(prog="launch.benchmark --suite dot_ceiling", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", default=",".join(str(r) for r in ROWS), help="row counts, comma-separated")
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--torch_threads", default="1,2")
  opts = parser.parse_args(args)
  rows = [int(r) for r in opts.rows.split(",")]
  result = compare(rows, repeats=opts.repeats, torch_threads=[int(t) for t in opts.torch_threads.split(",")],
                   **SMOLLM2)
  first = rows[0]
  return {"suite": "dot_ceiling", "unit": "GFLOP/s", "ours": result[f"dot_gflops_ours_{first}"],
          "peer": result[f"dot_gflops_peer_{first}"], "speedup": result[f"dot_ratio_{first}"], "rows": rows,
          **SMOLLM2, **result}


if __name__ == "__main__":
  if len(sys.argv) > 1 and sys.argv[1] == "--worker":  # --worker jax|torch ROWS HIDDEN INTER LAYERS STEPS REPEATS [T]
    kind, numbers = sys.argv[2], [int(v) for v in sys.argv[3:]]
    if kind == "jax":
      print(json.dumps(_worker_jax(*numbers[:6])))
    else:
      print(json.dumps(_worker_torch(*numbers[:6], threads=numbers[6])))
  else:  # as `launch.benchmark --suite dot_ceiling`
    print(json.dumps(run(sys.argv[1:])))
