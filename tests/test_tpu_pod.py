"""launch/tpu_pod.sh: the dry run prints the gcloud commands (placeholder names when none are given), the user's
gin files and bindings reach `launch.train --distributed` on every worker intact, whatever their quoting; a real
run executes the same commands, and refuses bad flags or a missing gcloud with a message.

  python -m pytest tests/test_tpu_pod.py -q
"""

import json
import os
import shlex
import shutil
import stat
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "launch", "tpu_pod.sh")
BASH = shutil.which("bash")
TRICKY = "HF_CHECKPOINT='/data/my models/Qwen \"7B\" $HOME `x` \\n'"


def pod(*args, path=None, tmp=None):
  env = dict(os.environ)
  if path is not None:
    env["PATH"] = path
  if tmp is not None:
    env["TMPDIR"] = str(tmp)
  return subprocess.run([BASH, SCRIPT, *args], capture_output=True, text=True, env=env, timeout=60)


def commands(stdout: str) -> list[list[str]]:
  """The printed commands, each split as a shell would (comment lines left out)."""
  return [shlex.split(line) for line in stdout.splitlines() if line.strip() and not line.startswith("#")]


def worker_commands(cmds: list[list[str]]) -> list[list[str]]:
  """The --command of each `ssh --worker=all`, split as the workers' shell would."""
  out = []
  for cmd in cmds:
    if cmd[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]:
      assert "--worker=all" in cmd
      (command,) = [a[len("--command="):] for a in cmd if a.startswith("--command=")]
      out.append(shlex.split(command))
  return out


def train_argv(cmds: list[list[str]]) -> list[str]:
  (words,) = [w for w in worker_commands(cmds) if "launch.train" in w]
  start = words.index("python")
  return words[start:words.index("2>&1", start)]


def test_the_dry_run_prints_every_command_with_placeholder_names():
  proc = pod("--dry_run")
  assert proc.returncode == 0, proc.stderr
  cmds = commands(proc.stdout)
  assert all(c[0] in ("gcloud", "git") for c in cmds)
  create = [c for c in cmds if c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "create"]]
  assert create and "TPU_NAME" in create[0] and "--zone=ZONE" in create[0]
  assert "--accelerator-type=v5p-64" in create[0] and "--version=v2-alpha-tpuv5" in create[0]
  assert any(c[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "scp"] and "--worker=all" in c for c in cmds)
  steps = [" ".join(w) for w in worker_commands(cmds)]
  assert len(steps) == 3 and "tar -xzf" in steps[0] and "setup_venv.sh run" in steps[1] and ".[tpu]" in steps[1]
  argv = train_argv(cmds)
  assert argv[:4] == ["python", "-m", "launch.train", "--distributed"]
  assert "--gin_bindings=MODEL_DIR='gs://BUCKET/evolver-run'" in argv
  assert any(a.startswith("--gin_file=") for a in argv)


def test_gin_files_and_bindings_reach_every_worker_intact():
  proc = pod("--dry_run", "--name=my-v5p", "--zone", "us-east5-a", "--project=proj",
             "--accelerator=v6e-8", "--reuse", "--gin_file=gin_configs/real/qwen2_5_7b_grpo_exp_v5p64.gin",
             "--gin_file", "gin_configs/experience/hybrid.gin", "--model_dir=gs://b/runs/q7",
             f"--gin_bindings={TRICKY}", "--gin_bindings", "train_grpo.envs = ['maze', 'sql']",
             "--repo=https://example.com/evolver.git", "--ref=v0.1")
  assert proc.returncode == 0, proc.stderr
  cmds = commands(proc.stdout)
  assert not any("create" in c for c in cmds)  # --reuse
  assert all("--zone=us-east5-a" in c and "--project=proj" in c for c in cmds if c[0] == "gcloud")
  assert ["git", "clone", "--quiet", "https://example.com/evolver.git", "evolver"] == worker_commands(cmds)[0][4:9]
  assert train_argv(cmds)[4:] == [
      "--gin_file=gin_configs/real/qwen2_5_7b_grpo_exp_v5p64.gin", "--gin_file=gin_configs/experience/hybrid.gin",
      "--gin_bindings=MODEL_DIR='gs://b/runs/q7'", f"--gin_bindings={TRICKY}",
      "--gin_bindings=train_grpo.envs = ['maze', 'sql']"]


@pytest.mark.parametrize("args, message", [
    (("--dry_run", "--bogus=1"), "unknown flag --bogus"),
    (("--dry_run", "stray"), "unexpected argument 'stray'"),
    (("--dry_run", "--name"), "--name needs a value"),
    (("--dry_run", "--accelerator=v9z-8"), "give --version"),
    (("--zone=z", "--model_dir=gs://b/r", "--gin_file=x.gin"), "give --name"),
])
def test_bad_flags_fail_with_a_message(args, message):
  proc = pod(*args)
  assert proc.returncode == 2 and message in proc.stderr and not proc.stdout


@pytest.fixture
def tools(tmp_path):
  """A PATH with what the script needs besides gcloud."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  for tool in ("dirname", "git", "sed"):
    os.symlink(shutil.which(tool), bin_dir / tool)
  return bin_dir


def test_without_gcloud_a_real_run_says_what_to_install(tools):
  proc = pod("--name=n", "--zone=z", "--model_dir=gs://b/r", "--gin_file=x.gin", path=str(tools))
  assert proc.returncode == 2 and "gcloud not found" in proc.stderr and "--dry_run" in proc.stderr


def test_a_real_run_executes_the_printed_commands(tools, tmp_path):
  """With a stub gcloud (each call logged; `ssh --command` run by bash with a stub python), the real run makes the
  calls the dry run prints, and launch.train gets the bindings as given."""
  log = tmp_path / "calls.jsonl"
  stub_bin = tmp_path / "stub_bin"
  stub_bin.mkdir()
  (stub_bin / "python").write_text(f"#!{BASH}\nprintf '%s\\n' \"$@\" > {tmp_path}/train_args\n")
  (stub_bin / "python").chmod(0o755)
  (tools / "gcloud").write_text(
      f"#!{BASH}\n"
      f"printf '%s\\0' \"$@\" | {shutil.which('python3')} -c 'import json,sys; "
      f"print(json.dumps(sys.stdin.read().split(chr(0))[:-1]))' >> {log}\n"
      "for a in \"$@\"; do case \"$a\" in --command=*) cmd=\"${a#--command=}\" ;; esac; done\n"
      "[ \"$4\" = describe ] && exit 1\n"  # no such slice yet: the script creates it
      "case \"${cmd:-}\" in *launch.train*)\n"
      f"  cd {tmp_path} && mkdir -p evolver/.venv/bin && printf 'export PATH={stub_bin}:$PATH\\n' "
      "> evolver/.venv/bin/activate && HOME=" + str(tmp_path) + f" {BASH} -c \"$cmd\" ;;\n"
      "esac\n")
  (tools / "gcloud").chmod((tools / "gcloud").stat().st_mode | stat.S_IXUSR)
  args = ["--name=pod1", "--zone=z1", "--model_dir=gs://b/r", "--gin_file=runs/grpo.gin", f"--gin_bindings={TRICKY}",
          "--repo=https://example.com/evolver.git"]
  real = pod(*args, path=f"{tools}:/usr/bin:/bin", tmp=tmp_path)
  assert real.returncode == 0, real.stderr
  made = [json.loads(line) for line in log.read_text().splitlines()]
  printed = commands(pod("--dry_run", *args).stdout)
  assert [["gcloud", *c] for c in made] == printed  # the describe (which failed), the create, then each step
  assert (tmp_path / "train_args").read_text().splitlines() == [
      "-m", "launch.train", "--distributed", "--gin_file=runs/grpo.gin", "--gin_bindings=MODEL_DIR='gs://b/r'",
      f"--gin_bindings={TRICKY}"]
