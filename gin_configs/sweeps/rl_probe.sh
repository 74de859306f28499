#!/usr/bin/env bash
# The overfit probe (gin_configs/rl_signal/probe.gin) over the loss's aggregation and the learning rate, 1 seed: does
# a GRPO step learn the tasks it trains on, and where does a larger step collapse? val (the trained tasks, avg@4) at
# steps 0, 8 and 16 is the figure; about 30 min a job, two at a time on 2 cores.
#   bash gin_configs/sweeps/rl_probe.sh
#   python -m launch.sweep --root runs/rl_signal/probe --report
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec "${PYTHON:-python}" -m launch.sweep --gin_file=gin_configs/rl_signal/probe.gin --root runs/rl_signal/probe \
  --seeds 0 --eval_tasks -1 \
  --sweep "het_ppo_loss_fn.agg_mode=['seq-mean-token-mean','token-mean']" \
  --sweep "make_optimizer.learning_rate=[3e-4,1e-3,1e-4]" "$@"
