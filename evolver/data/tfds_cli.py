"""`tfds build` without TensorFlow: tfds' own build command, with evolver's builders registered.

The `tfds` executable of tensorflow-datasets 4.9.x imports its `convert_format` command at start-up, and that
module touches `tf.train.Example`, so `tfds build` fails without TensorFlow even for array_record datasets.
This runs the same `build` command (tfds' `build.Args`: every flag and behaviour of `tfds build`) without
loading the other commands:

  python -m evolver.data.tfds_cli build expert_trajectories/maze_512 --file_format=array_record \\
      --data_dir="${EVOLVER_CACHE_DIR:-$HOME/.cache/evolver}/tensorflow_datasets"
  python -m evolver.data.tfds_cli build agent_traj_json/manual --manual_dir=path/to/AgentTraj-L \\
      --file_format=array_record --data_dir="${EVOLVER_CACHE_DIR:-$HOME/.cache/evolver}/tensorflow_datasets"

Where TensorFlow is installed, `tfds build --imports=evolver.data.tfds_builders <the same arguments>` is
equivalent.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from tensorflow_datasets.scripts.cli import build, cli_utils

import evolver.data.tfds_builders  # noqa: F401  (registers expert_trajectories and agent_traj_json)

_USAGE = "usage: python -m evolver.data.tfds_cli build DATASET[/CONFIG] [tfds build flags]"


def main(argv: Sequence[str] | None = None) -> int:
  argv = list(sys.argv if argv is None else argv)
  if len(argv) < 2 or argv[1] != "build":
    print(_USAGE, file=sys.stderr)
    return 2
  parse = cli_utils.make_flags_parser(build.Args, description="Build a TFDS dataset (tfds build).")
  # make_flags_parser drops argv[0]; drop the program name and keep "build"'s arguments.
  args = parse(argv[1:])
  args.execute()
  return 0


if __name__ == "__main__":
  sys.exit(main())
