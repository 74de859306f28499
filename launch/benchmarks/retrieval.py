"""Retrieval benchmark: the experience index's ScaNN regime against exact numpy search.

  python -m launch.benchmark --suite retrieval [--sizes 100000,1000000] [--queries 1000] [--recall_floor 0.95]
      [--small]

Data: clustered synthetic 384-d unit vectors, a mixture of Gaussians (1,000 unit centres, each point a centre plus
isotropic noise of norm ~1, renormalised; fixed seed), like sentence embeddings of a few thousand topics. Queries
are fresh draws from the same mixture. Both sides run through `VectorIndex` on the same stored vectors and every
core: ScaNN (tree + anisotropic hashing, its candidates re-scored exactly, `search`) and exact (one BLAS matmul +
argpartition per query chunk, `search(exact=True)`), k = 10, all queries in one batch. Reported per size: build time
(from empty: copy, ScaNN training and hashing), the index's resident size (resident-set growth from empty to built:
the vectors once, ScaNN's tree and codes, the ids), the peak while building and the bytes a vector, batched
queries/s of each (median of `--repeats` timed runs after a warm-up), recall@10 against exact, and the time to upsert
1,000 new vectors (median of 5 rounds, incremental: no rebuild). The output states the resident size at 1M x 384:
measured when 1M is among the sizes (the default), else extrapolated from the largest.

Goals: recall@10 >= 0.95 at >= 150x exact search at 1M; an upsert of 1,000 into the 100k index <= 1 s. Recall is
also a floor: under `--recall_floor` (0.95) at any size, the suite prints its figures and JSON line and exits
non-zero. `--small` runs tiny sizes in seconds (for tests); its figures say nothing about the goals.

Measured (2 CPUs shared with other work, default ScannParams), this index and, below each, the one before it held
each vector once (when ScaNN reordered on a float32 copy of its own, with docid maps):
      n  leaves  searched  build s  index MB  peak MB  B/vector  exact q/s  ScaNN q/s  speedup  recall@10  upsert 1k s
 100000     316        13     16.6     177.7    763.1      1864     1361.0    20019.3    14.7x     0.9737       0.0245
 before                       16.5     337.2                        1357.4    27862.9    20.5x     0.9737       0.0260
1000000    1000         5     64.2    1709.4   4928.1      1792      124.6    13321.6   106.9x     0.9834       0.0302
 before                       63.9    3216.5                         124.8    14985.8   120.1x     0.9834       0.0361
An earlier run, on CPUs shared with a training run, gave 213x with the exact peer at 38 q/s; here the peer ran 3x
faster and neither index reached 150x. The peak is ScaNN's build (about 2.4x the vectors on top of the index).
Tuning notes (1M): recall is bound by the reorder depth, not the leaves searched (3 to 20 leaves of 1,000 all gave
0.983 at reorder 100; reorder 60/80/200 gave 0.949/0.972/0.994); 4 dims per AH block was faster but fell to
0.62-0.80; a tree of 2,000 leaves trained on 100k points came out lopsided (recall 0.77), hence at least 100
training points per leaf. The exact peer is blocked (each database row read once per chunk of queries) and runs
near the BLAS peak of these CPUs; its timed batches are 250 queries.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import threading
import time
from typing import Any

import numpy as np

from evolver.experience.index import DRIFT_FRACTION, EXACT_THRESHOLD, ScannParams, VectorIndex
from launch.benchmarks import common

DIM = 384
CLUSTERS = 1000
NOISE = 1.0
K = 10
GOALS = {"recall_at_10": 0.95, "qps_speedup": 150.0, "upsert_1k_s": 1.0}
STATED_N = 1_000_000  # the size whose resident index the output states (measured there, else extrapolated)


def _mixture(n: int, seed: int, dim: int) -> np.ndarray:
  """`[n, dim]` float32 unit vectors: one of CLUSTERS fixed centres (seed 0) plus Gaussian noise of norm ~NOISE."""
  centres = np.random.default_rng(0).standard_normal((CLUSTERS, dim), dtype=np.float32)
  centres /= np.linalg.norm(centres, axis=1, keepdims=True)
  rng = np.random.default_rng(seed)
  out = np.empty((n, dim), np.float32)
  for start in range(0, n, 100_000):
    m = min(100_000, n - start)
    x = centres[rng.integers(0, CLUSTERS, m)] + rng.standard_normal((m, dim), dtype=np.float32) * (NOISE / dim ** 0.5)
    out[start:start + m] = x / np.linalg.norm(x, axis=1, keepdims=True)
  return out


def _flag(text: str) -> bool:
  if text.lower() not in ("true", "false", "1", "0"):
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
  return text.lower() in ("true", "1")


def _resident_mb() -> float:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_resident_mb(fn) -> float:
  """Runs `fn()`; returns the highest resident set (MiB) seen while it ran, sampled every 5 ms."""
  peak, done = [_resident_mb()], threading.Event()

  def sample():
    while not done.wait(0.005):
      peak[0] = max(peak[0], _resident_mb())

  sampler = threading.Thread(target=sample, daemon=True)
  sampler.start()
  try:
    fn()
  finally:
    done.set()
    sampler.join()
  return max(peak[0], _resident_mb())


def _recall(approximate: list[list[tuple[str, float]]], exact: list[list[tuple[str, float]]]) -> float:
  return float(np.mean([len({i for i, _ in a} & {i for i, _ in e}) / max(1, len(e))
                        for a, e in zip(approximate, exact)]))


def _median_qps(search, queries: np.ndarray, repeats: int) -> float:
  seconds, _ = common.median_time(lambda: search(queries), warmup=1, repeats=repeats)
  return queries.shape[0] / seconds


def measure(n: int, queries: np.ndarray, params: ScannParams, repeats: int, exact_queries: int, seed: int,
            drift_fraction: float = DRIFT_FRACTION) -> dict[str, Any]:
  """One size: build, memory, exact and ScaNN throughput, recall@10 and a 1,000-vector upsert."""
  dim = queries.shape[1]
  data = _mixture(n, seed + 1, dim)
  index = VectorIndex(dim, exact_threshold=min(EXACT_THRESHOLD, n), params=params, drift_fraction=drift_fraction)
  before = _resident_mb()
  ids = [f"d{i}" for i in range(n)]  # their strings count: the index keeps them
  start = time.perf_counter()
  peak_mb = _peak_resident_mb(lambda: index.upsert(ids, data)) - before
  build_s = time.perf_counter() - start
  del ids
  index_mb = _resident_mb() - before  # the caller's `data` is not the index's: it copied it
  del data
  if index.mode != "scann":
    raise RuntimeError(f"expected a ScaNN index at {n} vectors, got {index.mode}")

  truth = index.search(queries, K, exact=True)  # also warms exact search up
  exact_batch = queries[:exact_queries]
  exact_qps = _median_qps(lambda q: index.search(q, K, exact=True), exact_batch, max(1, min(repeats, 3)))
  scann_qps = _median_qps(lambda q: index.search(q, K), queries, repeats)
  recall = _recall(index.search(queries, K), truth)

  upserts = []
  for r in range(5):
    fresh = _mixture(1000, seed + 100 + r, dim)
    start = time.perf_counter()
    index.upsert([f"u{r}-{i}" for i in range(1000)], fresh)
    upserts.append(time.perf_counter() - start)
  if index.builds != 1:
    raise RuntimeError("the upserts triggered a rebuild; the upsert figure would not be incremental")
  return {"n": n, "build_s": round(build_s, 2), "index_mb": round(index_mb, 1), "build_peak_mb": round(peak_mb, 1),
          "bytes_per_vector": round(index_mb * 2**20 / n), "vectors_mb": round(n * dim * 4 / 2**20, 1),
          "exact_qps": round(exact_qps, 2), "scann_qps": round(scann_qps, 1),
          "qps_speedup": round(scann_qps / exact_qps, 1), "recall_at_10": round(recall, 4),
          "upsert_1k_s": round(statistics.median(upserts), 4),
          "leaves": params.leaves(n), "leaves_to_search": params.leaves_to_search(n)}


def run(args: list[str]) -> dict[str, Any]:
  from scann.scann_ops.py import scann_ops_pybind  # noqa: F401  loaded first, so no size's memory counts the library

  defaults = ScannParams()
  parser = argparse.ArgumentParser(prog="launch.benchmark --suite retrieval")
  parser.add_argument("--sizes", default="100000,1000000", help="comma-separated index sizes")
  parser.add_argument("--queries", type=int, default=1000, help="queries per batch")
  parser.add_argument("--exact_queries", type=int, default=250, help="queries per timed exact batch")
  parser.add_argument("--repeats", type=int, default=5, help="timed runs per figure (exact: at most 3)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--small", action="store_true", help="tiny sizes and few queries, for tests (seconds)")
  parser.add_argument("--recall_floor", type=float, default=GOALS["recall_at_10"],
                      help="exit non-zero when recall@10 at any size falls under this")
  for field in dataclasses.fields(ScannParams):
    value = getattr(defaults, field.name)
    parser.add_argument(f"--{field.name}", type=_flag if isinstance(value, bool) else type(value), default=None,
                        help=f"ScannParams.{field.name} (default {value})")
  opts = parser.parse_args(args)
  overrides = {f.name: getattr(opts, f.name) for f in dataclasses.fields(ScannParams)
               if getattr(opts, f.name) is not None}
  params = dataclasses.replace(defaults, **overrides)
  dim = DIM
  sizes = [int(s) for s in opts.sizes.split(",")]
  if opts.small:
    sizes, dim, opts.queries, opts.exact_queries, opts.repeats = [2000, 4000], 64, 64, 64, 2
  queries = _mixture(opts.queries, opts.seed + 2, dim)
  # The 5,000 upserted vectors stay under the default drift fraction from 25k vectors up; --small lifts it.
  drift = 10.0 if opts.small else DRIFT_FRACTION
  rows = [measure(n, queries, params, opts.repeats, min(opts.exact_queries, opts.queries), opts.seed, drift)
          for n in sizes]

  common.print_table(
      f"retrieval benchmark: {dim}-d unit vectors, {CLUSTERS}-centre Gaussian mixture, {opts.queries} queries per "
      f"batch, k={K}, {os.cpu_count()} CPUs; ScaNN tree + AH ({params.dims_per_block} dims/block) + reorder "
      f"{params.reorder} vs exact numpy",
      ("n", "leaves", "searched", "build s", "index MB", "peak MB", "B/vector", "exact q/s", "ScaNN q/s", "speedup",
       "recall@10", "upsert 1k s"),
      [(r["n"], r["leaves"], r["leaves_to_search"], r["build_s"], r["index_mb"], r["build_peak_mb"],
        r["bytes_per_vector"], r["exact_qps"], r["scann_qps"], f"{r['qps_speedup']}x", r["recall_at_10"],
        r["upsert_1k_s"]) for r in rows])
  largest = rows[-1]
  upsert_row = min(rows, key=lambda r: abs(r["n"] - 100_000))
  stated = resident_at_stated_size(rows, dim)
  print(stated["line"])
  print(f"goals at the largest size: recall@10 >= {GOALS['recall_at_10']} at >= {GOALS['qps_speedup']:g}x; "
        f"upsert of 1,000 into the ~100k index <= {GOALS['upsert_1k_s']:g} s")
  failures = [f"recall@10 {r['recall_at_10']} < {opts.recall_floor} at n={r['n']}" for r in rows
              if not r["recall_at_10"] >= opts.recall_floor]
  print(f"recall floor {opts.recall_floor}: " + ("; ".join(failures) if failures else "met at every size"))
  result = {"suite": "retrieval", "ours": largest["scann_qps"], "peer": largest["exact_qps"], "unit": "queries/s",
            "speedup": largest["qps_speedup"], "qps_speedup": largest["qps_speedup"],
            "recall_at_10": largest["recall_at_10"], "upsert_1k_s": upsert_row["upsert_1k_s"],
            "upsert_1k_at": upsert_row["n"], "build_s": largest["build_s"], "index_mb": largest["index_mb"],
            "resident_mb_at_1m": stated["mb"], "resident_at_1m_measured": stated["measured"],
            "recall_floor": opts.recall_floor, "floor_failures": failures,
            "n": largest["n"], "dim": dim, "queries": opts.queries, "k": K, "clusters": CLUSTERS, "noise": NOISE,
            "small": opts.small, "params": dataclasses.asdict(params), "goals": GOALS, "sizes": rows,
            "peer_name": "exact numpy (BLAS matmul + argpartition)", "cpus": os.cpu_count()}
  if failures:  # the JSON line first, as `launch.benchmark` prints it on success, then a non-zero exit
    print(json.dumps(result), flush=True)
    raise SystemExit(f"retrieval benchmark: recall floor {opts.recall_floor} not met: {'; '.join(failures)}")
  return result


def resident_at_stated_size(rows: list[dict[str, Any]], dim: int) -> dict[str, Any]:
  """The index's resident size at STATED_N x DIM: measured when a row ran it, else the largest row's bytes per
  vector times STATED_N (ScaNN's tree grows with sqrt(n), the rest linearly); None for another width."""
  if dim != DIM:
    return {"mb": None, "measured": False,
            "line": f"resident size at {STATED_N:,} x {DIM}: not stated ({dim}-d run; drop --small)"}
  exact = [r for r in rows if r["n"] == STATED_N]
  if exact:
    mb = exact[0]["index_mb"]
    return {"mb": mb, "measured": True, "line": f"resident size at {STATED_N:,} x {DIM}: {mb:,.0f} MiB measured "
                                                f"({exact[0]['bytes_per_vector']:,} bytes a vector, of which "
                                                f"{4 * DIM:,} are the float32 vector)"}
  largest = max(rows, key=lambda r: r["n"])
  mb = round(largest["bytes_per_vector"] * STATED_N / 2**20, 1)
  return {"mb": mb, "measured": False,
          "line": f"resident size at {STATED_N:,} x {DIM}: ~{mb:,.0f} MiB extrapolated from n={largest['n']:,} "
                  f"({largest['bytes_per_vector']:,} bytes a vector; not measured at {STATED_N:,})"}
