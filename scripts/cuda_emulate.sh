#!/bin/sh
# Runs CUDA kernels on the CPU against the float64 reference, where there is no GPU, to
# check indexing, lane mappings and synchronisation (tests/cuda_emu/: one OS thread per CUDA thread,
# barriers for __syncthreads and the warp shuffles, mma_emu.h for ldmatrix / mma.sync in their PTX
# fragment layouts, cp.async as a copy). The source is taken as it is; sed swaps its includes for
# the emulation's headers and cuts or rewrites what only nvcc understands:
#
#   lin        src/cuda/lin_cuda.cu's recurrent kernels (the host side cut; tests/cuda_emu/lin_emu.cpp
#              mirrors it)
#   lin_chunk  src/cuda/lin_chunk*.cu and their headers whole, kernels and host side, concatenated
#              into one file (their includes of each other dropped): a kernel's dynamic shared
#              memory becomes a static array, each launch k<<<g, b, s, st>>>(...) a call of
#              emu_launch, cuBLAS's products CPU loops with TF32 operands (lin_chunk_emu.h); both
#              paths, the fused kernels (the default) and the cuBLAS one (MESANET_LIN=cublas). EXTRA
#              "f32": float32 operands instead of TF32. lin_chunk_d32: the same with the fused path built
#              for head sizes up to 32 (lin_chunk_fused_d32.cu's build; larger ones take the cuBLAS path)
#              lin_chunk_bf16: with one bf16 product each (lin_chunk_fused_bf16.cu's build, LF_SPLIT 0)
#   attn       src/cuda/attn_cuda.cu's kernels (the host side cut; attn_emu.cpp mirrors it)
#   mlstm      src/cuda/mlstm_chunk.cuh and mlstm_cuda.cu whole, kernels and host side (xlstm_emu.h),
#              against a float64 reference in mlstm_emu.cpp
#   slstm      src/cuda/slstm_cuda.cu and slstm_cluster.cu whole, cuBLAS's products as loops, a cluster's
#              blocks run together with their barrier and remote stores (xlstm_emu.h)
#   scan       src/cuda/scan_cuda.cu whole, kernels and host side (xlstm_emu.h), RG-LRU and Longhorn
#              against a float64 reference in scan_emu.cpp (itself checked against finite differences)
#
# Usage: scripts/cuda_emulate.sh lin|lin_chunk|lin_chunk_d32|lin_chunk_bf16|attn|mlstm|slstm|scan [BUILD dir of a CPU build, default build-emu] [EXTRA]
set -eu
cd "$(dirname "$0")/.."
what=${1:-}
B=${2:-build-emu}
out="$B/cuda_emu"
case "$what" in
lin)
    src=src/cuda/lin_cuda.cu opt=-O1
    set -- -e 's|#include "cuda_common.cuh"|#include "emu.h"|' \
        -e '/^extern "C" {$/,/^}$/d' \
        -e '/^static __global__ void to_bf16_kernel/,$d' \
        -e 's/extern __shared__ float/extern float/' \
        -e 's/static __global__ void/static void/' ;;
lin_chunk | lin_chunk_d32 | lin_chunk_bf16)
    src="src/cuda/lin_chunk.cuh src/cuda/lin_chunk_fused.cuh src/cuda/lin_chunk.cu src/cuda/lin_chunk_cublas.cu
         src/cuda/lin_chunk_fused_walk.cu src/cuda/lin_chunk_fused.cu src/cuda/lin_chunk_fused_bwd.cu"
    # one build of the fused path: the one for head sizes up to 128, or (lin_chunk_d32) the one for 32
    opt="-O2 -fno-strict-aliasing -DLF_ONE_BUILD"
    if [ "$what" = lin_chunk_d32 ]; then opt="$opt -DLF_KMAX=32" out="$B/cuda_emu_d32" what=lin_chunk; fi
    if [ "$what" = lin_chunk_bf16 ]; then opt="$opt -DLF_SPLIT=0" out="$B/cuda_emu_bf16" what=lin_chunk; fi
    set -- -e 's|#include "cuda_common.cuh"|#include "lin_chunk_emu.h"|' \
        -e '/#include "mma.cuh"/d' \
        -e '/#include "lin_chunk\(_fused\)\{0,1\}\.cuh"/d' \
        -e 's/extern __shared__ \(.*\) lf_dsmem\[\];/static \1 lf_dsmem[1 << 18];/' \
        -e 's/\([A-Za-z_0-9]*\)<<<\(.*\)>>>(\(.*\));/emu_launch(\1, \2, \3);/' ;;
attn)
    src=src/cuda/attn_cuda.cu opt=-O1
    set -- -e 's|#include "cuda_common.cuh"|#include "emu.h"|' \
        -e 's|#include "mma.cuh"|#include "mma_emu.h"|' \
        -e '/^extern "C" {$/,/^}$/d' \
        -e '/^\/\/ ---- host side/,$d' \
        -e 's/extern __shared__/extern/' \
        -e 's/static __global__ void/static void/' ;;
mlstm)
    src="src/cuda/mlstm_chunk.cuh src/cuda/mlstm_cuda.cu"
    opt="-O2 -fno-strict-aliasing"
    set -- -e 's|#include "cuda_common.cuh"|#include "xlstm_emu.h"|' \
        -e '/#include "mma.cuh"/d' -e '/#include "mlstm_chunk.cuh"/d' \
        -e 's/extern __shared__ __align__(16) unsigned char \([a-z_]*\)\[\];/unsigned char *\1 = emu_dsmem_c[emu_cta];/' \
        -e 's/\([A-Za-z_0-9]*\)<<<\(.*\)>>>(\(.*\));/emu_launch(\1, \2, \3);/' ;;
slstm)
    src="src/cuda/slstm_cuda.cuh src/cuda/slstm_cluster.cu src/cuda/slstm_cuda.cu"
    opt="-O2 -fno-strict-aliasing"
    set -- -e 's|#include "cuda_common.cuh"|#include "xlstm_emu.h"|' \
        -e '/#include "mma.cuh"/d' -e '/#include "slstm_cuda.cuh"/d' -e '/-- device-only: begin/,/-- device-only: end/d' \
        -e 's/extern __shared__ __align__(16) unsigned char \([a-z_]*\)\[\];/unsigned char *\1 = emu_dsmem_c[emu_cta];/' \
        -e 's/\([A-Za-z_0-9]*\)<<<\(.*\)>>>(\(.*\));/emu_launch(\1, \2, \3);/' ;;
scan)
    src=src/cuda/scan_cuda.cu
    opt="-O2 -fno-strict-aliasing"
    set -- -e 's|#include "cuda_common.cuh"|#include "xlstm_emu.h"|' \
        -e '/#include "mma.cuh"/d' \
        -e 's/extern __shared__ __align__(16) unsigned char \([a-z_]*\)\[\];/unsigned char *\1 = emu_dsmem_c[emu_cta];/' ;;
*)
    echo "usage: scripts/cuda_emulate.sh lin|lin_chunk|lin_chunk_d32|lin_chunk_bf16|attn|mlstm|slstm|scan [BUILD dir] [EXTRA]" >&2
    exit 2 ;;
esac
extra=${3:-}
make -s CUDA=0 BUILD="$B" "$B/libmesanet.a"
mkdir -p "$out"
# shellcheck disable=SC2086  # $src is a list of files (lin_chunk)
sed "$@" $src > "$out/${what}_emu_kernels.h"
libs=$(make -s CUDA=0 BUILD="$B" --eval 'emu-ldlibs: ; @echo $(LDLIBS)' emu-ldlibs)
# shellcheck disable=SC2086  # $opt and $libs are lists of flags
${CXX:-g++} -std=c++17 $opt -Wall -Wno-unused-parameter -Wno-unused-function -Wno-unknown-pragmas -I"$out" \
    -Itests/cuda_emu -Iinclude -Isrc -o "$out/${what}_emu" "tests/cuda_emu/${what}_emu.cpp" "$B/libmesanet.a" $libs \
    -fopenmp -lpthread
"./$out/${what}_emu" $extra
