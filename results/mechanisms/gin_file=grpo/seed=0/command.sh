#!/usr/bin/env bash
# Job gin_file=grpo/seed=0 of the sweep in runs/sweeps/mechanisms: run from anywhere.
cd .
start=$(date +%s.%N)
rc=0
python -m launch.train --gin_file=gin_configs/sweeps/mechanisms/grpo.gin '--gin_bindings=MODEL_DIR = '"'"'runs/sweeps/mechanisms/gin_file=grpo/seed=0'"'"'' '--gin_bindings=SEED = 0' '--gin_bindings=LoopConfig.eval_tasks = 100' >> runs/sweeps/mechanisms/gin_file=grpo/seed=0/train.log 2>&1 || rc=$?
python -m launch.sweep --record_status runs/sweeps/mechanisms/gin_file=grpo/seed=0 --returncode "$rc" --started "$start"
exit "$rc"
