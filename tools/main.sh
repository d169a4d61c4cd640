#!/usr/bin/env bash
# README command 1: set up the environment, then run the main job on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/env.sh
exec .venv/bin/flowgrpo compare "$@"
