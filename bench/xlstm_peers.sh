#!/bin/bash
# The xLSTM family on one GPU in one go, ours beside the peers (NX-AI's kernels and models, Hugging
# Face's xLSTMForCausalLM), each step under a share of one time budget, so that a command limited to
# 10 minutes ends with everything it measured written:
#
#   xlstm-kernels-GPU.txt  mesanet bench xlstm --backend cuda (the cores at the default shapes, then at
#                          the presets' layer shapes, batch 8 x 2048), then bench/xlstm_kernels_bench.py
#                          at the same shapes (mlstm_kernels' Triton kernels, the xlstm package's sLSTM
#                          CUDA kernel; FlashRNN last)
#   xlstm-models-GPU.txt   the parameter counts; mesanet bench train (batch 8 x 2048) and bench decode
#                          (16-token prompt, 128 new tokens, B = 1, 16, 128) of xlstm-7b-160m and
#                          xlstm-125m, then bench/hf_xlstm_bench.py train / decode of the peer models;
#                          the peers under torch.compile last
#   xlstm-ratios-GPU.txt   bench/xlstm_ratios.py: ours / theirs wherever both ran
#   xlstm-log-GPU.txt      the build, each step's command, time and exit status, the stderr of all
#
# or, with PART=125m, the whole-model comparison at the xLSTM paper's 125M size alone:
#
#   xlstm-125m-GPU.txt     training tokens/s and memory, bf16, batch 8 x 2048: mesanet bench train of
#                          xlstm-125m (xLSTM[7:1], the paper's block layout) and xlstm10-125m (mLSTM
#                          blocks only); our mLSTM core at their layer's shape (8 x 2048, 4 heads of
#                          384; the forward recurrent, then chunkwise); bench/nxai_xlstm_model_bench.py
#                          (NX-AI's xLSTMLMModel at the same sizes: mlstm_kernels' TFLA mLSTM kernel,
#                          the sLSTM's "vanilla" backend since its CUDA kernel does not build here;
#                          xLSTM[1:0] the same without sLSTM); bench/xlstm_kernels_bench.py at the
#                          layer's shape; the package's own parallel mLSTM form last; the ratios
#   xlstm-125m-log-GPU.txt the log
#
#   bench/xlstm_peers.sh [OUT_DIR] [GPU_NAME]
#
# OUT_DIR: default $OUT where set (the device tool's folder that comes back), else bench/results.
# GPU_NAME: default h200. Environment: BIN (default build/mesanet, built here with make unless
# SKIP_BUILD=1 and it exists), BUDGET (seconds for everything, default 570), PART (all, ours, peers or
# 125m).
# Needs a GPU, nvcc, python3 with torch, triton, einops and transformers, the peers' sources in
# .peers/ (bench/xlstm_kernels_bench.py says which; bench/xlstm_peers_copy.sh makes it), and OpenBLAS:
# where the system has none, the .debs in .devlibs/ (libopenblas0-openmp, libopenblas-openmp-dev,
# libopenblas-dev, libgfortran5) are unpacked into /tmp/ob.
set -u
cd "$(dirname "$0")/.." || exit 1
DEST=${1:-${OUT:-bench/results}}
GPU=${2:-h200}
BIN=${BIN:-build/mesanet}
BUDGET=${BUDGET:-570}
PART=${PART:-all}
RESERVE=15  # seconds kept for the ratios at the end
case $PART in
all | ours | peers | 125m) ;;
*) echo "bench/xlstm_peers.sh: PART=$PART: expected all, ours, peers or 125m" >&2; exit 2 ;;
esac
mkdir -p "$DEST"
KERN=$DEST/xlstm-kernels-$GPU.txt MODELS=$DEST/xlstm-models-$GPU.txt RATIOS=$DEST/xlstm-ratios-$GPU.txt
LOG=$DEST/xlstm-log-$GPU.txt
if [ "$PART" = 125m ]; then  # one file: the header, the runs, the ratios
    KERN=$DEST/xlstm-125m-$GPU.txt MODELS=$KERN RATIOS=$KERN LOG=$DEST/xlstm-125m-log-$GPU.txt
fi
START=$(date +%s)
export PYTHONUNBUFFERED=1 TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-/tmp/torch_extensions}
export MAX_JOBS=${MAX_JOBS:-$(nproc)}

left() { echo $((BUDGET - ($(date +%s) - START))); }

# step NAME CAP FILE CMD...: CMD under min(CAP, the time left less the reserve) seconds, its stdout
# added to FILE (and shown), its stderr to the log.
step() {
    local name=$1 cap=$2 file=$3 t t0 rc
    shift 3
    t=$(($(left) - RESERVE))
    [ "$t" -gt "$cap" ] && t=$cap
    if [ "$t" -lt 20 ]; then
        echo "### $name: not run (the time budget is spent)" | tee -a "$file" >> "$LOG"
        return
    fi
    echo "### $*" >> "$file"
    echo "### $name, at most ${t}s: $*" >> "$LOG"
    t0=$(date +%s)
    timeout -k 10 "$t" "$@" 2>> "$LOG" | tee -a "$file"
    rc=${PIPESTATUS[0]}
    echo "### $name: exit $rc after $(($(date +%s) - t0))s$([ "$rc" = 124 ] && echo ' (stopped at its time limit)')" |
        tee -a "$LOG"
}

{
    echo "### $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1), build" \
        "$(git rev-parse --short HEAD 2>/dev/null || echo '(no git)'), $(date -u '+%Y-%m-%d %H:%M UTC'), budget ${BUDGET}s"
    python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__,
'transformers', transformers.__version__)" 2>&1
    printf '%s ' .peers/*; echo
} | tee "$KERN" > "$LOG"
[ "$MODELS" = "$KERN" ] || cp "$KERN" "$MODELS"

# --- our build -----------------------------------------------------------------------------------
if [ "$PART" != peers ] && { [ -z "${SKIP_BUILD:-}" ] || [ ! -x "$BIN" ]; }; then
    MK=(CUDNN=0)  # the xLSTM models use no attention
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
        echo "### build: FAILED after $(($(date +%s) - t0))s (the log's end:)" | tee -a "$KERN" "$MODELS" >> "$LOG"
        tail -20 "$LOG"
    fi
elif [ -d /tmp/ob ]; then
    export LD_LIBRARY_PATH=/tmp/ob/usr/lib/x86_64-linux-gnu/openblas-openmp:/tmp/ob/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi

MSHAPES=8x2048x16x128,16x2048x8x64
MSHAPES_MODEL=8x2048x4x96x192,8x2048x4x384  # xlstm-7b-160m's layer (Dk 96, Dv 192), xlstm-125m's (384)
SSHAPES=16x1024x4x192
SSHAPES_MODEL=8x2048x4x192                  # xlstm-125m's sLSTM layer
DEC=(--batch "1,16,128" --prompt 16 --tokens 128)

# --- the 125M models alone (PART=125m) -------------------------------------------------------------
if [ "$PART" = 125m ]; then
    {
        echo "### xLSTM at 125M (the paper's: embedding 768, 24 blocks, mLSTM blocks of 4 heads of 384, sLSTM at"
        echo "### blocks 3 and 20), training, bf16 autocast / bf16 activations, batch 8 x 2048, AdamW, random tokens."
        echo "### Theirs: NX-AI's xLSTMLMModel (the xlstm package) with mlstm_kernels' TFLA chunkwise mLSTM"
        echo "### (chunkwise--triton_xl_chunk) and the sLSTM's \"vanilla\" PyTorch backend: the package's sLSTM CUDA"
        echo "### kernel does not build with this machine's nvcc 13 and torch 2.11. xLSTM[1:0] (mLSTM blocks only)"
        echo "### compares the mLSTM side without it."
    } >> "$MODELS"
    if [ -x "$BIN" ]; then
        for c in xlstm-125m xlstm10-125m; do
            step "ours: train $c" 60 "$MODELS" "$BIN" bench train --backend cuda --config $c --batch 8 --seq 2048 \
                --steps 5
        done
        for f in recurrent auto; do  # the forward as it was, then as AUTO takes it (the one the ratios keep)
            step "ours: mLSTM core, 4 heads of 384, form $f" 45 "$MODELS" "$BIN" bench xlstm --backend cuda \
                --mlstm 8x2048x4x384 --slstm "" --form $f --err-heads 1
        done
    else
        echo "### ours: not run, no $BIN" | tee -a "$MODELS" >> "$LOG"
    fi
    # a process each: a Triton crash (xLSTMLarge's training once ended in an LLVM assertion) ends one
    for m in nxai-125m-tfla nxai10-125m-tfla; do
        step "peers: train $m" 150 "$MODELS" python3 bench/nxai_xlstm_model_bench.py --models $m --steps 5 --bin "$BIN"
        if ! grep -q "^$m train eager, .* tokens/s" "$MODELS"; then  # TFLA's other kernel, chunk 64
            step "peers: train $m, triton_limit_chunk" 150 "$MODELS" python3 bench/nxai_xlstm_model_bench.py \
                --models $m --mlstm-kernel chunkwise--triton_limit_chunk --steps 5 --bin "$BIN"
        fi
    done
    step "peers: mLSTM kernels, 4 heads of 384" 90 "$MODELS" python3 bench/xlstm_kernels_bench.py \
        --mlstm 8x2048x4x384 --slstm "" --err-heads 1
    step "peers: train nxai-125m-parallel" 120 "$MODELS" python3 bench/nxai_xlstm_model_bench.py \
        --models nxai-125m-parallel --steps 3 --bin "$BIN"
    echo "### ratios (bench/xlstm_ratios.py)" >> "$MODELS"
    r=$(python3 bench/xlstm_ratios.py "$MODELS" "$MODELS" 2>> "$LOG")  # read whole before the file grows
    echo "$r" | tee -a "$MODELS"
    echo "### done in $(($(date +%s) - START))s; results in $MODELS" | tee -a "$LOG"
    exit 0
fi

# --- ours ----------------------------------------------------------------------------------------
if [ "$PART" != peers ] && [ -x "$BIN" ]; then
    step "ours: cores" 90 "$KERN" "$BIN" bench xlstm --backend cuda --mlstm "$MSHAPES" --slstm "$SSHAPES"
    step "ours: cores at the presets' layer shapes" 60 "$KERN" "$BIN" bench xlstm --backend cuda \
        --mlstm "$MSHAPES_MODEL" --slstm "$SSHAPES_MODEL" --err-heads 1
    for c in xlstm-7b-160m xlstm-125m; do
        step "ours: train $c" 45 "$MODELS" "$BIN" bench train --backend cuda --config $c --batch 8 --seq 2048 --steps 5
    done
    for c in xlstm-7b-160m xlstm-125m; do
        step "ours: decode $c" 45 "$MODELS" "$BIN" bench decode --backend cuda --config $c "${DEC[@]}"
    done
elif [ "$PART" != peers ]; then
    echo "### ours: not run, no $BIN" | tee -a "$KERN" "$MODELS" >> "$LOG"
fi

# --- the peers -----------------------------------------------------------------------------------
if [ "$PART" != ours ]; then
    step "peers: parameter counts" 40 "$MODELS" python3 bench/hf_xlstm_bench.py params --bin "$BIN"
    step "peers: mLSTM kernels" 150 "$KERN" python3 bench/xlstm_kernels_bench.py --mlstm "$MSHAPES,$MSHAPES_MODEL" \
        --slstm ""
    step "peers: sLSTM CUDA kernel (xlstm)" 150 "$KERN" python3 bench/xlstm_kernels_bench.py --mlstm "" \
        --slstm "$SSHAPES,$SSHAPES_MODEL" --slstm-kernels xlstm-cuda
    step "peers: train, eager" 150 "$MODELS" python3 bench/hf_xlstm_bench.py train hf-7b-160m nxai-7b-160m nxai-125m \
        --steps 5 --bin "$BIN"
    step "peers: decode" 120 "$MODELS" python3 bench/hf_xlstm_bench.py decode hf-7b-160m nxai-7b-160m nxai-125m \
        "${DEC[@]}" --reps 2 --bin "$BIN"
    step "peers: sLSTM kernels (FlashRNN)" 120 "$KERN" python3 bench/xlstm_kernels_bench.py --mlstm "" \
        --slstm "$SSHAPES,$SSHAPES_MODEL" --slstm-kernels flashrnn-cuda_fused,flashrnn-cuda
    step "peers: train, torch.compile" 200 "$MODELS" python3 bench/hf_xlstm_bench.py train hf-7b-160m nxai-125m \
        --mode compiled --steps 5 --bin "$BIN"
fi

python3 bench/xlstm_ratios.py "$KERN" "$MODELS" > "$RATIOS" 2>> "$LOG"
cat "$RATIOS"
echo "### done in $(($(date +%s) - START))s; results in $DEST" | tee -a "$LOG"
