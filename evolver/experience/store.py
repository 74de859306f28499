"""ExperienceStore: task memories kept per workspace, one SQLite database (WAL) each, the pool's source of truth.

Layout: `root/<workspace_id>/experience.sqlite3` (plus SQLite's `-wal` and `-shm` files). A workspace id is checked
with `check_workspace_id` before anything touches the filesystem, so a refused id (`../x`, `a/b`, `/abs`) creates
nothing. `root` is a local directory (SQLite needs real local files); what leaves the machine is a workspace's
`snapshot`, one consistent image of its database without what can be rebuilt (the embedding cache's rows and the
tables' indexes), which an RL checkpoint keeps (`evolver.train.experience`) and `restore` puts back, keeping the
workspace's own cache. At 10,000 memories with 384-d vectors a snapshot is 7.9 MiB, against 29.2 MiB with the cache
(figures in `evolver.experience.pool`).

Durability and concurrency:
  * `journal_mode=WAL`: readers never block the writer and see a consistent snapshot; a process killed at any
    point (SIGKILL mid-commit included) leaves every committed transaction intact and no partial one.
  * `synchronous=FULL`: each commit fsyncs the WAL, so a commit also survives power loss. Commits are rare and
    batched (one per RL step), so the fsync costs nothing measurable, and an RL checkpoint that says "the pool as
    of step t" can rely on every commit up to t being on disk (NORMAL could lose the last commits on power loss).
  * Every write is one `BEGIN IMMEDIATE` transaction (the write lock is taken up front, so two writers never
    deadlock upgrading read locks); a busy database is waited on (`busy_timeout`) and `BEGIN` is retried until
    `LOCK_WAIT_S`, after which an ExperienceError names the workspace. Two processes or threads writing one
    workspace lose nothing. A Workspace object serialises its own threads with a lock (one connection each).

Step bookkeeping (rewinding the pool with an RL checkpoint):
  * `put(..., step=s)` records `committed_step = s`; replacing a record committed at an earlier step keeps the old
    version soft-deleted (`deleted_step = s`). `delete(..., step=s)` soft-deletes (`deleted_step = s`).
  * `set_aside_after(t)` makes the workspace what it was after step t: live records committed after t move to the
    `set_aside` table (kept, listed by `set_aside()`); soft-deleted versions committed after t are purged (they
    were never live at t and are not live now); records deleted after t are restored; freq/utility bumps made
    with a step after t are subtracted.
  * Soft-deleted rows are kept for good (a checkpoint from any earlier step may still need them); they cost one
    row each and are invisible to every read. Writes without a step (imports, edits outside a run) are outside the
    run's history: `put(step=None)` replaces in place and `delete(step=None)` purges, each dropping the old
    versions of those ids, so no rewind brings them back.

Versions (persisted, seen by every process): `version` counts every change, `content_version` only those that
add, replace or remove records (what the pool's index follows; freq/utility bumps leave it alone).

Records: the ReMe 0.2 JSON object is stored as is; `freq`, `utility`, `committed_step` (metadata) and
`time_modified` are columns, written back into the record on every read, and `workspace_id` is always the
workspace's own (so a copied workspace reads as the copy).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from evolver.experience.records import ExperienceError, TaskMemory, check_workspace_id, now

DB_NAME = "experience.sqlite3"
SCHEMA_VERSION = 1
LOCK_WAIT_S = 120.0  # how long a write waits for another writer before giving up
BUSY_TIMEOUT_MS = 5000  # SQLite's own wait per attempt; BEGIN is retried until LOCK_WAIT_S
_CHUNK = 500  # ids per `IN (...)` clause (SQLite's host-parameter limit is 999 on old builds)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS memories (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  memory_id TEXT NOT NULL,
  record TEXT NOT NULL,
  freq INTEGER NOT NULL DEFAULT 0,
  utility INTEGER NOT NULL DEFAULT 0,
  time_modified TEXT NOT NULL,
  committed_step INTEGER,
  deleted_step INTEGER
);
CREATE UNIQUE INDEX IF NOT EXISTS live_memory_ids ON memories (memory_id) WHERE deleted_step IS NULL;
CREATE INDEX IF NOT EXISTS memory_versions ON memories (memory_id);
CREATE INDEX IF NOT EXISTS committed_steps ON memories (committed_step);
CREATE INDEX IF NOT EXISTS deleted_steps ON memories (deleted_step) WHERE deleted_step IS NOT NULL;
CREATE TABLE IF NOT EXISTS set_aside (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  memory_id TEXT NOT NULL,
  record TEXT NOT NULL,
  freq INTEGER NOT NULL,
  utility INTEGER NOT NULL,
  time_modified TEXT NOT NULL,
  committed_step INTEGER,
  rewound_to INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS bumps (
  memory_seq INTEGER NOT NULL,
  step INTEGER NOT NULL,
  freq INTEGER NOT NULL,
  utility INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS bump_steps ON bumps (step);
CREATE TABLE IF NOT EXISTS vectors (
  embedder TEXT NOT NULL,
  text TEXT NOT NULL,
  vector BLOB NOT NULL,
  PRIMARY KEY (embedder, text)
);
"""
_LIVE_COLUMNS = "seq, memory_id, record, freq, utility, time_modified, committed_step"
# What a snapshot keeps: every table but the embedding cache (`vectors`), which can be rebuilt from the records.
_SNAPSHOT_TABLES = ("meta", "memories", "set_aside", "bumps")


def _tables_in(schema: str) -> list[str]:
  """`_SCHEMA`'s CREATE TABLE statements, creating the tables in the attached database `schema` (tables only: the
  indexes are rebuilt by whoever fills the tables)."""
  return [statement.replace("IF NOT EXISTS ", f"IF NOT EXISTS {schema}.", 1)
          for statement in _SCHEMA.split(";") if statement.strip().startswith("CREATE TABLE")]


def _check_step(step: Any, name: str = "step") -> int | None:
  if step is None:
    return None
  if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
    raise ExperienceError(f"{name} must be a non-negative int or None, got {step!r}")
  return int(step)


def _check_count(value: Any, name: str) -> int:
  if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
    raise ExperienceError(f"{name} must be a non-negative int, got {value!r}")
  return int(value)


def _counters(memory: TaskMemory, where: str) -> tuple[int, int]:
  """The record's `(freq, utility)` from its metadata (0 when absent)."""
  return (_check_count(memory.metadata.get("freq", 0), f"{where}: metadata['freq']"),
          _check_count(memory.metadata.get("utility", 0), f"{where}: metadata['utility']"))


def _check_ids(ids: Iterable[str]) -> list[str]:
  if isinstance(ids, str):
    raise ExperienceError(f"expected a sequence of memory ids, got the string {ids[:60]!r}")
  ids = list(ids)
  bad = [i for i in ids if not isinstance(i, str)]
  if bad:
    raise ExperienceError(f"memory ids must be strings, got {bad[:3]!r}")
  return ids


def _chunks(items: Sequence[Any]) -> Iterator[Sequence[Any]]:
  for start in range(0, len(items), _CHUNK):
    yield items[start:start + _CHUNK]


def _marks(n: int) -> str:
  return ",".join("?" * n)


class Workspace:
  """One workspace's database. Open it with `ExperienceStore.open`; safe to share between threads."""

  def __init__(self, workspace_id: str, path: str):
    self.id = workspace_id
    self.path = path
    self._lock = threading.RLock()
    # (content_version before, after) of this object's latest change to the records (see `content_version`).
    self.last_content_change: tuple[int, int] | None = None
    self._conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None,
                                 check_same_thread=False)
    self._conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
    self._retry_busy(lambda: self._conn.execute("PRAGMA journal_mode=WAL").fetchone())
    self._conn.execute("PRAGMA synchronous=FULL")
    with self._write() as conn:
      for statement in _SCHEMA.split(";"):
        if statement.strip():
          conn.execute(statement)
      conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
      conn.execute("INSERT OR IGNORE INTO meta VALUES ('version', 0)")
      conn.execute("INSERT OR IGNORE INTO meta VALUES ('content_version', 0)")
      schema = conn.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()[0]
    if schema != SCHEMA_VERSION:
      self.close()
      raise ExperienceError(f"workspace {workspace_id!r} at {path} has schema {schema}; this code reads "
                            f"{SCHEMA_VERSION}")

  # ----------------------------------------------------------------------------------------------------------
  # Connection plumbing.
  # ----------------------------------------------------------------------------------------------------------

  def close(self) -> None:
    with self._lock:
      self._conn.close()

  def __enter__(self) -> "Workspace":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def _retry_busy(self, fn):
    """Runs `fn` (which takes no lock of its own beyond SQLite's), retrying while the database is locked."""
    deadline = time.monotonic() + LOCK_WAIT_S
    delay = 0.005
    while True:
      try:
        return fn()
      except sqlite3.OperationalError as e:
        if "locked" not in str(e) and "busy" not in str(e):
          raise
        if time.monotonic() > deadline:
          raise ExperienceError(f"workspace {self.id!r} stayed locked by another writer for over {LOCK_WAIT_S:g} s "
                                f"({self.path})") from e
        time.sleep(delay)
        delay = min(delay * 2, 0.2)

  @contextlib.contextmanager
  def _write(self) -> Iterator[sqlite3.Connection]:
    """One write transaction, holding SQLite's write lock from the start: commits on success, rolls back on
    any exception (so a failed write changes nothing)."""
    with self._lock:
      self._retry_busy(lambda: self._conn.execute("BEGIN IMMEDIATE"))
      try:
        yield self._conn
      except BaseException:
        self._conn.execute("ROLLBACK")
        raise
      self._conn.execute("COMMIT")

  def _changed(self, conn: sqlite3.Connection, content: bool = True) -> None:
    """Bumps `version`, and `content_version` when records were added, replaced or removed (not for counters)."""
    conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'version'")
    if content:
      after = conn.execute("UPDATE meta SET value = value + 1 WHERE key = 'content_version' RETURNING value"
                           ).fetchone()[0]
      self.last_content_change = (after - 1, after)

  def _read(self, sql: str, params: Sequence[Any] = ()) -> list[tuple]:
    with self._lock:
      return self._conn.execute(sql, params).fetchall()

  def _live_rows(self, ids: Sequence[str]) -> list[tuple]:
    """The live rows of `ids` (in one read transaction, so one snapshot)."""
    with self._lock:
      self._conn.execute("BEGIN")
      try:
        rows = []
        for chunk in _chunks(ids):
          rows += self._conn.execute(f"SELECT {_LIVE_COLUMNS} FROM memories WHERE deleted_step IS NULL AND "
                                     f"memory_id IN ({_marks(len(chunk))})", chunk).fetchall()
      finally:
        self._conn.execute("COMMIT")
    return rows

  def _memory(self, row: tuple) -> TaskMemory:
    _, _, record, freq, utility, time_modified, committed_step = row
    data = json.loads(record)
    data["workspace_id"] = self.id
    data["time_modified"] = time_modified
    data["metadata"] = {**data.get("metadata", {}), "freq": freq, "utility": utility,
                        "committed_step": committed_step}
    return TaskMemory.from_json(data)

  # ----------------------------------------------------------------------------------------------------------
  # Reads.
  # ----------------------------------------------------------------------------------------------------------

  @property
  def version(self) -> int:
    """A counter bumped (and persisted) by every change, by any process: compare two reads to see a change."""
    return self._read("SELECT value FROM meta WHERE key = 'version'")[0][0]

  @property
  def content_version(self) -> int:
    """Like `version`, but bumped only when records are added, replaced or removed (what an index over their
    `when_to_use` must follow), not by freq/utility bumps."""
    return self._read("SELECT value FROM meta WHERE key = 'content_version'")[0][0]

  def count(self) -> int:
    return self._read("SELECT COUNT(*) FROM memories WHERE deleted_step IS NULL")[0][0]

  def get(self, ids: Sequence[str]) -> list[TaskMemory]:
    """The live records of `ids`, in the order of `ids`; ids with no live record are skipped (so the result can
    be shorter: compare `memory_id`s when that matters)."""
    ids = _check_ids(ids)
    by_id = {row[1]: row for row in self._live_rows(list(dict.fromkeys(ids)))}
    return [self._memory(by_id[i]) for i in ids if i in by_id]

  def all(self) -> list[TaskMemory]:
    """Every live record, oldest write first."""
    rows = self._read(f"SELECT {_LIVE_COLUMNS} FROM memories WHERE deleted_step IS NULL ORDER BY seq")
    return [self._memory(row) for row in rows]

  def set_aside(self) -> list[TaskMemory]:
    """Records moved out by `set_aside_after`, oldest first (`metadata["committed_step"]` says when they were
    committed). The same memory_id can appear more than once (set aside by two rewinds)."""
    rows = self._read(f"SELECT {_LIVE_COLUMNS} FROM set_aside ORDER BY seq")
    return [self._memory(row) for row in rows]

  # ----------------------------------------------------------------------------------------------------------
  # Writes.
  # ----------------------------------------------------------------------------------------------------------

  def put(self, memories: Iterable[TaskMemory], *, step: int | None = None) -> list[str]:
    """Inserts or replaces `memories` by memory_id, all in one transaction (all or nothing).

    Args:
      memories: TaskMemory records of this workspace (another workspace's record raises ExperienceError: import
        it with `import_jsonl`, which rewrites ids). Consumed inside the transaction. `metadata["freq"]` and
        `["utility"]` (default 0) seed the counters; a later record with the same id in one batch wins.
      step: the RL step committing them (`metadata["committed_step"]`), or None outside a run (module
        docstring: a replacement without a step drops the old versions for good).

    Returns:
      The memory ids written, in order.
    """
    step = _check_step(step)
    if isinstance(memories, TaskMemory):
      raise ExperienceError("put takes a sequence of TaskMemory, got one TaskMemory")
    ids = []
    with self._write() as conn:
      for k, memory in enumerate(memories):
        if not isinstance(memory, TaskMemory):
          raise ExperienceError(f"put: item {k} is a {type(memory).__name__}, not a TaskMemory")
        if memory.workspace_id != self.id:
          raise ExperienceError(f"put: memory {memory.memory_id!r} belongs to workspace {memory.workspace_id!r}, "
                                f"not {self.id!r}")
        self._put_one(conn, memory, step, k)
        ids.append(memory.memory_id)
      if ids:
        self._changed(conn)
    return ids

  def _put_one(self, conn: sqlite3.Connection, memory: TaskMemory, step: int | None, k: int) -> None:
    freq, utility = _counters(memory, f"put: item {k}")
    data = memory.to_json()
    data["metadata"] = {**memory.metadata, "committed_step": step}
    record = json.dumps(data, ensure_ascii=False)
    live = conn.execute("SELECT seq, committed_step FROM memories WHERE memory_id = ? AND deleted_step IS NULL",
                        (memory.memory_id,)).fetchone()
    if step is None:
      # Outside a run: the new version replaces every old one (live and soft-deleted) for good.
      self._purge(conn, [memory.memory_id])
    elif live is not None and live[1] is not None and live[1] >= step:
      # Committed again within one step: no rewind can separate the two versions.
      self._purge_seqs(conn, [live[0]])
    elif live is not None:
      conn.execute("UPDATE memories SET deleted_step = ? WHERE seq = ?", (step, live[0]))
    conn.execute("INSERT INTO memories (memory_id, record, freq, utility, time_modified, committed_step) "
                 "VALUES (?, ?, ?, ?, ?, ?)", (memory.memory_id, record, freq, utility, memory.time_modified, step))

  def _purge(self, conn: sqlite3.Connection, ids: Sequence[str]) -> int:
    """Removes every version (live and soft-deleted) of `ids`; returns how many were live."""
    live = 0
    for chunk in _chunks(ids):
      marks = _marks(len(chunk))
      seqs = conn.execute(f"SELECT seq, deleted_step IS NULL FROM memories WHERE memory_id IN ({marks})",
                          chunk).fetchall()
      live += sum(1 for _, is_live in seqs if is_live)
      self._purge_seqs(conn, [seq for seq, _ in seqs])
    return live

  def _purge_seqs(self, conn: sqlite3.Connection, seqs: Sequence[int]) -> None:
    for chunk in _chunks(seqs):
      marks = _marks(len(chunk))
      conn.execute(f"DELETE FROM bumps WHERE memory_seq IN ({marks})", chunk)
      conn.execute(f"DELETE FROM memories WHERE seq IN ({marks})", chunk)

  def delete(self, ids: Sequence[str], *, step: int | None = None) -> int:
    """Deletes the live records of `ids` (absent ids are ignored); with a step the deletion is soft (a rewind to
    an earlier step restores them), without one it is permanent. Returns how many live records went."""
    ids = list(dict.fromkeys(_check_ids(ids)))
    step = _check_step(step)
    with self._write() as conn:
      deleted = self._delete(conn, ids, step)
      if deleted:
        self._changed(conn)
    return deleted

  def _delete(self, conn: sqlite3.Connection, ids: Sequence[str], step: int | None) -> int:
    if step is None:
      return self._purge(conn, ids)
    deleted = 0
    for chunk in _chunks(ids):
      deleted += conn.execute(f"UPDATE memories SET deleted_step = ? WHERE deleted_step IS NULL AND memory_id IN "
                              f"({_marks(len(chunk))})", (step, *chunk)).rowcount
    return deleted

  def bump(self, ids: Sequence[str], freq: int = 0, utility: int = 0, *, step: int | None = None) -> int:
    """Adds `freq` (times retrieved) and `utility` (times a retrieval helped) to each record of `ids` and sets its
    time_modified; an id listed twice is bumped twice, absent ids are ignored. With a step, the bump is logged
    so `set_aside_after` can undo it. Returns the number of bumps applied."""
    ids = _check_ids(ids)
    freq, utility = _check_count(freq, "freq"), _check_count(utility, "utility")
    step = _check_step(step)
    if not ids or (freq == 0 and utility == 0):
      return 0
    stamp = now()
    with self._write() as conn:
      seqs = {}
      for chunk in _chunks(list(dict.fromkeys(ids))):
        seqs.update(conn.execute(f"SELECT memory_id, seq FROM memories WHERE deleted_step IS NULL AND memory_id IN "
                                 f"({_marks(len(chunk))})", chunk).fetchall())
      applied = [seqs[i] for i in ids if i in seqs]
      conn.executemany("UPDATE memories SET freq = freq + ?, utility = utility + ?, time_modified = ? WHERE seq = ?",
                       [(freq, utility, stamp, seq) for seq in applied])
      if step is not None:
        conn.executemany("INSERT INTO bumps VALUES (?, ?, ?, ?)", [(seq, step, freq, utility) for seq in applied])
      if applied:
        self._changed(conn, content=False)
    return len(applied)

  def delete_by_thresholds(self, freq_min: int, utility_ratio_min: float, *, step: int | None = None) -> list[str]:
    """ReMe 0.2's delete flow: deletes the records retrieved at least `freq_min` times whose utility / freq is
    below `utility_ratio_min` (they keep being retrieved and rarely help). Returns their ids."""
    freq_min = _check_count(freq_min, "freq_min")
    if freq_min < 1:
      raise ExperienceError("freq_min must be at least 1 (the rule divides utility by freq)")
    step = _check_step(step)
    with self._write() as conn:
      ids = [row[0] for row in conn.execute(
          "SELECT memory_id FROM memories WHERE deleted_step IS NULL AND freq >= ? AND "
          "CAST(utility AS REAL) / freq < ? ORDER BY seq", (freq_min, float(utility_ratio_min)))]
      if self._delete(conn, ids, step):
        self._changed(conn)
    return ids

  def set_aside_after(self, step: int) -> int:
    """Makes the workspace what it was after RL step `step` (module docstring): records committed later are set
    aside, records deleted later restored, bumps logged later undone. Returns how many records were set aside."""
    step = _check_step(step)
    if step is None:
      raise ExperienceError("set_aside_after needs a step, got None")
    with self._write() as conn:
      moved = conn.execute(
          "INSERT INTO set_aside (memory_id, record, freq, utility, time_modified, committed_step, rewound_to) "
          f"SELECT memory_id, record, freq, utility, time_modified, committed_step, ? FROM memories "
          "WHERE committed_step > ? AND deleted_step IS NULL ORDER BY seq", (step, step)).rowcount
      later = [row[0] for row in conn.execute("SELECT seq FROM memories WHERE committed_step > ?", (step,))]
      self._purge_seqs(conn, later)
      restored = conn.execute("UPDATE memories SET deleted_step = NULL WHERE deleted_step > ?", (step,)).rowcount
      undone = conn.execute(
          "UPDATE memories SET freq = memories.freq - b.dfreq, utility = memories.utility - b.dutility FROM "
          "(SELECT memory_seq, SUM(freq) AS dfreq, SUM(utility) AS dutility FROM bumps WHERE step > ? "
          "GROUP BY memory_seq) AS b WHERE memories.seq = b.memory_seq", (step,)).rowcount
      conn.execute("DELETE FROM bumps WHERE step > ?", (step,))
      if moved or later or restored or undone:
        self._changed(conn, content=bool(moved or later or restored))
    return moved

  # ----------------------------------------------------------------------------------------------------------
  # Snapshots (the whole database: what a checkpoint keeps).
  # ----------------------------------------------------------------------------------------------------------

  def snapshot(self) -> bytes:
    """One consistent image of the workspace for a checkpoint: live records, their history, set-aside records,
    bumps and versions, as of one commit. Without what can be rebuilt from them: the embedding cache's rows (the
    `vectors` table is there, empty) and the tables' indexes, which `restore` or a Workspace opening the image
    rebuilds. A pool restored from it re-embeds the `when_to_use`s its own cache lacks (`ExperiencePool.restore`).

    Returns:
      An SQLite database image (rollback-journal format: it opens in memory or as a file).
    """
    with self._lock:
      self._conn.execute("ATTACH DATABASE ':memory:' AS snapshot")
      try:
        self._conn.execute("BEGIN")  # writes go to `snapshot` alone; `main` is read as of one commit
        try:
          for statement in _tables_in("snapshot"):
            self._conn.execute(statement)
          for table in _SNAPSHOT_TABLES:
            self._conn.execute(f"INSERT INTO snapshot.{table} SELECT * FROM main.{table}")
          # AUTOINCREMENT's high-water marks as they are (the inserts above set them to the largest seq present).
          self._conn.execute("DELETE FROM snapshot.sqlite_sequence")
          self._conn.execute("INSERT INTO snapshot.sqlite_sequence SELECT * FROM main.sqlite_sequence")
        except BaseException:
          self._conn.execute("ROLLBACK")
          raise
        self._conn.execute("COMMIT")
        return self._conn.serialize(name="snapshot")
      finally:
        self._conn.execute("DETACH DATABASE snapshot")

  def restore(self, image: bytes) -> None:
    """Makes the workspace's records, history, set-aside records, bumps and versions exactly those of `image`
    (`snapshot`), in one transaction. The embedding cache is kept, and any cache rows the image holds (an image
    from before snapshots left them out) are added to it: a row is the embedding of a text by an embedder, valid
    whatever the records are, so a pool's reload re-embeds only texts neither held. The image is checked first:
    one that is not a workspace database of this schema raises ExperienceError and changes nothing."""
    with self._lock:
      self._conn.execute("ATTACH DATABASE ':memory:' AS image")
      try:
        self._check_image(image)
        with self._write() as conn:
          for table in (*_SNAPSHOT_TABLES, "sqlite_sequence"):
            conn.execute(f"DELETE FROM main.{table}")
            conn.execute(f"INSERT INTO main.{table} SELECT * FROM image.{table}")
          conn.execute("INSERT OR IGNORE INTO main.vectors SELECT * FROM image.vectors")
        self.last_content_change = None
      finally:
        self._conn.execute("DETACH DATABASE image")

  def _check_image(self, image: bytes) -> None:
    """Loads `image` as the attached database `image`; ExperienceError unless it is a workspace of this schema."""
    try:
      self._conn.deserialize(image, name="image")
      tables = {row[0] for row in self._conn.execute("SELECT name FROM image.sqlite_master WHERE type = 'table'")}
      schema = (self._conn.execute("SELECT value FROM image.meta WHERE key = 'schema'").fetchall()
                if "meta" in tables else [])
    except sqlite3.DatabaseError as e:
      raise ExperienceError(f"workspace {self.id!r}: the image to restore is not a workspace database ({e})") from e
    if not schema or schema[0][0] != SCHEMA_VERSION:
      raise ExperienceError(f"workspace {self.id!r}: the image to restore has schema {schema[0][0] if schema else None}"
                            f"; this code reads {SCHEMA_VERSION}")
    missing = sorted({*_SNAPSHOT_TABLES, "sqlite_sequence", "vectors"} - tables)
    if missing:
      raise ExperienceError(f"workspace {self.id!r}: the image to restore lacks the tables {missing}")

  # ----------------------------------------------------------------------------------------------------------
  # ReMe 0.2 JSONL libraries.
  # ----------------------------------------------------------------------------------------------------------

  def import_jsonl(self, path: str, workspace_id_override: bool = True) -> int:
    """Loads a ReMe 0.2 library: one JSON record per line (blank lines skipped), or one JSON list of records
    (ReMe's `cookbook/simple_demo/task_memory.jsonl`). All or nothing: a malformed line raises ExperienceError
    naming the line and what is wrong, and nothing is imported.

    Args:
      path: the library file.
      workspace_id_override: put every record in this workspace (ReMe's `load` action); False keeps the
        records' own workspace_id and refuses a record of another workspace.

    Returns:
      The number of records imported (without a step: outside any run's history).
    """
    memories = [memory for _, memory in self._parse_library(path, workspace_id_override)]
    self.put(memories)
    return len(memories)

  def _parse_library(self, path: str, override: bool) -> list[tuple[str, TaskMemory]]:
    try:
      with open(path, encoding="utf-8") as f:
        text = f.read()
    except UnicodeDecodeError as e:
      raise ExperienceError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from e
    if text.lstrip().startswith("["):
      try:
        items = json.loads(text)
      except json.JSONDecodeError as e:
        raise ExperienceError(f"{path}: line {e.lineno}: not valid JSON ({e.msg})") from e
      located = [(f"item {k}", item) for k, item in enumerate(items)]
    else:
      located = []
      for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
          continue
        try:
          located.append((f"line {lineno}", json.loads(line)))
        except json.JSONDecodeError as e:
          raise ExperienceError(f"{path}: line {lineno}: not valid JSON ({e.msg} at column {e.colno})") from e
    parsed = []
    for where, item in located:
      try:
        memory = TaskMemory.from_json(item, workspace_id=self.id if override else None)
      except (ExperienceError, TypeError, ValueError) as e:
        raise ExperienceError(f"{path}: {where}: {e}") from e
      if memory.workspace_id != self.id:
        raise ExperienceError(f"{path}: {where}: record of workspace {memory.workspace_id!r}, not {self.id!r} "
                              "(import with workspace_id_override=True to move it here)")
      _counters(memory, f"{path}: {where}")
      parsed.append((where, memory))
    return parsed

  def export_jsonl(self, path: str) -> int:
    """Writes every live record to `path` as a ReMe 0.2 library (one JSON object per line, written to a temporary
    file then renamed, so a reader never sees half a library). Returns the number of records."""
    memories = self.all()
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
      with open(tmp, "w", encoding="utf-8") as f:
        for memory in memories:
          f.write(json.dumps(memory.to_json(), ensure_ascii=False) + "\n")
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
    return len(memories)

  # ----------------------------------------------------------------------------------------------------------
  # Embedding cache (not part of a record; never bumps `version`).
  # ----------------------------------------------------------------------------------------------------------

  def cached_vectors(self, embedder: str, texts: Sequence[str], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Cached embeddings of `texts` under embedder `embedder`, streamed into one array (no row held twice).

    Returns:
      `(vectors [len(texts), dim] float32, found [len(texts)] bool)`; rows not found are zero.
    """
    vectors = np.zeros((len(texts), dim), np.float32)
    found = np.zeros(len(texts), bool)
    first: dict[str, int] = {}  # text -> its first row; later rows with the same text are copied from it
    for row, text in enumerate(texts):
      first.setdefault(text, row)
    unique = list(first)
    with self._lock:
      for chunk in _chunks(unique):
        for text, blob in self._conn.execute(f"SELECT text, vector FROM vectors WHERE embedder = ? AND text IN "
                                             f"({_marks(len(chunk))})", (embedder, *chunk)):
          if len(blob) == 4 * dim:
            vectors[first[text]] = np.frombuffer(blob, np.float32)
            found[first[text]] = True
    repeats = [(row, first[text]) for row, text in enumerate(texts) if first[text] != row]
    if repeats:
      rows, sources = map(list, zip(*repeats))
      vectors[rows], found[rows] = vectors[sources], found[sources]
    return vectors, found

  def live_embeddings(self, embedder: str, dim: int) -> tuple[list[str], np.ndarray, list[tuple[int, str]]]:
    """Every live record's id, oldest write first, with the cached embedding of its `when_to_use` under `embedder`:
    one read of the database, streamed row by row into one matrix (what a pool's reload hands to its index).

    Returns:
      `(ids, vectors [len(ids), dim] float32, missing)`: row i of `vectors` embeds record ids[i]'s when_to_use, or
      is zero when the cache lacks it; `missing` lists `(row, when_to_use)` of those rows.
    """
    row_bytes = 4 * dim
    with self._lock:
      self._conn.execute("BEGIN")  # the count and the rows from one commit
      try:
        n = self._conn.execute("SELECT COUNT(*) FROM memories WHERE deleted_step IS NULL").fetchone()[0]
        vectors = np.zeros((n, dim), np.float32)
        flat = memoryview(vectors.reshape(-1).view(np.uint8))
        ids, missing = [], []
        # The text is matched in SQL (json_extract), except in records holding an escaped NUL, which json_extract
        # cuts short: those count as missing. A missing row brings its record, to read the text exactly.
        cursor = self._conn.execute(
            "SELECT m.memory_id, v.vector, CASE WHEN v.vector IS NULL THEN m.record END FROM memories AS m "
            "LEFT JOIN vectors AS v ON v.embedder = ? AND v.text = json_extract(m.record, '$.when_to_use') AND "
            "length(v.vector) = ? AND instr(m.record, '\\u0000') = 0 WHERE m.deleted_step IS NULL ORDER BY m.seq",
            (embedder, row_bytes))
        for row, (memory_id, blob, record) in enumerate(cursor):
          ids.append(memory_id)
          if blob is not None:
            flat[row * row_bytes:(row + 1) * row_bytes] = blob
          else:
            missing.append((row, json.loads(record)["when_to_use"]))
      finally:
        self._conn.execute("COMMIT")
    return ids, vectors, missing

  def cache_vectors(self, embedder: str, texts: Sequence[str], vectors: np.ndarray) -> None:
    """Remembers `vectors [len(texts), dim]` as the embeddings of `texts` under `embedder`."""
    vectors = np.ascontiguousarray(vectors, np.float32)
    if vectors.ndim != 2 or vectors.shape[0] != len(texts):
      raise ExperienceError(f"cache_vectors: {len(texts)} texts but vectors of shape {vectors.shape}")
    with self._write() as conn:  # rows turned into bytes one at a time, as SQLite takes them
      conn.executemany("INSERT OR REPLACE INTO vectors VALUES (?, ?, ?)",
                       ((embedder, text, row.tobytes()) for text, row in zip(texts, vectors)))


class ExperienceStore:
  """Workspaces under `root`, one directory and SQLite database each. The constructor touches nothing; `root` is
  created by the first `open(..., create=True)`."""

  def __init__(self, root: str):
    self.root = os.path.abspath(root)

  def _dir(self, workspace_id: str) -> str:
    return os.path.join(self.root, check_workspace_id(workspace_id))

  def exists(self, workspace_id: str) -> bool:
    return os.path.isfile(os.path.join(self._dir(workspace_id), DB_NAME))

  def open(self, workspace_id: str, create: bool = True) -> Workspace:
    """The workspace `workspace_id` (validated before anything touches the filesystem); a missing one is
    created when `create`, else ExperienceError."""
    directory = self._dir(workspace_id)
    if not self.exists(workspace_id):
      if not create:
        raise ExperienceError(f"no workspace {workspace_id!r} under {self.root}")
      os.makedirs(directory, exist_ok=True)
    return Workspace(workspace_id, os.path.join(directory, DB_NAME))

  def workspaces(self) -> list[str]:
    """The ids of the workspaces under root, sorted."""
    if not os.path.isdir(self.root):
      return []
    names = []
    for name in sorted(os.listdir(self.root)):
      try:
        check_workspace_id(name)
      except ExperienceError:
        continue  # temporary and trash directories start with '.'
      if os.path.isfile(os.path.join(self.root, name, DB_NAME)):
        names.append(name)
    return names

  def delete_workspace(self, workspace_id: str) -> bool:
    """Removes the workspace's directory (renamed away first, so it disappears at once). Returns False if there
    was none. Workspace objects still open on it keep working on the unlinked files until closed."""
    directory = self._dir(workspace_id)
    if not os.path.isdir(directory):
      return False
    trash = os.path.join(self.root, f".trash-{workspace_id}-{uuid.uuid4().hex}")
    os.rename(directory, trash)
    shutil.rmtree(trash)
    return True

  def copy_workspace(self, src: str, dst: str) -> Workspace:
    """Copies workspace `src` (a consistent snapshot, history and set-aside records included) to a new
    workspace `dst`, which must not exist. Returns the copy, open."""
    source_dir, target_dir = self._dir(src), self._dir(dst)
    if not self.exists(src):
      raise ExperienceError(f"no workspace {src!r} to copy under {self.root}")
    if os.path.exists(target_dir):
      raise ExperienceError(f"workspace {dst!r} already exists under {self.root}; delete it first")
    tmp = os.path.join(self.root, f".copy-{dst}-{uuid.uuid4().hex}")
    os.makedirs(tmp)
    try:
      source = sqlite3.connect(os.path.join(source_dir, DB_NAME), timeout=BUSY_TIMEOUT_MS / 1000)
      target = sqlite3.connect(os.path.join(tmp, DB_NAME))
      try:
        source.backup(target)
      finally:
        source.close()
        target.close()
      os.rename(tmp, target_dir)
    finally:
      if os.path.exists(tmp):
        shutil.rmtree(tmp)
    return self.open(dst, create=False)
