#!/usr/bin/env bash
# Install lightfed and its offline assets into ./.venv (idempotent; a second run takes seconds).
#   torch is installed FIRST and pinned (2.13.0, the CPU build found on local disk): an unpinned
#   torch pulled in by another package would download a CUDA build of several GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON_BOOTSTRAP:-python3}"
[[ -x .venv/bin/python ]] || "$PY" -m venv .venv
VPY=.venv/bin/python
"$VPY" -m pip install -q --disable-pip-version-check torch==2.13.0
"$VPY" -m pip install -q --disable-pip-version-check -e ".[test,flower]"
PYTHON="$VPY" bash scripts/install_assets.sh
# a headless browser, for the test that opens `lightfed report`'s HTML page as a person would (optional elsewhere)
if ! command -v chromium-headless-shell >/dev/null && [[ $EUID -eq 0 ]] && command -v apt-get >/dev/null; then
    (apt-get update -qq && apt-get install -y -qq --no-install-recommends chromium-headless-shell) >/dev/null 2>&1 \
        || echo "lightfed: could not install chromium-headless-shell: the browser test will skip" >&2
fi
echo "lightfed: set up in $(pwd)/.venv"
