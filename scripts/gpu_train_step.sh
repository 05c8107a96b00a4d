#!/bin/sh
# The recorded training step on a GPU (after .devlibs/gpu.sh has built build/): its tests, then the
# MAD model's training time (mad-fuzzy-recall, width 128, 2 blocks, 128 x 128 tokens, 300 steps)
# with recorded steps and with eager ones (MESANET_TRAIN_GRAPHS=0). The train_seconds column of
# each results.csv is the comparison; the metric columns of the two should agree closely (mesa's
# dlambda is summed by atomics, so its runs differ in the last bits; the others' should be equal).
set -e
out=${1:-/tmp/train-step}
mkdir -p "$out"
build/run_tests_cuda train_step
build/run_tests_cuda cuda_op_optimizer
build/run_tests_cuda cuda_decode_graph
build/run_tests_cuda cuda_training_reduces_loss
for mode in recorded eager; do
    if [ "$mode" = eager ]; then export MESANET_TRAIN_GRAPHS=0; else unset MESANET_TRAIN_GRAPHS; fi
    rm -rf "$out/$mode"
    build/mesanet synth mad-fuzzy-recall --mixers gdn,mesa,mha,hawk,mlstm --backend cuda --max-steps 300 \
        --out "$out/$mode" > "$out/$mode.log" 2>&1
    echo "== $mode"
    cat "$out/$mode/results.csv"
done
