#!/bin/sh
# Runs src/cuda/lin_chunk_cuda.cu (the chunkwise form: its kernels and its host side, cuBLAS's
# products as CPU loops with TF32 operands) on the CPU against the float64 reference, where there is
# no GPU (tests/cuda_emu/lin_chunk_emu.h: one OS thread per CUDA thread). The source is taken as it
# is: sed swaps the include for the emulation's header (which brings mma_emu.h for the fused
# kernels' ldmatrix / mma.sync), a kernel's dynamic shared memory for a static array and each kernel
# launch k<<<g, b, s, st>>>(...) for emu_launch(k, g, b, s, st, ...). Both paths run: the fused
# kernels (MESANET_LIN=fused) and the cuBLAS path (the default). Usage:
# scripts/lin_chunk_cuda_emulate.sh [BUILD dir of a CPU build, default build-emu] [f32: float32
# operands instead of TF32]
set -eu
cd "$(dirname "$0")/.."
B=${1:-build-emu}
make -s CUDA=0 BUILD="$B" "$B/libmesanet.a"
out="$B/cuda_emu"
mkdir -p "$out"
sed -e 's|#include "cuda_common.cuh"|#include "lin_chunk_emu.h"|' \
    -e '/#include "mma.cuh"/d' \
    -e 's/extern __shared__ \(.*\) lf_dsmem\[\];/static \1 lf_dsmem[1 << 18];/' \
    -e 's/\([A-Za-z_0-9]*\)<<<\(.*\)>>>(\(.*\));/emu_launch(\1, \2, \3);/' \
    src/cuda/lin_chunk_cuda.cu > "$out/lin_chunk_emu_kernels.h"
libs=$(make -s CUDA=0 BUILD="$B" --eval 'lin-emu-ldlibs: ; @echo $(LDLIBS)' lin-emu-ldlibs)
${CXX:-g++} -std=c++17 -O2 -fno-strict-aliasing -Wall -Wno-unused-parameter -Wno-unused-function -Wno-unknown-pragmas -I"$out" -Itests/cuda_emu -Iinclude -Isrc \
    -o "$out/lin_chunk_emu" tests/cuda_emu/lin_chunk_emu.cpp "$B/libmesanet.a" $libs -fopenmp -lpthread
"./$out/lin_chunk_emu" ${2:-}
