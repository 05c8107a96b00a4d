#!/bin/sh
# Runs the CUDA kernels of src/cuda/lin_cuda.cu on the CPU against the float64 reference
# (tests/cuda_emu/: one OS thread per CUDA thread, barriers for __syncthreads and the warp
# shuffles), to check their indexing and synchronisation where there is no GPU. The kernels are
# taken from the source as they are: the CUDA-only lines (the include, the host side) are cut with
# sed. Usage: scripts/lin_cuda_emulate.sh [BUILD dir of a CPU build, default build-emu]
set -eu
cd "$(dirname "$0")/.."
B=${1:-build-emu}
make -s CUDA=0 BUILD="$B" "$B/libmesanet.a"
out="$B/cuda_emu"
mkdir -p "$out"
sed -e 's|#include "cuda_common.cuh"|#include "emu.h"|' \
    -e '/^extern "C" {$/,/^}$/d' \
    -e '/^static __global__ void to_bf16_kernel/,$d' \
    -e 's/extern __shared__ float/extern float/' \
    -e 's/static __global__ void/static void/' \
    src/cuda/lin_cuda.cu > "$out/lin_emu_kernels.h"
libs=$(make -s CUDA=0 BUILD="$B" --eval 'lin-emu-ldlibs: ; @echo $(LDLIBS)' lin-emu-ldlibs)
${CXX:-g++} -std=c++17 -O1 -Wall -Wno-unused-parameter -Wno-unused-function -I"$out" -Itests/cuda_emu -Iinclude -Isrc \
    -o "$out/lin_emu" tests/cuda_emu/lin_emu.cpp "$B/libmesanet.a" $libs -fopenmp -lpthread
"./$out/lin_emu"
