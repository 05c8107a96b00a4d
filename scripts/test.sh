#!/usr/bin/env bash
# Installs what is missing, builds, and runs the whole test suite (CPU only).
# Ends with "N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
make -j"$(nproc)" all
make test
