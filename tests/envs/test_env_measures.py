"""The step judges' measures (`TextEnv.measures`): before a reset, in explorations, at the end, and over HTTP
(`GET /measures`, `RemoteEnv.measures`) equal to the in-process values."""

import pytest

from evolver import envs
from evolver.envs.remote import RemoteEnv
from evolver.envs.server import ServerThread

from tests.envs.agentgym_fixture import AgentGymFixture
from tests.envs.helpers import expert_readings, request

NAMES = envs.names()
NONE = {"cost_to_go": None, "progress": None}


def _expert_measures(env, index: int, split: str = "train") -> list[dict]:
  """The measures before each expert turn of task `index`, and the final ones."""
  return expert_readings(env, index, lambda e: e.measures(), split)


@pytest.mark.parametrize("name", NAMES)
def test_measures_need_a_reset_and_end_solved(name):
  env = envs.make(name)
  with pytest.raises(envs.EpisodeNotStartedError, match="reset"):
    env.measures()
  measured = _expert_measures(env, 1)
  assert all(set(m) == {"cost_to_go", "progress"} for m in measured)
  assert all(isinstance(m["cost_to_go"], int) and 0.0 <= m["progress"] <= 1.0 for m in measured)
  assert measured[0]["cost_to_go"] > 0 and measured[-1] == {"cost_to_go": 0, "progress": 1.0}
  assert _expert_measures(envs.make(name), 1) == measured  # deterministic, in any instance
  env.reset_world(1, "train")  # an exploration has no task to measure
  assert env.measures() == NONE


@pytest.mark.parametrize("name", NAMES)
def test_get_measures_equals_the_in_process_measures(name):
  local = envs.make(name)
  with ServerThread(name) as server:
    status, created = request(server.port, "POST", "/create", {"data_idx": 2, "split": "train"})
    assert status == 200
    session = created["id"]
    local.reset(2, "train")
    for _ in range(3):
      status, answer = request(server.port, "GET", f"/measures?id={session}")
      assert status == 200 and answer == local.measures()
      if local.done:
        break
      turn = local.expert_action()
      local.step(turn)
      assert request(server.port, "POST", "/step", {"id": session, "action": turn})[0] == 200
    remote = RemoteEnv(server.url, name)
    with pytest.raises(envs.EpisodeNotStartedError):
      remote.measures()
    remote.reset(2, "train")
    local.reset(2, "train")
    assert remote.measures() == local.measures()
    remote.step(local.expert_action())
    local.step(local.expert_action())
    assert remote.measures() == local.measures()
    remote.close()


def test_get_measures_errors_are_4xx():
  with ServerThread("maze") as server:
    status, created = request(server.port, "POST", "/create", {})
    assert status == 200
    assert request(server.port, "GET", f"/measures?id={created['id']}")[0] == 409  # before any reset
    assert request(server.port, "GET", f"/measures?id={created['id'] + 10**6}")[0] == 404
    assert request(server.port, "GET", "/measures?id=x")[0] == 400
    assert request(server.port, "GET", "/measures")[0] == 400
    assert request(server.port, "POST", f"/measures?id={created['id']}", {})[0] == 405
    status, _ = request(server.port, "POST", "/reset", {"id": created["id"], "data_idx": 0, "explore": True})
    assert status == 200
    assert request(server.port, "GET", f"/measures?id={created['id']}") == (200, NONE)


def test_remote_measures_on_agentgym_servers_are_none_without_a_request():
  fixture = AgentGymFixture("lmrl")
  try:
    remote = RemoteEnv(fixture.url, "maze", server="agentgym", task_ranges={"train": (0, 40), "eval": (40, 50)})
    with pytest.raises(envs.EpisodeNotStartedError):
      remote.measures()
    remote.reset(0, "train")

    def no_request(*args, **kwargs):
      raise AssertionError(f"RemoteEnv.measures sent a request to an AgentGym server: {args}")

    remote._http.request = no_request
    assert remote.measures() == NONE
  finally:
    fixture.stop()
