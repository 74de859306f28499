#!/usr/bin/env bash
# Job negative_weight=0.5/seed=0 of the sweep in runs/rl_signal/probe_neg: run from anywhere.
cd .
start=$(date +%s.%N)
rc=0
python -m launch.train --gin_file=gin_configs/rl_signal/probe.gin '--gin_bindings=LoopConfig.val_start = False' '--gin_bindings=het_ppo_loss_fn.negative_weight = 0.5' '--gin_bindings=MODEL_DIR = '"'"'runs/rl_signal/probe_neg/negative_weight=0.5/seed=0'"'"'' '--gin_bindings=SEED = 0' >> runs/rl_signal/probe_neg/negative_weight=0.5/seed=0/train.log 2>&1 || rc=$?
python -m launch.sweep --record_status runs/rl_signal/probe_neg/negative_weight=0.5/seed=0 --returncode "$rc" --started "$start"
exit "$rc"
