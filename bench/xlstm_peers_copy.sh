#!/bin/sh
# Makes .peers/ (git-ignored; never committed) for bench/xlstm_kernels_bench.py and
# bench/hf_xlstm_bench.py: the package folders of NX-AI's mlstm_kernels, xlstm and flashrnn, from
# SRC/mlstm_kernels, SRC/xlstm and SRC/flashrnn, each a checkout or a git directory (its HEAD is
# taken), without the notebooks, the JAX kernels and the plotting and benchmarking utilities.
#
#   bench/xlstm_peers_copy.sh SRC
set -eu
[ $# -eq 1 ] || { echo "usage: bench/xlstm_peers_copy.sh SRC (SRC/mlstm_kernels, SRC/xlstm, SRC/flashrnn)" >&2; exit 2; }
cd "$(dirname "$0")/.."
mkdir -p .peers
for r in mlstm_kernels xlstm flashrnn; do
    src=$1/$r
    rm -rf ".peers/$r"
    if [ -d "$src/$r" ]; then
        cp -r "$src/$r" ".peers/$r"
    elif git -C "$src" rev-parse --git-dir > /dev/null 2>&1; then
        git -C "$src" archive --format=tar HEAD "$r" | tar -x -C .peers
    else
        echo "bench/xlstm_peers_copy.sh: $src is neither a checkout holding $r/ nor a git directory" >&2
        exit 1
    fi
done
find .peers -name '*.ipynb' -delete
rm -rf .peers/mlstm_kernels/jax .peers/mlstm_kernels/utils/analysis .peers/mlstm_kernels/utils/benchmark
du -sh .peers
