#!/bin/bash
# The diagonal recurrences on one GPU in one go: `mesanet bench scan` (RG-LRU and Longhorn, d_state 16,
# forward and forward+backward, against a device copy) and bench/hgrn_bench.py (fla's chunk_hgrn and
# fused_recurrent_hgrn, the RG-LRU's peer) at the same shapes, into one file:
#
#   bench/scan_peers.sh [OUT_DIR] [GPU_NAME]     ->  OUT_DIR/scan-GPU_NAME.txt
#
# OUT_DIR: default $OUT where set (the device tool's folder that comes back), else bench/results.
# GPU_NAME: default h200. Environment: BIN (default build/mesanet, which must exist: build it first,
# e.g. with `make`), SHAPES (default 8x2048x2048,16x4096x1536). Needs a GPU, python3 with torch and
# triton, and fla's source in .fla/fla (git-ignored): e.g. `git clone --depth 1
# https://github.com/fla-org/flash-linear-attention /tmp/fla && cp -r /tmp/fla/fla .fla/`.
set -u
cd "$(dirname "$0")/.." || exit 1
DEST=${1:-${OUT:-bench/results}}
GPU=${2:-h200}
BIN=${BIN:-build/mesanet}
SHAPES=${SHAPES:-8x2048x2048,16x4096x1536}
mkdir -p "$DEST"
F=$DEST/scan-$GPU.txt
{
    echo "### $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), build" \
        "$(git rev-parse --short HEAD 2>/dev/null || echo '(no git)'), $(date -u '+%Y-%m-%d %H:%M UTC')"
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1
    echo "### $BIN bench scan --shapes $SHAPES"
    timeout -k 10 240 "$BIN" bench scan --shapes "$SHAPES" 2>&1
    echo "### exit $?"
    echo
    echo "### python3 bench/hgrn_bench.py --shapes $SHAPES"
    timeout -k 10 240 python3 bench/hgrn_bench.py --shapes "$SHAPES" 2>&1
    echo "### exit $?"
} | tee "$F"
echo "### results in $F"
