"""ExperienceStore: round trips, ReMe 0.2 JSONL libraries, refused workspace ids, concurrent writers, SIGKILL
mid-commit, freq/utility bookkeeping, step rewinds, snapshots without the embedding cache and the cache itself."""

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading

import numpy as np
import pytest

from evolver.experience.records import ExperienceError, TaskMemory
from evolver.experience.store import DB_NAME, ExperienceStore

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Lines in the spirit of ReMe 0.2's libraries (docs/library/appworld.jsonl): metadata with author and times.
REME_LINE = {"workspace_id": "appworld_8b_0725", "memory_id": "dd0b9a452acc4d85a8ebd519976a01ab",
             "memory_type": "task",
             "when_to_use": "When interacting with APIs that require authentication and multiple steps.",
             "content": "Always verify the API documentation for required parameters before executing code.",
             "score": 0.0, "time_created": "2025-07-24 21:15:17", "time_modified": "2025-07-24 21:15:17",
             "author": "qwen3-8b", "metadata": {"author": "qwen3-8b", "created_time": "2025-07-24 21:15:17",
                                                "modified_time": "2025-07-24 21:15:17", "extra_info": None}}


def memory(ws: str, i, **kwargs) -> TaskMemory:
  return TaskMemory(ws, f"when doing task {i}", f"do {i} carefully", memory_id=f"m{i}", **kwargs)


@pytest.fixture
def store(tmp_path):
  return ExperienceStore(str(tmp_path / "pool"))


def ids(memories):
  return [m.memory_id for m in memories]


def tree(path) -> list[str]:
  return sorted(os.path.relpath(os.path.join(d, name), path) for d, dirs, files in os.walk(path)
                for name in dirs + files)


# ------------------------------------------------------------------------------------------------------------
# Round trips and workspaces.
# ------------------------------------------------------------------------------------------------------------


def test_put_get_all_delete_round_trip(store):
  ws = store.open("ws")
  assert ws.count() == 0 and ws.all() == [] and ws.version == 0
  written = ws.put([memory("ws", i, score=0.5, metadata={"env": "maze"}) for i in range(3)])
  assert written == ["m0", "m1", "m2"] and ws.count() == 3 and ws.version == 1
  got = ws.get(["m2", "missing", "m0"])
  assert ids(got) == ["m2", "m0"]
  assert got[0].content == "do 2 carefully" and got[0].score == 0.5 and got[0].workspace_id == "ws"
  assert got[0].metadata == {"env": "maze", "freq": 0, "utility": 0, "committed_step": None}
  ws.put([TaskMemory("ws", "new when", "new content", memory_id="m1")])  # replace by id
  assert ws.count() == 3 and ws.get(["m1"])[0].content == "new content"
  assert ws.delete(["m0", "missing"]) == 1 and ids(ws.all()) == ["m2", "m1"]
  assert ws.delete(["missing"]) == 0 and ws.version == 3  # a no-op changes nothing
  ws.close()
  reopened = store.open("ws", create=False)
  assert reopened.version == 3 and ids(reopened.all()) == ["m2", "m1"]


def test_put_is_all_or_nothing_and_refuses_other_workspaces(store):
  ws = store.open("ws")
  with pytest.raises(ExperienceError, match="belongs to workspace 'other'"):
    ws.put([memory("ws", 0), memory("other", 1)])
  with pytest.raises(ExperienceError, match="item 1 is a dict"):
    ws.put([memory("ws", 0), {"memory_id": "x"}])
  with pytest.raises(ExperienceError, match=r"metadata\['freq'\]"):
    ws.put([memory("ws", 0), memory("ws", 1, metadata={"freq": -1})])
  assert ws.count() == 0 and ws.version == 0


def test_workspaces_copy_and_delete(store):
  assert store.workspaces() == []
  store.open("b").put([memory("b", 1)])
  store.open("a")
  assert store.workspaces() == ["a", "b"]
  copy = store.copy_workspace("b", "c")
  assert [m.workspace_id for m in copy.all()] == ["c"] and ids(copy.all()) == ["m1"]
  with pytest.raises(ExperienceError, match="already exists"):
    store.copy_workspace("b", "a")
  with pytest.raises(ExperienceError, match="no workspace 'zz'"):
    store.copy_workspace("zz", "d")
  assert store.delete_workspace("b") is True and store.delete_workspace("b") is False
  assert store.workspaces() == ["a", "c"]
  with pytest.raises(ExperienceError, match="no workspace 'b'"):
    store.open("b", create=False)
  assert store.open("c").count() == 1  # the copy outlives its source


BAD_IDS = ["../x", "a/b", "/abs", "..", "", "x" * 129, ".hidden", "a\\b", "a..b", None, 7]


@pytest.mark.parametrize("bad", BAD_IDS)
def test_bad_workspace_ids_are_refused_and_create_nothing(tmp_path, bad):
  store = ExperienceStore(str(tmp_path / "pool"))
  good = store.open("good")
  before = tree(tmp_path)
  for action in (lambda: store.open(bad), lambda: store.open(bad, create=False), lambda: store.delete_workspace(bad),
                 lambda: store.copy_workspace("good", bad), lambda: store.copy_workspace(bad, "dst")):
    with pytest.raises(ExperienceError, match="bad workspace_id"):
      action()
  assert tree(tmp_path) == before  # `../x` would have landed in tmp_path
  assert not os.path.exists("/abs")
  assert good.count() == 0


def test_a_refused_id_does_not_even_create_the_root(tmp_path):
  store = ExperienceStore(str(tmp_path / "never"))
  with pytest.raises(ExperienceError):
    store.open("../escape")
  assert os.listdir(tmp_path) == [] and store.workspaces() == []


# ------------------------------------------------------------------------------------------------------------
# ReMe 0.2 JSONL libraries.
# ------------------------------------------------------------------------------------------------------------


def test_import_reme_library_lines_and_export_round_trip(store, tmp_path):
  library = tmp_path / "lib.jsonl"
  own = {**REME_LINE, "memory_id": "b2", "when_to_use": "When a recipe needs planks.",
         "content": "Craft planks from logs first.", "metadata": {"freq": 3, "utility": 2}}
  library.write_text(json.dumps(REME_LINE) + "\n\n" + json.dumps(own, ensure_ascii=False) + "\n")
  ws = store.open("imported")
  assert ws.import_jsonl(str(library)) == 2
  first, second = ws.all()
  assert first.workspace_id == "imported" and first.memory_id == REME_LINE["memory_id"]
  assert first.author == "qwen3-8b" and first.time_created == "2025-07-24 21:15:17"
  assert first.metadata["extra_info"] is None and first.metadata["freq"] == 0
  assert second.metadata["freq"] == 3 and second.metadata["utility"] == 2

  out = tmp_path / "out.jsonl"
  assert ws.export_jsonl(str(out)) == 2
  lines = [json.loads(line) for line in out.read_text().splitlines()]
  assert [line["memory_id"] for line in lines] == [REME_LINE["memory_id"], "b2"]
  assert set(lines[0]) == set(REME_LINE)
  again = store.open("again")
  assert again.import_jsonl(str(out)) == 2
  assert [m.to_json() for m in again.all()] == [{**m.to_json(), "workspace_id": "again"} for m in ws.all()]


def test_import_a_json_list_library_like_remes_sample(store, tmp_path):
  library = tmp_path / "task_memory.jsonl"
  library.write_text(json.dumps([REME_LINE, {**REME_LINE, "memory_id": "second"}], indent=2))
  ws = store.open("demo")
  assert ws.import_jsonl(str(library)) == 2 and ids(ws.all()) == [REME_LINE["memory_id"], "second"]


def test_import_keeping_workspace_ids_refuses_a_foreign_record(store, tmp_path):
  library = tmp_path / "lib.jsonl"
  library.write_text(json.dumps({**REME_LINE, "workspace_id": "mine"}) + "\n" + json.dumps(REME_LINE) + "\n")
  ws = store.open("mine")
  with pytest.raises(ExperienceError, match="line 2: record of workspace 'appworld_8b_0725'"):
    ws.import_jsonl(str(library), workspace_id_override=False)
  assert ws.count() == 0


@pytest.mark.parametrize("bad_line, message", [
    ('{"workspace_id": "x", "when_to_use": "w"', "line 3: not valid JSON"),
    (json.dumps({**REME_LINE, "surprise": 1}), r"line 3: unknown task memory fields \['surprise'\]"),
    (json.dumps({k: v for k, v in REME_LINE.items() if k != "content"}), r"line 3: a task memory needs \['content'\]"),
    (json.dumps({**REME_LINE, "content": "  "}), "line 3: a task memory needs a non-empty string 'content'"),
    (json.dumps({**REME_LINE, "memory_type": "personal"}), "line 3: memory_type must be 'task'"),
    (json.dumps({**REME_LINE, "metadata": {"freq": "often"}}), r"line 3: metadata\['freq'\] must be"),
    ("[1, 2]", "line 3: a task memory must be a JSON object"),
])
def test_a_malformed_line_is_refused_with_its_number_and_nothing_is_imported(store, tmp_path, bad_line, message):
  library = tmp_path / "lib.jsonl"
  good = [json.dumps({**REME_LINE, "memory_id": f"g{i}"}) for i in range(3)]
  library.write_text("\n".join([good[0], good[1], bad_line, good[2]]) + "\n")
  ws = store.open("ws")
  with pytest.raises(ExperienceError, match=message):
    ws.import_jsonl(str(library))
  assert ws.count() == 0 and ws.version == 0


def test_a_malformed_json_list_names_the_item(store, tmp_path):
  library = tmp_path / "lib.json"
  library.write_text(json.dumps([REME_LINE, {"workspace_id": "x"}]))
  with pytest.raises(ExperienceError, match=r"item 1: a task memory needs \['when_to_use', 'content'\]"):
    store.open("ws").import_jsonl(str(library))


# ------------------------------------------------------------------------------------------------------------
# Concurrency and crashes.
# ------------------------------------------------------------------------------------------------------------

_WRITER = """
import sys
from evolver.experience.records import TaskMemory
from evolver.experience.store import ExperienceStore
root, tag, batches = sys.argv[1], sys.argv[2], int(sys.argv[3])
ws = ExperienceStore(root).open("shared")
print("READY", flush=True)
sys.stdin.readline()  # both start writing together
for b in range(batches):
  ws.put([TaskMemory("shared", f"when {tag} {b} {i}", "c", memory_id=f"{tag}-{b}-{i}") for i in range(5)])
  ws.bump([f"{tag}-0-0"], freq=1)
"""


def test_two_processes_writing_one_workspace_lose_nothing(store):
  store.open("shared").close()
  procs = [subprocess.Popen([sys.executable, "-c", _WRITER, store.root, tag, "60"], cwd=ROOT, text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE) for tag in "ab"]
  assert [p.stdout.readline().strip() for p in procs] == ["READY", "READY"]
  for p in procs:
    p.stdin.write("go\n")
    p.stdin.flush()
  assert [p.wait(timeout=120) for p in procs] == [0, 0]
  ws = store.open("shared")
  assert ws.count() == 2 * 60 * 5
  assert {m.memory_id for m in ws.all()} == {f"{t}-{b}-{i}" for t in "ab" for b in range(60) for i in range(5)}
  assert [m.metadata["freq"] for m in ws.get(["a-0-0", "b-0-0"])] == [60, 60]
  assert ws.version == 2 * 60 * 2


def test_threads_sharing_or_not_sharing_a_workspace_lose_nothing(store):
  shared = store.open("ws")

  def write(tag, ws):
    for b in range(30):
      ws.put([TaskMemory("ws", "w", "c", memory_id=f"{tag}-{b}-{i}") for i in range(3)])
      ws.bump(["t0-0-0"], freq=1)

  threads = [threading.Thread(target=write, args=(f"t{k}", shared if k < 2 else store.open("ws"))) for k in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert shared.count() == 4 * 30 * 3
  assert shared.get(["t0-0-0"])[0].metadata["freq"] >= 30 * 3  # every bump after t0's first put landed


_KILLED_INSIDE = """
import sys, time
from evolver.experience.records import TaskMemory
from evolver.experience.store import ExperienceStore
ws = ExperienceStore(sys.argv[1]).open("ws")
ws.put([TaskMemory("ws", f"when {i}", "committed", memory_id=f"ok{i}") for i in range(100)], step=1)

def batch():
  for i in range(5000):
    if i == 2500:
      print("INSIDE", flush=True)  # half the batch is written, the transaction is open
      time.sleep(600)
    yield TaskMemory("ws", f"when {i}", "x" * 500, memory_id=f"partial{i}")

ws.put(batch(), step=2)
"""


def test_sigkill_inside_a_put_keeps_committed_records_and_no_partial_batch(store):
  proc = subprocess.Popen([sys.executable, "-c", _KILLED_INSIDE, store.root], cwd=ROOT, stdout=subprocess.PIPE,
                          text=True)
  try:
    assert proc.stdout.readline().strip() == "INSIDE"
  finally:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
  ws = store.open("ws")
  assert ws._read("PRAGMA integrity_check") == [("ok",)]
  assert sorted(ids(ws.all())) == sorted(f"ok{i}" for i in range(100)) and ws.version == 1
  ws.put([memory("ws", 1)])  # and the workspace takes writes again
  assert ws.count() == 101


_KILLED_ANYWHERE = """
import sys
from evolver.experience.records import TaskMemory
from evolver.experience.store import ExperienceStore
ws = ExperienceStore(sys.argv[1]).open("ws")
b = 0
while True:
  ws.put([TaskMemory("ws", f"when {b} {i}", "y" * 2000, memory_id=f"b{b}-{i}") for i in range(400)], step=b)
  print(b, flush=True)
  b += 1
"""


@pytest.mark.slow
def test_sigkill_at_any_moment_leaves_whole_batches(store):
  proc = subprocess.Popen([sys.executable, "-c", _KILLED_ANYWHERE, store.root], cwd=ROOT, stdout=subprocess.PIPE,
                          text=True)
  acknowledged = -1
  try:
    for _ in range(6):  # kill it while it is (most likely) inside a commit of the next batch
      acknowledged = int(proc.stdout.readline())
  finally:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
  ws = store.open("ws")
  batches = {}
  for memory_id in ids(ws.all()):
    b = int(memory_id[1:].split("-")[0])
    batches[b] = batches.get(b, 0) + 1
  assert set(range(acknowledged + 1)) <= set(batches)
  assert all(count == 400 for count in batches.values())


# ------------------------------------------------------------------------------------------------------------
# Bookkeeping and rewinds.
# ------------------------------------------------------------------------------------------------------------


def test_bump_counts_each_listing_and_updates_time_modified(store):
  ws = store.open("ws")
  ws.put([memory("ws", i, time_created="2020-01-01 00:00:00") for i in range(2)])
  assert ws.bump(["m0", "m0", "m1", "gone"], freq=1) == 3
  assert ws.bump(["m0"], utility=1) == 1
  assert (ws.version, ws.content_version) == (3, 1)  # counters are changes, but not to the records
  m0, m1 = ws.get(["m0", "m1"])
  assert (m0.metadata["freq"], m0.metadata["utility"], m1.metadata["freq"]) == (2, 1, 1)
  assert m0.time_modified > "2020-01-01 00:00:00" and m0.time_created == "2020-01-01 00:00:00"
  with pytest.raises(ExperienceError, match="freq must be a non-negative int"):
    ws.bump(["m0"], freq=-1)


def test_delete_by_thresholds_follows_remes_rule(store):
  ws = store.open("ws")
  counters = {"never": (0, 0), "rare": (2, 0), "useless": (5, 0), "weak": (10, 2), "useful": (10, 5)}
  ws.put([TaskMemory("ws", "w", "c", memory_id=k, metadata={"freq": f, "utility": u})
          for k, (f, u) in counters.items()])
  # freq >= 5 and utility / freq < 0.3: useless (0.0) and weak (0.2) go; rare is too rarely used to judge.
  assert ws.delete_by_thresholds(5, 0.3) == ["useless", "weak"]
  assert ids(ws.all()) == ["never", "rare", "useful"]
  assert ws.delete_by_thresholds(5, 0.3) == []
  with pytest.raises(ExperienceError, match="freq_min must be at least 1"):
    ws.delete_by_thresholds(0, 0.5)


def test_set_aside_after_undoes_later_commits_deletions_and_bumps(store):
  ws = store.open("ws")
  ws.put([memory("ws", 0)])  # outside any run: never set aside
  ws.put([memory("ws", 1), memory("ws", 2)], step=1)
  ws.put([memory("ws", 3)], step=2)
  ws.bump(["m1"], freq=2, utility=1, step=2)
  ws.delete(["m2"], step=2)
  ws.put([TaskMemory("ws", "rewritten", "v2", memory_id="m1")], step=3)  # a new version of m1
  ws.put([memory("ws", 4)], step=3)
  ws.bump(["m1"], freq=5, step=3)
  ws.delete(["m3"], step=3)
  assert ids(ws.all()) == ["m0", "m1", "m4"] and ws.get(["m1"])[0].metadata["freq"] == 5

  version = ws.version
  assert ws.set_aside_after(2) == 2  # m1 v2 and m4, committed at step 3
  assert ids(ws.all()) == ["m0", "m1", "m3"]  # m3's deletion at step 3 undone
  m1 = ws.get(["m1"])[0]
  assert (m1.content, m1.metadata["freq"], m1.metadata["utility"]) == ("do 1 carefully", 2, 1)
  assert [(m.memory_id, m.metadata["committed_step"]) for m in ws.set_aside()] == [("m1", 3), ("m4", 3)]
  assert ws.version == version + 1

  assert ws.set_aside_after(0) == 2  # m1 v1 and m3; m2 (committed at 1, deleted at 2) was never live at 0
  assert ids(ws.all()) == ["m0"]
  assert ids(ws.set_aside()) == ["m1", "m4", "m1", "m3"]
  assert ws.set_aside_after(0) == 0 and ws.count() == 1


def test_writes_without_a_step_are_outside_the_history(store):
  ws = store.open("ws")
  ws.put([memory("ws", 1)], step=1)
  ws.put([TaskMemory("ws", "w", "edited by hand", memory_id="m1")])  # no step: replaces every version
  ws.delete(["m1"], step=3)
  ws.put([memory("ws", 2)], step=1)
  ws.delete(["m2"])  # no step: purged for good
  assert ws.set_aside_after(0) == 0
  assert [m.content for m in ws.all()] == ["edited by hand"]  # committed outside a run, deleted at step 3


def test_steps_are_checked(store):
  ws = store.open("ws")
  for bad in (-1, 1.5, True, "3"):
    with pytest.raises(ExperienceError, match="step must be a non-negative int"):
      ws.put([memory("ws", 0)], step=bad)
  with pytest.raises(ExperienceError, match="needs a step"):
    ws.set_aside_after(None)


def test_the_database_uses_wal_and_full_sync(store):
  ws = store.open("ws")
  assert ws._read("PRAGMA journal_mode") == [("wal",)]
  assert ws._read("PRAGMA synchronous") == [(2,)]
  assert os.path.basename(ws.path) == DB_NAME


# ------------------------------------------------------------------------------------------------------------
# Snapshots and the embedding cache.
# ------------------------------------------------------------------------------------------------------------


def unit_rows(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
  x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
  return x / np.linalg.norm(x, axis=1, keepdims=True)


def image_rows(image: bytes, sql: str) -> list[tuple]:
  conn = sqlite3.connect(":memory:")
  try:
    conn.deserialize(image)
    return conn.execute(sql).fetchall()
  finally:
    conn.close()


def history(ws) -> tuple:
  """Everything a snapshot must carry, as plain values."""
  return ([m.to_json() for m in ws.all()], [m.to_json() for m in ws.set_aside()], ws.version, ws.content_version,
          ws._read("SELECT * FROM memories ORDER BY seq"), ws._read("SELECT * FROM bumps ORDER BY rowid"),
          ws._read("SELECT * FROM sqlite_sequence ORDER BY name"))


def test_a_snapshot_holds_no_cache_rows_and_restores_records_history_and_versions(store):
  ws = store.open("ws")
  ws.put([memory("ws", i) for i in range(6)], step=1)
  ws.bump(["m1", "m2"], freq=3, utility=1, step=1)
  ws.delete(["m5"])  # purged: its seq stays the high-water mark of memories
  ws.delete(["m3"], step=2)
  ws.put([memory("ws", 6)], step=3)
  ws.set_aside_after(2)
  ws.cache_vectors("e", [f"when doing task {i}" for i in range(7)], unit_rows(7))
  image = ws.snapshot()
  assert image_rows(image, "SELECT COUNT(*) FROM vectors") == [(0,)]
  assert image_rows(image, "SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL") == []
  assert len(image) < os.path.getsize(ws.path) + os.path.getsize(ws.path + "-wal")
  expected = history(ws)

  copy = store.open("elsewhere")
  copy.restore(image)
  assert history(copy)[0] == [{**m, "workspace_id": "elsewhere"} for m in expected[0]]
  assert history(copy)[2:] == expected[2:]
  assert copy.cached_vectors("e", ["when doing task 1"], 8)[1].tolist() == [False]  # to be re-embedded
  copy.put([memory("elsewhere", 9)], step=4)  # the restored tables keep their indexes and sequences
  assert copy.get(["m9"])[0].metadata["committed_step"] == 4 and copy._read(
      "SELECT seq FROM memories WHERE memory_id = 'm9'")[0][0] > max(row[0] for row in expected[4])

  ws.put([memory("ws", 7)], step=5)
  ws.cache_vectors("e", ["only in the live cache"], unit_rows(1, seed=1))
  ws.restore(image)  # back in its own workspace: the records as they were, the cache as it is
  assert history(ws) == expected
  vectors, found = ws.cached_vectors("e", ["when doing task 2", "only in the live cache", "never"], 8)
  assert found.tolist() == [True, True, False] and np.allclose(vectors[1], unit_rows(1, seed=1)[0])


def test_restore_takes_a_whole_database_image_and_adds_its_cache(store):
  old = store.open("old")
  old.put([memory("old", 1)], step=1)
  old.cache_vectors("e", ["when doing task 1"], unit_rows(1))
  image = bytearray(old._conn.serialize())  # what snapshots held before they left the cache out
  image[18:20] = b"\x01\x01"
  ws = store.open("ws")
  ws.cache_vectors("e", ["mine"], unit_rows(1, seed=2))
  ws.restore(bytes(image))
  assert ids(ws.all()) == ["m1"]
  assert ws.cached_vectors("e", ["when doing task 1", "mine"], 8)[1].tolist() == [True, True]


def test_a_bad_image_is_refused_and_changes_nothing(store):
  ws = store.open("ws")
  ws.put([memory("ws", 1)], step=1)
  before = history(ws)
  with pytest.raises(ExperienceError, match="not a workspace database"):
    ws.restore(b"not a database at all" * 100)
  other = sqlite3.connect(":memory:")
  other.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL)")
  other.execute("INSERT INTO meta VALUES ('schema', 99)")
  with pytest.raises(ExperienceError, match="has schema 99; this code reads 1"):
    ws.restore(other.serialize())
  other.execute("UPDATE meta SET value = 1")
  with pytest.raises(ExperienceError, match=r"lacks the tables \['bumps', 'memories'"):
    ws.restore(other.serialize())
  assert history(ws) == before
  assert ws._read("PRAGMA database_list") == ws._read("PRAGMA database_list")[:1]  # nothing left attached
  ws.put([memory("ws", 2)], step=2)  # and the workspace still writes
  assert ids(ws.all()) == ["m1", "m2"]


def test_cached_vectors_and_live_embeddings_read_the_cache_exactly(store):
  ws = store.open("ws")
  texts = ["plain", "a\x00b", "é “quotes” \\ \n tab", "a", "plain"]
  ws.put([TaskMemory("ws", text, "c", memory_id=f"m{k}") for k, text in enumerate(texts)], step=1)
  vectors = unit_rows(4)
  ws.cache_vectors("e", ["plain", "a", "é “quotes” \\ \n tab"], vectors[:3])
  ws.cache_vectors("other", ["a\x00b"], vectors[3:])  # another embedder's
  ws.cache_vectors("e", ["a\x00b"], unit_rows(1, dim=4))  # another width
  got, found = ws.cached_vectors("e", texts, 8)
  assert found.tolist() == [True, False, True, True, True]
  assert np.array_equal(got, np.stack([vectors[0], np.zeros(8, np.float32), vectors[2], vectors[1], vectors[0]]))
  ws.delete(["m3"], step=2)
  live_ids, matrix, missing = ws.live_embeddings("e", 8)
  assert live_ids == ["m0", "m1", "m2", "m4"] and missing == [(1, "a\x00b")]  # json_extract would read "a"
  assert np.array_equal(matrix, np.stack([vectors[0], np.zeros(8, np.float32), vectors[2], vectors[0]]))
  assert ws.live_embeddings("none", 8)[2] == list(enumerate(["plain", "a\x00b", "é “quotes” \\ \n tab", "plain"]))
