#!/usr/bin/env bash
# AgentEvolver's experience ablation: rollout_ratio x train_sample_mode (gin_configs/sweeps/ratio_mode.gin), 3 seeds,
# 100 held-out tasks per env:
#   bash gin_configs/sweeps/ratio_mode.sh                                      # runs/sweeps/ratio_mode, here
#   bash gin_configs/sweeps/ratio_mode.sh --emit slurm                         # any launch.sweep flag after
#   python -m launch.sweep --root runs/sweeps/ratio_mode --report --baseline "rollout_ratio=0.0,train_sample_mode=alldiscard"
# One seed of each distinct cell first, each job's records archived as it finishes (a later session resumes from the
# archive): at rollout_ratio 0 no rollout gets experience and the three modes are the same run, so alldiscard
# stands for them (13 jobs):
#   bash gin_configs/sweeps/ratio_mode.sh --archive results/ratio_mode --jobs 1 \
#     --only 'rollout_ratio=0.0,train_sample_mode=alldiscard/seed=0' --only 'rollout_ratio=0.[257]*/seed=0' \
#     --only 'rollout_ratio=1.0,*/seed=0'
# The workflow's demonstration (results/sweeps/demo; 2 RL steps a job, one seed: not a result):
#   bash gin_configs/sweeps/ratio_mode.sh --root runs/sweeps/demo --seeds 0 --gin_bindings="TRAIN_STEPS = 2" \
#     --gin_bindings="train_grpo.tasks_per_step = 4" --eval_tasks 20 --archive results/sweeps/demo
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
exec "${PYTHON:-python}" -m launch.sweep --gin_file=gin_configs/sweeps/ratio_mode.gin --root runs/sweeps/ratio_mode \
  --seeds 0,1,2 --eval_tasks 100 \
  --sweep "ExperienceManager.rollout_ratio=[0.0,0.25,0.5,0.75,1.0]" \
  --sweep "ExperienceManager.train_sample_mode=['alldiscard','allkeep','hybrid']" "$@"
