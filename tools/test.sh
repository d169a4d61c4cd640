#!/usr/bin/env bash
# README command 2: set up the environment if needed, then run every check (tools/check.py says which).
# Browser tests need Debian's chromium: installed here when missing and we are root with apt (else they are skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/env.sh
if [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "[test] installing Debian chromium for the browser tests"
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver >/dev/null) \
    || echo "[test] chromium could not be installed: browser tests will be skipped"
fi
exec .venv/bin/python tools/check.py "$@"
