#!/usr/bin/env bash
# Job rollout_ratio=0.0,train_sample_mode=allkeep/seed=0 of the sweep in runs/sweeps/demo: run from anywhere.
cd .
start=$(date +%s.%N)
rc=0
python -m launch.train --gin_file=gin_configs/sweeps/ratio_mode.gin '--gin_bindings=TRAIN_STEPS = 2' '--gin_bindings=train_grpo.tasks_per_step = 4' '--gin_bindings=ExperienceManager.rollout_ratio = 0.0' '--gin_bindings=ExperienceManager.train_sample_mode = '"'"'allkeep'"'"'' '--gin_bindings=MODEL_DIR = '"'"'runs/sweeps/demo/rollout_ratio=0.0,train_sample_mode=allkeep/seed=0'"'"'' '--gin_bindings=SEED = 0' '--gin_bindings=LoopConfig.eval_tasks = 20' >> runs/sweeps/demo/rollout_ratio=0.0,train_sample_mode=allkeep/seed=0/train.log 2>&1 || rc=$?
python -m launch.sweep --record_status runs/sweeps/demo/rollout_ratio=0.0,train_sample_mode=allkeep/seed=0 --returncode "$rc" --started "$start"
exit "$rc"
