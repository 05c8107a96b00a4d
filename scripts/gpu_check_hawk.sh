#!/bin/sh
# GPU checks for the hawk work: the new generic ops (bias, GELU's tanh approximation alone and
# gating) against the float64 reference, the xLSTM blocks whose biases now go through bias_fwd/bwd,
# and the conformance battery on the GPU (hawk is refused by name there until the GPU scan core is
# in; with it, its cases run). Run on a GPU machine after .devlibs/gpu.sh or a plain `make`.
set -eu
cd "$(dirname "$0")/.."
make -j"$(nproc)" build/run_tests_cuda build/mesanet
build/run_tests_cuda cuda_op_bias
build/run_tests_cuda cuda_op_gelu_tanh
build/run_tests_cuda cuda_op_
build/run_tests_cuda conformance
