#!/usr/bin/env bash
# The whole test suite: bash launch/test.sh [extra pytest args]
# Two pytest-xdist workers (this project's machines have 2 cores), a test file at a time per worker, the files
# with slow tests first (tests/conftest.py's order; --no-loadscope-reorder keeps xdist from reordering the files by
# their number of tests, which put the longest file last). `-n 0` after it runs in one process (the last -n wins).
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup_venv.sh" test
python -m pytest tests -q -ra -n 2 --dist loadfile --no-loadscope-reorder "$@"
