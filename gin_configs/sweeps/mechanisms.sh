#!/usr/bin/env bash
# The mechanism table: plain GRPO, + the experience pool, + self-questioning, + ADCA step credit, + anchor states, and
# the full stack, each from the shared BC checkpoint with the settled RL recipe and its budget
# (gin_configs/rl_recipe.gin: 16 steps x 8 tasks x 8 episodes on maze and babyai, 1,024 episodes; the mechanisms in
# gin_configs/sweeps/mechanisms/),
# 3 seeds, 100 held-out tasks per env (greedy and avg@4, the selected and the last policy), compared with plain GRPO
# (the same recipe as results/rl_signal/main's "GRPO after", whose behaviour log-probabilities were recomputed):
#   bash gin_configs/sweeps/mechanisms.sh                                     # runs/sweeps/mechanisms, here
#   bash gin_configs/sweeps/mechanisms.sh --gin_bindings="TRAIN_STEPS = 8" --dry_run   # any launch.sweep flag after
#   python -m launch.sweep --root runs/sweeps/mechanisms --report --baseline gin_file=grpo
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
M=gin_configs/sweeps/mechanisms
exec "${PYTHON:-python}" -m launch.sweep --root runs/sweeps/mechanisms --seeds 0,1,2 --eval_tasks 100 \
  --zip "gin_file=[$M/grpo.gin,$M/experience.gin,$M/selfq.gin,$M/adca.gin,$M/anchor.gin,$M/full.gin]" "$@"
