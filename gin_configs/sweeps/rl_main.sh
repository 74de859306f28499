#!/usr/bin/env bash
# The RL-signal main comparison (results/rl_signal/main): from the shared BC checkpoint on maze and babyai, 3 seeds,
# 1,024 episodes each: GRPO before the RL-signal changes (gin_configs/rl_signal/grpo_before.gin), GRPO after them
# (rl_signal/grpo.gin) and one AgentEvol iteration (rl_signal/agentevol.gin); held out on 100 `eval` tasks per env,
# greedy and avg@4 (temperature 1, seed 0), paired with the start's own evaluation (results/rl_signal/start):
#   python -m launch.eval --hf_checkpoint evolver/assets/checkpoints/bc_tiny --envs maze,babyai --num_tasks 100 \
#     --num_samples 4 --with_greedy --out results/rl_signal/start
#   bash gin_configs/sweeps/rl_main.sh                  # runs/rl_signal/main, resumable; records to results/
#   python -m launch.sweep --root results/rl_signal/main --report --baseline_eval results/rl_signal/start
#   python -m launch.sweep --root results/rl_signal/main --report --baseline_eval results/rl_signal/start \
#     --policy last      # each job's last policy (LoopConfig.eval_last; seed 0 ran without it), results_last.md
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
R=gin_configs/rl_signal
exec "${PYTHON:-python}" -m launch.sweep --root runs/rl_signal/main --archive results/rl_signal/main \
  --zip "gin_file=[$R/grpo_before.gin,$R/grpo.gin,$R/agentevol.gin]" --seeds 0,1,2 --eval_tasks 100 "$@"
