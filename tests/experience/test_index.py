"""VectorIndex: exact below the threshold, ScaNN above it (recall against exact on clustered data), upserts and
deletes by id, small and empty indexes, drift rebuilds, determinism, refused inputs."""

import numpy as np
import pytest

from evolver.experience.index import ScannParams, VectorIndex
from evolver.experience.records import ExperienceError

DIM = 32


def unit(x: np.ndarray) -> np.ndarray:
  return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


def clustered(n: int, seed: int, clusters: int = 20, noise: float = 1.0) -> np.ndarray:
  """A mixture of Gaussians around `clusters` fixed unit centres (the same centres for every seed)."""
  centres = unit(np.random.default_rng(1234).standard_normal((clusters, DIM)))
  rng = np.random.default_rng(seed)
  labels = rng.integers(0, clusters, n)
  return unit(centres[labels] + rng.standard_normal((n, DIM)) * noise / np.sqrt(DIM))


def names(n: int, prefix: str = "v") -> list[str]:
  return [f"{prefix}{i}" for i in range(n)]


def brute_force(data: np.ndarray, queries: np.ndarray, k: int) -> list[list[int]]:
  return np.argsort(-(queries @ data.T), axis=1, kind="stable")[:, :k].tolist()


def test_exact_below_the_threshold_matches_brute_force():
  data, queries = clustered(500, 0), clustered(20, 1)
  index = VectorIndex(DIM)
  index.upsert(names(500), data)
  assert index.mode == "exact" and len(index) == 500
  hits = index.search(queries, 5)
  assert [[int(i[1:]) for i, _ in row] for row in hits] == brute_force(data, queries, 5)
  scores = queries @ data.T
  for q, row in enumerate(hits):
    assert [s for _, s in row] == pytest.approx([scores[q, int(i[1:])] for i, _ in row], abs=1e-6)
    assert [s for _, s in row] == sorted((s for _, s in row), reverse=True)


def test_equal_scores_are_listed_by_row():
  index = VectorIndex(DIM)
  same = unit(np.ones((4, DIM)))
  index.upsert(["d", "c", "b", "a"], same)
  assert [i for i, _ in index.search(same[:1], 4)[0]] == ["d", "c", "b", "a"]


def test_empty_and_tiny_indexes_return_fewer_hits():
  index = VectorIndex(DIM)
  queries = clustered(3, 1)
  assert index.search(queries, 10) == [[], [], []]
  index.upsert(names(2), clustered(2, 0))
  assert [len(row) for row in index.search(queries, 10)] == [2, 2, 2]
  assert index.search(queries, 0) == [[], [], []]
  assert index.search(np.zeros((0, DIM), np.float32), 4) == []


def test_min_score_filters_hits():
  index = VectorIndex(DIM)
  basis = np.eye(DIM, dtype=np.float32)
  index.upsert(["x", "y"], basis[:2])
  query = unit(np.array([[1.0, 0.5] + [0.0] * (DIM - 2)]))
  assert [i for i, _ in index.search(query, 2, min_score=0.0)[0]] == ["x", "y"]
  assert [i for i, _ in index.search(query, 2, min_score=0.5)[0]] == ["x"]
  assert index.search(query, 2, min_score=0.95)[0] == []


@pytest.mark.parametrize("threshold", [10_000, 200])
def test_upsert_replaces_and_delete_removes_by_id(threshold):
  data = clustered(600, 0)
  index = VectorIndex(DIM, exact_threshold=threshold)
  index.upsert(names(600), data)
  assert index.mode == ("exact" if threshold > 600 else "scann")
  new = clustered(1, 99)
  index.upsert(["v7", "fresh"], np.concatenate([new, new]))
  assert len(index) == 601
  top = index.search(new, 2)[0]
  assert {i for i, _ in top} == {"v7", "fresh"} and top[0][1] == pytest.approx(1.0, abs=1e-5)
  assert index.delete(["v7", "v8", "absent", "v8"]) == 2 and len(index) == 599
  assert "v7" not in index and "v9" in index
  everything = {i for row in index.search(clustered(50, 5), 100) for i, _ in row}
  assert not everything & {"v7", "v8"}
  index.upsert(["dup", "dup"], np.concatenate([data[:1], new]))  # the later duplicate wins
  assert {i for i, _ in index.search(new, 2)[0]} == {"dup", "fresh"} and len(index) == 600
  assert sorted(index.ids) == sorted(set(names(600)) - {"v7", "v8"} | {"fresh", "dup"})


def test_scann_above_the_threshold_has_high_recall_on_clustered_data():
  data, queries = clustered(6000, 0), clustered(200, 1)
  index = VectorIndex(DIM, exact_threshold=2000)
  index.upsert(names(6000), data)
  assert index.mode == "scann" and index.builds == 1
  approximate = index.search(queries, 10)
  exact = index.search(queries, 10, exact=True)
  recall = np.mean([len({i for i, _ in a} & {i for i, _ in e}) / 10 for a, e in zip(approximate, exact)])
  assert recall >= 0.95
  assert [i for i, _ in exact[0]] == [f"v{j}" for j in brute_force(data, queries, 10)[0]]
  for row in approximate:  # reordered scores are exact dot products
    for memory_id, score in row:
      assert score == pytest.approx(float(data[int(memory_id[1:])] @ queries[approximate.index(row)]), abs=1e-4)


def test_scann_defers_to_exact_for_a_k_beyond_its_reorder_depth():
  data, queries = clustered(3000, 0), clustered(5, 1)
  index = VectorIndex(DIM, exact_threshold=1000, params=ScannParams(reorder=20))
  index.upsert(names(3000), data)
  assert index.search(queries, 50) == index.search(queries, 50, exact=True)


def test_drift_triggers_a_rebuild_and_shrinking_returns_to_exact():
  index = VectorIndex(DIM, exact_threshold=1000, drift_fraction=0.2)
  index.upsert(names(1200), clustered(1200, 0))
  assert (index.mode, index.builds) == ("scann", 1)
  index.upsert(names(200, "a"), clustered(200, 1))  # 200 changes <= 0.2 * 1200
  assert index.builds == 1
  index.delete(names(50, "a"))  # 250 > 240: rebuilt from scratch
  assert index.builds == 2 and len(index) == 1350
  queries = clustered(30, 2)
  assert index.search(queries, 5) == rebuilt_copy(index).search(queries, 5)
  index.delete(names(1000))  # 350 left < 1000 // 2: exact again
  assert (index.mode, index.builds) == ("exact", 2) and len(index) == 350


def rebuilt_copy(index: VectorIndex) -> VectorIndex:
  copy = VectorIndex(index.dim, exact_threshold=index.exact_threshold, params=index.params)
  copy.upsert(index.ids, index.vectors())
  return copy


def test_results_are_deterministic():
  data, queries = clustered(3000, 0), clustered(50, 1)
  runs = []
  for _ in range(2):
    index = VectorIndex(DIM, exact_threshold=1000)
    index.upsert(names(3000), data)
    index.upsert(names(100, "n"), clustered(100, 3))
    index.delete(names(40))
    runs.append(index.search(queries, 10))
  assert runs[0] == runs[1]


def test_bad_inputs_are_refused():
  index = VectorIndex(DIM)
  with pytest.raises(ExperienceError, match=r"row 1 has norm 2"):
    index.upsert(["a", "b"], np.stack([unit(np.ones(DIM)), 2 * unit(np.ones(DIM))]))
  with pytest.raises(ExperienceError, match=r"must be \[n, 32\], got shape \(2, 8\)"):
    index.upsert(["a", "b"], np.ones((2, 8)))
  with pytest.raises(ExperienceError, match="2 ids but 1 vectors"):
    index.upsert(["a", "b"], unit(np.ones((1, DIM))))
  with pytest.raises(ExperienceError, match="unit-norm and finite: row 0"):
    index.search(np.zeros((1, DIM)), 3)
  with pytest.raises(ExperienceError, match="k must be a non-negative int"):
    index.search(unit(np.ones((1, DIM))), -1)
  assert len(index) == 0


def test_scann_keeps_no_float_copy_and_follows_upserts_and_deletes_row_for_row():
  # Every leaf searched and a deep reorder: whatever ScaNN holds at a row is what the index re-scores there, so a
  # vector searched for itself comes first only if the two agree on its row after the mutations.
  params = ScannParams(search_fraction=1.0, reorder=200)
  index = VectorIndex(DIM, exact_threshold=1000, drift_fraction=10.0, params=params)
  data = clustered(1500, 0)
  index.upsert(names(1500), data)
  assert index.mode == "scann" and "exact_reordering" not in index._searcher.config()  # AH codes only
  fresh = clustered(6, 7)
  index.upsert(["v3", "n0", "v1499", "n1", "n2", "v40"], fresh)  # replacements and appends interleaved
  assert index.delete(["v10", "n1", "v1498", "v10", "absent", "n2", "v0"]) == 5  # holes filled from the end
  later = clustered(2, 8)
  index.upsert(["n3", "v11"], later)
  assert index.builds == 1 and index._searcher.size() == len(index) == 1500 + 3 - 5 + 1
  stored = dict(zip(index.ids, index.vectors()))
  assert np.array_equal(stored["n3"], later[0]) and np.array_equal(stored["v40"], fresh[5])
  probe = sorted(stored)
  hits = index.search(np.stack([stored[i] for i in probe]), 1)
  assert [row[0][0] for row in hits] == probe
  queries = clustered(40, 3)
  assert [[i for i, _ in row] for row in index.search(queries, 10)] == \
      [[i for i, _ in row] for row in index.search(queries, 10, exact=True)]


def test_fill_takes_the_matrix_as_its_own_and_answers_like_upsert():
  data, queries = clustered(1200, 0), clustered(30, 1)
  for threshold in (10_000, 1000):
    filled, upserted = VectorIndex(DIM, exact_threshold=threshold), VectorIndex(DIM, exact_threshold=threshold)
    matrix = data.copy()
    filled.fill(names(1200), matrix)
    upserted.upsert(names(1200), data)
    assert np.shares_memory(filled.vectors(), matrix) and filled.ids == names(1200)
    assert filled.mode == upserted.mode == ("exact" if threshold > 1200 else "scann")
    assert filled.search(queries, 10) == upserted.search(queries, 10)
    filled.upsert(["late"], data[:1])
    assert filled.search(data[:1], 2)[0][0][1] == pytest.approx(1.0, abs=1e-5) and len(filled) == 1201
  with pytest.raises(ExperienceError, match="fill needs an empty index"):
    filled.fill(["x"], data[:1])
  with pytest.raises(ExperienceError, match="'a' appears more than once"):
    VectorIndex(DIM).fill(["a", "b", "a"], data[:3])
  with pytest.raises(ExperienceError, match="2 ids but 3 vectors"):
    VectorIndex(DIM).fill(["a", "b"], data[:3])
