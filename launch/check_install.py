"""Checks that an install of evolver has every package it runs: the audit CI runs in a venv set up for `run` alone.

  EVOLVER_VENV=.venv-run bash -c 'source launch/setup_venv.sh run && python -m launch.check_install'
  python -m launch.check_install --extras test,sciworld      # in the test venv: the extras' imports too

A test venv carries more than `setup.py` declares for running (torch brings jinja2, for one), so a run-time import
that `install_requires` lacks passes every test and fails a user's first command. Four checks, each naming what is
missing and where it is imported:
1. every import statement under `evolver/` and `launch/`, at module level or inside a function, resolves
   (a module that only an extra provides is checked only when that extra is named by `--extras`);
2. every module under `evolver/` and `launch/` imports (again, those of an unnamed extra are skipped);
3. every chat template that ships with evolver renders a conversation through transformers (which needs jinja2);
4. every entry point under `launch/` (`python -m launch.NAME`) answers `--help` with exit status 0.
Exit status 0 when all pass, 1 otherwise; the last line is one JSON object with the counts.
"""

from __future__ import annotations

import argparse
import ast
import glob
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("evolver", "launch")
FIRST_PARTY = frozenset(PACKAGES) | {"tests"}

# Top-level modules that only an extra of setup.py (or the test venv) provides, and the extra's name.
EXTRA_MODULES = {
    "torch": "test",  # reference checks in the benchmarks' peers
    "pytest": "test",
    "scienceworld": "sciworld",
    "py4j": "sciworld",  # scienceworld's bridge to its JVM
    "llama_cpp": "llamacpp",  # the llama_cpp benchmark suite's peer
}
# Modules of ours that need an extra to import at all.
EXTRA_OWN_MODULES = {
    "evolver.envs.sciworld": "sciworld",
}


def python_files(root: str = ROOT, packages: Sequence[str] = PACKAGES) -> list[str]:
  """Every .py file of the given packages, relative to `root`, sorted."""
  files = []
  for package in packages:
    files += glob.glob(os.path.join(root, package, "**", "*.py"), recursive=True)
  return sorted(os.path.relpath(f, root) for f in files)


def module_name(path: str) -> str:
  """`evolver/envs/maze.py` -> `evolver.envs.maze`; a package's `__init__.py` -> the package."""
  parts = path[:-len(".py")].split(os.sep)
  if parts[-1] == "__init__":
    parts = parts[:-1]
  return ".".join(parts)


def imports_of(source: str) -> list[tuple[str, int]]:
  """The absolute modules a source file imports, anywhere in it (module level, functions, try blocks), with their
  line numbers: `import a.b` -> `a.b`; `from a.b import c` -> `a.b` (c may be a module or a name: both resolve by
  importing a.b). Relative imports are ours and left out."""
  found = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      found += [(alias.name, node.lineno) for alias in node.names]
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      found.append((node.module, node.lineno))
  return found


def third_party_imports(files: Iterable[str], root: str = ROOT) -> dict[str, list[str]]:
  """{module: ["file:line", ...]} for every import of a module that is neither ours nor the standard library's."""
  where: dict[str, list[str]] = {}
  for path in files:
    with open(os.path.join(root, path), encoding="utf-8") as f:
      source = f.read()
    for name, line in imports_of(source):
      top = name.split(".")[0]
      if top in FIRST_PARTY or top in sys.stdlib_module_names or top == "__future__":
        continue
      where.setdefault(name, []).append(f"{path}:{line}")
  return where


def _extra_of(module: str) -> str | None:
  for name, extra in {**EXTRA_MODULES, **EXTRA_OWN_MODULES}.items():
    if module == name or module.startswith(name + "."):
      return extra
  return None


def check_imports(where: dict[str, list[str]], extras: set[str]) -> tuple[list[str], list[str]]:
  """Imports every module in `where` ({module: the places that import it}); those of extras not in `extras` are
  skipped. Returns (failures, skipped)."""
  failures, skipped = [], []
  for module in sorted(where):
    extra = _extra_of(module)
    if extra is not None and extra not in extras:
      skipped.append(f"{module} (extra '{extra}')")
      continue
    try:
      importlib.import_module(module)
    except Exception as e:  # pylint: disable=broad-except  # any failure to import is what this reports
      place = f"; imported at {', '.join(where[module][:3])}" if where[module] else ""
      failures.append(f"import {module} failed ({type(e).__name__}: {e}){place}")
  return failures, skipped


def check_own_modules(files: Iterable[str], extras: set[str], exclude: Iterable[str] = ()) -> tuple[list[str], list[str]]:
  """Imports every module of ours but those in `exclude` (entry points, which define absl flags that clash in one
  process; their `--help` run imports them). Returns (failures, skipped)."""
  exclude = set(exclude)
  return check_imports({name: [] for name in map(module_name, files) if name not in exclude}, extras)


def shipped_tokenizer_dirs(root: str = ROOT) -> list[str]:
  """Every directory under evolver/ that ships a tokenizer with a chat template."""
  dirs = {os.path.dirname(p) for p in glob.glob(os.path.join(root, "evolver", "**", "tokenizer_config.json"),
                                                recursive=True)}
  return sorted(dirs)


def check_chat_templates(root: str = ROOT) -> tuple[list[str], int]:
  """Renders a conversation through each shipped tokenizer's chat template, and through evolver's ChatML template
  set on the first. Returns (failures, templates rendered)."""
  from evolver.data import chat  # pylint: disable=import-outside-toplevel
  from evolver.models.tokenizer import load_tokenizer  # pylint: disable=import-outside-toplevel
  conversation = [{"role": "user", "content": "Go to the exit."}, {"role": "assistant", "content": "Action: north"}]
  failures, rendered = [], 0
  dirs = shipped_tokenizer_dirs(root)
  if not dirs:
    return ["no shipped tokenizer found under evolver/"], 0
  for directory in dirs:
    label = os.path.relpath(directory, root)
    try:
      tokenizer = load_tokenizer(directory)
      templates = [("its template", tokenizer.chat_template), ("CHATML_TEMPLATE", chat.CHATML_TEMPLATE)]
      for name, template in templates:
        tokenizer.chat_template = template
        for prompt in (False, True):
          text = chat.render_chat(tokenizer, conversation, add_generation_prompt=prompt)
          if "Go to the exit." not in text:
            failures.append(f"{label} ({name}) rendered without the message: {text!r}")
        rendered += 1
    except Exception as e:  # pylint: disable=broad-except
      failures.append(f"rendering the chat template of {label} failed ({type(e).__name__}: {e})")
  return failures, rendered


def entry_points(root: str = ROOT) -> dict[str, bool]:
  """{`launch.NAME`: whether it parses flags with absl} for every module of launch/ that runs as a script."""
  names = {}
  for path in python_files(root, ("launch",)):
    with open(os.path.join(root, path), encoding="utf-8") as f:
      source = f.read()
    if '__name__ == "__main__"' in source:
      names[module_name(path)] = "from absl import app" in source
  return names


def check_entry_points(names: dict[str, bool], root: str = ROOT, timeout_s: float = 300) -> list[str]:
  """Runs `python -m NAME --help` for each; a failure is a non-zero exit (absl's `--help` exits 1 by design after
  printing its usage, so there the usage must be printed instead), reported with the last lines of its output."""
  failures = []
  for name, uses_absl in names.items():
    proc = subprocess.run([sys.executable, "-m", name, "--help"], cwd=root, capture_output=True, text=True,
                          timeout=timeout_s, env=dict(os.environ, JAX_PLATFORMS="cpu"))
    answered = proc.returncode == 0 or (uses_absl and proc.returncode == 1 and "Try --helpfull" in proc.stdout)
    if not answered:
      tail = "\n    ".join((proc.stdout + proc.stderr).strip().splitlines()[-8:])
      failures.append(f"python -m {name} --help exited {proc.returncode}:\n    {tail}")
  return failures


def main(argv: Sequence[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--extras", default="", help="comma-separated extras of setup.py installed here "
                      f"(known: {', '.join(sorted(set(EXTRA_MODULES.values()) | set(EXTRA_OWN_MODULES.values())))})")
  parser.add_argument("--skip_entry_points", action="store_true", help="skip the `--help` runs (the slow part)")
  args = parser.parse_args(argv)
  extras = {e for e in args.extras.split(",") if e}
  start = time.time()
  files = python_files()
  report = {}
  failures = []

  where = third_party_imports(files)
  found, skipped = check_imports(where, extras)
  failures += found
  report["imports"] = len(where) - len(skipped)
  print(f"[check_install] {len(where) - len(skipped)} third-party imports resolve, "
        f"{len(found)} do not; skipped {len(skipped)}: {', '.join(skipped) or 'none'}")

  names = entry_points()
  found, skipped = check_own_modules(files, extras, exclude=() if args.skip_entry_points else names)
  failures += found
  count = len(files) - len(skipped) - (0 if args.skip_entry_points else len(names))
  report["modules"] = count
  print(f"[check_install] {count - len(found)} of {count} modules import"
        f"{'' if args.skip_entry_points else ' (and the entry points through --help)'}; "
        f"skipped {len(skipped)}: {', '.join(skipped) or 'none'}")

  found, rendered = check_chat_templates()
  failures += found
  report["chat_templates"] = rendered
  print(f"[check_install] {rendered} chat templates rendered, {len(found)} failed")

  if not args.skip_entry_points:
    found = check_entry_points(names)
    failures += found
    report["entry_points"] = len(names)
    print(f"[check_install] {len(names) - len(found)} of {len(names)} entry points answer --help")

  for failure in failures:
    print(f"[check_install] FAIL: {failure}", file=sys.stderr)
  if failures:
    print("[check_install] a package evolver runs is missing from this install: declare it in setup.py's "
          "install_requires (or the extra of the feature that needs it)", file=sys.stderr)
  report.update(failures=len(failures), seconds=round(time.time() - start, 1))
  print(json.dumps(report))
  return 1 if failures else 0


if __name__ == "__main__":
  sys.exit(main())
