"""Per-env summary of the built-in suite and benchmarks: task counts, the expert's and a random agent's success.

  python -m evolver.envs.report [--episodes 100] [--seed 0] [--envs maze,bfcl,...]

The expert runs on `episodes` held-out (`eval`) tasks drawn with `seed`, the random agent on as many `train` tasks.

The random agent picks, each turn, a uniformly random well-formed action from the env's current action
space (`TextEnv.sample_action`), a floor that shows the tasks are not trivial.
"""

from __future__ import annotations

import argparse
import random

from evolver import envs
from evolver.envs import base


def run_episode(env: base.Env, index: int, split: str, policy) -> tuple[bool, int, float]:
  """(success, turns, final reward) of one episode where `policy(env)` gives each whole turn."""
  env.reset(index, split)
  turns, reward, info = 0, 0.0, {"success": False}
  done = False
  while not done:
    _, reward, done, info = env.step(policy(env))
    turns += 1
  return bool(info["success"]), turns, reward


def expert_results(env: base.Env, split: str, indices: list[int]) -> list[tuple[bool, int, float]]:
  return [run_episode(env, i, split, lambda e: e.expert_action()) for i in indices]


def random_success_rate(env: base.TextEnv, episodes: int, seed: int = 0, split: str = "train") -> float:
  """Success rate of the uniformly random agent over `episodes` tasks drawn with `seed`."""
  rng = random.Random(seed)
  indices = [rng.randrange(env.num_tasks(split)) for _ in range(episodes)]
  wins = sum(run_episode(env, i, split, lambda e: e.sample_action(rng))[0] for i in indices)
  return wins / episodes


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--episodes", type=int, default=100)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--envs", default=",".join(envs.names() + envs.benchmark_names()),
                      help="comma-separated env names (default: the suite and the benchmarks)")
  args = parser.parse_args()
  print(f"{'env':<10} {'version':<24} {'train':>6} {'eval':>5} {'rounds':>6} {'expert':>7} {'turns':>6} "
        f"{'random':>7}")
  for name in [name.strip() for name in args.envs.split(",") if name.strip()]:
    env = envs.make(name)
    rng = random.Random(args.seed)
    indices = rng.sample(range(env.num_tasks("eval")), min(args.episodes, env.num_tasks("eval")))
    results = expert_results(env, "eval", indices)
    expert = sum(r[0] for r in results) / len(results)
    turns = sum(r[1] for r in results) / len(results)
    chance = random_success_rate(env, args.episodes, args.seed)
    print(f"{name:<10} {env.version:<24} {env.num_tasks('train'):>6} {env.num_tasks('eval'):>5} "
          f"{env.max_rounds:>6} {expert:>7.2f} {turns:>6.1f} {chance:>7.2f}")


if __name__ == "__main__":
  main()
