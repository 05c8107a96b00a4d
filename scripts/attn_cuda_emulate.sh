#!/bin/sh
# Runs the CUDA kernels of src/cuda/attn_cuda.cu on the CPU against the float64 reference
# (tests/cuda_emu/: one OS thread per CUDA thread, barriers for __syncthreads and the warp
# shuffles; mma_emu.h for ldmatrix / mma.sync with the PTX fragment layouts, cp.async as a copy),
# to check their indexing, lane mappings and synchronisation where there is no GPU. The kernels are
# taken from the source as they are: the CUDA-only lines (the includes, the host side) are cut
# with sed. Usage: scripts/attn_cuda_emulate.sh [BUILD dir of a CPU build, default build-emu]
set -eu
cd "$(dirname "$0")/.."
B=${1:-build-emu}
make -s CUDA=0 BUILD="$B" "$B/libmesanet.a"
out="$B/cuda_emu"
mkdir -p "$out"
sed -e 's|#include "cuda_common.cuh"|#include "emu.h"|' \
    -e 's|#include "mma.cuh"|#include "mma_emu.h"|' \
    -e '/^extern "C" {$/,/^}$/d' \
    -e '/^\/\/ ---- host side/,$d' \
    -e 's/extern __shared__/extern/' \
    -e 's/static __global__ void/static void/' \
    src/cuda/attn_cuda.cu > "$out/attn_emu_kernels.h"
libs=$(make -s CUDA=0 BUILD="$B" --eval 'attn-emu-ldlibs: ; @echo $(LDLIBS)' attn-emu-ldlibs)
${CXX:-g++} -std=c++17 -O1 -Wall -Wno-unused-parameter -Wno-unused-function -Wno-unknown-pragmas -I"$out" -Itests/cuda_emu -Iinclude -Isrc \
    -o "$out/attn_emu" tests/cuda_emu/attn_emu.cpp "$B/libmesanet.a" $libs -fopenmp -lpthread
"./$out/attn_emu"
