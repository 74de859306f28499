#!/usr/bin/env bash
# The overfit probe (gin_configs/rl_signal/probe.gin) over the learning rate, 1 seed: does a GRPO step learn the tasks
# it trains on, and does 3x the step collapse? val (the 48 trained tasks, avg@4, fixed seeds) at steps 8 and 16 is
# the figure; the start's val (step 0) is the same paired evaluation in every job (.349: maze .552, babyai .146), so
# it is measured once (LoopConfig.val_start in probe.gin) and not repeated here. Two jobs side by side, ~80 min.
#   bash gin_configs/sweeps/rl_probe.sh
#   python -m launch.sweep --root runs/rl_signal/probe --report
# With DAPO's dynamic sampling (up to 2 refill rounds a step; ~2.5x the episodes, ~100 min two side by side):
#   bash gin_configs/sweeps/rl_probe.sh --root runs/rl_signal/probe_ds \
#     --gin_bindings="train_grpo.dynamic_sampling_rounds = 2"
# AXIS replaces the learning-rate axis: the other probes of results/rl_signal/probe (each its own root):
#   AXIS="make_optimizer.learning_rate=[2e-4]" bash gin_configs/sweeps/rl_probe.sh --root runs/rl_signal/probe_lr
#   AXIS="train_grpo.ppo_epochs=[2]" bash gin_configs/sweeps/rl_probe.sh --root runs/rl_signal/probe_ppo_epochs
#   AXIS="het_ppo_loss_fn.agg_mode=['token-mean','seq-mean-token-sum-norm']" \
#     bash gin_configs/sweeps/rl_probe.sh --root runs/rl_signal/probe_agg        # the aggregation modes
#   AXIS="het_ppo_loss_fn.negative_weight=[0.5]" bash gin_configs/sweeps/rl_probe.sh --root runs/rl_signal/probe_neg
#   AXIS="train_grpo.task_source=[@PassRateCurriculum()]" \
#     bash gin_configs/sweeps/rl_probe.sh --root runs/rl_signal/probe_curriculum     # the pass-rate curriculum
# The table of all (records copied to results/rl_signal/probe/POINT/seed=0, the start's val in its start/):
#   python -m launch.probe_report results/rl_signal/probe
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
AXIS="${AXIS:-make_optimizer.learning_rate=[1e-4,3e-4]}"
exec "${PYTHON:-python}" -m launch.sweep --gin_file=gin_configs/rl_signal/probe.gin --root runs/rl_signal/probe \
  --seeds 0 --eval_tasks -1 --gin_bindings="LoopConfig.val_start = False" --sweep "$AXIS" "$@"
