"""Training entry point.

  python -m launch.train --gin_file=gin_configs/runs/bc.gin --gin_bindings="MODEL_DIR='runs/bc'" \
      --gin_bindings="TRAIN_STEPS=40"

Flags are repeatable: later files and bindings override earlier ones. A --gin_file is read as given (relative to
the working directory), else from --gin_search_paths, gin_configs/ or the repository root; `include`s only from
those, so a run config reads the same from any directory (from outside the repository, with PYTHONPATH=<repo>).
The run writes MODEL_DIR/config.gin (every binding) at the start and MODEL_DIR/operative_config.gin (what was
used) once training runs, and resumes from MODEL_DIR/checkpoints when started again.

Multi-host (every host runs this same command; `evolver.distributed`): `--distributed` lets JAX detect the
cluster (TPU VM slices, SLURM); or give it explicitly on each host:
  python -m launch.train --coordinator_address=HOST0:1234 --num_processes=2 --process_id=0 --gin_file=...
"""

import sys

from absl import app, flags, logging

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "gin config files (repeatable)")
flags.DEFINE_multi_string("gin_bindings", [], "gin bindings, e.g. \"MODEL_DIR='runs/x'\" (repeatable)")
flags.DEFINE_multi_string("gin_search_paths", [], "extra directories to look up gin files and includes in")
flags.DEFINE_bool("distributed", False, "join a multi-process run, the cluster detected by JAX (TPU VMs, SLURM)")
flags.DEFINE_string("coordinator_address", None, "multi-process run: process 0's host:port")
flags.DEFINE_integer("num_processes", None, "multi-process run: how many processes")
flags.DEFINE_integer("process_id", None, "multi-process run: this process's index in [0, num_processes)")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every save step at INFO
  from evolver.train import gin_config
  if not FLAGS.gin_file:
    sys.exit("give at least one --gin_file, e.g. --gin_file=gin_configs/runs/bc.gin")
  from evolver import distributed
  try:
    distributed.initialize(auto=FLAGS.distributed, coordinator_address=FLAGS.coordinator_address,
                           num_processes=FLAGS.num_processes, process_id=FLAGS.process_id)
  except ValueError as e:
    sys.exit(f"error: {e}")
  try:
    gin_config.parse(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
  except gin_config.ConfigError as e:
    sys.exit(f"error: {e}")
  try:
    gin_config.run()
  except gin_config.ConfigError as e:  # what gin could not check at parse time (e.g. served_envs.urls)
    sys.exit(f"error: {e}")


if __name__ == "__main__":
  app.run(main)
