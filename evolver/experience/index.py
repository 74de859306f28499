"""VectorIndex: nearest neighbours by cosine over unit-norm float32 vectors with string ids.

Two regimes, chosen by size at each (re)build:
  * exact (numpy) below `exact_threshold` records (EXACT_THRESHOLD = 10,000): one matmul + argpartition. At that
    size a batch of 64 queries takes a few ms and a single query well under 1 ms, a ScaNN build would cost
    seconds, and exact search has no recall loss, so there is nothing to win. Experience pools live here.
  * ScaNN above it: a k-means tree (sqrt(n) leaves, 0.5% of them searched, at least 4,000 points' worth),
    anisotropic asymmetric hashing (2 dims per 16-centre block) and exact float32 re-scoring of the best 100,
    kept in step with the index's rows so that upserts and deletes are incremental. The
    index is rebuilt from scratch when it drifts: once the upserts and deletes since the last build exceed
    `drift_fraction` (20%) of the size it was built at (new records are hashed with the old tree and codebooks,
    which serve a changing collection less well as it grows away from them). It falls back to exact once it
    shrinks below half the threshold (hysteresis: no flapping around the threshold).

Each vector is held once: one float32 matrix `[capacity, dim]` (row i for `ids[i]`; capacity doubles when full, the
old and new matrices both held while the rows are copied) and the id<->row maps. ScaNN is built over that matrix
without a reorder stage of its own and on integer rows rather than docids, so it keeps no float32 copy and no id
list or dict: only its tree and 4-bit AH codes (dim/4 bytes a vector). A search takes ScaNN's best `reorder`
candidates by AH score and re-scores them exactly against the matrix (the float32 reorder ScaNN would otherwise run
on a copy of its own: the same candidates, the same recall), on `threads` threads. `fill` adopts a caller's matrix
without copying it (a pool's reload). Measured at 1M x 384 on 2 CPUs (`python -m launch.benchmark --suite
retrieval`, resident growth from empty to built): 1,709 MiB, 1,792 bytes a vector of which 1,536 are the vector,
against 3,217 MiB (3,373 bytes) when ScaNN kept its own float32 copy and docid maps; batched queries/s fell by about
a tenth at 1M (13.3k against 15.0k; a quarter at 100k: 20.0k against 27.9k), as gathering 100 random rows a query in
numpy costs more than ScaNN's own reorder did. ScaNN's build still holds about 2.4x the vectors on top, for its
duration. Results are deterministic given the same calls: equal scores are listed by row, and the tree's k-means
starts from k-means++ (ScannParams).
`search(..., exact=True)` always answers exactly (the benchmark's ground truth and peer). Tuning and measured
figures: `python -m launch.benchmark --suite retrieval`.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from evolver.experience.records import ExperienceError

EXACT_THRESHOLD = 10_000
DRIFT_FRACTION = 0.2
NORM_TOLERANCE = 1e-3
_EXACT_CHUNK_SCORES = 1 << 24  # at most this many scores (64 MiB of float32) materialised at once
_EXACT_QUERY_CHUNK = 1024
_RESCORE_QUERY_CHUNK = 32  # queries whose ScaNN candidates are gathered at once ([32, 100, dim] float32: 4.7 MiB)


@dataclasses.dataclass(frozen=True)
class ScannParams:
  """ScaNN's knobs, as functions of the size `n` the tree is built for.

  Attributes:
    leaves_per_sqrt_n: tree leaves = leaves_per_sqrt_n * sqrt(n) (so about sqrt(n) points per leaf).
    search_fraction: leaves searched per query = the more of search_fraction * leaves and enough leaves to
      cover min_points_to_search points (a small tree is searched more widely: scanning a few thousand codes
      costs microseconds).
    dims_per_block: asymmetric hashing block width (2 = 192 codes of 4 bits for 384-d: accurate, a little slower
      than 4).
    anisotropic_threshold: AH's anisotropic quantisation threshold (ScaNN's recommended 0.2 for dot products).
    reorder: candidates re-scored exactly (float32) before the top k are returned.
    training_sample: points that train the tree and the codebooks (ScaNN's default, 100k; all when fewer), raised
      to min_sample_per_leaf per leaf.
    min_sample_per_leaf: training points per leaf at least. At 50 per leaf (100k for 2,000 leaves) ScaNN's tree
      came out lopsided (empty leaves next to leaves of 5,000+) and recall@10 fell to 0.77 at 1M.
    kmeans_plus_plus: seed the tree's k-means with k-means++ rather than random centres. ScaNN 1.4.2's random
      initialisation is not reproducible (the same data gave different trees from build to build, within and
      across processes); k-means++ is, at some extra build time.
  """

  leaves_per_sqrt_n: float = 1.0
  search_fraction: float = 0.005
  min_points_to_search: int = 4000
  dims_per_block: int = 2
  anisotropic_threshold: float = 0.2
  reorder: int = 100
  training_sample: int = 100_000
  min_sample_per_leaf: int = 100
  kmeans_plus_plus: bool = True

  def leaves(self, n: int) -> int:
    return max(2, int(round(self.leaves_per_sqrt_n * math.sqrt(n))))

  def sample(self, n: int) -> int:
    return min(n, max(self.training_sample, self.min_sample_per_leaf * self.leaves(n)))

  def leaves_to_search(self, n: int) -> int:
    leaves = self.leaves(n)
    by_points = math.ceil(self.min_points_to_search * leaves / max(n, 1))
    return min(leaves, max(1, by_points, math.ceil(self.search_fraction * leaves)))


def _top_k(scores: np.ndarray, rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
  """The k best columns of each row of `scores [q, m]` (all when m <= k), with their `rows`, unordered."""
  if scores.shape[1] <= k:
    return scores, rows
  top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
  return np.take_along_axis(scores, top, axis=1), np.take_along_axis(rows, top, axis=1)


def check_vectors(vectors: np.ndarray, dim: int, what: str) -> np.ndarray:
  """`vectors` as a C-contiguous float32 `[n, dim]` array of unit rows (the same array when it already is one: no
  copy), else ExperienceError naming the row."""
  vectors = np.asarray(vectors)
  if vectors.ndim != 2 or vectors.shape[1] != dim:
    raise ExperienceError(f"{what} must be [n, {dim}], got shape {vectors.shape}")
  vectors = np.ascontiguousarray(vectors, np.float32)
  norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))  # no [n, dim] temporary (np.linalg.norm makes one)
  bad = np.flatnonzero(~np.isfinite(norms) | (np.abs(norms - 1.0) > NORM_TOLERANCE))
  if bad.size:
    raise ExperienceError(f"{what} must be unit-norm and finite: row {bad[0]} has norm {norms[bad[0]]:.6g} "
                          f"({bad.size} bad rows)")
  return vectors


def _check_ids(ids: Sequence[str]) -> list[str]:
  ids = list(ids)
  bad = [i for i in ids if not isinstance(i, str)]
  if bad:
    raise ExperienceError(f"ids must be strings, got {bad[:3]!r}")
  return ids


class VectorIndex:
  """Unit-norm float32 vectors under string ids; `search` ranks by dot product (= cosine). Not thread-safe: the
  pool serialises access."""

  def __init__(self, dim: int, *, exact_threshold: int = EXACT_THRESHOLD, drift_fraction: float = DRIFT_FRACTION,
               params: ScannParams | None = None, threads: int | None = None):
    """
    Args:
      dim: vector width.
      exact_threshold: at least this many vectors at a (re)build -> ScaNN; fewer -> exact.
      drift_fraction: rebuild when upserts + deletes since the last build exceed this fraction of its size.
      params: ScaNN's knobs (ScannParams()).
      threads: ScaNN's training and search threads, and those re-scoring its candidates (default: all CPUs).
    """
    if dim < 1:
      raise ExperienceError(f"dim must be positive, got {dim}")
    if exact_threshold < 1 or not 0 < drift_fraction:
      raise ExperienceError(f"need exact_threshold >= 1 and drift_fraction > 0, got {exact_threshold}, "
                            f"{drift_fraction}")
    self.dim = dim
    self.exact_threshold = exact_threshold
    self.drift_fraction = drift_fraction
    self.params = params or ScannParams()
    self.threads = threads or os.cpu_count() or 1
    self._vectors = np.zeros((0, dim), np.float32)  # [capacity, dim]: rows [0, len) hold the vectors, once
    self._ids: list[str] = []  # row -> id
    self._rows: dict[str, int] = {}  # id -> row
    self._searcher = None  # ScaNN's pybind searcher over the rows (AH codes only), or None in the exact regime
    self._rescorers: ThreadPoolExecutor | None = None  # threads re-scoring ScaNN's candidates (made on first use)
    self._built_size = 0
    self._changes = 0
    self.builds = 0  # ScaNN builds so far (drift and threshold crossings included)

  # ----------------------------------------------------------------------------------------------------------
  # State.
  # ----------------------------------------------------------------------------------------------------------

  def __len__(self) -> int:
    return len(self._ids)

  def __contains__(self, memory_id: str) -> bool:
    return memory_id in self._rows

  @property
  def ids(self) -> list[str]:
    return list(self._ids)

  @property
  def mode(self) -> str:
    """'scann' or 'exact': how `search` answers now."""
    return "exact" if self._searcher is None else "scann"

  def vectors(self) -> np.ndarray:
    """The stored vectors `[len(self), dim]`, row i for `self.ids[i]` (a view: do not modify)."""
    return self._vectors[:len(self._ids)]

  # ----------------------------------------------------------------------------------------------------------
  # Updates.
  # ----------------------------------------------------------------------------------------------------------

  def upsert(self, ids: Sequence[str], vectors: np.ndarray) -> None:
    """Inserts or replaces `vectors [len(ids), dim]` (unit-norm) under `ids`; a later duplicate id wins."""
    ids = _check_ids(ids)
    vectors = check_vectors(vectors, self.dim, "upsert vectors")
    if len(ids) != vectors.shape[0]:
      raise ExperienceError(f"upsert: {len(ids)} ids but {vectors.shape[0]} vectors")
    if not ids:
      return
    last = {memory_id: k for k, memory_id in enumerate(ids)}  # dedupe: the last occurrence wins
    if len(last) != len(ids):
      ids, vectors = list(last), vectors[list(last.values())]
    prior = [self._rows.get(i) for i in ids]  # ScaNN's rows to replace; None appends (in order, as here)
    self._reserve(len(self._ids) + sum(row is None for row in prior))
    for memory_id, row in zip(ids, prior):
      if row is None:
        self._rows[memory_id] = len(self._ids)
        self._ids.append(memory_id)
    self._vectors[[self._rows[i] for i in ids]] = vectors
    if self._searcher is not None:
      self._mutate(lambda: self._searcher.upsert(prior, vectors, len(ids)))
    self._changes += len(ids)
    self._maybe_rebuild()

  def delete(self, ids: Sequence[str]) -> int:
    """Removes `ids` (absent ones are ignored). Returns how many were present."""
    present = [i for i in dict.fromkeys(ids) if i in self._rows]
    removed = []  # each deleted row at its turn: ScaNN's delete moves its last row into each hole the same way
    for memory_id in present:  # move the last row into the hole
      row, last = self._rows.pop(memory_id), len(self._ids) - 1
      removed.append(row)
      if row != last:
        moved = self._ids[last]
        self._ids[row] = moved
        self._rows[moved] = row
        self._vectors[row] = self._vectors[last]
      self._ids.pop()
    if removed and self._searcher is not None:
      self._mutate(lambda: self._searcher.delete(removed))
    self._changes += len(present)
    self._maybe_rebuild()
    return len(present)

  def fill(self, ids: Sequence[str], vectors: np.ndarray) -> None:
    """Fills an empty index with `vectors [len(ids), dim]` (unit-norm) under `ids` (distinct) and builds it. A
    C-contiguous float32 `vectors` becomes the index's own storage, not copied: the caller hands it over and must
    not change it. How a pool reloads (a million vectors held once, not twice while the index copies them)."""
    if len(self._ids):
      raise ExperienceError(f"fill needs an empty index, this one holds {len(self._ids)} vectors (upsert instead)")
    ids = _check_ids(ids)
    vectors = check_vectors(vectors, self.dim, "fill vectors")
    if len(ids) != vectors.shape[0]:
      raise ExperienceError(f"fill: {len(ids)} ids but {vectors.shape[0]} vectors")
    rows = {memory_id: row for row, memory_id in enumerate(ids)}
    if len(rows) != len(ids):
      twice = next(i for k, i in enumerate(ids) if rows[i] != k)
      raise ExperienceError(f"fill: ids must be distinct, {twice!r} appears more than once")
    self._vectors, self._ids, self._rows = vectors, ids, rows
    self._changes += len(ids)
    self._maybe_rebuild()

  def rebuild(self) -> None:
    """Rebuilds from the stored vectors: ScaNN from scratch at `exact_threshold` or more, else exact."""
    n = len(self._ids)
    self._searcher = None
    if n >= self.exact_threshold:
      self._searcher = self._build_scann()
      self.builds += 1
    self._built_size, self._changes = n, 0

  def _mutate(self, change) -> None:
    """Applies `change` to the ScaNN searcher; if it fails part-way, rebuilds from the stored vectors (which
    already hold the change) so the two never disagree on a row, then re-raises."""
    try:
      change()
    except BaseException:
      self.rebuild()
      raise

  def _maybe_rebuild(self) -> None:
    n = len(self._ids)
    if self._searcher is None:
      if n >= self.exact_threshold:
        self.rebuild()
    elif n < self.exact_threshold // 2 or self._changes > self.drift_fraction * self._built_size:
      self.rebuild()

  def _reserve(self, n: int) -> None:
    """Room for `n` rows: a new matrix of at least twice the capacity, the rows in use copied (the old one freed)."""
    if n > self._vectors.shape[0]:
      grown = np.zeros((max(n, 2 * self._vectors.shape[0], 1024), self.dim), np.float32)
      grown[:len(self._ids)] = self._vectors[:len(self._ids)]
      self._vectors = grown

  def _build_scann(self):
    from scann.scann_ops.py import scann_ops_pybind  # imported here: exact-only users never load ScaNN

    n, p = len(self._ids), self.params
    # No .reorder(): ScaNN would keep a float32 copy of every vector for it; `_search_scann` re-scores on ours.
    builder = (scann_ops_pybind.builder(self._vectors[:n], p.reorder, "dot_product")
               .tree(num_leaves=p.leaves(n), num_leaves_to_search=p.leaves_to_search(n),
                     training_sample_size=p.sample(n), random_init=not p.kmeans_plus_plus)
               .score_ah(p.dims_per_block, anisotropic_quantization_threshold=p.anisotropic_threshold,
                         training_sample_size=p.sample(n))
               .set_n_training_threads(self.threads))
    # The pybind searcher itself, not the Python wrapper: without docids it answers with rows (no docid list and
    # dict beside ours), and its upsert/delete take rows, None appending.
    searcher = builder.build().searcher
    searcher.set_num_threads(self.threads)
    return searcher

  # ----------------------------------------------------------------------------------------------------------
  # Search.
  # ----------------------------------------------------------------------------------------------------------

  def search(self, queries: np.ndarray, k: int, min_score: float = -1.0, *,
             exact: bool = False) -> list[list[tuple[str, float]]]:
    """The `k` nearest ids of each query, best first, as `(id, cosine)`, keeping only scores >= `min_score`.

    Args:
      queries: `[Q, dim]` unit-norm float32.
      k: hits per query (fewer when the index holds fewer, or fewer reach `min_score`; never an error).
      min_score: the lowest cosine returned.
      exact: answer exactly even in the ScaNN regime. ScaNN also defers to exact search when `k` exceeds its
        reorder depth (a listing, not a nearest-neighbour query).

    Returns:
      One list per query of `(id, score)` pairs, scores descending.
    """
    queries = check_vectors(queries, self.dim, "queries")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 0:
      raise ExperienceError(f"k must be a non-negative int, got {k!r}")
    n = len(self._ids)
    if k == 0 or n == 0 or queries.shape[0] == 0:
      return [[] for _ in range(queries.shape[0])]
    if exact or self._searcher is None or k > self.params.reorder:
      return self._search_exact(queries, min(k, n), min_score)
    return self._search_scann(queries, k, min_score)

  def _search_exact(self, queries: np.ndarray, k: int, min_score: float) -> list[list[tuple[str, float]]]:
    """Blocked brute force: up to 1,024 queries at a time against blocks of rows sized so that one block's scores
    stay under 64 MiB, keeping a running top k (each row of the database is read once per query chunk)."""
    data = self._vectors[:len(self._ids)]
    results = []
    for start in range(0, queries.shape[0], _EXACT_QUERY_CHUNK):
      chunk = queries[start:start + _EXACT_QUERY_CHUNK]
      block = max(k, _EXACT_CHUNK_SCORES // chunk.shape[0])
      best_scores, best_rows = None, None
      for first in range(0, data.shape[0], block):
        scores = chunk @ data[first:first + block].T  # [chunk, block]
        rows = np.broadcast_to(np.arange(first, first + scores.shape[1]), scores.shape)
        scores, rows = _top_k(scores, rows, k)
        if best_scores is not None:  # merge with the best so far: [chunk, 2k] -> [chunk, k]
          scores, rows = _top_k(np.concatenate([best_scores, scores], axis=1),
                                np.concatenate([best_rows, rows], axis=1), k)
        best_scores, best_rows = scores, rows
      results += self._ranked(best_scores, best_rows, min_score)
    return results

  def _ranked(self, scores: np.ndarray, rows: np.ndarray, min_score: float) -> list[list[tuple[str, float]]]:
    """`scores [q, m]` of `rows [q, m]` as `(id, score)` lists, score descending then by row, keeping scores >=
    `min_score` (NaN, a missing candidate, never is)."""
    order = np.lexsort((rows, -scores), axis=1)
    rows = np.take_along_axis(rows, order, axis=1).tolist()
    scores = np.take_along_axis(scores, order, axis=1).tolist()
    return [[(self._ids[r], s) for r, s in zip(row_ids, row_scores) if s >= min_score]
            for row_ids, row_scores in zip(rows, scores)]

  def _search_scann(self, queries: np.ndarray, k: int, min_score: float) -> list[list[tuple[str, float]]]:
    """ScaNN's best `reorder` candidates by AH score (k <= reorder here), re-scored exactly against the stored
    vectors in chunks of queries, the best k kept."""
    depth = self.params.reorder
    batch = max(1, min(1024, math.ceil(queries.shape[0] / self.threads)))  # one batch per thread
    rows, approximate = self._searcher.search_batched(
        queries, depth, depth, self.params.leaves_to_search(max(self._built_size, 1)), True, batch)
    missing = ~np.isfinite(np.asarray(approximate))  # ScaNN pads a short answer with NaN scores
    rows = np.where(missing, 0, np.asarray(rows, np.intp))  # and with rows that say nothing

    def rescore(start: int) -> list[list[tuple[str, float]]]:
      chunk = slice(start, start + _RESCORE_QUERY_CHUNK)
      candidates = np.take(self._vectors, rows[chunk], axis=0)  # [chunk, depth, dim] float32
      scores = np.einsum("qd,qcd->qc", queries[chunk], candidates)
      scores[missing[chunk]] = np.nan  # sorted last, and `>= min_score` drops it
      return self._ranked(*_top_k(scores, rows[chunk], k), min_score)

    # Gathering random rows is bound by memory latency: threads overlap it (numpy releases the GIL there).
    starts = range(0, queries.shape[0], _RESCORE_QUERY_CHUNK)
    if len(starts) > 1 and self.threads > 1:
      if self._rescorers is None:
        self._rescorers = ThreadPoolExecutor(self.threads, thread_name_prefix="vector-index")
      parts = self._rescorers.map(rescore, starts)
    else:
      parts = map(rescore, starts)
    return [hits for part in parts for hits in part]
