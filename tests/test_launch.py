"""How `python -m launch.X` starts: JAX's persistent compilation cache is on for every launch command, and
`launch.train` finds run configs and their includes the same from any working directory, printing no
"Path not found" errors on the way."""

import json
import logging
import os
import subprocess
import sys
import textwrap

import gin
import jax
import pytest

from evolver import runtime
from evolver.train import gin_config
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BC_GIN = os.path.join(ROOT, "gin_configs", "runs", "bc.gin")

PROBE = textwrap.dedent('''\
    """A training loop for the tests that reports what launch.train set up and trains nothing."""
    import json

    import gin
    import jax
    import jax.numpy as jnp


    @gin.configurable
    def probe_loop(model_dir=gin.REQUIRED):
      jax.jit(lambda x: x * 2 + 1)(jnp.arange(3.0)).block_until_ready()  # one program for the cache
      print("PROBE " + json.dumps({"cache_dir": jax.config.jax_compilation_cache_dir, "model_dir": model_dir,
                                   "hidden_size": gin.query_parameter("ModelConfig.hidden_size"),
                                   "seed": gin.query_parameter("%SEED")}))
    ''')


def decoy_workdir(path):
  """A working directory with folders named like the includes' (`models/`, `runs/`: namespace packages there, on
  which gin's package reader crashed) and files named like them (which gin read instead of the shipped ones)."""
  (path / "models").mkdir(parents=True)
  (path / "models" / "tiny.gin").write_text("ModelConfig.hidden_size = 7\n")
  (path / "runs").mkdir()
  (path / "base.gin").write_text("SEED = 99\n")
  return path


# compare/bc.gin includes runs/bc.gin, which includes base.gin and models/tiny.gin: from the decoy directory,
# gin crashed with a TypeError (`runs`) and would have read the decoys; from an empty one it logged
# "Path not found: base.gin" and "Path not found: models/tiny.gin" at ERROR level.
@pytest.mark.parametrize("workdir,run_config", [("decoys", "compare/bc.gin"), ("empty", "runs/bc.gin")])
def test_train_runs_the_same_from_another_directory_with_the_cache_on(tmp_path, workdir, run_config):
  work = decoy_workdir(tmp_path / "work") if workdir == "decoys" else tmp_path / "work"
  work.mkdir(exist_ok=True)
  probe = tmp_path / "probe"
  probe.mkdir()
  (probe / "launch_probe.py").write_text(PROBE)
  (probe / "probe.gin").write_text("import launch_probe\nrun.loop = @probe_loop\nprobe_loop.model_dir = %MODEL_DIR\n")
  env = {k: v for k, v in one_device_env().items() if k != runtime.JAX_CACHE_DIR_ENV}
  env.update(EVOLVER_CACHE_DIR=str(tmp_path / "cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
             PYTHONPATH=os.pathsep.join([ROOT, str(probe)]))  # launch/ is at the repository root, not installed
  gin_file = os.path.relpath(os.path.join(ROOT, "gin_configs", run_config), work)
  cmd = [sys.executable, "-m", "launch.train", f"--gin_file={gin_file}", "--gin_file=../probe/probe.gin",
         "--gin_bindings=MODEL_DIR = '/nonexistent/run'"]
  proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "Path not found" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
  (line,) = [l for l in proc.stdout.splitlines() if l.startswith("PROBE ")]
  seen = json.loads(line[len("PROBE "):])
  cache_dir = str(tmp_path / "cache" / "jax")
  # The shipped includes (tiny: hidden 192; base: seed 0), not the working directory's files of the same names.
  assert seen == {"cache_dir": cache_dir, "model_dir": "/nonexistent/run", "hidden_size": 192, "seed": 0}
  assert os.listdir(cache_dir), "the compiled program was not written to the persistent cache"


def test_every_launch_command_turns_the_cache_on_without_importing_jax(tmp_path):
  env = {k: v for k, v in os.environ.items() if k != runtime.JAX_CACHE_DIR_ENV}
  env.update(EVOLVER_CACHE_DIR=str(tmp_path), PYTHONPATH=ROOT)
  script = ("import sys, launch.serve_env\n"
            "print('jax' in sys.modules)\n"  # the env server starts without JAX
            "import jax\n"
            "print(jax.config.jax_compilation_cache_dir)\n")
  proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, env=env,
                        timeout=120)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert proc.stdout.split() == ["False", str(tmp_path / "jax")]


def test_cache_dir_is_the_explicit_one_else_under_evolvers_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  monkeypatch.delenv(runtime.JAX_CACHE_DIR_ENV, raising=False)
  monkeypatch.delenv(runtime.CACHE_DIR_ENV, raising=False)
  assert runtime.compilation_cache_dir() == str(tmp_path / "home" / ".cache" / "evolver" / "jax")
  monkeypatch.setenv(runtime.CACHE_DIR_ENV, str(tmp_path / "evolver"))
  assert runtime.compilation_cache_dir() == str(tmp_path / "evolver" / "jax")
  monkeypatch.setenv(runtime.JAX_CACHE_DIR_ENV, "")  # empty: unset
  assert runtime.compilation_cache_dir() == str(tmp_path / "evolver" / "jax")
  monkeypatch.setenv(runtime.JAX_CACHE_DIR_ENV, str(tmp_path / "explicit"))
  assert runtime.compilation_cache_dir() == str(tmp_path / "explicit")


def test_enabling_after_jax_is_imported_updates_its_setting(monkeypatch, tmp_path):
  before = jax.config.jax_compilation_cache_dir
  monkeypatch.setenv(runtime.JAX_CACHE_DIR_ENV, str(tmp_path / "jax"))
  try:
    assert runtime.enable_compilation_cache() == str(tmp_path / "jax")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax")
  finally:
    jax.config.update("jax_compilation_cache_dir", before)


def test_includes_ignore_the_working_directory_and_log_no_errors(monkeypatch, tmp_path, caplog):
  # In pytest's process `tests/` is on sys.path, so `models` is importable as a namespace package here too.
  work = decoy_workdir(tmp_path)
  monkeypatch.chdir(work)
  monkeypatch.syspath_prepend(str(work))
  lookup = list(gin.config._LOCATION_PREFIXES), list(gin.config._FILE_READERS)  # pylint: disable=protected-access
  gin.clear_config()
  try:
    with caplog.at_level(logging.INFO):
      gin_config.parse([os.path.relpath(BC_GIN, work)], ["MODEL_DIR = 'x'"])
      assert gin.query_parameter("ModelConfig.hidden_size") == 192 and gin.query_parameter("%SEED") == 0
      gin.clear_config()
      gin_config.parse(["gin_configs/runs/bc.gin"], ["MODEL_DIR = 'x'"])  # relative to the repository
      assert gin.query_parameter("ModelConfig.hidden_size") == 192
      gin.clear_config()
      gin_config.parse(["models/tiny.gin"], [])  # a file given on the command line: the working directory's first
      assert gin.query_parameter("ModelConfig.hidden_size") == 7
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text
    # gin's own lookup is left as it was.
    assert lookup == (gin.config._LOCATION_PREFIXES, gin.config._FILE_READERS)  # pylint: disable=protected-access
  finally:
    gin.clear_config()


def test_missing_files_and_includes_are_config_errors(monkeypatch, tmp_path):
  monkeypatch.chdir(tmp_path)
  with pytest.raises(gin_config.ConfigError, match=r"gin file 'nope.gin' not found .*--gin_search_paths"):
    gin_config.parse(["nope.gin"], [])
  (tmp_path / "mine.gin").write_text("include 'extra.gin'\n")
  (tmp_path / "extra.gin").write_text("SEED = 5\n")
  gin.clear_config()
  try:
    with pytest.raises(gin_config.ConfigError, match=r"Unable to open file: extra.gin"):
      gin_config.parse(["mine.gin"], [])  # includes are not looked up in the working directory ...
    gin.clear_config()
    gin_config.parse(["mine.gin"], [], search_paths=["."])  # ... but in the search paths given
    assert gin.query_parameter("%SEED") == 5
  finally:
    gin.clear_config()
