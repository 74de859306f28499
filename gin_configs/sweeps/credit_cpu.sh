#!/usr/bin/env bash
# The step-credit comparison at the CPU size, as a sweep: GRPO from the shared BC checkpoint on the full exploration
# slice, 8 steps of 8 tasks x 4 episodes, with ADCA (oracle judge), anchor-state grouping and ADCA (env judge), held
# out at each job's end on 100 `eval` tasks per env of maze, babyai, sql and textcraft (greedy, the val-selected
# policy); plain GRPO on the same budget is selfq_cpu.sh's selfq_full. One gin file per method:
# gin_configs/compare/cpu/credit_*.gin. Records (no checkpoints) go to results/credit_cpu, where the measured ones
# (seed 0) are: a job done there is not run again.
#   bash gin_configs/sweeps/credit_cpu.sh                  # seeds 0-2, run here, resumable; then ROOT/results.md
#   bash gin_configs/sweeps/credit_cpu.sh --dry_run        # one launch.train command line per job
#   bash gin_configs/sweeps/credit_cpu.sh --seeds 0        # any launch.sweep flag may follow; a repeated one wins
#   python -m launch.sweep --root results/credit_cpu --report       # the measured table: its results.md
# Runs from anywhere (python: $PYTHON, else the one on PATH).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CPU=gin_configs/compare/cpu
exec "${PYTHON:-python}" -m launch.sweep --root runs/sweeps/credit_cpu --archive results/credit_cpu \
  --zip "gin_file=[$CPU/credit_adca_oracle.gin,$CPU/credit_anchor.gin,$CPU/credit_adca_env.gin]" \
  --seeds 0,1,2 --eval_tasks 100 "$@"
