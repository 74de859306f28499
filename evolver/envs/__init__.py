"""Environments: the Env protocol, the built-in suite, the HTTP server and the `RemoteEnv` client.

  env = evolver.envs.make("maze")
  first = env.reset(3, split="train")
  observation, reward, done, info = env.step(env.expert_action())
  key = env.state_key()                                     # the true state the next action is taken in
  first = env.reset_spec({"env": "maze", "world": 3, "target": {"cell": [1, 1]}})   # a task given as a spec
  first = env.reset_world(3, split="train")                 # the world of task 3 with no goal: an exploration
  tasks = env.hindsight_tasks()                             # what it reached, as specs with their actions
  key = env.target_key(0, "eval")                           # what a task asks on which world (decontamination)

No JAX here, and nothing else of evolver: the suite runs as its own service (`python -m launch.serve_env`).
"""

from __future__ import annotations

import importlib

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


def make(name: str) -> TextEnv:
  """A fresh instance of the built-in env or benchmark `name` (call `reset(index, split)` before `step`)."""
  return env_class(name)()


def __getattr__(attribute: str):
  # RemoteEnv lives with the HTTP code; import it lazily so that `make` stays light.
  if attribute == "RemoteEnv":
    from evolver.envs.remote import RemoteEnv
    return RemoteEnv
  raise AttributeError(attribute)


__all__ = ["Env", "EnvError", "EpisodeNotStartedError", "ExplorableEnv", "HindsightTask", "RemoteEnv", "TaskSpec",
           "TextEnv", "benchmark_names", "env_class", "make", "names"]
