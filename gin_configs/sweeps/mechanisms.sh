#!/usr/bin/env bash
# The mechanism table: plain GRPO, + the experience pool, + self-questioning, + ADCA step credit, + anchor states, and
# the full stack, each from the shared BC checkpoint with the same budget of episodes (gin_configs/sweeps/mechanisms/),
# 3 seeds, 100 held-out tasks per env, compared with plain GRPO:
#   bash gin_configs/sweeps/mechanisms.sh                                     # runs/sweeps/mechanisms, here
#   bash gin_configs/sweeps/mechanisms.sh --gin_bindings="TRAIN_STEPS = 16" --dry_run   # any launch.sweep flag after
#   python -m launch.sweep --root runs/sweeps/mechanisms --report --baseline gin_file=grpo
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
M=gin_configs/sweeps/mechanisms
exec "${PYTHON:-python}" -m launch.sweep --root runs/sweeps/mechanisms --seeds 0,1,2 --eval_tasks 100 \
  --zip "gin_file=[$M/grpo.gin,$M/experience.gin,$M/selfq.gin,$M/adca.gin,$M/anchor.gin,$M/full.gin]" "$@"
