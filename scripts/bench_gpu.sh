#!/bin/sh
# The GPU comparisons, each side by side in one run on one GPU, ours then the peer's:
#
#   mesa    the Mesa core (fla's Triton kernels), whole-model training and generation (fla's MesaNet
#           model in PyTorch); where several GPUs are visible, data-parallel training on one and all
#   lin     the gated linear-attention cores (fla's chunk_gated_delta_rule, chunk_simple_gla, ...,
#           and its fused_recurrent decoding), both our fused paths (split and bf16 products), their
#           errors on hard inputs (--hard), and GatedDeltaNet models (fla's GatedDeltaNetForCausalLM)
#   attn    the attention core (torch SDPA's flash and cuDNN backends, FlexAttention for windows),
#           a Llama's training and decoding (Hugging Face's LlamaForCausalLM), and its checkpoints
#           both ways (bench/hf_llama_compat.py)
#
#   scripts/bench_gpu.sh [mesa|lin|attn|all] [OUT_DIR] [GPU_NAME]   (default all, bench/results, h100)
#
# Needs a GPU, a CUDA build (make; for attention with cuDNN where the build found it: a pip wheel's
# cuDNN is at CUDNN_HOME=.../site-packages/nvidia/cudnn, its lib/ then on LD_LIBRARY_PATH), fla's
# source in .fla/ (git-ignored, never committed; see bench/fla_bench.py), torch and transformers.
# fla's Triton kernels compile on first use (3-5 minutes a kernel family; TRITON_CACHE_DIR keeps
# them): on a machine with a 10-minute limit per command, run one part per command.
set -e
BIN=${BIN:-build/mesanet}
WHAT=${1:-all}
OUT=${2:-bench/results}
GPU=${3:-h100}
mkdir -p "$OUT"
case "$WHAT" in mesa|lin|attn|all) ;; *) echo "usage: scripts/bench_gpu.sh [mesa|lin|attn|all] [OUT_DIR] [GPU_NAME]" >&2; exit 2 ;; esac
TMP=${TMPDIR:-/tmp}/mesanet-bench-gpu
mkdir -p "$TMP"

if [ "$WHAT" = mesa ] || [ "$WHAT" = all ]; then
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
fi

if [ "$WHAT" = lin ] || [ "$WHAT" = all ]; then
    { "$BIN" bench lin --backend cuda --paths split,bf16,cublas
      python3 bench/fla_lin_bench.py; } | tee "$OUT/gpu-lin-$GPU.txt"
    { "$BIN" bench lin --backend cuda --hard
      python3 bench/fla_lin_bench.py --hard; } | tee "$OUT/gpu-lin-hard-$GPU.txt"
    for s in gdn-162m gdn-412m; do python3 bench/fla_model_bench.py --write-config $s "$TMP/$s" > /dev/null; done
    { for s in gdn-162m gdn-412m; do
          "$BIN" bench train --backend cuda --config "$TMP/$s/config.json" --batch 8 --seq 2048 --steps 3
      done
      python3 bench/fla_model_bench.py --steps 3 gdn-162m gdn-412m; } | tee "$OUT/gpu-models-gdn-$GPU.txt"
fi

if [ "$WHAT" = attn ] || [ "$WHAT" = all ]; then
    { for sh in 8,2048,16,128 1,8192,16,128; do
          "$BIN" bench attn --backend cuda --shape $sh --decode ""
          MESANET_ATTN=own "$BIN" bench attn --backend cuda --shape $sh --decode ""
      done
      "$BIN" bench attn --backend cuda --window 1024
      MESANET_ATTN=own "$BIN" bench attn --backend cuda --window 1024 --decode ""
      python3 bench/torch_attn_bench.py; } | tee "$OUT/attn-$GPU.txt"
    python3 bench/hf_llama_bench.py --write-config "$TMP/llama160" > /dev/null
    { "$BIN" bench train --backend cuda --config "$TMP/llama160/config.json" --batch 8 --seq 2048 --steps 3
      python3 bench/hf_llama_bench.py --steps 3
      "$BIN" bench decode --backend cuda --config "$TMP/llama160/config.json" --prompt 2048
      python3 bench/hf_llama_bench.py --decode; } | tee "$OUT/gpu-models-$GPU.txt"
    for b in cpu cuda; do python3 bench/hf_llama_compat.py "$TMP/hf-compat-$b" --backend $b; done |
        tee "$OUT/hf-llama-compat-$GPU.txt"
fi
