#!/usr/bin/env bash
# SmolLM2 experiment (b): experience without training, as ReMe is used. The warm-up's policy plays train tasks, its
# solved episodes are summarized by the policy itself into a pool (ReMe's LLM pipeline, MiniLM embeddings, ScaNN),
# and held-out tasks are evaluated with retrieval from that pool against without it: the same tasks and sampling
# seeds (avg@4, temperature 1, seed 0), paired, with a bootstrap 95% interval over tasks (paired.json).
#   bash gin_configs/smollm2/experience_eval.sh              # records in results/smollm2/b_experience/
# The budget, its defaults (environment variables override them):
#   ENVS=maze,sql           the envs where the warm-up solves some held-out tasks (textcraft and tools: 0/50)
#   TRAIN_TASKS=40          train tasks per env played greedily to build the pool
#   EVAL_TASKS=25           held-out tasks per env, each sampled SAMPLES=4 times, in each arm
#   POLICY="--model_dir runs/smollm2/warmup --best"  (trained first, gin_configs/smollm2/warmup.gin, if missing)
#   OUT=results/smollm2/b_experience  RUN=runs/smollm2/b_experience (the pool: RUN/pool)
# Expected: ~80 + 2 x 200 episodes at 0.07-0.15 episodes/s on 2 CPU cores, 1-2 h after the warm-up; ~4 GB.
# Resumable by stage: a stage whose output exists is skipped (delete it to redo it). If the policy's summaries leave
# the pool empty, the extractive summarizer builds it from the same episodes instead (said in the log and records).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
PY="${PYTHON:-python}"
ENVS="${ENVS:-maze,sql}"
TRAIN_TASKS="${TRAIN_TASKS:-40}"
EVAL_TASKS="${EVAL_TASKS:-25}"
SAMPLES="${SAMPLES:-4}"
OUT="${OUT:-results/smollm2/b_experience}"
RUN="${RUN:-runs/smollm2/b_experience}"
POLICY="${POLICY:---model_dir runs/smollm2/warmup --best}"
read -r -a POLICY_ARGS <<< "$POLICY"
# SmolLM2's context and turn budget, as in experiment (a) (results/smollm2/README.md).
ROLLOUT=(--max_rounds 10 --max_new_tokens 96 --batch_size 16 --max_context_tokens 2048)
mkdir -p "$OUT" "$RUN"
log() { echo "[experience_eval] $(date -u +%H:%M:%S) $*"; }

if [ "$POLICY" = "--model_dir runs/smollm2/warmup --best" ] && [ ! -d runs/smollm2/warmup/best ]; then
  log "the format warm-up (gin_configs/smollm2/warmup.gin)"
  "$PY" -m launch.train --gin_file=gin_configs/smollm2/warmup.gin --gin_bindings="MODEL_DIR='runs/smollm2/warmup'"
fi

timed() {  # timed NAME [--builds DIR] CMD...: runs CMD unless OUT/NAME.json exists (and DIR, the pool it builds,
  # is still there: records are kept in OUT, pools in RUN, which a fresh machine lacks); wall seconds to OUT/NAME.time
  local name="$1"; shift
  local builds=""
  if [ "$1" = "--builds" ]; then builds="$2"; shift 2; fi
  if [ -e "$OUT/$name.json" ] || [ -e "$OUT/$name/eval_samples.json" ]; then
    if [ -z "$builds" ] || [ -d "$builds" ]; then log "$name: done before"; return; fi
    log "$name: its record is here but its pool $builds is not: rebuilt (greedy, so the same episodes)"
  fi
  log "$name"
  local start; start=$(date +%s)
  "$@"
  echo "$(( $(date +%s) - start ))" > "$OUT/$name.time"
}

# 1. The pool: the policy's own train episodes (greedy), the solved ones summarized by the policy.
pool_size() { "$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['experience_summary']['size'])" "$1"; }
POLICY_POOL=(--builds "$RUN/pool")  # an empty pool recorded need not be rebuilt: the extractive one is used instead
if [ -e "$OUT/pool_train.json" ] && [ "$(pool_size "$OUT/pool_train.json")" = 0 ]; then POLICY_POOL=(); fi
timed pool_train "${POLICY_POOL[@]}" "$PY" -m launch.eval "${POLICY_ARGS[@]}" --envs "$ENVS" --split train \
  --num_tasks "$TRAIN_TASKS" "${ROLLOUT[@]}" --summarize_into "$RUN/pool" --summarizer policy --embedder minilm \
  --out "$OUT/pool_train.json"
POOL="$RUN/pool"
if [ "$(pool_size "$OUT/pool_train.json")" = 0 ]; then
  # At 135M the policy's summaries may not parse at all (pool_train.json counts them): the same episodes are
  # then summarized without a model (the extractive summarizer: the solved episodes' actions as memories), so
  # retrieval itself is still measured; the records say which pool the held-out arm used.
  log "the policy's summaries gave an empty pool: the extractive summarizer builds it instead"
  timed pool_train_extractive --builds "$RUN/pool_extractive" "$PY" -m launch.eval "${POLICY_ARGS[@]}" \
    --envs "$ENVS" --split train --num_tasks "$TRAIN_TASKS" "${ROLLOUT[@]}" --summarize_into "$RUN/pool_extractive" \
    --summarizer extractive --embedder minilm --out "$OUT/pool_train_extractive.json"
  POOL="$RUN/pool_extractive"
fi
# 2. Held out without the pool, then with it, paired (paired.json in OUT/with_pool/).
timed plain "$PY" -m launch.eval "${POLICY_ARGS[@]}" --envs "$ENVS" --split eval --num_tasks "$EVAL_TASKS" \
  --num_samples "$SAMPLES" --temperature 1.0 "${ROLLOUT[@]}" --with_greedy --out "$OUT/plain"
timed with_pool "$PY" -m launch.eval "${POLICY_ARGS[@]}" --envs "$ENVS" --split eval --num_tasks "$EVAL_TASKS" \
  --num_samples "$SAMPLES" --temperature 1.0 "${ROLLOUT[@]}" --with_greedy --out "$OUT/with_pool" \
  --experience "$POOL" --embedder minilm --baseline "$OUT/plain"
log "done: $OUT/with_pool/paired.json"
