"""Environments: the Env protocol, the built-in suite, the HTTP server and the `RemoteEnv` client.

  env = evolver.envs.make("maze")
  first = env.reset(3, split="train")
  observation, reward, done, info = env.step(env.expert_action())
  key = env.state_key()                                     # the true state the next action is taken in
  first = env.reset_spec({"env": "maze", "world": 3, "target": {"cell": [1, 1]}})   # a task given as a spec
  first = env.reset_world(3, split="train")                 # the world of task 3 with no goal: an exploration
  tasks = env.hindsight_tasks()                             # what it reached, as specs with their actions
  key = env.target_key(0, "eval")                           # what a task asks on which world (decontamination)
  with evolver.envs.serving({"maze": "http://127.0.0.1:36001"}):  # make("maze") opens a RemoteEnv there

No JAX here, and nothing else of evolver: the suite runs as its own service (`python -m launch.serve_env`).
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator

from evolver.envs.base import (Env, EnvError, EpisodeNotStartedError, ExplorableEnv, HindsightTask, TaskSpec,
                               TextEnv)

# name -> "module:class"; modules are imported on first use (BabyAI pulls in minigrid).
_REGISTRY = {
    "babyai": "evolver.envs.babyai:BabyAIEnv",
    "maze": "evolver.envs.maze:MazeEnv",
    "sql": "evolver.envs.sql:SqlEnv",
    "textcraft": "evolver.envs.textcraft:TextCraftEnv",
    "tools": "evolver.envs.tools:ToolsEnv",
    "wordle": "evolver.envs.wordle:WordleEnv",
}

# Outside benchmarks played through the Env protocol: fixed task sets scored by the benchmark's own checker. They
# take no spec tasks and open no explorations, so the suite-wide tests and tools (`names()`) leave them out.
_BENCHMARKS = {
    "bfcl": "evolver.envs.bfcl:BfclEnv",
    "sciworld": "evolver.envs.sciworld:SciWorldEnv",
}


def names() -> list[str]:
  """The built-in environments, sorted."""
  return sorted(_REGISTRY)


def benchmark_names() -> list[str]:
  """The built-in benchmark envs (BFCL's multi-turn tasks, ...), sorted; `make` takes them too."""
  return sorted(_BENCHMARKS)


def env_class(name: str) -> type[TextEnv]:
  registry = {**_REGISTRY, **_BENCHMARKS}
  if name not in registry:
    raise EnvError(f"unknown env {name!r}; choose one of {names() + benchmark_names()}")
  module_name, class_name = registry[name].split(":")
  return getattr(importlib.import_module(module_name), class_name)


# name -> (server URLs, RemoteEnv keyword arguments): the envs `make` opens on servers (`serving`).
_SERVED: dict[str, tuple[list[str], dict]] = {}


@contextlib.contextmanager
def serving(urls: dict[str, str | list[str]], **remote_kwargs) -> Iterator[dict[str, list[str]]]:
  """Within the block, `make(name)` opens a `RemoteEnv` on `urls[name]` (one URL or several, sessions spread over
  them) for each name given, and the built-in env for every other name; leaving it restores what was served
  before. How a training run plays served envs (gin: `served_envs.urls`, evolver.train.gin_config) and
  `launch.eval --env_urls`; `remote_kwargs` go to each `RemoteEnv` (`server="agentgym"`, `timeout_s`, ...).
  Every URL is checked before anything changes. Yields `served()`."""
  from evolver.envs.remote import HttpClient
  checked = {}
  for name, where in urls.items():
    where = [where] if isinstance(where, str) else list(where)
    try:
      if not where or not all(isinstance(url, str) for url in where):
        raise ValueError("no URL")
      for url in where:
        HttpClient(url, timeout_s=1.0)  # parses the URL, connects to nothing
    except ValueError as e:
      raise EnvError(f"env {name!r}: expected a server URL or a list of them (http://HOST:PORT), got "
                     f"{urls[name]!r} ({e})") from None
    checked[name] = (where, dict(remote_kwargs))
  before = dict(_SERVED)
  _SERVED.clear()
  _SERVED.update(checked)
  try:
    yield served()
  finally:
    _SERVED.clear()
    _SERVED.update(before)


def served() -> dict[str, list[str]]:
  """{env name: its server URLs} for the envs `make` opens on servers (`serving`)."""
  return {name: list(where) for name, (where, _) in _SERVED.items()}


def make(name: str) -> TextEnv:
  """A fresh instance of the built-in env or benchmark `name`, or a `RemoteEnv` on its server when `serving`
  names one (call `reset(index, split)` before `step`)."""
  if name in _SERVED:
    from evolver.envs.remote import RemoteEnv
    where, kwargs = _SERVED[name]
    return RemoteEnv(where, name, **kwargs)
  return env_class(name)()


def __getattr__(attribute: str):
  # RemoteEnv lives with the HTTP code; import it lazily so that `make` stays light.
  if attribute == "RemoteEnv":
    from evolver.envs.remote import RemoteEnv
    return RemoteEnv
  raise AttributeError(attribute)


__all__ = ["Env", "EnvError", "EpisodeNotStartedError", "ExplorableEnv", "HindsightTask", "RemoteEnv", "TaskSpec",
           "TextEnv", "benchmark_names", "env_class", "make", "names", "served", "serving"]
