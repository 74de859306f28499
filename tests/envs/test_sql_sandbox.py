"""The SQL env's sandbox: hostile statements are refused or stopped in time, and the database never changes."""

import hashlib
import os
import time

from evolver.envs import sql


def _shop_env() -> sql.SqlEnv:
  env = sql.SqlEnv()
  index = next(i for i, task in enumerate(sql.tasks_of("train")) if task.db.startswith("shop_"))
  env.reset(index)
  return env


def _digest(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


HOSTILE = [
    "ATTACH DATABASE '{tmp}/evil.db' AS evil",
    "ATTACH DATABASE ':memory:' AS scratch",
    "DETACH DATABASE main",
    "INSERT INTO customers VALUES (999, 'Mallory', 'Oslo', 2020)",
    "REPLACE INTO customers VALUES (1, 'Mallory', 'Oslo', 2020)",
    "UPDATE products SET price = 0",
    "DELETE FROM orders",
    "DROP TABLE orders",
    "ALTER TABLE customers ADD COLUMN password TEXT",
    "ALTER TABLE customers RENAME TO clients",
    "CREATE TABLE loot (x)",
    "CREATE TEMP TABLE loot (x)",
    "CREATE INDEX idx ON orders(quantity)",
    "CREATE VIEW v AS SELECT * FROM orders",
    "CREATE TRIGGER t AFTER INSERT ON orders BEGIN DELETE FROM orders; END",
    "PRAGMA writable_schema = ON",
    "PRAGMA writable_schema = 1",
    "PRAGMA query_only = 0",
    "PRAGMA journal_mode = DELETE",
    "PRAGMA user_version = 42",
    "PRAGMA foreign_keys = ON",
    "SELECT load_extension('{tmp}/evil.so')",
    "SELECT load_extension('libsqlite3_evil')",
    "VACUUM",
    "VACUUM INTO '{tmp}/copy.db'",
    "ANALYZE",
    "REINDEX",
    "BEGIN IMMEDIATE",
    "SAVEPOINT sp",
    "SELECT 1; DROP TABLE orders",
    "WITH RECURSIVE forever(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM forever) SELECT COUNT(*) FROM forever",
    "WITH RECURSIVE forever(x) AS (SELECT 1 UNION ALL SELECT x FROM forever) SELECT MAX(x) FROM forever",
    "SELECT COUNT(*) FROM orders a, orders b, orders c, orders d, orders e",
    "SELECT SUM(a.quantity * b.quantity) FROM orders a CROSS JOIN orders b CROSS JOIN orders c CROSS JOIN customers d",
    "SELECT zeroblob(2000000000)",
    "SELECT randomblob(1000000000)",
    "SELECT printf('%.*c', 2000000000, 'x')",
    "SELECT length(replace(hex(zeroblob(40000)), '0', '0000000000'))",
]


def test_hostile_statements_are_refused_or_stopped_and_the_database_is_unchanged(tmp_path):
  env = _shop_env()
  path = sql.database_path(env._task.db)
  before = _digest(path)
  assert len(HOSTILE) >= 20
  for statement in HOSTILE:
    statement = statement.format(tmp=tmp_path)
    start = time.perf_counter()
    observation, reward, done, info = env.step(f"Thought: try.\nAction: {statement}")
    elapsed = time.perf_counter() - start
    assert elapsed < sql.QUERY_TIME_LIMIT_S + 0.5, f"{statement!r} ran {elapsed:.2f} s"
    assert reward == 0.0 and not info["success"], statement
    refused = observation.startswith(("Not allowed", "Query stopped", "SQL error", "Query failed"))
    harmless = observation.startswith("Result (") and statement in ("REINDEX",)
    assert refused or harmless, f"{statement!r} -> {observation!r}"
    if done:
      env.reset(env._index)
  assert _digest(path) == before
  assert not os.listdir(tmp_path), "a hostile statement wrote a file"
  # The env still answers honest queries.
  env.reset(env._index)
  observation, reward, done, info = env.step(env.expert_action())
  assert info["success"]


def test_time_limit_stops_a_runaway_query():
  env = _shop_env()
  start = time.perf_counter()
  observation, *_ = env.step("Action: WITH RECURSIVE r(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM r) "
                             "SELECT SUM(x) FROM r")
  assert observation.startswith("Query stopped") and time.perf_counter() - start < sql.QUERY_TIME_LIMIT_S + 0.2


def test_reading_is_allowed():
  env = _shop_env()
  observation, *_ = env.step("Action: SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
  assert "customers" in observation and "orders" in observation
  observation, *_ = env.step("Action: PRAGMA table_info(orders)")
  assert "quantity" in observation


def test_execution_match_compares_rows_not_text():
  assert sql.normalise([(1,)], ordered=False) == sql.normalise([(1.0,)], ordered=False)
  assert sql.normalise([(2, "a"), (1, "b")], ordered=False) == sql.normalise([(1, "b"), (2, "a")], ordered=False)
  assert sql.normalise([(2, "a"), (1, "b")], ordered=True) != sql.normalise([(1, "b"), (2, "a")], ordered=True)
  env = _shop_env()
  gold = env._task.gold_sql
  observation, reward, done, info = env.step(f"Action: SELECT *, 1 FROM ({gold})")  # an extra column
  assert not info["success"] and "not the expected answer" in observation
  observation, reward, done, info = env.step(f"Action: SELECT * FROM ({gold})")  # same rows, other text
  assert info["success"] and reward == 1.0
