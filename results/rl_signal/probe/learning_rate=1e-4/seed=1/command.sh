#!/usr/bin/env bash
# Job learning_rate=1e-4/seed=1 of the sweep in runs/rl_signal/probe_seed1: run from anywhere.
cd .
start=$(date +%s.%N)
rc=0
python -m launch.train --gin_file=gin_configs/rl_signal/probe.gin '--gin_bindings=LoopConfig.val_start = False' '--gin_bindings=make_optimizer.learning_rate = 1e-4' '--gin_bindings=MODEL_DIR = '"'"'runs/rl_signal/probe_seed1/learning_rate=1e-4/seed=1'"'"'' '--gin_bindings=SEED = 1' >> runs/rl_signal/probe_seed1/learning_rate=1e-4/seed=1/train.log 2>&1 || rc=$?
python -m launch.sweep --record_status runs/rl_signal/probe_seed1/learning_rate=1e-4/seed=1 --returncode "$rc" --started "$start"
exit "$rc"
