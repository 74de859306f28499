"""A chat-endpoint policy (`APIRolloutEngine`, `launch.eval --policy openai`) against a fake local endpoint.

The fake reads the conversation, rebuilds the episode (which env from the instruction, which task from the first
observation, then the assistant's actions so far replayed) and answers with the scripted expert's next turn, so
an expert-driven evaluation succeeds on every task. It can also refuse keys and inject 429s and 5xx.
"""

import json
import threading

import pytest

from evolver import envs
from evolver.models.openai_api import APIRequestError, OpenAIChat
from evolver.rollout import RolloutConfig, Task
from evolver.rollout.api import APIRolloutEngine
from tests.fake_http import JSONHandler, serving

ENVS = ("maze", "sql")
SPLIT = "eval"
TASKS = 2
KEY = "sk-fake-secret-0123"


def expert_turn(messages: list[dict]) -> str:
  """The scripted expert's next turn in the episode `messages` tells (an AgentGym conversation)."""
  for name in ENVS:
    env = envs.make(name)
    if env.instruction() != messages[0]["content"]:
      continue
    for index in range(TASKS):
      if env.reset(index, SPLIT) == messages[2]["content"]:
        for turn in messages[3::2]:
          env.step(turn["content"])
        return env.expert_action()
  raise AssertionError("a conversation of no known task")


class _FakeEndpoint(JSONHandler):
  faults: list = []        # statuses to answer before the next real answers, in order
  requests: list = []      # (authorization, body)
  mode = "expert"          # expert | context | fixed
  lock = threading.Lock()

  def do_POST(self):  # noqa: N802 (http.server's name)
    cls = type(self)
    body = self.read_json()
    auth = self.headers.get("Authorization")
    with cls.lock:
      cls.requests.append((auth, body))
      fault = cls.faults.pop(0) if cls.faults else None
    if self.path != "/v1/chat/completions":
      return self.send_json(404, {"detail": "Not Found"})
    if auth != f"Bearer {KEY}":
      return self.send_json(401, {"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}})
    if fault == 429:
      return self.send_json(429, {"error": {"message": "rate limited"}}, {"Retry-After": "0.2"})
    if fault is not None:
      return self.send_json(fault, {"error": {"message": "internal error"}})
    if cls.mode == "context":
      return self.send_json(400, {"error": {"message": "This model's maximum context length is 64 tokens"}})
    text = expert_turn(body["messages"]) if cls.mode == "expert" else "Thought: no idea\nAction: look"
    self.send_json(200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 100, "completion_tokens": 10}})

@pytest.fixture()
def endpoint():
  _FakeEndpoint.faults, _FakeEndpoint.requests, _FakeEndpoint.mode = [], [], "expert"
  with serving(_FakeEndpoint) as url:
    yield url + "/v1"


def test_launch_eval_openai_policy_end_to_end(endpoint, tmp_path, monkeypatch):
  from launch import eval as eval_cli
  _FakeEndpoint.faults = [429, 500]
  monkeypatch.setenv("FAKE_KEY", KEY)
  out = tmp_path / "eval_results.json"
  results = eval_cli.main(["--policy", "openai", "--base_url", endpoint, "--model", "fake-expert",
                           "--api_key_env", "FAKE_KEY", "--envs", ",".join(ENVS), "--num_tasks", str(TASKS),
                           "--split", SPLIT, "--max_concurrency", "2", "--requests_per_s", "200",
                           "--out", str(out)])
  text = out.read_text()
  written = json.loads(text)
  assert KEY not in text
  for name in ENVS:
    env = written["envs"][name]
    assert env["success"] == 1.0 and env["reward"] == 1.0 and env["num_tasks"] == TASKS
    assert env["num_failed"] == 0 and env["turns"] >= 1 and env["version"] == envs.make(name).version
  assert written["overall"]["success"] == 1.0 and written["overall"]["num_episodes"] == len(ENVS) * TASKS
  assert written["policy"]["kind"] == "openai" and written["policy"]["model"] == "fake-expert"
  assert written["policy"]["base_url"] == endpoint and written["endpoint"] == written["policy"]
  stats = written["api_stats"]
  assert stats["retries"] == 2 and stats["requests"] == len(_FakeEndpoint.requests)
  assert written["rollout_stats"]["generate_calls"] == stats["requests"] - 2
  assert written["rollout_stats"]["sampled_tokens"] == 10 * written["rollout_stats"]["generate_calls"]
  assert {e["finish_reason"] for e in written["episodes"]} == {"done"}
  assert results["overall"] == written["overall"]
  # What the endpoint saw: the AgentGym conversation, the key, greedy decoding, the turn budget.
  auth, body = _FakeEndpoint.requests[-1]
  assert auth == f"Bearer {KEY}" and body["temperature"] == 0.0 and body["max_tokens"] == 128
  assert body["messages"][1] == {"role": "assistant", "content": "Ok."}
  assert [m["role"] for m in body["messages"]][:3] == ["user", "assistant", "user"]


def test_launch_eval_openai_policy_fails_clearly_on_a_bad_key(endpoint, tmp_path, monkeypatch):
  from launch import eval as eval_cli
  monkeypatch.setenv("FAKE_KEY", "sk-wrong-key-456")
  out = tmp_path / "eval_results.json"
  with pytest.raises(SystemExit, match="401: Incorrect API key provided") as caught:
    eval_cli.main(["--policy", "openai", "--base_url", endpoint, "--model", "fake-expert", "--api_key_env",
                   "FAKE_KEY", "--envs", "maze", "--num_tasks", "2", "--out", str(out)])
  assert "sk-wrong-key-456" not in str(caught.value)
  assert not out.exists()
  with pytest.raises(SystemExit, match="--base_url"):
    eval_cli.main(["--policy", "openai", "--model", "fake-expert", "--envs", "maze"])
  with pytest.raises(SystemExit, match="--policy openai"):
    eval_cli.main(["--base_url", endpoint, "--model", "fake-expert", "--envs", "maze"])


def test_engine_rounds_context_and_samples(endpoint):
  client = OpenAIChat(endpoint, "fake", KEY, timeout_s=10, max_retries=0)
  with APIRolloutEngine(client, max_concurrency=3) as engine:
    _FakeEndpoint.mode = "fixed"  # never solves: the episode runs to the round limit
    ended = []
    batch = engine.run([Task("maze", 0, SPLIT)], RolloutConfig(max_rounds=3, temperature=1.0, num_samples=2,
                                                               record_expert_actions=True), progress=ended.append)
    assert ended == [1, 1]  # one report per episode ended
    assert [(t.sample, t.turns, t.finish_reason, t.success) for t in batch.trajectories] == [
        (0, 3, "max_rounds", False), (1, 3, "max_rounds", False)]
    t = batch.trajectories[0]
    assert len(t.step_rewards) == len(t.state_keys) == len(t.expert_actions) == 3
    assert len(t.messages) == 3 + 2 * 3 and t.token_ids.size == 0 and not t.failed
    seeds = [body["seed"] for _, body in _FakeEndpoint.requests]
    assert len(set(seeds)) == len(seeds) == 6  # per episode and turn
    _FakeEndpoint.mode = "context"
    batch = engine.run([Task("sql", 1, SPLIT)], RolloutConfig())
    # The endpoint has no room for the opening itself: unscored (failed), reported as such.
    assert [(t.finish_reason, t.truncated, t.turns, t.failed) for t in batch.trajectories] == [
        ("opening", False, 0, True)]
    assert batch.stats.opening_too_long == 1 and "no room for the opening" in batch.trajectories[0].error
    _FakeEndpoint.mode, _FakeEndpoint.faults = "expert", [503]  # no retries left: that episode fails, others go on
    batch = engine.run([Task("maze", 0, SPLIT), Task("maze", 1, SPLIT)], RolloutConfig(max_rounds=40))
    assert sorted(t.failed for t in batch.trajectories) == [False, True]
    assert batch.stats.failed == 1 and "503" in next(t.error for t in batch.trajectories if t.failed)
  bad = OpenAIChat(endpoint, "fake", "sk-nope", timeout_s=10)
  with APIRolloutEngine(bad) as engine, pytest.raises(APIRequestError, match="401"):
    engine.run([Task("maze", 0, SPLIT)])
