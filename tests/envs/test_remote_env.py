"""RemoteEnv against real servers: parity with local envs, restarts, divergence, several URLs."""

import time

import pytest

from evolver import envs
from evolver.envs import adapters
from evolver.envs.remote import RemoteEnv
from evolver.envs.server import ServerThread

from tests.envs.helpers import ServerProcess


def _play(env, index, split="train", steps=None):
  trajectory = [env.reset(index, split)]
  done = False
  while not done and (steps is None or len(trajectory) <= steps):
    observation, reward, done, info = env.step(env.expert_action())
    trajectory.append((observation, reward, done, info))
  return trajectory


@pytest.mark.parametrize("name", ["textcraft", "sql", "tools", "wordle"])
def test_remote_env_is_indistinguishable_from_local(name):
  with ServerThread(name) as server:
    remote, local = RemoteEnv(server.url, name), envs.make(name)
    assert isinstance(remote, envs.Env)
    assert (remote.name, remote.version, remote.max_rounds, remote.instruction()) == (
        local.name, local.version, local.max_rounds, local.instruction())
    assert remote.num_tasks("eval") == local.num_tasks("eval")
    assert _play(remote, 3, "eval") == _play(local, 3, "eval")
    assert remote.step("Action: anything")[2] is True  # after done: still done, no request needed
    with pytest.raises(envs.EnvError):
      remote.reset(10**9)
    remote.close()


def test_remote_env_raises_like_a_local_env_before_reset():
  with ServerThread("maze") as server:
    remote = RemoteEnv(server.url)
    with pytest.raises(envs.EpisodeNotStartedError):
      remote.step("Action: move up")
    with pytest.raises(ValueError, match="serves 'maze'"):
      RemoteEnv(server.url, "wordle")


def test_survives_a_server_kill_and_restart_mid_episode():
  server = ServerProcess("textcraft")
  port = server.port
  try:
    remote, local = RemoteEnv(server.url, "textcraft", backoff_s=0.1), envs.make("textcraft")
    index = next(i for i in range(100) if len(_play(local, i)) > 5)  # an episode long enough to cut
    expected = _play(local, index)
    got = [remote.reset(index)]
    for _ in range(2):
      got.append(remote.step(remote.expert_action()))
    server.kill()  # SIGKILL mid-episode: the session is gone with the process
    server = ServerProcess("textcraft", port)
    while not got[-1][2]:
      got.append(remote.step(remote.expert_action()))
    assert got == expected and got[-1][3]["success"]
    assert remote.recoveries >= 1
  finally:
    server.kill()


def test_a_step_that_cannot_be_replayed_is_reported_as_a_failed_episode():
  original = envs.env_class("maze")

  class Changed(original):  # a server that came back with different tasks
    def _reset_task(self, index, split):
      return "Changed " + super()._reset_task(index, split)

  first = ServerThread("maze")
  remote = RemoteEnv(first.url, "maze", backoff_s=0.05)
  remote.reset(0)
  remote.step(remote.expert_action())
  port = first.port
  first.stop()
  with ServerThread(env_factory=Changed, port=port):
    observation, reward, done, info = remote.step("Action: move up")
    assert done and reward == 0.0 and info["success"] is False and "diverged" in info["error"]
    assert remote.step("Action: move up")[2] is True
    remote.reset(0)  # a new episode works again
    assert remote.observation.startswith("Changed")


def test_an_unreachable_server_fails_the_episode_instead_of_hanging():
  server = ServerThread("maze")
  remote = RemoteEnv(server.url, max_retries=2, backoff_s=0.01)
  remote.reset(0)
  server.stop()
  observation, reward, done, info = remote.step("Action: move up")
  assert done and not info["success"] and "error" in info
  with pytest.raises(adapters.TransportError):
    remote.reset(0)


def test_sessions_spread_over_urls_and_fail_over():
  with ServerThread("maze") as a, ServerThread("maze") as b:
    remotes = [RemoteEnv([a.url, b.url], "maze", max_retries=3, backoff_s=0.02) for _ in range(4)]
    for i, remote in enumerate(remotes):
      remote.reset(i)
    assert {remote.url for remote in remotes} == {a.url, b.url}
    on_a = [remote for remote in remotes if remote.url == a.url]
    for remote in on_a:
      remote.step(remote.expert_action())
    a.stop()
    for i, remote in enumerate(remotes):
      while not remote.done:
        _, _, _, info = remote.step(remote.expert_action())
      assert info["success"] and remote.url == b.url
    assert all(remote.recoveries >= 1 for remote in on_a)


def test_a_hung_server_times_out_and_fails_the_episode():
  original = envs.env_class("maze")

  class Hangs(original):
    def _act(self, text):
      if "hang" in text:
        time.sleep(0.4)  # longer than the client's timeout; blocks the whole server meanwhile
      return super()._act(text)

  with ServerThread(env_factory=Hangs) as server:
    remote = RemoteEnv(server.url, timeout_s=0.1, max_retries=3, backoff_s=0.05)
    remote.reset(0)
    start = time.monotonic()
    observation, reward, done, info = remote.step("Action: hang")
    assert done and not info["success"] and "error" in info
    assert time.monotonic() - start < 15
    remote.reset(1)  # the server is fine for requests that do not hang
    while not remote.done:
      _, _, _, info = remote.step(remote.expert_action())
    assert info["success"]


def test_a_run_plays_the_envs_its_gin_serves_and_the_rest_in_process():
  """`served_envs.urls` (gin) makes every `envs.make` of the run open those envs on their servers: rollouts, val,
  task slices and self-questioning's checks all make envs by name."""
  import gin
  from evolver.envs.maze import MazeEnv
  from evolver.envs.sql import SqlEnv
  from evolver.train import gin_config, slices
  seen = {}

  def loop():
    seen["maze"], seen["sql"] = envs.make("maze"), envs.make("sql")
    seen["available"] = slices.train_tasks_available(["maze"])
    seen["played"] = _play(seen["maze"], 2)
    return "done"

  with ServerThread("maze") as server:
    with gin.unlock_config():
      gin.bind_parameter("served_envs.urls", {"maze": [server.url]})
    try:
      assert gin_config.run(loop) == "done"
    finally:
      gin.clear_config()
  assert isinstance(seen["maze"], RemoteEnv) and seen["maze"].urls == (server.url,)
  assert isinstance(seen["sql"], SqlEnv)  # not served: in process
  assert seen["available"] == {"maze": MazeEnv().num_tasks("train")}
  assert seen["played"] == _play(envs.make("maze"), 2)  # the same episode as the built-in env's
  assert isinstance(envs.make("maze"), MazeEnv) and envs.served() == {}  # the run's end undid it


@pytest.mark.parametrize("urls, message", [({"maze": "ftp://host:1"}, "env 'maze': expected a server URL"),
                                           ({"sql": []}, "env 'sql': expected a server URL")])
def test_served_envs_refuse_what_is_not_a_server_url(urls, message):
  with envs.serving({"textcraft": "http://127.0.0.1:1"}):
    with pytest.raises(envs.EnvError, match=message):
      with envs.serving({"maze": "http://127.0.0.1:2", **urls}):
        pass
    assert envs.served() == {"textcraft": ["http://127.0.0.1:1"]}  # nothing half-applied: the outer block's
  assert envs.served() == {}
