#!/usr/bin/env bash
# README command 2: set up the environment if needed, then run every check (tools/check.py says which).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/env.sh
exec .venv/bin/python tools/check.py "$@"
