#!/usr/bin/env bash
# The whole test suite (CPU) built with AddressSanitizer, LeakSanitizer and
# UndefinedBehaviorSanitizer (make SAN=1), any finding fatal. Installs clang and
# its runtimes first where missing (scripts/install-deps.sh --clang).
#
#     scripts/sanitize.sh          SAN_CC=gcc for gcc's sanitizers; SAN_BUILD=dir (build-san)
#
# The runner's closing line is reworded ("sanitized suite: N ok, M failed") so that
# it is not taken for the plain suite's "N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."
cc=${SAN_CC:-clang}
build=${SAN_BUILD:-build-san}
scripts/install-deps.sh --clang
make -j"$(nproc)" SAN=1 CC="$cc" BUILD="$build" all
make SAN=1 CC="$cc" BUILD="$build" test 2>&1 |
    sed -E 's/^([0-9]+) passed, ([0-9]+) failed/sanitized suite: \1 ok, \2 failed/'
