"""ExperiencePool: commit then retrieve, counting, dedup scores, deletes, rewinds, reloads after another writer,
retrievals concurrent with commits seeing each commit whole or not at all, and restores from snapshots that leave
the embedding cache out."""

import sqlite3
import threading
import zlib

import numpy as np
import pytest

from evolver.experience import pool as pool_lib
from evolver.experience.index import VectorIndex
from evolver.experience.pool import ExperiencePool
from evolver.experience.records import ExperienceError, TaskMemory
from evolver.experience.store import ExperienceStore


class HashingEmbedder:
  """Each word adds 1 to one of `dim` buckets (crc32: the same in every process); rows L2-normalised."""

  name = "test-hashing-64"
  dim = 64

  def __init__(self):
    self.calls = 0
    self.texts = 0

  def embed(self, texts):
    self.calls += 1
    self.texts += len(texts)
    out = np.zeros((len(texts), self.dim), np.float32)
    for row, text in enumerate(texts):
      for word in text.lower().split():
        out[row, zlib.crc32(word.encode()) % self.dim] += 1.0
    return out / np.linalg.norm(out, axis=1, keepdims=True)


TOPICS = {
    "craft": "when crafting planks from oak logs at a workbench",
    "maze": "when a maze corridor ends in a dead end wall",
    "sql": "when a sql query joins two tables on a key",
    "web": "when a shopping website search shows no results",
}


def memory(ws, key, **kwargs):
  return TaskMemory(ws, TOPICS[key], f"advice about {key}", memory_id=key, **kwargs)


@pytest.fixture
def store(tmp_path):
  return ExperienceStore(str(tmp_path / "pool"))


@pytest.fixture
def pool(store):
  return ExperiencePool(store, "ws", HashingEmbedder())


def top_ids(results):
  return [[m.memory_id for m, _ in row] for row in results]


def test_commit_then_retrieve_finds_it(pool):
  assert pool.size == 0 and pool.retrieve(["crafting planks"], 3) == [[]]
  assert pool.commit([memory("ws", k) for k in TOPICS]) == list(TOPICS)
  assert pool.size == 4
  results = pool.retrieve(["crafting oak planks", "the maze corridor is a dead end"], 2)
  assert [row[0][0].memory_id for row in results] == ["craft", "maze"]
  record, score = results[0][0]
  assert record.content == "advice about craft" and record.workspace_id == "ws" and 0 < score <= 1
  assert all([s for _, s in row] == sorted((s for _, s in row), reverse=True) for row in results)
  assert pool.workspace.get(["craft"])[0].metadata["freq"] == 0  # not counted unless asked


def test_retrieve_counts_only_when_asked(pool):
  pool.commit([memory("ws", k) for k in TOPICS])
  pool.retrieve(["crafting planks", "oak logs workbench"], 1, count=True)
  pool.retrieve(["crafting planks"], 1)
  results = pool.retrieve(["crafting planks"], 1, count=True)
  assert results[0][0][0].metadata["freq"] == 3  # two queries, then one more; returned after the bump
  assert not pool.stale  # counters do not touch the index
  pool.workspace.bump(["craft"], utility=1)  # e.g. the service crediting a retrieval
  assert not pool.stale and pool.workspace.get(["craft"])[0].metadata["utility"] == 1
  pool.workspace.delete(["maze"])  # behind the index's back
  assert pool.stale


def test_min_score_and_top_k_limit_hits(store):
  pool = ExperiencePool(store, "ws", HashingEmbedder(), min_score=0.5)
  pool.commit([memory("ws", k) for k in TOPICS])
  assert pool.retrieve(["completely unrelated words here"], 4) == [[]]
  assert top_ids(pool.retrieve([TOPICS["sql"]], 4)) == [["sql"]]
  with pytest.raises(ExperienceError, match="one string"):
    pool.retrieve("crafting", 1)


def test_similar_scores_for_dedup(pool):
  assert pool.similar(["anything at all"], 0.5) == [-1.0]  # empty pool
  pool.commit([memory("ws", k) for k in TOPICS])
  same, unrelated = pool.similar([TOPICS["web"], "zebra quantum violin"], 0.5)
  assert same == pytest.approx(1.0, abs=1e-5) and unrelated == -1.0
  assert pool.similar(["zebra quantum violin"], -1.0)[0] > -1.0


def test_delete_and_threshold_deletion_reach_the_index(pool):
  pool.commit([memory("ws", k, metadata={"freq": 10, "utility": 1 if k == "web" else 9}) for k in TOPICS])
  assert pool.delete(["maze", "absent"]) == 1 and pool.size == 3
  assert "maze" not in top_ids(pool.retrieve([TOPICS["maze"]], 4))[0]
  assert pool.delete_by_thresholds(5, 0.5) == ["web"] and pool.size == 2
  assert "web" not in top_ids(pool.retrieve([TOPICS["web"]], 4))[0]
  assert {m.memory_id for m in pool.workspace.all()} == {"craft", "sql"}


def test_rewind_restores_the_pool_at_a_step(pool):
  pool.commit([memory("ws", "craft")], step=1)
  pool.commit([memory("ws", "maze")], step=2)
  pool.commit([memory("ws", "sql"), memory("ws", "web")], step=3)
  pool.delete(["craft"], step=3)
  assert pool.size == 3
  assert pool.rewind(1) == 3 and pool.size == 1
  assert top_ids(pool.retrieve([TOPICS["sql"], TOPICS["craft"]], 4)) == [["craft"], ["craft"]]
  assert sorted(m.memory_id for m in pool.workspace.set_aside()) == ["maze", "sql", "web"]


def test_reload_sees_another_writer_and_reuses_cached_embeddings(store):
  embedder = HashingEmbedder()
  pool = ExperiencePool(store, "ws", embedder)
  pool.commit([memory("ws", k) for k in ("craft", "maze")])
  other = ExperiencePool(store, "ws", HashingEmbedder())  # e.g. the service, in another process
  assert other.size == 2
  other.commit([memory("ws", "sql")])
  assert pool.stale and pool.size == 2
  texts_before = embedder.texts
  pool.reload()
  assert not pool.stale and pool.size == 3 and embedder.texts == texts_before  # all three were cached
  assert top_ids(pool.retrieve([TOPICS["sql"]], 1)) == [["sql"]]
  fresh = HashingEmbedder()
  reopened = ExperiencePool(store, "ws", fresh)  # a restart: the index is rebuilt from the store
  assert reopened.size == 3 and fresh.calls == 0


def test_bad_commits_change_nothing(store, pool):
  with pytest.raises(ExperienceError, match="belongs to workspace 'other'"):
    pool.commit([memory("ws", "craft"), memory("other", "maze")])
  assert pool.size == 0 and pool.workspace.count() == 0

  class Broken(HashingEmbedder):
    def embed(self, texts):
      return super().embed(texts)[:, :10]

  broken = ExperiencePool(store, "ws", Broken())
  with pytest.raises(ExperienceError, match=r"returned shape \(1, 10\)"):
    broken.commit([memory("ws", "craft")])
  assert broken.workspace.count() == 0


def test_the_pool_can_run_on_a_scann_index(store):
  embedder = HashingEmbedder()
  rng = np.random.default_rng(0)
  words = [f"w{i}" for i in range(400)]
  memories = [TaskMemory("ws", " ".join(rng.choice(words, 6)), "c", memory_id=f"m{i}") for i in range(1500)]
  pool = ExperiencePool(store, "ws", embedder, min_score=-1.0, index=VectorIndex(embedder.dim, exact_threshold=1000))
  pool.commit(memories)
  assert pool._index.mode == "scann"
  hits = pool.retrieve([memories[7].when_to_use], 3)
  assert hits[0][0][0].when_to_use == memories[7].when_to_use
  pool.reload()
  assert pool._index.mode == "scann" and pool.size == 1500


def test_retrievals_concurrent_with_commits_see_whole_commits(pool):
  batch, batches = 20, 30
  seen_sizes = []
  errors = []
  done = threading.Event()

  def commit():
    try:
      for b in range(batches):
        pool.commit([TaskMemory("ws", f"batch{b} item{i} shared words", "c", memory_id=f"b{b}-{i}")
                     for i in range(batch)], step=b)
    except Exception as e:  # surfaced below
      errors.append(e)
    finally:
      done.set()

  def retrieve():
    while not done.is_set():
      (row,) = pool.retrieve(["shared words"], 10_000)
      counts = {}
      for record, _ in row:
        key = record.memory_id.split("-")[0]
        counts[key] = counts.get(key, 0) + 1
      if any(c != batch for c in counts.values()):
        errors.append(AssertionError(f"a half commit was visible: {counts}"))
      seen_sizes.append(len(row))

  pool.min_score = -1.0
  threads = [threading.Thread(target=commit), threading.Thread(target=retrieve)]
  for t in threads:
    t.start()
  for t in threads:
    t.join(timeout=120)
  assert not errors, errors[:1]
  assert pool.size == batch * batches and len(seen_sizes) > 1
  assert all(size % batch == 0 for size in seen_sizes)


def many_memories(n: int, seed: int = 0) -> list[TaskMemory]:
  rng = np.random.default_rng(seed)
  words = [f"w{i}" for i in range(300)]
  return [TaskMemory("ws", " ".join(rng.choice(words, 6)), f"c{i}", memory_id=f"m{i}") for i in range(n)]


@pytest.mark.parametrize("threshold", [10_000, 500])
def test_a_pool_restored_from_a_snapshot_retrieves_exactly_what_the_original_did(tmp_path, threshold):
  embedder = HashingEmbedder()
  make = lambda root, e: ExperiencePool(ExperienceStore(str(tmp_path / root)), "ws", e, min_score=-1.0,
                                        index=VectorIndex(e.dim, exact_threshold=threshold))
  pool = make("a", embedder)
  memories = many_memories(800)
  for step in range(4):
    pool.commit(memories[step * 200:(step + 1) * 200], step=step)
  pool.delete([f"m{i}" for i in range(0, 800, 7)], step=3)
  pool.reload()  # the original's index built as a restored one is (a ScaNN tree depends on the build)
  queries = [m.when_to_use for m in many_memories(30, seed=1)] + [memories[5].when_to_use]
  expected = [[(m.memory_id, s) for m, s in row] for row in pool.retrieve(queries, 10)]
  image = pool.workspace.snapshot()
  conn = sqlite3.connect(":memory:")
  conn.deserialize(image)
  assert conn.execute("SELECT COUNT(*) FROM vectors").fetchone() == (0,)

  fresh = HashingEmbedder()
  restored = make("b", fresh)  # another machine: an empty store
  restored.restore(image)
  assert restored.size == pool.size == 800 - 115 and fresh.texts == 800 - 115  # every when_to_use re-embedded
  assert [[(m.memory_id, s) for m, s in row] for row in restored.retrieve(queries, 10)] == expected

  pool.commit(many_memories(50, seed=2), step=4)
  calls = embedder.texts
  pool.restore(image)  # in place: the cache it kept covers every text
  assert embedder.texts == calls and not pool.stale
  assert [[(m.memory_id, s) for m, s in row] for row in pool.retrieve(queries, 10)] == expected


def test_reload_embeds_only_what_the_cache_lacks_in_batches(store, monkeypatch):
  embedder = HashingEmbedder()
  pool = ExperiencePool(store, "ws", embedder, min_score=-1.0)
  memories = many_memories(30)
  pool.commit(memories)
  queries = [m.when_to_use for m in memories[:5]]
  expected = pool.retrieve(queries, 5)
  lost = [m.when_to_use for m in memories[3:10]]
  with pool.workspace._write() as conn:
    conn.executemany("DELETE FROM vectors WHERE text = ?", [(t,) for t in lost])
  monkeypatch.setattr(pool_lib, "EMBED_BATCH", 3)
  calls, texts = embedder.calls, embedder.texts
  pool.reload()
  assert (embedder.calls - calls, embedder.texts - texts) == (3, 7)  # 7 texts, 3 at a time
  assert pool.retrieve(queries, 5) == expected
  assert pool.workspace.cached_vectors(embedder.name, lost, embedder.dim)[1].all()  # cached again


def test_a_failed_reload_leaves_the_pool_empty_and_stale(store):
  class Failing(HashingEmbedder):
    fail = False

    def embed(self, texts):
      if self.fail:
        raise RuntimeError("embedder down")
      return super().embed(texts)

  embedder = Failing()
  pool = ExperiencePool(store, "ws", embedder)
  pool.commit([memory("ws", k) for k in TOPICS])
  with pool.workspace._write() as conn:
    conn.execute("DELETE FROM vectors")
  embedder.fail = True
  with pytest.raises(RuntimeError, match="embedder down"):
    pool.reload()
  assert pool.size == 0 and pool.stale
  embedder.fail = False
  pool.reload()
  assert pool.size == 4 and not pool.stale
