#!/usr/bin/env bash
# Creates or reuses .venv at the repository root and installs evolver with its test extra.
# Idempotent: a stamp keyed on setup.py's hash skips the install when nothing changed.
# Sourced by quickstart.sh and test.sh; leaves the venv activated.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
STAMP=".venv/.evolver-install-$(cat setup.py launch/setup_venv.sh | sha256sum | cut -c1-16)"
if [ ! -f "$STAMP" ]; then
  echo "[setup] installing evolver and its dependencies into .venv (once)"
  LOG=".venv/install.log"
  if ! { python -m pip install --upgrade pip setuptools wheel && python -m pip install -e ".[test]"; } >"$LOG" 2>&1; then
    tail -n 40 "$LOG"
    echo "[setup] install failed; the whole log is in $LOG" >&2
    exit 1
  fi
  rm -f .venv/.evolver-install-*
  touch "$STAMP"
fi
export EVOLVER_CACHE_DIR="${EVOLVER_CACHE_DIR:-$ROOT/.cache}"
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-$EVOLVER_CACHE_DIR/jax}"
mkdir -p "$JAX_COMPILATION_CACHE_DIR"
