"""RemoteEnv's adapters for AgentGym's servers, against a fixture that reproduces their quirks."""

import re
import time

import pytest

from evolver import envs
from evolver.envs import adapters
from evolver.envs.remote import HttpClient, RemoteEnv

from tests.envs.agentgym_fixture import AgentGymFixture
from tests.envs.helpers import expert_length

RANGES = {"train": (0, 40), "eval": (40, 50)}
CASES = [("textcraft", "textcraft"), ("babyai", "babyai"), ("maze", "lmrl"), ("wordle", "lmrl")]


def _mirror_episode(remote: RemoteEnv, name: str, index: int) -> tuple[bool, float]:
  """Plays our expert on the local twin of the fixture's task through `remote`; (success, final reward)."""
  local = envs.make(name)
  local.reset(index % local.num_tasks("train"))
  remote.reset(index)
  done = False
  while not done:
    turn = local.expert_action()
    local.step(turn)
    _, reward, done, info = remote.step(turn)
  return info["success"], reward


@pytest.mark.parametrize("name, kind", CASES)
def test_adapter_plays_whole_episodes(name, kind):
  fixture = AgentGymFixture(kind)
  try:
    remote = RemoteEnv(fixture.url, name, server="agentgym", task_ranges=RANGES)
    assert remote.name == name and remote.num_tasks("train") == 40 and remote.num_tasks("eval") == 10
    assert "Thought:" in remote.instruction() and "Action:" in remote.instruction()
    for index in (0, 3, 7):
      success, reward = _mirror_episode(remote, name, index)
      assert success and 0.0 < reward <= 1.0
    # Their servers do not parse ReAct: only bare actions were sent.
    assert fixture.actions and not any(re.search(r"Thought|Action", a) for a in fixture.actions)
    with pytest.raises(NotImplementedError, match="no scripted expert"):
      remote.expert_action()
    with pytest.raises(envs.EnvError):
      remote.reset(40)  # outside task_ranges["train"]
  finally:
    fixture.stop()


def test_adapter_normalises_actions_like_agentgym_clients():
  assert adapters.TextCraftAdapter().action("Thought: x\nAction: get 2 oak log!") == "get 2 oak log"
  assert adapters.TextCraftAdapter().action("Action: look") == "inventory"
  assert adapters.LmrlMazeAdapter().action("Thought: go\nAction: Up") == "move up"
  assert adapters.LmrlWordleAdapter().action("Action: crate") == "c r a t e"
  assert adapters.LmrlWordleAdapter().action("Action: c r a t e") == "c r a t e"


def test_errors_as_200_and_422_become_exceptions():
  fixture = AgentGymFixture("textcraft")
  try:
    http = HttpClient(fixture.url, timeout_s=10)
    adapter = adapters.TextCraftAdapter()
    with pytest.raises(adapters.SessionLostError):  # {"error": "The id 99 is not valid."} with HTTP 200
      adapter.reset(http, 99, 0, "train")
    with pytest.raises(adapters.RequestError, match="422"):
      adapter._post(http, "/reset", {"id": "zero"})
  finally:
    fixture.stop()


def test_babyai_score_is_the_reward_and_steps_after_the_end_stay_local():
  fixture = AgentGymFixture("babyai")
  try:
    remote = RemoteEnv(fixture.url, "babyai", server="agentgym", task_ranges=RANGES)
    success, reward = _mirror_episode(remote, "babyai", 2)
    assert success and 0.0 < reward < 1.0  # BabyAI's own discounted reward
    observation, again, done, info = remote.step("Action: turn left")  # their server would answer an error
    assert done and again == reward and info["success"] and "over" in observation
  finally:
    fixture.stop()


def test_adapter_recovers_after_an_agentgym_server_restart():
  fixture = AgentGymFixture("lmrl")
  port = fixture.port
  restarted = None
  try:
    remote = RemoteEnv(fixture.url, "maze", server="agentgym", task_ranges=RANGES, backoff_s=0.02)
    local = envs.make("maze")
    index = next(i for i in range(40) if expert_length(local, i) >= 4)
    local.reset(index)
    remote.reset(index)
    for _ in range(2):
      turn = local.expert_action()
      local.step(turn)
      remote.step(turn)
    fixture.stop()
    restarted = AgentGymFixture("lmrl", port)  # ids start again at 0: our old id is unknown there
    done = False
    while not done:
      turn = local.expert_action()
      local.step(turn)
      _, _, done, info = remote.step(turn)
    assert info["success"] and remote.recoveries >= 1
  finally:
    (restarted or fixture).stop()


def test_agentgym_server_needs_task_ranges_and_a_known_env():
  with pytest.raises(ValueError, match="task_ranges"):
    RemoteEnv("http://127.0.0.1:9", "textcraft", server="agentgym")
  with pytest.raises(ValueError, match="no AgentGym adapter"):
    RemoteEnv("http://127.0.0.1:9", "webarena", server="agentgym", task_ranges=RANGES)


@pytest.mark.parametrize("name, kind", [("textcraft", "textcraft"), ("babyai", "babyai")])
def test_close_ends_the_agentgym_session(name, kind):
  fixture = AgentGymFixture(kind)
  try:
    remote = RemoteEnv(fixture.url, name, server="agentgym", task_ranges=RANGES)
    remote.reset(3)
    remote.close()
    assert fixture.closes == [0] and not fixture.games[name]  # their server dropped the env
    remote.close()  # nothing left to close: no request
    assert fixture.closes == [0]
    remote.reset(4)  # a closed env can start again, on a new session
    assert fixture.next_id[name] == 2
  finally:
    fixture.stop()


def test_close_is_skipped_where_agentgym_has_no_close_route():
  fixture = AgentGymFixture("lmrl")
  try:
    remote = RemoteEnv(fixture.url, "maze", server="agentgym", task_ranges=RANGES)
    remote.reset(0)
    remote.close()
    assert not any(request.endswith("/close") for request in fixture.requests)
  finally:
    fixture.stop()


def test_close_is_best_effort_with_a_short_timeout():
  fixture = AgentGymFixture("textcraft", close_delay_s=2.0)
  try:
    remote = RemoteEnv(fixture.url, "textcraft", server="agentgym", task_ranges=RANGES, timeout_s=30,
                       close_timeout_s=0.2)
    remote.reset(0)
    start = time.monotonic()
    remote.close()  # the server does not answer in time: no error, no waiting for timeout_s
    assert time.monotonic() - start < 1.5
  finally:
    fixture.stop()


@pytest.mark.parametrize("ranges, problem", [
    ({"train": (0, 40), "eval": (30, 50)}, r"overlap.*\[30, 40\)"),
    ({"train": (40, 0), "eval": (40, 50)}, r"task_ranges\['train'\].*\(40, 0\).*reversed"),
    ({"train": (0, 40), "eval": (40, 40)}, r"task_ranges\['eval'\].*empty"),
    ({"train": (-5, 40), "eval": (40, 50)}, r"task_ranges\['train'\].*below 0"),
    ({"train": (0, 40), "eval": (40,)}, r"task_ranges\['eval'\].*\(start, stop\) pair"),
    ({"train": (0, 40.5), "eval": (41, 50)}, r"task_ranges\['train'\].*integers"),
    ({"train": (0, 40), "eval": (40, 50), "test": (50, 60)}, "'train' and 'eval'"),
])
def test_bad_task_ranges_are_refused_before_any_request(ranges, problem):
  start = time.monotonic()
  with pytest.raises(ValueError, match=problem):
    RemoteEnv("http://127.0.0.1:9", "textcraft", server="agentgym", task_ranges=ranges, max_retries=1)
  assert time.monotonic() - start < 0.5


def test_task_ranges_are_for_agentgym_servers_only():
  with pytest.raises(ValueError, match="task_ranges.*only.*server='agentgym'"):
    RemoteEnv("http://127.0.0.1:9", "maze", task_ranges=RANGES, max_retries=1)


@pytest.mark.parametrize("kind, suggestion", [
    ("textcraft", "env_name='textcraft'"), ("babyai", "env_name='babyai'"), ("lmrl", "env_name='maze' or 'wordle'")])
def test_our_protocol_at_an_agentgym_server_says_what_to_do(kind, suggestion):
  fixture = AgentGymFixture(kind)
  try:
    with pytest.raises(ValueError) as error:
      RemoteEnv(fixture.url, max_retries=1)
    message = str(error.value)
    assert f"{fixture.url}/info" in message and "server='evolver'" in message and "HTTP 404" in message
    assert "looks like an AgentGym server" in message and "server='agentgym'" in message
    assert suggestion in message and "task_ranges=" in message
  finally:
    fixture.stop()
