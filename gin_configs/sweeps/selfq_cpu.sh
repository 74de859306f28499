#!/usr/bin/env bash
# The self-questioning comparison at the CPU size, as a sweep: GRPO from the shared BC checkpoint, 8 steps of 8 tasks
# x 4 episodes, on 16 original tasks per env (scarce), on those plus as many tasks self-questioned in the same worlds
# (mix: results/selfq_cpu/taskset) and on the full exploration slice (full), held out at each job's end on 100 `eval`
# tasks per env of maze, babyai, sql and textcraft (greedy, the val-selected policy). One gin file per method:
# gin_configs/compare/cpu/selfq_*.gin. Records (no checkpoints) go to results/selfq_cpu, where the measured ones
# (seed 0) are: a job done there is not run again.
#   bash gin_configs/sweeps/selfq_cpu.sh                   # seeds 0-2, run here, resumable; then ROOT/results.md
#   bash gin_configs/sweeps/selfq_cpu.sh --dry_run         # one launch.train command line per job
#   bash gin_configs/sweeps/selfq_cpu.sh --seeds 0         # any launch.sweep flag may follow; a repeated one wins
#   python -m launch.sweep --root results/selfq_cpu --report        # the measured table: its results.md
# Runs from anywhere (python: $PYTHON, else the one on PATH).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CPU=gin_configs/compare/cpu
exec "${PYTHON:-python}" -m launch.sweep --root runs/sweeps/selfq_cpu --archive results/selfq_cpu \
  --zip "gin_file=[$CPU/selfq_scarce.gin,$CPU/selfq_mix.gin,$CPU/selfq_full.gin]" \
  --seeds 0,1,2 --eval_tasks 100 "$@"
