#!/usr/bin/env bash
# The test command: set up (idempotent), then run the fast suite (CPU, tiny twins + a few real-asset runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# two workers (CI has 2 cores); the Flower tests share one (tests/test_flower.py's xdist_group)
.venv/bin/python -m pytest -m "not slow" -n 2 --dist loadgroup "$@"
