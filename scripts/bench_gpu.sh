#!/bin/sh
# The GPU comparison, side by side in one run on one GPU: the Mesa core (ours,
# then fla's Triton kernels), then whole-model training and generation (ours,
# then fla's MesaNet model in PyTorch); where several GPUs are visible, last,
# data-parallel training on one and on all of them. Needs a GPU, a CUDA build (make) and fla's source
# in .fla/ (git-ignored, never committed; see bench/fla_bench.py).
#
#   scripts/bench_gpu.sh [OUT_DIR] [GPU_NAME]    (default bench/results, h100)
#
# About 15 minutes on an H100, most of it fla's exact references and Triton
# compilation; on a machine with a 10-minute limit per command, run the steps
# as separate commands.
set -e
BIN=${BIN:-build/mesanet}
OUT=${1:-bench/results}
GPU=${2:-h100}
mkdir -p "$OUT"
"$BIN" bench mesa-gpu | tee "$OUT/gpu-mesa-$GPU.txt"
python3 bench/fla_bench.py | tee "$OUT/fla-$GPU.txt"
for c in 125m 400m fla-162m fla-412m; do
    "$BIN" bench train --backend cuda --config "$c" --batch 8 --seq 2048 --steps 3
done | tee "$OUT/gpu-train-$GPU.txt"
python3 bench/fla_model_bench.py fla-162m fla-412m | tee "$OUT/fla-model-$GPU.txt"
for tol in 0 1e-4; do "$BIN" bench decode --backend cuda --config fla-162m --cg-tol $tol; done |
    tee "$OUT/gpu-decode-model-$GPU.txt"
python3 bench/fla_model_bench.py --decode fla-162m | tee "$OUT/fla-decode-model-$GPU.txt"
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$NGPU" -gt 1 ]; then
    for c in fla-412m fla-162m; do
        for g in 1 "$NGPU"; do
            "$BIN" bench train --backend cuda --config "$c" --batch 8 --seq 2048 --steps 8 --gpus "$g"
        done
    done | tee "$OUT/gpu-train-dp-$GPU.txt"
fi
