#!/usr/bin/env bash
# SmolLM2 experiment (c): GRPO without experience (gin_configs/smollm2/grpo.gin) against GRPO with the pool
# (smollm2/experience.gin: extractive memories of expert episodes and rollouts, hybrid retrieval), both from the
# format warm-up, on the same small budget: 4 steps of 4 tasks x 4 episodes of maze and sql (64 episodes each);
# each arm's last policy (val only at the end, the start not a candidate: this compares what the two trainings did)
# held out on 25 `eval` tasks per env, greedy and avg@4 (temperature 1, seed 0: both arms and the start play the
# same episodes); 1 seed, one job at a time (each peaks near 10 GB). Starts from runs/smollm2/warmup
# (gin_configs/smollm2/warmup.gin); the start's own evaluation on those episodes is experiment (b)'s plain arm
# (gin_configs/smollm2/experience_eval.sh).
#   bash gin_configs/sweeps/smollm2_experience.sh     # runs/smollm2/c, resumable; records to results/smollm2/c/
#   python -m launch.sweep --root results/smollm2/c --report --baseline_eval results/smollm2/b_experience/plain
# Expected on 2 idle CPU cores: ~30 min of steps and ~40 min of held-out evaluation a job, ~2.5 h for both.
# On a machine without the warm-up it is trained first (~35 min idle; gin_configs/smollm2/warmup.gin), unless the
# command only prints or emits (--dry_run, --emit, --report). One arm at a time, each archived as it finishes:
#   bash gin_configs/sweeps/smollm2_experience.sh --only 'gin_file=grpo/*'
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
S=gin_configs/smollm2
case " $* " in
  *" --dry_run "*|*" --emit"*|*" --report "*) ;;
  *) if [ ! -d runs/smollm2/warmup/best ]; then
       echo "[smollm2_experience] the format warm-up first (runs/smollm2/warmup)" >&2
       "${PYTHON:-python}" -m launch.train --gin_file=$S/warmup.gin --gin_bindings="MODEL_DIR='runs/smollm2/warmup'"
     fi ;;
esac
exec "${PYTHON:-python}" -m launch.sweep --root runs/smollm2/c --archive results/smollm2/c \
  --zip "gin_file=[$S/grpo.gin,$S/experience.gin]" --seeds 0 --eval_tasks 25 --jobs 1 \
  --gin_bindings="INIT_CHECKPOINT = 'runs/smollm2/warmup'" --gin_bindings="TRAIN_STEPS = 4" \
  --gin_bindings="LoopConfig.eval_every = 4" --gin_bindings="LoopConfig.val_start = False" \
  --gin_bindings="LoopConfig.eval_samples = 4" "$@"
