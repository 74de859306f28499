#!/usr/bin/env bash
# The main job on the built-in tiny default: bash launch/quickstart.sh
set -euo pipefail
source "$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/setup_venv.sh"
python -m launch.sample "$@"
