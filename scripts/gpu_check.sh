#!/usr/bin/env bash
# The GPU check (issue 23), for whoever has a CUDA GPU for a few minutes: every method one round on the synthetic
# tiny twins on the GPU, zeroth-order replay with the client on the GPU and the server on the CPU, FedNL streaming
# 16K tokens and tokens/s on SmolLM2-135M's architecture (random weights), CPU vs GPU. Needs no lightfed asset and
# no network: the GPU machine's own torch (with CUDA), transformers and peft. Writes benchmarks/results/gpu_check.*
# (`lightfed check`: src/lightfed/devicecheck.py)
#
#   bash scripts/gpu_check.sh            # about 5 minutes on one GPU
#
# setup.sh is NOT used here (it installs the CPU build of torch): a venv that sees the machine's own packages gets
# lightfed alone, without its dependencies (pip --no-deps), so nothing replaces the CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
"$PY" -c "import torch, transformers, peft; assert torch.cuda.is_available(), 'no CUDA device visible to torch'" \
    || { echo "gpu_check: needs torch with a CUDA device, transformers and peft on $PY" >&2; exit 2; }
[[ -x .venv-gpu/bin/python ]] || "$PY" -m venv --system-site-packages .venv-gpu
.venv-gpu/bin/python -m pip install -q --no-deps --no-build-isolation -e . 2>/dev/null \
    || .venv-gpu/bin/python -m pip install -q --no-deps -e .
# lightfed's light dependencies the GPU machine may lack (pure Python; never torch)
for m in safetensors tqdm matplotlib numpy; do
    .venv-gpu/bin/python -c "import $m" 2>/dev/null || .venv-gpu/bin/python -m pip install -q --no-deps "$m" || true
done
PYTHONUNBUFFERED=1 timeout 900 .venv-gpu/bin/python -m lightfed.cli check --device cuda --out benchmarks/results "$@"
