#!/usr/bin/env bash
# The main job on the built-in tiny default: self-evolution of the shipped BC checkpoint, measured against its start
# (launch/quickstart.py: start evaluation, GRPO on practised tasks, the same evaluation of the evolved policy, a
# paired table and the learning curve).
#   bash launch/quickstart.sh [--model_dir DIR] [--smoke]
#     --model_dir DIR  where the run lives (default runs/quickstart, or runs/quickstart_smoke with --smoke);
#                      run the same command again to resume a stopped run or re-print its table
#     --smoke          the same stages at the smallest size (a few tasks, one step): what CI runs in a venv set up
#                      for `run` alone, so a run-time import missing from setup.py fails it
# The venv is .venv (or $EVOLVER_VENV), set up for `run` by launch/setup_venv.sh on first use.
set -euo pipefail
usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --smoke) ARGS+=(--smoke) ;;
    --model_dir) [ $# -ge 2 ] || { echo "[quickstart] --model_dir needs a directory" >&2; exit 2; }
                 ARGS+=(--model_dir "$2"); shift ;;
    --model_dir=*) ARGS+=(--model_dir "${1#--model_dir=}") ;;
    -h|--help) usage; exit 0 ;;
    *) echo "[quickstart] unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
start=$(date +%s)
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup_venv.sh" run
python -m launch.quickstart "${ARGS[@]}"
echo "[quickstart] done in $(( $(date +%s) - start )) s, set-up included"
