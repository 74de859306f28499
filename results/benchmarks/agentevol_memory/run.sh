#!/bin/bash
# AgentEvol's peak resident memory on the tiny default: the CPU comparison's recipe with short phases, on the six
# envs of runs/agentevol.gin (the comparison itself runs maze, babyai and sql).
cd "$(dirname "$0")/../../.."
source .venv/bin/activate
rm -rf runs/agentevol_memory
python -m launch.train --gin_file=gin_configs/compare/cpu/agentevol.gin \
  --gin_bindings="train_agentevol.envs=['maze', 'wordle', 'textcraft', 'babyai', 'sql', 'tools']" \
  --gin_bindings="MODEL_DIR='runs/agentevol_memory'" --gin_bindings="TRAIN_STEPS=30" \
  --gin_bindings="train_agentevol.curriculum_steps=10" --gin_bindings="train_agentevol.num_iterations=1" \
  --gin_bindings="TaskSlices.explore_count=8" --gin_bindings="LoopConfig.eval_tasks=0" \
  --gin_bindings="TrainerConfig.checkpoint_every=1000"
