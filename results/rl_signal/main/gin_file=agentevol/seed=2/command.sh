#!/usr/bin/env bash
# Job gin_file=agentevol/seed=2 of the sweep in runs/rl_signal/main: run from anywhere.
cd .
start=$(date +%s.%N)
rc=0
python -m launch.train --gin_file=gin_configs/rl_signal/agentevol.gin '--gin_bindings=MODEL_DIR = '"'"'runs/rl_signal/main/gin_file=agentevol/seed=2'"'"'' '--gin_bindings=SEED = 2' '--gin_bindings=LoopConfig.eval_tasks = 100' >> runs/rl_signal/main/gin_file=agentevol/seed=2/train.log 2>&1 || rc=$?
python -m launch.sweep --record_status runs/rl_signal/main/gin_file=agentevol/seed=2 --returncode "$rc" --started "$start"
exit "$rc"
