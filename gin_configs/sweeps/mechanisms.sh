#!/usr/bin/env bash
# The mechanism table: plain GRPO, + the experience pool, + self-questioning, + ADCA step credit, + anchor states and
# the full stack, each from the shared BC checkpoint with the settled RL recipe and its budget
# (gin_configs/rl_recipe.gin: 16 steps x 8 tasks x 8 episodes on maze and babyai, 1,024 episodes; the mechanisms in
# gin_configs/sweeps/mechanisms/), and BC on 5x the expert data from scratch (mechanisms/bc_x5.gin). AgentEvol's row
# is results/rl_signal/main's (the same start and episode budget), not run again. Up to 3 seeds, 100 held-out tasks
# per env (greedy and avg@4, the selected and the last policy), each paired with the start's own evaluation
# (results/rl_signal/start). Plain GRPO here takes the sampler's behaviour log-probabilities, as every mechanism
# does (results/rl_signal/main's "GRPO after" recomputed them).
#   bash gin_configs/sweeps/mechanisms.sh                                     # runs/sweeps/mechanisms, here
#   bash gin_configs/sweeps/mechanisms.sh --gin_bindings="TRAIN_STEPS = 8" --dry_run   # any launch.sweep flag after
# Seed 0 of every point first, then more seeds of some, each job archived as it finishes (a later session resumes
# from the archive), and the table from the records:
#   bash gin_configs/sweeps/mechanisms.sh --archive results/mechanisms --jobs 1 --only '*/seed=0'
#   bash gin_configs/sweeps/mechanisms.sh --archive results/mechanisms --jobs 1 --only 'gin_file=grpo/*' ...
#   python -m launch.sweep --root results/mechanisms --report --baseline_eval results/rl_signal/start [--policy last]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
M=gin_configs/sweeps/mechanisms
exec "${PYTHON:-python}" -m launch.sweep --root runs/sweeps/mechanisms --seeds 0,1,2 --eval_tasks 100 \
  --zip "gin_file=[$M/grpo.gin,$M/experience.gin,$M/selfq.gin,$M/adca.gin,$M/anchor.gin,$M/full.gin,$M/bc_x5.gin]" "$@"
