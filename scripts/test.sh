#!/usr/bin/env bash
# The test command: set up (idempotent), then run the fast suite (CPU, tiny twins + a few real-asset runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m pytest -m "not slow" "$@"
