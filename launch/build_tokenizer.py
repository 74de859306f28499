"""Builds the tiny default's tokenizer from the built-in environments' text (expert episodes on `train`).

  python -m launch.build_tokenizer [--vocab_size 4096] [--episodes_per_env 400] [--out evolver/assets/tokenizer]

The result is committed (a few hundred KB); rebuild it when the environments' text changes a lot.
"""

import argparse
from collections.abc import Iterator

import evolver.envs as envs
from evolver.models import tokenizer as tokenizer_lib


def environment_texts(episodes_per_env: int) -> Iterator[str]:
  for name in envs.names():
    env = envs.make(name)
    yield env.instruction()
    for index in range(min(episodes_per_env, env.num_tasks("train"))):
      yield env.reset(index, "train")
      done = False
      while not done:
        action = env.expert_action()
        observation, _, done, _ = env.step(action)
        yield action
        yield observation


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--vocab_size", type=int, default=4096)
  parser.add_argument("--episodes_per_env", type=int, default=400)
  parser.add_argument("--out", default=tokenizer_lib.TINY_TOKENIZER_DIR)
  args = parser.parse_args()
  tok = tokenizer_lib.train_tokenizer(environment_texts(args.episodes_per_env), args.vocab_size, args.out)
  print(f"saved a {len(tok)}-token tokenizer to {args.out}")


if __name__ == "__main__":
  main()
