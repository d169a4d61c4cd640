#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv: the CPU build of torch when no torch is
# present, then this package in editable mode with its dev extras. Fast when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[env] creating .venv with $($PY --version)"
  $PY -m venv .venv
fi
stamp=.venv/.flowgrpo-stamp
want=$(cat pyproject.toml | md5sum | cut -d' ' -f1)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && .venv/bin/python -c "import torch, flowgrpo_nb" 2>/dev/null; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  echo "[env] installing torch==2.13.0 (CPU build); GPU users: install your CUDA torch into .venv first"
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
echo "[env] installing flowgrpo_nb (editable, with dev extras)"
.venv/bin/python -m pip install -q -e ".[dev]"
echo "$want" > "$stamp"
