#!/usr/bin/env bash
# The experience-pool comparison at the CPU size, as a sweep: GRPO from the shared BC checkpoint with the pool's
# lifecycle init + train + update and each method (woexp; mixed 0.5 with alldiscard, allkeep, hybrid 0.5), 8 steps of
# 8 tasks x 4 episodes, held out at each job's end on 100 `eval` tasks per env of maze, babyai, sql and textcraft
# (greedy, the val-selected policy). One gin file per method: gin_configs/compare/cpu/exp_*.gin. Records (no
# checkpoints) go to results/experience_cpu, where the measured ones (seed 0) are: a job done there is not run again.
#   bash gin_configs/sweeps/experience_cpu.sh              # seeds 0-2, run here, resumable; then ROOT/results.md
#   bash gin_configs/sweeps/experience_cpu.sh --dry_run    # one launch.train command line per job
#   bash gin_configs/sweeps/experience_cpu.sh --seeds 0    # any launch.sweep flag may follow; a repeated one wins
#   python -m launch.sweep --root results/experience_cpu --report   # the measured table: its results.md
# Runs from anywhere (python: $PYTHON, else the one on PATH).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CPU=gin_configs/compare/cpu
exec "${PYTHON:-python}" -m launch.sweep --root runs/sweeps/experience_cpu --archive results/experience_cpu \
  --zip "gin_file=[$CPU/exp_woexp.gin,$CPU/exp_discard.gin,$CPU/exp_keep.gin,$CPU/exp_hybrid.gin]" \
  --seeds 0,1,2 --eval_tasks 100 "$@"
