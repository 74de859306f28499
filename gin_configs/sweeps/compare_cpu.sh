#!/usr/bin/env bash
# The self-evolution comparison at the CPU size, as a sweep: BC (80 demos per env), BC on 5x the expert data, GRPO
# from the BC job of its seed and AgentEvol (M = 2), seeds 0-2, held out at each job's end on 100 `eval` tasks per
# env of maze, babyai and sql (greedy, the val-selected policy). One gin file per method: gin_configs/compare/cpu/.
# Records (no checkpoints) go to results/compare_cpu, where the measured ones are: a job done there is not run again.
#   bash gin_configs/sweeps/compare_cpu.sh                 # run here, resumable; then ROOT/results.md
#   bash gin_configs/sweeps/compare_cpu.sh --dry_run       # one launch.train command line per job
#   bash gin_configs/sweeps/compare_cpu.sh --emit slurm    # any launch.sweep flag may follow; a repeated one wins
#   python -m launch.sweep --root results/compare_cpu --report    # the measured table: results/compare_cpu/results.md
# Runs from anywhere (python: $PYTHON, else the one on PATH). INIT_CHECKPOINT is None (a fresh init) but for GRPO.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
CPU=gin_configs/compare/cpu
exec "${PYTHON:-python}" -m launch.sweep --root runs/sweeps/compare_cpu --archive results/compare_cpu \
  --zip "gin_file=[$CPU/bc.gin,$CPU/bc_x5.gin,$CPU/grpo.gin,$CPU/agentevol.gin]" \
  --zip "INIT_CHECKPOINT=[None,None,'{job:gin_file=bc}',None]" \
  --seeds 0,1,2 --eval_tasks 100 "$@"
