#!/usr/bin/env bash
# The main job on the built-in tiny default: expert data, BC, one AgentEvol iteration, held-out evaluation.
#   bash launch/quickstart.sh [--model_dir DIR] [--smoke]
#     --model_dir DIR  where the run lives (default runs/quickstart, or runs/quickstart_smoke with --smoke);
#                      run the same command again to resume a stopped run or re-print its table
#     --smoke          the same pipeline and entry points at the smallest size (a few steps, a few tasks): what CI
#                      runs in a venv set up for `run` alone, so a run-time import missing from setup.py fails it
# The venv is .venv (or $EVOLVER_VENV), set up for `run` by launch/setup_venv.sh on first use.
set -euo pipefail
usage() { sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
MODEL_DIR=""
SMOKE=0
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) SMOKE=1 ;;
    --model_dir) [ $# -ge 2 ] || { echo "[quickstart] --model_dir needs a directory" >&2; exit 2; }
                 MODEL_DIR="$2"; shift ;;
    --model_dir=*) MODEL_DIR="${1#--model_dir=}" ;;
    -h|--help) usage; exit 0 ;;
    *) echo "[quickstart] unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup_venv.sh" run
GIN_FILES=(--gin_file=gin_configs/runs/agentevol.gin --gin_file=gin_configs/quickstart.gin)
if [ "$SMOKE" = 1 ]; then
  GIN_FILES+=(--gin_file=gin_configs/quickstart_smoke.gin)
  MODEL_DIR="${MODEL_DIR:-runs/quickstart_smoke}"
fi
MODEL_DIR="${MODEL_DIR:-runs/quickstart}"
start=$(date +%s)
python -m launch.train "${GIN_FILES[@]}" --gin_bindings="MODEL_DIR='${MODEL_DIR}'"
echo "[quickstart] done in $(( $(date +%s) - start )) s; results in ${MODEL_DIR}/eval_results.json"
