"""launch/quickstart.sh installs what it runs, launch/test.sh adds the test extra, and the install stamp knows
which one a venv has. The scripts run in a copy of the repository whose .venv is a stub: its `python` records
what it is asked to do, so nothing is installed. setup.py's dependencies themselves are checked too."""

import os
import shutil
import stat
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = ("setup.py", "launch/setup_venv.sh", "launch/quickstart.sh", "launch/test.sh")

STUB_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG"
"""


@pytest.fixture
def repo(tmp_path):
  """A copy of the scripts and setup.py with a stub .venv."""
  root = tmp_path / "repo"
  for path in SCRIPTS:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(os.path.join(ROOT, path), root / path)
  bin_dir = root / ".venv" / "bin"
  bin_dir.mkdir(parents=True)
  (bin_dir / "python").write_text(STUB_PYTHON)
  (bin_dir / "python").chmod((bin_dir / "python").stat().st_mode | stat.S_IXUSR)
  (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')
  return root


def run(repo, script, *args):
  """Runs a script of the copy; returns (what the stub python was asked, in order; the script's stdout)."""
  log = repo / "stub.log"
  log.write_text("")
  env = dict(os.environ, STUB_LOG=str(log))
  env.pop("EVOLVER_CACHE_DIR", None)
  proc = subprocess.run(["bash", f"launch/{script}", *args], cwd=repo, env=env, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == 0, proc.stderr
  return log.read_text().splitlines(), proc.stdout


def installs(calls):
  return [c for c in calls if c.startswith("-m pip install -e")]


def test_quickstart_installs_without_the_test_extra_and_test_sh_adds_it(repo):
  calls, out = run(repo, "quickstart.sh")
  assert installs(calls) == ["-m pip install -e ."]
  assert "with its test extra" not in out
  assert calls[-1].startswith("-m launch.train --gin_file=gin_configs/runs/agentevol.gin")
  calls, _ = run(repo, "quickstart.sh")
  assert not installs(calls) and len(calls) == 1  # stamped: nothing to install
  calls, out = run(repo, "test.sh", "-k", "x")
  assert installs(calls) == ["-m pip install -e .[test,sciworld]"] and "with its test extra" in out
  assert calls[-1] == "-m pytest tests -q -ra -k x"
  calls, _ = run(repo, "test.sh")
  assert calls == ["-m pytest tests -q -ra"]
  calls, _ = run(repo, "quickstart.sh")
  assert not installs(calls)
  stamps = [p for p in os.listdir(repo / ".venv") if p.startswith(".evolver-install-")]
  assert len(stamps) == 1 and stamps[0].endswith("-test")


def test_a_venv_set_up_for_tests_needs_nothing_more_for_the_quickstart(repo):
  calls, _ = run(repo, "test.sh")
  assert installs(calls) == ["-m pip install -e .[test,sciworld]"]
  calls, _ = run(repo, "quickstart.sh")
  assert len(calls) == 1 and calls[0].startswith("-m launch.train")


def test_changing_setup_py_installs_again(repo):
  run(repo, "test.sh")
  with open(repo / "setup.py", "a") as f:
    f.write("# changed\n")
  calls, _ = run(repo, "quickstart.sh")
  assert installs(calls) == ["-m pip install -e ."]
  calls, _ = run(repo, "test.sh")  # the old stamp for tests no longer counts
  assert installs(calls) == ["-m pip install -e .[test,sciworld]"]


def test_setup_venv_says_how_to_call_it(repo):
  proc = subprocess.run(["bash", "-c", "source launch/setup_venv.sh"], cwd=repo, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == 2 and "usage: source launch/setup_venv.sh run|test" in proc.stderr


def _setup_kwargs():
  calls = []
  import setuptools  # pylint: disable=import-outside-toplevel
  original = setuptools.setup
  setuptools.setup = lambda **kwargs: calls.append(kwargs)
  try:
    with open(os.path.join(ROOT, "setup.py")) as f:
      exec(compile(f.read(), "setup.py", "exec"), {"__name__": "__main__"})  # pylint: disable=exec-used
  finally:
    setuptools.setup = original
  (kwargs,) = calls
  return kwargs


def test_only_the_test_extra_brings_torch_and_pytest():
  kwargs = _setup_kwargs()
  names = [r.split(">")[0].split("=")[0].split("<")[0].strip().lower() for r in kwargs["install_requires"]]
  assert not {"torch", "pytest", "grain"} & set(names), names  # grain: nothing imports it
  test_names = {r.split(">")[0].split("=")[0].strip().lower() for r in kwargs["extras_require"]["test"]}
  assert {"torch", "pytest"} <= test_names
