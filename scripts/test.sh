#!/usr/bin/env bash
# Checks the folders' include layers (scripts/check_layers.sh), installs what is missing, builds,
# and runs the whole test suite (CPU only). Ends with "N passed, M failed".
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/check_layers.sh
scripts/install-deps.sh
make -j"$(nproc)" all
make test
