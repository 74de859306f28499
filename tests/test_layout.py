"""The dependency direction the README's layout states: the rooms of `evolver/` import one way,

  envs <- data <- models <- rollout <- {experience, tasks, credit, rl} <- train

(a room imports itself and rooms to its left; the four in braces never import each other), and the shared
modules at the top of the package (`paths`, `runtime`, `distributed`, `json_http`) import no room. Every import
statement of every module is read, the ones inside functions included. Envs also import no JAX and data no model
code, checked in fresh processes (the test process has imported everything)."""

import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "evolver")
# Each room's layer; a room may import the rooms of lower layers and itself, never a room of its own layer.
LAYERS = {"envs": 0, "data": 1, "models": 2, "rollout": 3, "experience": 4, "tasks": 4, "credit": 4, "rl": 4,
          "train": 5}
SHARED = {"paths", "runtime", "distributed", "json_http"}


def evolver_imports(path: str) -> list[tuple[int, str]]:
  """(line, the part of evolver imported: a room or a shared module) of every import statement in a module."""
  found = []
  for node in ast.walk(ast.parse(open(path, encoding="utf-8").read(), path)):
    if isinstance(node, ast.Import):
      names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names = ([f"{node.module}.{alias.name}" for alias in node.names] if node.module == "evolver"
               else [node.module])
    else:
      continue
    found += [(node.lineno, name.split(".")[1]) for name in names
              if name.startswith("evolver.") and name.split(".")[1] != "__init__"]
  return found


def modules() -> list[tuple[str, str]]:
  """(the room or shared module it belongs to, path) of every module of the package."""
  out = []
  for folder, _, files in os.walk(PACKAGE):
    relative = os.path.relpath(folder, PACKAGE)
    for name in sorted(files):
      if name.endswith(".py") and not (relative == "." and name == "__init__.py"):
        out.append((relative.split(os.sep)[0] if relative != "." else name[:-3], os.path.join(folder, name)))
  return out


def test_every_part_of_the_package_is_placed():
  parts = {part for part, _ in modules()}
  assert parts == set(LAYERS) | SHARED, parts ^ (set(LAYERS) | SHARED)


def test_rooms_import_one_way_and_shared_modules_import_no_room():
  wrong = []
  for part, path in modules():
    for line, imported in evolver_imports(path):
      if imported == part:
        continue
      if part in SHARED:
        allowed = imported in SHARED
      else:
        allowed = imported in SHARED or LAYERS.get(imported, LAYERS[part]) < LAYERS[part]
      if not allowed:
        wrong.append(f"{os.path.relpath(path, ROOT)}:{line} ({part}) imports evolver.{imported}")
  assert not wrong, "\n".join(wrong)


def test_the_check_sees_imports_inside_functions(tmp_path):
  module = tmp_path / "m.py"
  module.write_text("import evolver.rollout\n\ndef f():\n  from evolver import train as t\n"
                    "  from evolver.credit.judges import oracle_labels\n  import numpy\n")
  assert evolver_imports(str(module)) == [(1, "rollout"), (4, "train"), (5, "credit")]


def imported_after(statement: str) -> set[str]:
  script = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
  return set(proc.stdout.split())


@pytest.mark.parametrize("statement, forbidden", [
    ("import evolver.envs, evolver.envs.maze, evolver.envs.server, evolver.envs.remote",
     ("jax", "flax", "evolver.data", "evolver.models", "evolver.rollout", "evolver.train")),
    ("from evolver.data import chat, tokenize, batching, agenttraj, trajectory, expert",
     ("jax", "flax", "safetensors", "evolver.models", "evolver.rollout", "evolver.train")),
])
def test_lower_layers_do_not_import_upper_ones(statement, forbidden):
  loaded = imported_after(statement)
  assert not [m for m in forbidden if m in loaded]
