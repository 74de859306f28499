"""launch.aot: compiles a config's train step and sampler programs for a topology without weights and reports the
per-device memory of each; a mesh that does not fit the topology, or a topology that cannot be compiled for here,
is refused with a message that says why.

  python -m pytest tests/test_aot.py -q
"""

import json
import os
import subprocess
import sys

import pytest
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "--gin_file=gin_configs/models/tiny.gin"
SMALL = ["--gin_bindings=ModelConfig.max_position_embeddings = 512", "--length=128", "--sampler_rows=8",
         "--max_new_tokens=32"]


def aot(*args):
  env = one_device_env()  # the tool sets the devices up itself
  return subprocess.run([sys.executable, "-m", "launch.aot", *args], cwd=ROOT, capture_output=True, text=True,
                        env=env, timeout=300)


def report_of(proc) -> dict:
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_every_program_of_the_tiny_default_on_8_fake_devices():
  report = report_of(aot(TINY, "--topology=cpu:8", *SMALL))
  assert report["devices"] == 8 and report["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
  assert set(report["programs"]) == {"train_step", "score", "sampler_prefill", "sampler_decode"}
  for name, memory in report["programs"].items():
    assert memory["argument_bytes"] > 0 and memory["peak_bytes"] > 0, name
    assert memory["peak_bytes"] >= memory["argument_bytes"] + memory["temp_bytes"] - memory["alias_bytes"], name
  resident = report["resident_bytes_per_device"]
  assert resident["train_state"] == resident["params"] + resident["optimizer"] > 0
  # float32 master weights (~2.1M parameters) sharded 8 ways (small dimensions stay whole): about 1/8 of them.
  assert report["model"]["params"] * 4 / 8 <= resident["params"] < report["model"]["params"] * 4 / 2
  kv_cache = 2 * 4 * 8 * 2 * 512 * 48 * 4  # keys and values x layers x rows x KV heads x slots x head dim x f32
  assert kv_cache / 8 <= resident["sampler_slots"] < 1.1 * kv_cache  # (rows sharded over the devices, or not)
  assert report["programs"]["sampler_decode"]["argument_bytes"] >= resident["sampler_slots"]
  assert report["fits"] is None and "fake CPU devices" in report["note"]


def test_a_grpo_config_compiles_the_het_ppo_step_at_its_update_rows():
  report = report_of(aot("--gin_file=gin_configs/runs/grpo.gin", "--topology=cpu:4", "--programs=train_step",
                         "--length=128"))
  assert report["loss"] == "het_ppo (GRPO)"
  # 8 tasks x 4 rollouts in 2 minibatches, padded to a multiple of 4 devices x 4 microbatches: 16 rows.
  assert report["programs"]["train_step"]["shape"] == "16 x 128 tokens, 4 microbatches"
  assert report["sampler"]["rows"] == 32 and set(report["phase_peak_bytes"]) == {"update"}


def test_a_mesh_that_does_not_fit_the_topology_is_refused():
  proc = aot(TINY, "--topology=cpu:8", "--gin_bindings=TrainerConfig.mesh_fsdp = 3")
  assert proc.returncode != 0
  assert "does not fit cpu:8 (8 devices)" in proc.stderr and "mesh_fsdp=3" in proc.stderr


@pytest.mark.parametrize("topology, message", [
    ("v9-8", "unknown topology 'v9-8'"),
    ("v5p-63", "v5p-N takes N in"),
    ("16xH100", "one node of 1 to 8 GPUs"),
    ("", "give --topology"),
])
def test_a_bad_topology_is_refused_with_the_accepted_forms(topology, message):
  proc = aot(TINY, f"--topology={topology}")
  assert proc.returncode != 0 and message in proc.stderr and not proc.stdout


@pytest.mark.parametrize("topology, needs", [("v5p-8", "needs libtpu"), ("2xH100", "needs JAX's CUDA plugin")])
def test_accelerator_topologies_compile_here_or_say_what_to_install(topology, needs):
  """Compiling for TPUs and GPUs needs their compilers (libtpu, JAX's CUDA plugin), not the devices: with them the
  tiny default compiles; without them, the message names what to install."""
  proc = aot(TINY, f"--topology={topology}", "--programs=train_step", *SMALL)
  if proc.returncode:
    assert needs in proc.stderr and "pip install" in proc.stderr and "--topology=cpu:" in proc.stderr
  else:
    report = report_of(proc)
    assert report["platform"] in ("tpu", "cuda") and report["programs"]["train_step"]["peak_bytes"] > 0
    assert report["fits"] is True
