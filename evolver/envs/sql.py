"""sql (code): answer questions over generated SQLite databases with one SQL query per turn.

Four schemas (shop, school, library, hr), five generated databases each. A task is a question about one
database; the first observation gives the schema and the question. Each action is one SQL query: its result
is shown, and the episode succeeds when the result matches the gold query's result (execution match: rows
compared as a multiset, or as a list when the gold query orders them; numbers compared to 2 decimals).

The agent's SQL runs on a read-only connection (`mode=ro`, `PRAGMA query_only`), behind an authorizer that
allows reading only (no ATTACH, no writes or schema changes, no PRAGMA but a few read-only table pragmas, no
`load_extension`), with no attached databases allowed, limits on string and statement length, and a
progress handler that stops any query after `QUERY_TIME_LIMIT_S`.

A spec task (`reset_spec`) asks its own question about a task's database, with a gold query or the answer's
rows; see `SqlEnv._reset_spec`. An exploration (`reset_world`) shows a database's schema with no question and
yields one task per small result seen, worded as "return exactly these rows"; see `SqlEnv._reset_world`. The
state key is the set of distinct results seen so far. For the step judges, the cost to go is 1 until the question
is answered, and progress is how close the best query's result so far came to the answer (`SqlEnv._measures`).

The databases are generated deterministically on first use into a cache directory (`EVOLVER_ENV_CACHE`, by
default `~/.cache/evolver/envs`), never downloaded.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import random
import re
import sqlite3
import tempfile
import threading
import time
from typing import Any, Callable

from evolver.envs import base

QUERY_TIME_LIMIT_S = 0.25
_MAX_ROWS = 200  # more rows than this never match a gold answer
_SHOWN_ROWS = 5
_GOAL_ROWS, _GOAL_COLUMNS, _GOAL_CHARS = 5, 4, 300  # the largest result an exploration words as a task
_DBS_PER_SCHEMA = 5
_EVAL_EVERY = 5  # about one task in five goes to eval

# ----------------------------------------------------------------------------------------------------------
# The generated databases.
# ----------------------------------------------------------------------------------------------------------

_FIRST = ("Ada", "Ben", "Chloe", "Dan", "Eva", "Finn", "Grace", "Hugo", "Iris", "Jack", "Kara", "Liam", "Mia",
          "Noah", "Olga", "Paul", "Quinn", "Rosa", "Sam", "Tara", "Uma", "Victor", "Wen", "Xavi", "Yara", "Zoe")
_LAST = ("Adams", "Brown", "Chen", "Diaz", "Evans", "Fischer", "Garcia", "Haddad", "Ito", "Jones", "Kim",
         "Lopez", "Moreau", "Novak", "Okafor", "Patel", "Rossi", "Silva", "Tanaka", "Weber")
_CITIES = ("Oslo", "Lima", "Cairo", "Kyoto", "Porto", "Dublin", "Quito", "Accra", "Perth", "Riga")
_CATEGORIES = ("books", "garden", "kitchen", "toys", "sports", "music")
_ADJECTIVES = ("red", "blue", "tiny", "giant", "smart", "classic", "silent", "rapid", "golden", "wooden")
_NOUNS = ("lamp", "kettle", "drone", "puzzle", "racket", "guitar", "shovel", "novel", "blender", "kite",
          "helmet", "speaker", "planter", "whisk")
_MAJORS = ("math", "physics", "history", "biology", "art", "economics")
_DEPARTMENTS = ("Math", "Physics", "History", "Biology", "Art", "Economics")
_COURSE_WORDS = ("Intro to", "Advanced", "Topics in", "Seminar on", "Foundations of")
_COUNTRIES = ("Chile", "Kenya", "Japan", "Norway", "Peru", "Ghana", "Spain", "Canada")
_GENRES = ("mystery", "fantasy", "history", "poetry", "science", "romance")
_TITLE_WORDS = ("Silent", "Hidden", "Last", "Red", "Winter", "Lost", "Northern", "Glass", "Iron", "Paper",
                "River", "Garden", "Night", "Star", "Storm", "Harbor", "Secret", "Empty", "Bright", "Old")
_TEAMS = ("Sales", "Research", "Support", "Finance", "Legal", "Design", "Operations")

SCHEMAS = {
    "shop": ("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT, joined_year INTEGER)",
             "CREATE TABLE products (id INTEGER PRIMARY KEY, name TEXT, category TEXT, price REAL)",
             "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER, product_id INTEGER, "
             "quantity INTEGER, order_month INTEGER)"),
    "school": ("CREATE TABLE students (id INTEGER PRIMARY KEY, name TEXT, year INTEGER, major TEXT)",
               "CREATE TABLE courses (id INTEGER PRIMARY KEY, title TEXT, department TEXT, credits INTEGER)",
               "CREATE TABLE enrollments (student_id INTEGER, course_id INTEGER, grade INTEGER)"),
    "library": ("CREATE TABLE authors (id INTEGER PRIMARY KEY, name TEXT, country TEXT)",
                "CREATE TABLE books (id INTEGER PRIMARY KEY, title TEXT, author_id INTEGER, year INTEGER, "
                "genre TEXT, pages INTEGER)",
                "CREATE TABLE loans (id INTEGER PRIMARY KEY, book_id INTEGER, member TEXT, month INTEGER, "
                "returned INTEGER)"),
    "hr": ("CREATE TABLE departments (id INTEGER PRIMARY KEY, name TEXT, floor INTEGER)",
           "CREATE TABLE employees (id INTEGER PRIMARY KEY, name TEXT, department_id INTEGER, salary INTEGER, "
           "hire_year INTEGER, manager_id INTEGER)"),
}


def _people(rng: random.Random, n: int) -> list[str]:
  names = [f"{first} {last}" for first in _FIRST for last in _LAST]
  return rng.sample(names, n)


def _fill_shop(rng: random.Random) -> dict[str, list[tuple]]:
  customers = [(i + 1, name, rng.choice(_CITIES), rng.randint(2015, 2024)) for i, name in enumerate(_people(rng, 30))]
  names = rng.sample([f"{a} {n}" for a in _ADJECTIVES for n in _NOUNS], 24)
  prices = rng.sample(range(300, 20000), 24)  # distinct, so "most expensive first" has one answer
  products = [(i + 1, name, rng.choice(_CATEGORIES), p / 100) for i, (name, p) in enumerate(zip(names, prices))]
  orders = [(i + 1, rng.randint(1, 30), rng.randint(1, 24), rng.randint(1, 5), rng.randint(1, 12)) for i in range(90)]
  return {"customers": customers, "products": products, "orders": orders}


def _fill_school(rng: random.Random) -> dict[str, list[tuple]]:
  students = [(i + 1, name, rng.randint(1, 4), rng.choice(_MAJORS)) for i, name in enumerate(_people(rng, 30))]
  titles = rng.sample([f"{w} {d}" for w in _COURSE_WORDS for d in _DEPARTMENTS], 14)
  courses = [(i + 1, t, t.split()[-1], rng.choice((2, 3, 4, 5))) for i, t in enumerate(titles)]
  pairs = rng.sample([(s, c) for s in range(1, 31) for c in range(1, 15)], 110)
  enrollments = [(s, c, rng.randint(40, 100)) for s, c in pairs]
  return {"students": students, "courses": courses, "enrollments": enrollments}


def _fill_library(rng: random.Random) -> dict[str, list[tuple]]:
  authors = [(i + 1, name, rng.choice(_COUNTRIES)) for i, name in enumerate(_people(rng, 14))]
  titles = rng.sample([f"The {a} {b}" for a in _TITLE_WORDS for b in _TITLE_WORDS if a != b], 40)
  books = [(i + 1, t, rng.randint(1, 14), rng.randint(1950, 2023), rng.choice(_GENRES), rng.randint(90, 900))
           for i, t in enumerate(titles)]
  members = _people(rng, 15)
  loans = [(i + 1, rng.randint(1, 40), rng.choice(members), rng.randint(1, 12), rng.randint(0, 1)) for i in range(80)]
  return {"authors": authors, "books": books, "loans": loans}


def _fill_hr(rng: random.Random) -> dict[str, list[tuple]]:
  departments = [(i + 1, name, rng.randint(1, 5)) for i, name in enumerate(rng.sample(_TEAMS, 6))]
  employees = []
  for i, name in enumerate(_people(rng, 40)):
    manager = rng.randint(1, i) if i >= 4 else None  # the first four report to nobody
    employees.append((i + 1, name, rng.randint(1, 6), rng.randrange(40_000, 150_000, 500), rng.randint(2010, 2024),
                      manager))
  return {"departments": departments, "employees": employees}


_FILLERS: dict[str, Callable[[random.Random], dict[str, list[tuple]]]] = {
    "shop": _fill_shop, "school": _fill_school, "library": _fill_library, "hr": _fill_hr}
DATABASES = tuple(f"{schema}_{k}" for schema in SCHEMAS for k in range(_DBS_PER_SCHEMA))


def cache_dir() -> str:
  root = os.environ.get("EVOLVER_ENV_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "evolver", "envs")
  return os.path.join(root, SqlEnv.version)


def _build_database(path: str, db_name: str) -> None:
  schema = db_name.rsplit("_", 1)[0]
  rng = random.Random(f"sql:{db_name}")
  os.makedirs(os.path.dirname(path), exist_ok=True)
  fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), suffix=".tmp")
  os.close(fd)
  try:
    conn = sqlite3.connect(tmp)
    for statement in SCHEMAS[schema]:
      conn.execute(statement)
    for table, rows in _FILLERS[schema](rng).items():
      conn.executemany(f"INSERT INTO {table} VALUES ({', '.join('?' * len(rows[0]))})", rows)
    conn.commit()
    conn.close()
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)  # atomic: concurrent builders write identical files
  finally:
    if os.path.exists(tmp):
      os.remove(tmp)


_build_lock = threading.Lock()


def database_path(db_name: str) -> str:
  """The database file, generated on first use."""
  path = os.path.join(cache_dir(), f"{db_name}.sqlite")
  if not os.path.exists(path):
    with _build_lock:
      if not os.path.exists(path):
        _build_database(path, db_name)
  return path


# ----------------------------------------------------------------------------------------------------------
# The sandbox.
# ----------------------------------------------------------------------------------------------------------

_READ_PRAGMAS = frozenset({"table_info", "table_xinfo", "index_list", "index_info", "foreign_key_list"})
# printf/format: "%.*c" with a huge precision spins inside one function call, where no progress handler runs.
_DENIED_FUNCTIONS = frozenset({"load_extension", "readfile", "writefile", "edit", "fts3_tokenizer", "printf",
                               "format"})


def _authorize(action: int, arg1: str | None, arg2: str | None, db_name: str | None, trigger: str | None) -> int:
  """Allows reading and nothing else."""
  if action in (sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_RECURSIVE):
    return sqlite3.SQLITE_OK
  if action == sqlite3.SQLITE_FUNCTION:
    return sqlite3.SQLITE_DENY if (arg2 or "").lower() in _DENIED_FUNCTIONS else sqlite3.SQLITE_OK
  if action == sqlite3.SQLITE_PRAGMA and (arg1 or "").lower() in _READ_PRAGMAS:
    return sqlite3.SQLITE_OK
  return sqlite3.SQLITE_DENY


_REFUSALS = ("not authorized", "authorization denied", "prohibited", "readonly", "read-only", "too many attached")


class QueryTimeout(Exception):
  pass


class Sandbox:
  """A read-only, time-limited connection to one database file."""

  def __init__(self, path: str, time_limit_s: float = QUERY_TIME_LIMIT_S):
    self.time_limit_s = time_limit_s
    self._deadline = 0.0
    # No statement cache: the authorizer runs when a statement is prepared, and `tables_read` must see every query.
    self._conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, isolation_level=None, check_same_thread=False,
                                 cached_statements=0)
    self._conn.execute("PRAGMA query_only = 1")
    self._conn.setlimit(sqlite3.SQLITE_LIMIT_ATTACHED, 0)
    self._conn.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 100_000)  # bytes per string or blob
    self._conn.setlimit(sqlite3.SQLITE_LIMIT_LIKE_PATTERN_LENGTH, 1_000)
    self._conn.setlimit(sqlite3.SQLITE_LIMIT_SQL_LENGTH, 20_000)
    self.tables_read: set[str] = set()  # the tables the last query read (what its answer came from)
    self._conn.set_authorizer(self._authorize)
    self._conn.set_progress_handler(self._over_time, 2_000)

  def _authorize(self, action: int, arg1: str | None, arg2: str | None, db_name: str | None,
                 trigger: str | None) -> int:
    if action == sqlite3.SQLITE_READ and arg1 and not arg1.startswith("sqlite_"):
      self.tables_read.add(arg1)
    return _authorize(action, arg1, arg2, db_name, trigger)

  def _over_time(self) -> int:
    return 1 if time.perf_counter() > self._deadline else 0

  def query(self, sql: str, max_rows: int = _MAX_ROWS) -> list[tuple]:
    """Up to `max_rows` + 1 rows of `sql`; raises sqlite3.Error, or QueryTimeout after the time limit."""
    self._deadline = time.perf_counter() + self.time_limit_s
    self.tables_read = set()
    try:
      cursor = self._conn.execute(sql)
      rows = cursor.fetchmany(max_rows + 1)
      cursor.close()
      return rows
    except sqlite3.OperationalError as error:
      if "interrupted" in str(error):
        raise QueryTimeout(f"the query ran longer than {self.time_limit_s} s and was stopped") from error
      raise

  def close(self) -> None:
    self._conn.close()


def _normalise_value(value: Any) -> Any:
  if isinstance(value, (int, float)) and not isinstance(value, bool):
    return round(float(value), 2)
  if isinstance(value, bytes):
    return value.hex()
  return value


def normalise(rows: list[tuple], ordered: bool) -> tuple:
  """Rows in a form where equal answers compare equal."""
  rows = [tuple(_normalise_value(v) for v in row) for row in rows]
  return tuple(rows) if ordered else tuple(sorted(rows, key=repr))


# ----------------------------------------------------------------------------------------------------------
# Questions.
# ----------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SqlTask:
  db: str
  question: str
  gold_sql: str
  thought: str

  @property
  def ordered(self) -> bool:
    return orders_rows(self.gold_sql)


_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def orders_rows(sql: str) -> bool:
  """Whether a gold query fixes the order of its rows (it has an ORDER BY): answers then compare as lists."""
  return _ORDER_BY.search(sql) is not None


@dataclasses.dataclass(frozen=True)
class _Template:
  """A question with one parameter; `params` is a SQL query listing the values, or the values themselves."""
  params: str | tuple
  make: Callable[[Any], tuple[str, str, str]]  # value -> (question, gold SQL, expert thought)
  unique_top: bool = False  # the gold query takes the top row of an ordering: skip values with a tie


def _q(value: Any) -> str:
  return str(value).replace("'", "''")


_JOIN_OP = "FROM orders o JOIN products p ON o.product_id = p.id"
_JOIN_SE = "FROM students s JOIN enrollments e ON e.student_id = s.id JOIN courses c ON e.course_id = c.id"
_JOIN_BA = "FROM books b JOIN authors a ON b.author_id = a.id"
_JOIN_ED = "FROM employees e JOIN departments d ON e.department_id = d.id"

_TEMPLATES: dict[str, tuple[_Template, ...]] = {
    "shop": (
        _Template("SELECT DISTINCT city FROM customers", lambda v: (
            f"How many customers live in {v}?", f"SELECT COUNT(*) FROM customers WHERE city = '{_q(v)}'",
            f"I count the customers whose city is {v}.")),
        _Template("SELECT DISTINCT city FROM customers", lambda v: (
            f"List the names of the customers from {v} who joined after 2019, in alphabetical order.",
            f"SELECT name FROM customers WHERE city = '{_q(v)}' AND joined_year > 2019 ORDER BY name",
            f"I filter customers by city {v} and joined_year > 2019, sorted by name.")),
        _Template("SELECT DISTINCT category FROM products", lambda v: (
            f"List the names of the products in the {v} category, from the most to the least expensive.",
            f"SELECT name FROM products WHERE category = '{_q(v)}' ORDER BY price DESC",
            f"I select the {v} products and sort them by price, highest first.")),
        _Template("SELECT DISTINCT category FROM products", lambda v: (
            f"What is the average price of the products in the {v} category, rounded to 2 decimals?",
            f"SELECT ROUND(AVG(price), 2) FROM products WHERE category = '{_q(v)}'",
            f"I average the prices of the {v} products.")),
        _Template("SELECT DISTINCT p.name " + _JOIN_OP, lambda v: (
            f"What is the total quantity ordered of the product '{v}'?",
            f"SELECT SUM(o.quantity) {_JOIN_OP} WHERE p.name = '{_q(v)}'",
            "I join orders with products and add up the quantities of that product.")),
        _Template("SELECT DISTINCT p.name " + _JOIN_OP, lambda v: (
            f"Which customers ordered the product '{v}'? Give each name once.",
            f"SELECT DISTINCT c.name {_JOIN_OP} JOIN customers c ON o.customer_id = c.id WHERE p.name = '{_q(v)}'",
            "I join customers, orders and products and keep the customers who ordered it.")),
        _Template("SELECT DISTINCT c.name FROM customers c JOIN orders o ON o.customer_id = c.id", lambda v: (
            f"How much did {v} spend in total (price times quantity, rounded to 2 decimals)?",
            f"SELECT ROUND(SUM(p.price * o.quantity), 2) {_JOIN_OP} JOIN customers c ON o.customer_id = c.id "
            f"WHERE c.name = '{_q(v)}'", f"I sum price times quantity over the orders of {v}.")),
        _Template(tuple(range(1, 13)), lambda v: (
            f"How many orders were placed in month {v}?", f"SELECT COUNT(*) FROM orders WHERE order_month = {v}",
            f"I count the orders of month {v}.")),
        _Template(("garden", "kitchen", "toys"), lambda v: (
            f"How many units of {v} products were ordered in total?",
            f"SELECT SUM(o.quantity) {_JOIN_OP} WHERE p.category = '{v}'",
            f"I add up the quantities of orders of {v} products.")),
    ),
    "school": (
        _Template((1, 2, 3, 4), lambda v: (
            f"How many students are in year {v}?", f"SELECT COUNT(*) FROM students WHERE year = {v}",
            f"I count the students whose year is {v}.")),
        _Template("SELECT DISTINCT c.title " + _JOIN_SE, lambda v: (
            f"What is the average grade in the course '{v}', rounded to 1 decimal?",
            f"SELECT ROUND(AVG(e.grade), 1) {_JOIN_SE} WHERE c.title = '{_q(v)}'",
            "I average the grades of the enrollments in that course.")),
        _Template("SELECT DISTINCT s.name " + _JOIN_SE, lambda v: (
            f"List the titles of the courses that {v} is enrolled in.",
            f"SELECT c.title {_JOIN_SE} WHERE s.name = '{_q(v)}'", f"I join the enrollments of {v} with courses.")),
        _Template("SELECT DISTINCT c.title " + _JOIN_SE, lambda v: (
            f"Which student has the highest grade in '{v}'? Give the name.",
            f"SELECT s.name {_JOIN_SE} WHERE c.title = '{_q(v)}' ORDER BY e.grade DESC LIMIT 1",
            "I sort that course's enrollments by grade and take the top student."), unique_top=True),
        _Template("SELECT DISTINCT s.name " + _JOIN_SE, lambda v: (
            f"How many credits does {v} take in total?", f"SELECT SUM(c.credits) {_JOIN_SE} WHERE s.name = '{_q(v)}'",
            f"I add up the credits of the courses of {v}.")),
        _Template("SELECT DISTINCT major FROM students", lambda v: (
            f"List the names of the students majoring in {v}, in alphabetical order.",
            f"SELECT name FROM students WHERE major = '{_q(v)}' ORDER BY name",
            f"I select the {v} students and sort them by name.")),
        _Template("SELECT DISTINCT department FROM courses", lambda v: (
            f"How many students are enrolled in at least one {v} course?",
            f"SELECT COUNT(DISTINCT s.id) {_JOIN_SE} WHERE c.department = '{_q(v)}'",
            f"I count distinct students with an enrollment in a {v} course.")),
    ),
    "library": (
        _Template("SELECT name FROM authors", lambda v: (
            f"How many books did {v} write?", f"SELECT COUNT(*) {_JOIN_BA} WHERE a.name = '{_q(v)}'",
            f"I count the books whose author is {v}.")),
        _Template("SELECT DISTINCT genre FROM books", lambda v: (
            f"List the titles of the {v} books published after 1990.",
            f"SELECT title FROM books WHERE genre = '{_q(v)}' AND year > 1990",
            f"I filter books by genre {v} and year after 1990.")),
        _Template("SELECT DISTINCT genre FROM books", lambda v: (
            f"What is the title of the longest {v} book?",
            f"SELECT title FROM books WHERE genre = '{_q(v)}' ORDER BY pages DESC LIMIT 1",
            f"I sort the {v} books by pages and take the first."), unique_top=True),
        _Template("SELECT DISTINCT b.title FROM books b JOIN loans l ON l.book_id = b.id", lambda v: (
            f"How many loans of '{v}' have not been returned?",
            f"SELECT COUNT(*) FROM loans l JOIN books b ON l.book_id = b.id WHERE b.title = '{_q(v)}' AND "
            "l.returned = 0", "I count that book's loans with returned = 0.")),
        _Template("SELECT DISTINCT a.name " + _JOIN_BA, lambda v: (
            f"What is the total number of pages of the books by {v}?",
            f"SELECT SUM(b.pages) {_JOIN_BA} WHERE a.name = '{_q(v)}'", f"I add up the pages of the books by {v}.")),
        _Template("SELECT DISTINCT a.name " + _JOIN_BA + " JOIN loans l ON l.book_id = b.id", lambda v: (
            f"Which members borrowed books by {v}? Give each member once.",
            f"SELECT DISTINCT l.member {_JOIN_BA} JOIN loans l ON l.book_id = b.id WHERE a.name = '{_q(v)}'",
            f"I join loans, books and authors for {v}.")),
        _Template("SELECT DISTINCT country FROM authors", lambda v: (
            f"How many books were written by authors from {v}?",
            f"SELECT COUNT(*) {_JOIN_BA} WHERE a.country = '{_q(v)}'",
            f"I count the books whose author comes from {v}.")),
        _Template("SELECT DISTINCT member FROM loans", lambda v: (
            f"List the titles of the books {v} borrowed, in alphabetical order, each once.",
            f"SELECT DISTINCT b.title FROM loans l JOIN books b ON l.book_id = b.id WHERE l.member = '{_q(v)}' "
            "ORDER BY b.title", f"I join the loans of {v} with books and sort the distinct titles.")),
    ),
    "hr": (
        _Template("SELECT name FROM departments", lambda v: (
            f"How many employees work in the {v} department?", f"SELECT COUNT(*) {_JOIN_ED} WHERE d.name = '{_q(v)}'",
            f"I count the employees of the {v} department.")),
        _Template("SELECT DISTINCT d.name " + _JOIN_ED, lambda v: (
            f"What is the highest salary in the {v} department?",
            f"SELECT MAX(e.salary) {_JOIN_ED} WHERE d.name = '{_q(v)}'",
            f"I take the maximum salary over the {v} department.")),
        _Template("SELECT name FROM employees WHERE manager_id IS NOT NULL", lambda v: (
            f"What is the name of the manager of {v}?",
            f"SELECT m.name FROM employees e JOIN employees m ON e.manager_id = m.id WHERE e.name = '{_q(v)}'",
            "I join employees with itself on manager_id.")),
        _Template("SELECT DISTINCT hire_year FROM employees", lambda v: (
            f"List the names of the employees hired in {v}, in alphabetical order.",
            f"SELECT name FROM employees WHERE hire_year = {v} ORDER BY name",
            f"I select the employees hired in {v}, sorted by name.")),
        _Template("SELECT DISTINCT floor FROM departments", lambda v: (
            f"How many employees work in departments on floor {v}?",
            f"SELECT COUNT(*) {_JOIN_ED} WHERE d.floor = {v}", f"I count employees whose department is on floor {v}.")),
        _Template("SELECT DISTINCT m.name FROM employees e JOIN employees m ON e.manager_id = m.id", lambda v: (
            f"List the names of the employees managed directly by {v}, in alphabetical order.",
            f"SELECT e.name FROM employees e JOIN employees m ON e.manager_id = m.id WHERE m.name = '{_q(v)}' "
            "ORDER BY e.name", f"I join employees with their managers and keep those managed by {v}.")),
        _Template("SELECT DISTINCT d.name " + _JOIN_ED, lambda v: (
            f"Who is the highest-paid employee of the {v} department?",
            f"SELECT e.name {_JOIN_ED} WHERE d.name = '{_q(v)}' ORDER BY e.salary DESC LIMIT 1",
            f"I sort the {v} employees by salary and take the first."), unique_top=True),
    ),
}


def _has_unique_top(sandbox: Sandbox, gold_sql: str) -> bool:
  """Whether the row a `... ORDER BY x DESC LIMIT 1` query picks is the only one with the top value."""
  source, ordering = gold_sql.split(" FROM ", 1)[1].split(" ORDER BY ")
  column = ordering.split()[0]
  top = sandbox.query(f"SELECT {column} FROM {source} ORDER BY {column} DESC LIMIT 2")
  return len(top) < 2 or top[0] != top[1]


@functools.cache
def _enumerate_tasks() -> tuple[SqlTask, ...]:
  """Every (database, template, value) task with a non-empty answer, in a fixed order."""
  tasks = []
  for db in DATABASES:
    sandbox = Sandbox(database_path(db), time_limit_s=5.0)
    for template in _TEMPLATES[db.rsplit("_", 1)[0]]:
      values = template.params if isinstance(template.params, tuple) else sorted(
          {row[0] for row in sandbox.query(template.params, 10_000)}, key=repr)
      for value in values:
        question, gold_sql, thought = template.make(value)
        rows = sandbox.query(gold_sql)
        if not rows or all(v is None for row in rows for v in row):
          continue
        if template.unique_top and not _has_unique_top(sandbox, gold_sql):
          continue
        tasks.append(SqlTask(db, question, gold_sql, thought))
    sandbox.close()
  return tuple(tasks)


@functools.cache
def tasks_of(split: str) -> tuple[SqlTask, ...]:
  """The split's tasks: all tasks, split by a hash of (database, question), then shuffled deterministically."""
  base.check_split(split)
  chosen = [t for t in _enumerate_tasks() if base.split_of(f"{t.db}|{t.question}", _EVAL_EVERY) == split]
  random.Random(f"sql:{split}").shuffle(chosen)
  return tuple(chosen)


def schema_text(db: str) -> str:
  """`table(column, ...)` lines."""
  lines = []
  for statement in SCHEMAS[db.rsplit("_", 1)[0]]:
    table, columns = re.match(r"CREATE TABLE (\w+) \((.*)\)", statement).groups()
    lines.append(f"{table}({', '.join(c.split()[0] for c in columns.split(', '))})")
  return "\n".join(lines)


_INSTRUCTION = f"""\
You answer questions about a SQLite database by writing SQL queries. Every round you send one SQL query (a \
single SELECT statement) and see its result. The task is solved when your query returns exactly the answer \
to the question: the right rows and the right columns, nothing extra (in the stated order when the question \
asks for one). The database is read-only and each query may run for at most {QUERY_TIME_LIMIT_S} seconds.

Each turn, reply with a short thought and one query on a single line:
Thought: <your reasoning>
Action: <SQL query>

Example, for "How many customers live in Lima?":
Thought: I count the customers whose city is Lima.
Action: SELECT COUNT(*) FROM customers WHERE city = 'Lima'"""


def _answer_rows(answer: Any) -> list[tuple]:
  """A spec's answer (a JSON list of rows) as result rows; EnvError says what is wrong."""
  if not isinstance(answer, list) or not 1 <= len(answer) <= _MAX_ROWS:
    raise base.EnvError(f"sql spec target 'answer' must be a list of 1 to {_MAX_ROWS} rows (lists), got "
                        f"{answer!r:.80}")
  width = len(answer[0]) if isinstance(answer[0], list) else 0
  for row in answer:
    if not isinstance(row, list) or not row or len(row) != width:
      raise base.EnvError(f"sql spec target 'answer' rows must be non-empty lists of equal length, got {row!r:.80}")
    for value in row:
      if isinstance(value, bool) or not isinstance(value, (str, int, float, type(None))):
        raise base.EnvError(f"sql spec target 'answer' values must be strings, numbers or null (SQLite has no "
                            f"booleans: use 0 and 1), got {value!r:.40}")
  if all(value is None for row in answer for value in row):
    raise base.EnvError("sql spec target 'answer' is all null: any query that finds nothing would match it")
  return [tuple(row) for row in answer]


def result_similarity(result: tuple, answer: tuple, ordered: bool) -> float:
  """How close a query's result is to the answer, in [0, 1]: 1 iff they are equal as the task compares them.

  Args:
    result, answer: rows normalised by `normalise(rows, ordered)`.
    ordered: whether the answer's order counts.
  Returns:
    The F1 of the rows as multisets (the rows both share, against each one's count); when the order counts, the
    mean of that F1 and the fraction of positions (of the longer of the two) that hold the answer's row.
  """
  shared = sum((collections.Counter(result) & collections.Counter(answer)).values())
  f1 = 2 * shared / (len(result) + len(answer)) if shared else 0.0
  if not ordered:
    return f1
  in_place = sum(a == b for a, b in zip(result, answer)) / max(len(result), len(answer))
  return (f1 + in_place) / 2


def _show(rows: list[tuple]) -> str:
  shown = "; ".join(repr(row) for row in rows[:_SHOWN_ROWS])
  more = f" ... ({len(rows) - _SHOWN_ROWS} more)" if len(rows) > _SHOWN_ROWS else ""
  count = f"{_MAX_ROWS}+" if len(rows) > _MAX_ROWS else str(len(rows))
  text = f"Result ({count} rows): {shown}{more}"
  return text if len(text) <= 400 else text[:400] + " ..."


def _shown_value(value: Any) -> Any:
  return round(value, 2) if isinstance(value, float) else value


def shown_rows(rows: list[tuple]) -> str | None:
  """A small result spelled out as the env shows results (rows as tuples, floats to 2 decimals, "; " between
  rows), or None when it is too large (more than `_GOAL_ROWS` rows, `_GOAL_COLUMNS` columns or `_GOAL_CHARS`
  characters)."""
  if not rows or len(rows) > _GOAL_ROWS or len(rows[0]) > _GOAL_COLUMNS:
    return None
  shown = "; ".join(repr(tuple(_shown_value(v) for v in row)) for row in rows)
  return shown if len(shown) <= _GOAL_CHARS else None


def result_goal(shown: str, n_rows: int, n_columns: int, ordered: bool) -> str:
  """The question "return exactly these rows" for a result spelled out by `shown_rows`."""
  columns = f"{n_columns} column{'s' if n_columns > 1 else ''}"
  if n_rows == 1:
    return f"Write one SQL query that returns exactly this row of {columns}: {shown}"
  order = " in this order" if ordered else ""
  return f"Write one SQL query that returns exactly these {n_rows} rows of {columns}{order}: {shown}"


def _reads_a_table(sql: str, db: str) -> bool:
  """Whether `sql` names a table of `db`'s schema (a result that reads none says nothing about the database)."""
  tables = re.findall(r"CREATE TABLE (\w+)", " ".join(SCHEMAS[db.rsplit("_", 1)[0]]))
  return any(re.search(rf"\b{table}\b", sql, re.IGNORECASE) for table in tables)


class SqlEnv(base.TextEnv):
  name = "sql"
  version = "sql-v1"
  max_rounds = 6

  def __init__(self, time_limit_s: float = QUERY_TIME_LIMIT_S):
    super().__init__()
    self.time_limit_s = time_limit_s
    self._sandboxes: dict[str, Sandbox] = {}
    self._task: SqlTask | None = None
    self._gold: tuple = ()
    self._ordered = False  # whether answers compare as lists (in order) rather than as multisets
    self._results_seen: set[str] = set()  # digests of the distinct normalised results shown so far
    self._closeness = 0.0  # the best result_similarity to the answer of any query's result so far (0 before any)

  def instruction(self) -> str:
    return _INSTRUCTION

  def _num_tasks(self, split: str) -> int:
    return len(tasks_of(split))

  def _task_key(self, index: int, split: str) -> str:
    task = tasks_of(split)[index]
    return f"{task.db}|{task.question}"

  def _sandbox(self, db: str | None = None) -> Sandbox:
    db = self._task.db if db is None else db
    if db not in self._sandboxes:
      self._sandboxes[db] = Sandbox(database_path(db), self.time_limit_s)
    return self._sandboxes[db]

  def _reset_task(self, index: int, split: str) -> str:
    task = tasks_of(split)[index]
    sandbox = self._sandbox(task.db)
    sandbox.time_limit_s = 5.0  # the trusted gold query
    try:
      gold = normalise(sandbox.query(task.gold_sql), task.ordered)
    finally:
      sandbox.time_limit_s = self.time_limit_s
    return self._start(task, gold, task.ordered)

  def _reset_spec(self, spec: base.TaskSpec) -> str:
    """Target: `{"query": sql}` or `{"answer": rows}`, optionally with `"ordered": bool`, on the database of task
    `spec.world`; `spec.goal` is the question, required (the env cannot word a question from a result).

    - "query": a gold SELECT query, possibly model-written: it runs in the same read-only, time-limited
      `Sandbox` as the agent's queries (the only place model text is ever executed), and its result is the
      answer. It must succeed within the agent's time limit and return 1 to 200 rows, not all NULL (an empty
      answer would be matched by any query that finds nothing). The expert sends this query.
    - "answer": the answer's rows, a list of 1 to 200 equally long non-empty lists of strings, numbers and
      nulls. There is no expert for such a spec (`expert_action` raises EnvError).
    - "ordered": whether the rows must come in order; by default, true iff the gold query has an ORDER BY
      (false for an answer).
    - "from_tables": the answer must be read from the database's tables (a query of literals, `SELECT 'Oslo', 14`,
      does not count): for goals that show the rows to return, as hindsight tasks' do. Default false.

    Success, as for an indexed task: a query whose result equals the answer (rows as a list when ordered,
    else as a multiset; numbers to 2 decimals), reward 1.
    """
    base.check_target_keys(self.name, spec.target, (), ("query", "answer", "ordered", "from_tables"))
    target = spec.target
    if ("query" in target) == ("answer" in target):
      raise base.EnvError("sql spec target needs exactly one of 'query' (a gold SQL query) and 'answer' (rows)")
    if not spec.goal.strip():
      raise base.EnvError("a sql spec needs the question as its 'goal': the env cannot word one from a target")
    ordered = target.get("ordered")
    if ordered is not None and not isinstance(ordered, bool):
      raise base.EnvError(f"sql spec target 'ordered' must be true or false, got {ordered!r:.40}")
    from_tables = target.get("from_tables", False)
    if not isinstance(from_tables, bool):
      raise base.EnvError(f"sql spec target 'from_tables' must be true or false, got {from_tables!r:.40}")
    db = tasks_of(spec.split)[spec.world].db
    if "query" in target:
      gold_sql = base.spec_str(self.name, "query", target["query"]).strip().rstrip(";").strip()
      ordered = orders_rows(gold_sql) if ordered is None else ordered
      rows = self._gold_rows(db, gold_sql)
      thought = "I write one query that answers the question."
    else:
      gold_sql, thought = "", ""
      rows = _answer_rows(target["answer"])
      ordered = bool(ordered)
    return self._start(SqlTask(db, spec.goal.strip(), gold_sql, thought), normalise(rows, ordered), ordered,
                       from_tables)

  def _reset_world(self, index: int, split: str) -> str:
    """The schema of task `index`'s database, with no question; every query runs and shows its result.

    Outcomes: each query whose result a spec would accept as an answer (1 to 200 rows, not all NULL) and that
    is small enough to spell out (see `shown_rows`) and names a table of the database, as
    `{"query": sql}` with the goal "Write one SQL query that returns exactly these N rows of K columns[ in
    this order]: (...); (...)" ("exactly this row" for one) - in this order iff the query has an ORDER BY, as
    the spec then compares - and the query as the one action. One task per distinct result (and order): the
    first query that gave it. The goal spells out the answer, so a query of literals also solves it; telling
    such solutions apart is the task builder's business.
    """
    db = tasks_of(split)[index].db
    self._start(SqlTask(db, "", "", ""), (), False)
    return f"Database {db}:\n{schema_text(db)}"

  def _explored(self, sql: str, rows: list[tuple]) -> None:
    """Records a query's result as a task, if it is one (see `_reset_world`)."""
    if len(rows) > _MAX_ROWS or all(v is None for row in rows for v in row) or not _reads_a_table(sql, self._task.db):
      return
    shown = shown_rows(rows)
    if shown is not None:
      ordered = orders_rows(sql)
      self._add_hindsight({"query": sql, "from_tables": True}, [sql], f"the query {sql!r} returns {shown}",
                          goal=result_goal(shown, len(rows), len(rows[0]), ordered),
                          dedupe=f"{ordered and len(rows) > 1}|{normalise(rows, ordered)!r}")

  def _target_key_now(self) -> str:
    """The database and the answer's rows as a multiset (an ordered answer's rows too: the same rows in
    another order give the answer away all the same)."""
    answer = base.stable_digest(repr(tuple(sorted(self._gold, key=repr))))
    return f"sql|db={self._task.db}|answer={answer}"

  def _gold_rows(self, db: str, gold_sql: str) -> list[tuple]:
    """The result of a spec's gold query, run like an agent's query; EnvError when it is no usable answer."""
    try:
      rows = self._sandbox(db).query(gold_sql)
    except (QueryTimeout, sqlite3.Error, ValueError, OverflowError, MemoryError) as error:
      raise base.EnvError(f"sql spec target query failed on {db}: {error.__class__.__name__}: "
                          f"{str(error)[:200]}") from None
    if len(rows) > _MAX_ROWS:
      raise base.EnvError(f"sql spec target query returns more than {_MAX_ROWS} rows; no answer can match it")
    if not rows or all(v is None for row in rows for v in row):
      raise base.EnvError("sql spec target query returns no rows (or only NULLs): any query that finds nothing "
                          "would match it")
    return rows

  def _start(self, task: SqlTask, gold: tuple, ordered: bool, from_tables: bool = False) -> str:
    self._task = task
    self._gold = gold
    self._ordered = ordered
    self._from_tables = from_tables
    self._results_seen = set()
    self._closeness = 0.0
    return f"Database {task.db}:\n{schema_text(task.db)}\nQuestion: {task.question}"

  def _state_key(self) -> str:
    """The set of distinct results the agent has seen, each as a digest of its normalised rows (normalised as
    the task compares answers: as a multiset unless order matters).

    The database never changes, so what differs between two moments of an episode is only what the agent has
    learned from it: the same results in another order, or seen twice, leave it knowing the same. Queries that
    fail (errors, refusals, timeouts) show no data and leave the key unchanged.
    """
    return "seen=" + ",".join(sorted(self._results_seen))

  def _measures(self) -> tuple[int, float]:
    """cost_to_go: 1 until a query returns the answer (then the episode is solved: 0); progress: the closest any
    query's result so far came to the answer (`result_similarity`: row F1 as multisets, with the order when it
    counts; a query that failed (error, refusal, timeout, empty) or a result that must come from the tables but
    came from literals counts 0), 0 before any query. Every query costs a turn, so the oracle judges a turn by
    whether its result came closer to the answer than any before it: a detour through an error and back to an
    earlier result is no progress."""
    return 1, self._closeness

  def _act(self, text: str) -> base.Outcome:
    sql = base.action_text(text).strip().strip("`").removeprefix("sql").strip().rstrip(";").strip()
    if not sql:
      return base.Outcome("Empty query. Write one SQL SELECT statement after \"Action:\".", 0.0)
    try:
      rows = self._sandbox().query(sql)
    except QueryTimeout as error:
      return base.Outcome(f"Query stopped: {error}. Write a cheaper query.", 0.0)
    except sqlite3.DatabaseError as error:
      message = str(error)
      if any(reason in message for reason in _REFUSALS):
        return base.Outcome(f"Not allowed: {message}. Only read-only SELECT queries can run here.", 0.0)
      return base.Outcome(f"SQL error: {message[:200]}", 0.0)
    except (sqlite3.Error, ValueError, OverflowError, MemoryError) as error:
      return base.Outcome(f"Query failed: {str(error)[:200]}", 0.0)
    result = normalise(rows, self._ordered)
    self._results_seen.add(base.stable_digest(repr(result)))
    if self._exploring:
      self._explored(sql, rows)
      return base.Outcome(_show(rows), 0.0)
    literal = self._from_tables and not self._sandbox().tables_read
    if not literal:
      self._closeness = max(self._closeness, result_similarity(result, self._gold, self._ordered))
    if len(rows) <= _MAX_ROWS and result == self._gold:
      if literal:
        return base.Outcome(f"{_show(rows)}\nThese rows must come from the database's tables, not from literals "
                            "in the query.", 0.0)
      return base.Outcome(f"{_show(rows)}\nThis is the correct answer. Success!", 1.0, True, True)
    return base.Outcome(f"{_show(rows)}\nThis is not the expected answer yet.", 0.0)

  def _expert_turn(self) -> str:
    if not self._task.gold_sql:
      raise base.EnvError("no expert for an answer-only sql spec: it gives the answer's rows, not a query")
    return base.react_turn(self._task.thought, self._task.gold_sql)

  def _sample_action(self, rng: random.Random) -> str:
    statement = rng.choice(SCHEMAS[self._task.db.rsplit("_", 1)[0]])
    table, columns = re.match(r"CREATE TABLE (\w+) \((.*)\)", statement).groups()
    column = rng.choice([c.split()[0] for c in columns.split(", ")])
    form = rng.choice(("SELECT COUNT(*) FROM {t}", "SELECT {c} FROM {t}", "SELECT DISTINCT {c} FROM {t}",
                       "SELECT MAX({c}) FROM {t}", "SELECT SUM({c}) FROM {t}", "SELECT * FROM {t} LIMIT 5"))
    return form.format(t=table, c=column)

  def close(self) -> None:
    for sandbox in self._sandboxes.values():
      sandbox.close()
    self._sandboxes.clear()
    super().close()
