"""Which tasks `launch.eval` plays and where: `--env_urls` (an env evaluated on its server, a real `ServerThread` on
loopback, plays the same episodes as the built-in env in process, and nothing is left served behind) and
`--indices` (chosen tasks play the episodes they play in a contiguous slice).

  python -m pytest tests/launch/test_eval_served.py -q
"""

import json
import os

from evolver import envs
from evolver.envs.server import ServerThread
from launch import eval as eval_cli

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SHARED_BC = os.path.join(ROOT, "evolver", "assets", "checkpoints", "bc_tiny")
EPISODES = ["--hf_checkpoint", SHARED_BC, "--envs", "maze,wordle", "--split", "train", "--num_tasks", "1",
            "--max_rounds", "3", "--max_new_tokens", "32"]


def _episodes(path):
  with open(path) as f:
    return [{k: e[k] for k in ("env", "index", "sample", "success", "rounds", "reward") if k in e}
            for e in json.load(f)["episodes"]]


def test_served_env_plays_the_same_episodes_as_the_built_in_one(tmp_path, monkeypatch):
  local = str(tmp_path / "local.json")
  eval_cli.main([*EPISODES, "--out", local])
  made, make = [], envs.make

  def recording_make(name):
    env = make(name)
    made.append((name, type(env).__name__))
    return env

  monkeypatch.setattr(envs, "make", recording_make)
  with ServerThread("maze") as server:
    served = str(tmp_path / "served.json")
    results = eval_cli.main([*EPISODES, "--out", served, "--env_urls", f"maze={server.url}"])
  assert {kind for name, kind in made if name == "maze"} == {"RemoteEnv"}
  assert {kind for name, kind in made if name == "wordle"} == {"WordleEnv"}  # not served: in process
  assert results["envs"]["maze"]["num_episodes"] == 1
  assert _episodes(served) == _episodes(local) and len(_episodes(local)) == 2
  assert envs.served() == {}  # the evaluation's servers are not left behind for what runs next


def test_chosen_tasks_play_the_episodes_they_play_in_a_slice(tmp_path):
  sliced, chosen = str(tmp_path / "sliced.json"), str(tmp_path / "chosen.json")
  flags = ["--hf_checkpoint", SHARED_BC, "--envs", "maze", "--split", "train", "--max_rounds", "3",
           "--max_new_tokens", "32", "--num_samples", "2"]
  eval_cli.main([*flags, "--start", "2", "--num_tasks", "3", "--out", sliced])
  (tmp_path / "indices.json").write_text(json.dumps({"maze": [4, 2]}))
  eval_cli.main([*flags, "--indices", str(tmp_path / "indices.json"), "--out", chosen])
  by_task = {(e["index"], e["sample"]): e for e in _episodes(sliced)}
  assert sorted((e["index"], e["sample"]) for e in _episodes(chosen)) == [(2, 0), (2, 1), (4, 0), (4, 1)]
  assert all(e == by_task[(e["index"], e["sample"])] for e in _episodes(chosen))
