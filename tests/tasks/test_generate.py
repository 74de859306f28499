"""`generate_tasks`: explore, propose, filter, save, with stats; directly and through `python -m launch.train` (there
with the LLM proposer behind a loopback endpoint: its key from the environment, never in the configs written)."""

import json
import os
import subprocess
import sys

import pytest

from evolver.envs.base import TextEnv
from evolver.tasks import filters, generate, taskset
from tests.fake_http import JSONHandler, serving
from tests.tasks import fakes
from tests.subprocess_env import one_device_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ENV_API = all(hasattr(TextEnv, name) for name in ("reset_world", "hindsight_tasks", "target_key", "spec_target_key"))
SMALL = dict(envs=["line"], world_start=0, world_count=40, worlds_per_env=5, episodes_per_world=2, seed=0,
             env_factory=fakes.make, progress=False)


def check_run(model_dir, stats, envs):
  records = taskset.load_taskset(os.path.join(model_dir, generate.TASKSET_FILE))
  assert json.loads(open(os.path.join(model_dir, generate.STATS_FILE)).read()) == stats
  assert stats["kept"] == len(records) and set(stats["per_env"]) == set(envs)
  for name, row in stats["per_env"].items():
    drops = sum(row[f] for f in filters.FILTERS)
    assert row["proposals"] == drops + row["kept"], (name, row)
  assert set(stats["seconds"]) >= {"exploration", "proposing", "filtering", "filters", "total"}
  return records


def test_generate_tasks_writes_a_task_set_whose_tasks_replay_to_success(tmp_path):
  stats = generate.generate_tasks(model_dir=str(tmp_path), **SMALL)
  records = check_run(str(tmp_path), stats, ["line"])
  row = stats["per_env"]["line"]
  assert row["episodes"] == 10 and row["outcomes"] > 0 and row["kept"] > 0
  assert row["heldout"] > 0  # the fake's eval tasks ask for cells that exploration reaches
  for record in records:
    assert record.source["proposer"] == "hindsight" and record.spec.split == "train"
    env = fakes.LineEnv()  # a fresh env per task
    env.reset_spec(record.spec)
    assert filters.replay(env, record.actions) == len(record.actions)
  again = generate.generate_tasks(model_dir=str(tmp_path / "again"), **SMALL)
  assert taskset.load_taskset(again["out"]) == records


def test_generate_tasks_with_the_llm_proposer_and_the_policy_explorer(tmp_path):
  from tests.rollout.tiny_policy import tiny_model
  loaded = []

  def load_policy(init_checkpoint=None, hf_checkpoint=None):
    loaded.append((init_checkpoint, hf_checkpoint))
    return tiny_model()

  def llm(prompts):
    return [json.dumps([{"query": "Walk two cells to the right", "confidence": 0.8,
                         "action_sequence": ["right", "right"]}])] * len(prompts)

  stats = generate.generate_tasks(model_dir=str(tmp_path), **dict(SMALL, worlds_per_env=2, episodes_per_world=1),
                                  explorer="policy", load_policy=load_policy, init_checkpoint="runs/bc",
                                  max_steps=2, max_new_tokens=8, proposer="llm", llm=llm)
  assert loaded == [("runs/bc", None)]
  assert stats["llm"]["prompts"] == 2 and stats["llm"]["proposals"] == 2
  records = check_run(str(tmp_path), stats, ["line"])
  assert all(r.spec.goal == "Walk two cells to the right" and r.source["proposer"] == "llm" for r in records)
  # What the proposer wrote is in the records, one line per prompt.
  with open(os.path.join(tmp_path, generate.REPLIES_FILE)) as f:
    replies = [json.loads(line) for line in f]
  assert len(replies) == 2 and all(r["parsed"] and r["proposals"] == 1 and "Walk two cells" in r["reply"]
                                   for r in replies)


@pytest.mark.parametrize("kwargs, message", [
    (dict(explorer="greedy"), "unknown explorer"),
    (dict(proposer="llm"), "needs `llm`"),
    (dict(explorer="policy"), "needs `load_policy`"),
    (dict(explorer="policy", load_policy=lambda **_: None), "INIT_CHECKPOINT"),
    (dict(worlds_per_env=50), "worlds_per_env <= world_count"),
    (dict(world_count=41), "does not fit"),
])
def test_generate_tasks_refuses_bad_settings(tmp_path, kwargs, message):
  with pytest.raises(ValueError, match=message):
    generate.generate_tasks(model_dir=str(tmp_path), **dict(SMALL, **kwargs))


def launch(model_dir, *bindings, env=None):
  cmd = [sys.executable, "-m", "launch.train", "--gin_file=gin_configs/tasks/selfq.gin",
         f"--gin_bindings=MODEL_DIR = '{model_dir}'", *[f"--gin_bindings={b}" for b in bindings]]
  env = one_device_env(base=env)
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
  assert proc.returncode == 0, f"launch.train failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
  with open(os.path.join(model_dir, generate.STATS_FILE)) as f:
    return json.load(f)


class _FakeProposer(JSONHandler):
  """An OpenAI-compatible endpoint whose model proposes one task the line env can check."""

  requests = []

  def do_POST(self):  # noqa: N802 (http.server's name)
    body = self.read_json()
    type(self).requests.append((self.headers.get("Authorization"), body["model"]))
    task = {"query": "Walk two cells to the right", "confidence": 0.8, "action_sequence": ["right", "right"]}
    self.send_json(200, {"choices": [{"message": {"role": "assistant", "content": json.dumps([task])}}]})


def test_selfq_gin_runs_through_launch_train_with_an_endpoint_proposer(tmp_path):
  key_env, key = "EVOLVER_TEST_PROPOSER_KEY", "sk-proposer-secret-0123"
  _FakeProposer.requests = []
  with serving(_FakeProposer) as url:
    stats = launch(tmp_path, "import tests.tasks.fakes", "generate_tasks.env_factory = @line_env_factory",
                   "generate_tasks.envs = ['line']", "generate_tasks.world_start = 0",
                   "generate_tasks.world_count = 40", "generate_tasks.worlds_per_env = 3",
                   "generate_tasks.progress = False",
                   "generate_tasks.proposer = 'llm'", "generate_tasks.llm = @proposer/OpenAIGenerate()",
                   f"proposer/OpenAIGenerate.base_url = '{url}/v1'", "proposer/OpenAIGenerate.model = 'fake-proposer'",
                   f"proposer/OpenAIGenerate.api_key_env = '{key_env}'", env=dict(os.environ, **{key_env: key}))
  records = check_run(str(tmp_path), stats, ["line"])
  assert stats["per_env"]["line"]["episodes"] == 6 and stats["explorer"] == "random" and stats["proposer"] == "llm"
  assert stats["llm"]["prompts"] == 6 and records and all(r.spec.goal == "Walk two cells to the right" for r in records)
  assert _FakeProposer.requests and set(_FakeProposer.requests) == {(f"Bearer {key}", "fake-proposer")}
  # The key travels in the Authorization header only: the configs the run wrote name its variable, never hold it.
  for name in ("config.gin", "operative_config.gin"):
    text = (tmp_path / name).read_text()
    assert key_env in text and key not in text, name


@pytest.mark.skipif(not ENV_API, reason="the built-in envs do not have the self-questioning API yet")
def test_selfq_gin_runs_on_the_built_in_envs(tmp_path):
  envs = ["maze", "wordle", "textcraft", "babyai", "sql", "tools"]
  stats = launch(tmp_path, "generate_tasks.worlds_per_env = 2", "generate_tasks.episodes_per_world = 1",
                 "generate_tasks.world_count = 40", "generate_tasks.progress = False")
  check_run(str(tmp_path), stats, envs)
  assert all(stats["per_env"][name]["episodes"] == 2 for name in envs)


def test_the_task_generator_does_not_import_the_training_code():
  script = ("import sys\nimport evolver.tasks.generate\n"
            "print(sorted(m for m in sys.modules if m.startswith('evolver.train')))")
  proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, check=True)
  assert proc.stdout.strip() == "[]"
