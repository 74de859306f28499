#!/usr/bin/env bash
# Job gin_file=experience/seed=0 of the sweep in runs/smollm2/c: run from anywhere.
cd .
start=$(date +%s.%N)
rc=0
python -m launch.train --gin_file=gin_configs/smollm2/experience.gin '--gin_bindings=INIT_CHECKPOINT = '"'"'runs/smollm2/warmup'"'"'' '--gin_bindings=TRAIN_STEPS = 4' '--gin_bindings=LoopConfig.eval_every = 4' '--gin_bindings=LoopConfig.val_start = False' '--gin_bindings=LoopConfig.eval_samples = 4' '--gin_bindings=MODEL_DIR = '"'"'runs/smollm2/c/gin_file=experience/seed=0'"'"'' '--gin_bindings=SEED = 0' '--gin_bindings=LoopConfig.eval_tasks = 25' >> runs/smollm2/c/gin_file=experience/seed=0/train.log 2>&1 || rc=$?
python -m launch.sweep --record_status runs/smollm2/c/gin_file=experience/seed=0 --returncode "$rc" --started "$start"
exit "$rc"
