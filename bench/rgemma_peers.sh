#!/bin/bash
# Griffin (the recurrent_gemma architecture) on one GPU in one go: our preset griffin-160m beside
# Hugging Face's RecurrentGemmaForCausalLM at the same sizes, and the checkpoint check both ways, each
# step under a share of one time budget, so that a command limited to 10 minutes ends with everything
# it measured written to OUT_DIR/rgemma-GPU.txt (the stderr of all and each step's time and exit
# status to OUT_DIR/rgemma-log-GPU.txt):
#
#   `mesanet info griffin-160m`; bench/rgemma_check.py (logits both ways against transformers, mesanet on
#   its CPU backend); mesanet bench train (batch 8 x 2048) and bench decode (16-token prompt, 128 new
#   tokens, B = 1, 16, 128); bench/hf_rgemma_bench.py params / train / decode (transformers, eager;
#   generate and a step loop); bench/rgemma_check.py again with mesanet on its CUDA backend
#
#   bench/rgemma_peers.sh [OUT_DIR] [GPU_NAME]
#
# OUT_DIR: default $OUT where set (the device tool's folder that comes back), else bench/results.
# GPU_NAME: default h200. Environment: BIN (default build/mesanet, built here with make unless
# SKIP_BUILD=1 and it exists), BUDGET (seconds for everything, default 570). Needs a GPU, nvcc,
# python3 with torch and transformers, and OpenBLAS: where the system has none, the .debs in .devlibs/
# (libopenblas0-openmp, libopenblas-openmp-dev, libopenblas-dev, libgfortran5) are unpacked into /tmp/ob.
set -u
cd "$(dirname "$0")/.." || exit 1
DEST=${1:-${OUT:-bench/results}}
GPU=${2:-h200}
BIN=${BIN:-build/mesanet}
BUDGET=${BUDGET:-570}
mkdir -p "$DEST"
RES=$DEST/rgemma-$GPU.txt LOG=$DEST/rgemma-log-$GPU.txt
START=$(date +%s)
export PYTHONUNBUFFERED=1

left() { echo $((BUDGET - ($(date +%s) - START))); }

# step NAME CAP CMD...: CMD under min(CAP, the time left) seconds, its stdout added to the results
# (and shown), its stderr to the log.
step() {
    local name=$1 cap=$2 t t0 rc
    shift 2
    t=$(left)
    [ "$t" -gt "$cap" ] && t=$cap
    if [ "$t" -lt 20 ]; then
        echo "### $name: not run (the time budget is spent)" | tee -a "$RES" >> "$LOG"
        return
    fi
    echo "### $*" >> "$RES"
    echo "### $name, at most ${t}s: $*" >> "$LOG"
    t0=$(date +%s)
    timeout -k 10 "$t" "$@" 2>> "$LOG" | tee -a "$RES"
    rc=${PIPESTATUS[0]}
    echo "### $name: exit $rc after $(($(date +%s) - t0))s$([ "$rc" = 124 ] && echo ' (stopped at its time limit)')" |
        tee -a "$LOG"
}

{
    echo "### $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), build" \
        "$(git rev-parse --short HEAD 2>/dev/null || echo '(no git)'), $(date -u '+%Y-%m-%d %H:%M UTC'), budget ${BUDGET}s"
    python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" 2>&1
} | tee "$RES" > "$LOG"

# --- our build -----------------------------------------------------------------------------------
if [ -z "${SKIP_BUILD:-}" ] || [ ! -x "$BIN" ]; then
    MK=()
    if ! ldconfig -p 2>/dev/null | grep -q libopenblas && ls .devlibs/*.deb > /dev/null 2>&1; then
        [ -d /tmp/ob ] || { mkdir -p /tmp/ob && for f in .devlibs/*.deb; do dpkg -x "$f" /tmp/ob; done; }
        OB=/tmp/ob/usr/lib/x86_64-linux-gnu
        export LD_LIBRARY_PATH=$OB/openblas-openmp:$OB:${LD_LIBRARY_PATH:-}
        MK+=(BLAS_CFLAGS=-I/tmp/ob/usr/include/x86_64-linux-gnu/openblas-openmp
             "BLAS_LIBS=-L$OB/openblas-openmp -Wl,-rpath,$OB/openblas-openmp -L$OB -Wl,-rpath-link,$OB -lopenblas")
    fi
    t0=$(date +%s)
    if timeout 300 make -j"$(nproc)" "${MK[@]}" BUILD="$(dirname "$BIN")" "$BIN" >> "$LOG" 2>&1; then
        echo "### build: $BIN in $(($(date +%s) - t0))s" | tee -a "$LOG"
    else
        echo "### build: FAILED after $(($(date +%s) - t0))s (the log's end:)" | tee -a "$RES" >> "$LOG"
        tail -20 "$LOG"
    fi
elif [ -d /tmp/ob ]; then
    export LD_LIBRARY_PATH=/tmp/ob/usr/lib/x86_64-linux-gnu/openblas-openmp:/tmp/ob/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi

DEC=(--batch "1,16,128" --prompt 16 --tokens 128)

# --- ours, and the checkpoints both ways on its CPU backend (first: the check matters most) --------
if [ -x "$BIN" ]; then
    step "ours: info" 20 "$BIN" info griffin-160m
    step "check: cpu" 120 python3 bench/rgemma_check.py /tmp/rgemma-check --mesanet "$BIN" --backend cpu
    step "ours: train" 60 "$BIN" bench train --backend cuda --config griffin-160m --batch 8 --seq 2048 --steps 5
    step "ours: decode" 60 "$BIN" bench decode --backend cuda --config griffin-160m "${DEC[@]}"
else
    echo "### ours: not run, no $BIN" | tee -a "$RES" >> "$LOG"
fi

# --- transformers --------------------------------------------------------------------------------
step "transformers: parameters" 40 python3 bench/hf_rgemma_bench.py params --bin "$BIN"
step "transformers: train" 150 python3 bench/hf_rgemma_bench.py train --steps 3 --bin "$BIN"
step "transformers: decode" 150 python3 bench/hf_rgemma_bench.py decode "${DEC[@]}" --reps 2 --bin "$BIN"

# --- the checkpoints both ways on our CUDA backend ----------------------------------------------
if [ -x "$BIN" ]; then
    step "check: cuda" 60 python3 bench/rgemma_check.py /tmp/rgemma-check-cuda --mesanet "$BIN" --backend cuda
fi
echo "### done in $(($(date +%s) - START))s; results in $RES" | tee -a "$LOG"
