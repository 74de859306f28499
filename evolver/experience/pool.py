"""ExperiencePool: one workspace of the store, a VectorIndex over its `when_to_use` embeddings, and an embedder.

The store is the source of truth; the index is rebuilt from it on open (`reload`), after a rewind, and whenever
asked (e.g. after another process wrote: `stale` says so). Embeddings are cached in the workspace's database per
embedder name, so a reload re-embeds only texts it has not seen. Measured on 2 busy CPUs with 384-d vectors: opening
a pool of 10,000 records (the cached vectors and the index, which at 10,000 is a ScaNN build of ~1 s) took 1.2 s;
below 10,000 records the index is exact and a reload takes about as long as reading the records. A cold reload (no
cached vectors) first embeds every `when_to_use`, EMBED_BATCH texts a call, which is the embedder's cost (MiniLM on
a CPU: tens of seconds for 10,000 texts; the hashing embedder at 384-d: 3 s).

Memory: each vector is held once, in the index (`VectorIndex`). A reload drops the old index first, streams the
cached vectors from SQLite straight into one matrix (`Workspace.live_embeddings`: no list of per-row arrays, no
TaskMemory objects) and hands that matrix to the new index (`VectorIndex.fill`: no copy). Opening a pool of 100,000
records (384-d, ScaNN), resident growth per record: 1,956 bytes after, 5,422 before (the cache rows read into a
dict, the array made from them, the index's copy of it, ScaNN's own copy); the peak while opening, 8,037 bytes (was
11,082), and while reloading a full pool (a rewind, a restore), 8,099 (was 14,542): what is left of it is ScaNN's
build.

Snapshots (`Workspace.snapshot`, what an RL checkpoint keeps) leave the embedding cache out. `restore` keeps the
workspace's own cache (a cached vector is the embedding of a text, valid whatever the records), so the reload that
follows re-embeds only the `when_to_use`s no cache holds: none when restoring in place, all of them on a machine
whose store lacks the workspace. A snapshot of 10,000 memories (384-d hashing embedder; 12-word when_to_use, 40-word
content, committed 500 a step): 8,249,344 bytes (7.9 MiB), against 30,593,024 (29.2 MiB) with the cache.

Thread safety: one lock. A commit writes the store (one transaction) and upserts the index under it, and a
retrieval searches and reads the store under it, so a retrieval sees a commit entirely or not at all. Embedding
happens outside the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from evolver.experience.index import VectorIndex, check_vectors
from evolver.experience.records import Embedder, ExperienceError, TaskMemory
from evolver.experience.store import ExperienceStore, Workspace

EMBED_BATCH = 4096  # texts per embedder call when a reload embeds what the cache lacks


class ExperiencePool:
  """Commit and retrieve task memories of one workspace."""

  def __init__(self, store: ExperienceStore, workspace_id: str, embedder: Embedder, *, min_score: float = 0.0,
               index: VectorIndex | None = None):
    """
    Args:
      store: where the workspace lives (created if missing).
      workspace_id: which workspace.
      embedder: texts -> unit-norm `[n, embedder.dim]` vectors.
      min_score: the lowest cosine `retrieve` returns.
      index: an empty VectorIndex to fill (to choose its thresholds); default VectorIndex(embedder.dim).
    """
    if index is not None and (len(index) or index.dim != embedder.dim):
      raise ExperienceError(f"the pool needs an empty index of dim {embedder.dim}, got {len(index)} vectors of "
                            f"dim {index.dim}")
    self.embedder = embedder
    self.min_score = float(min_score)
    self.workspace: Workspace = store.open(workspace_id)
    self._lock = threading.RLock()
    self._index = index if index is not None else VectorIndex(embedder.dim)
    self._version = -1
    self.reload()

  @property
  def workspace_id(self) -> str:
    return self.workspace.id

  @property
  def size(self) -> int:
    """Records the index holds (what `retrieve` can return)."""
    with self._lock:
      return len(self._index)

  @property
  def stale(self) -> bool:
    """Whether records were added, replaced or removed behind the index's back (by another process, or through
    `workspace` directly): `reload()` then. Freq/utility bumps do not make the pool stale."""
    with self._lock:
      return self.workspace.content_version != self._version

  def _synced(self) -> None:
    """After this pool's own write: still in sync only if nobody else wrote since the index was synced."""
    change = self.workspace.last_content_change
    if change is not None and change[0] == self._version:
      self._version = change[1]

  # ----------------------------------------------------------------------------------------------------------
  # Embedding.
  # ----------------------------------------------------------------------------------------------------------

  def _embed(self, texts: Sequence[str]) -> np.ndarray:
    """`[len(texts), dim]` unit-norm float32 from the embedder, checked before anything is written."""
    if not texts:
      return np.zeros((0, self.embedder.dim), np.float32)
    vectors = np.asarray(self.embedder.embed(list(texts)), np.float32)
    if vectors.shape != (len(texts), self.embedder.dim):
      raise ExperienceError(f"embedder {self.embedder.name!r} returned shape {vectors.shape} for {len(texts)} "
                            f"texts; expected ({len(texts)}, {self.embedder.dim})")
    return check_vectors(vectors, self.embedder.dim, f"embeddings from {self.embedder.name!r}")

  def _embed_missing(self, vectors: np.ndarray, missing: Sequence[tuple[int, str]]) -> None:
    """Embeds the `(row, text)`s the cache lacked into `vectors [n, dim]`, and caches them, EMBED_BATCH texts a
    call (so a cold reload never holds a second [n, dim] array)."""
    for start in range(0, len(missing), EMBED_BATCH):
      rows, texts = zip(*missing[start:start + EMBED_BATCH])
      fresh = self._embed(texts)
      vectors[list(rows)] = fresh
      self.workspace.cache_vectors(self.embedder.name, texts, fresh)

  # ----------------------------------------------------------------------------------------------------------
  # Reads.
  # ----------------------------------------------------------------------------------------------------------

  def retrieve(self, queries: Sequence[str], top_k: int, *, count: bool = False,
               step: int | None = None) -> list[list[tuple[TaskMemory, float]]]:
    """The `top_k` records whose `when_to_use` best matches each query (cosine >= min_score), best first.

    Args:
      queries: query texts (one batched embedding and one batched search).
      top_k: hits per query (fewer when the pool is small).
      count: add 1 to `metadata["freq"]` of each record returned, per query that returned it (ReMe's
        retrieval count); `step` logs the bump so a rewind can undo it.
      step: the RL step retrieving (only with count).

    Returns:
      One list per query of `(record, score)`.
    """
    if isinstance(queries, str):
      raise ExperienceError("retrieve takes a sequence of query texts, got one string")
    vectors = self._embed(queries)
    with self._lock:
      hits = self._index.search(vectors, top_k, self.min_score)
      returned = [memory_id for row in hits for memory_id, _ in row]
      if count and returned:
        self.workspace.bump(returned, freq=1, step=step)
      records = {m.memory_id: m for m in self.workspace.get(list(dict.fromkeys(returned)))}
    return [[(records[i], score) for i, score in row if i in records] for row in hits]

  def similar(self, texts: Sequence[str], threshold: float) -> list[float]:
    """For deduplication: the best cosine of each text against the pool's `when_to_use`s, or -1.0 (the lowest
    cosine) when no record reaches `threshold` (or the pool is empty). Counts nothing."""
    if isinstance(texts, str):
      raise ExperienceError("similar takes a sequence of texts, got one string")
    vectors = self._embed(texts)
    with self._lock:
      hits = self._index.search(vectors, 1, float(threshold))
    return [row[0][1] if row else -1.0 for row in hits]

  # ----------------------------------------------------------------------------------------------------------
  # Writes.
  # ----------------------------------------------------------------------------------------------------------

  def commit(self, memories: Sequence[TaskMemory], *, step: int | None = None) -> list[str]:
    """Embeds the memories' `when_to_use`, writes them to the store (one transaction: insert or replace by id)
    and upserts the index, atomically for `retrieve`. Returns their ids."""
    memories = list(memories)
    if not memories:
      return []
    texts = [m.when_to_use for m in memories]
    vectors = self._embed(texts)
    with self._lock:
      ids = self.workspace.put(memories, step=step)
      try:
        self._index.upsert(ids, vectors)
      except BaseException:
        self._version = -1  # the store took the commit and the index did not: `stale` until `reload()`
        raise
      self._synced()
    self.workspace.cache_vectors(self.embedder.name, texts, vectors)
    return ids

  def delete(self, ids: Sequence[str], *, step: int | None = None) -> int:
    """Deletes `ids` from the store (soft with a step: a rewind restores them) and the index. Returns how many
    live records went."""
    with self._lock:
      deleted = self.workspace.delete(ids, step=step)
      self._index.delete(ids)
      self._synced()
    return deleted

  def delete_by_thresholds(self, freq_min: int, utility_ratio_min: float, *, step: int | None = None) -> list[str]:
    """ReMe's delete flow (`Workspace.delete_by_thresholds`), on the store and the index. Returns the ids."""
    with self._lock:
      ids = self.workspace.delete_by_thresholds(freq_min, utility_ratio_min, step=step)
      self._index.delete(ids)
      self._synced()
    return ids

  def rewind(self, step: int) -> int:
    """The pool as it was after RL step `step` (`Workspace.set_aside_after`), index rebuilt. Returns how many
    records were set aside."""
    with self._lock:
      moved = self.workspace.set_aside_after(step)
      self.reload()
    return moved

  def restore(self, image: bytes) -> None:
    """The workspace's records replaced by a `Workspace.snapshot` image (what a checkpoint kept), index rebuilt;
    the `when_to_use`s the workspace's cache lacks (snapshots hold no cache) are re-embedded."""
    with self._lock:
      self.workspace.restore(image)
      self.reload()

  def reload(self) -> None:
    """Rebuilds the index from the store (after a restart, a rewind or another process's writes): the cached
    embeddings stream into one matrix (`Workspace.live_embeddings`), the texts the cache lacks are embedded into
    it, and the new index takes it as its own (`VectorIndex.fill`). The old index is dropped first, so two sets of
    vectors are never held at once; a reload that fails (say the embedder) leaves the pool empty and `stale`."""
    with self._lock:
      self._index, self._version = self._empty_index(), -1
      version = self.workspace.content_version
      ids, vectors, missing = self.workspace.live_embeddings(self.embedder.name, self.embedder.dim)
      self._embed_missing(vectors, missing)
      index = self._empty_index()
      index.fill(ids, vectors)
      self._index, self._version = index, version

  def _empty_index(self) -> VectorIndex:
    """An empty index with the current one's settings."""
    return VectorIndex(self.embedder.dim, exact_threshold=self._index.exact_threshold,
                       drift_fraction=self._index.drift_fraction, params=self._index.params,
                       threads=self._index.threads)
