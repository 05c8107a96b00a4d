#!/usr/bin/env bash
# The synthetic benchmarks at their protocols on this machine's GPUs (build/mesanet built with CUDA),
# a table per call, resumable: the sweep trains for at most MINUTES (default 9) with every GPU's share
# of runs at once (12 a GPU), saves the runs in progress and stops; run the same command again to go
# on (finished runs are in results.csv; a run's saved state lives in DIR/.state on this machine).
#
#   scripts/gpu_protocols.sh mad        MAD's six tasks, baseline settings, every mixer (Table 1)
#   scripts/gpu_protocols.sh regbench   RegBench by training automata (1K .. 40K)
#   scripts/gpu_protocols.sh mqar       MQAR on its (L, K) grid
#   scripts/gpu_protocols.sh parity     parity, with and without negative eigenvalues
#   scripts/gpu_protocols.sh niah       S-NIAH by context length
#
# GRID=N (default 1: each run alone) trains the (lr, wd) runs of a task, setting and mixer as one model
# of up to N runs (synth --grid; then 12 grids a GPU at once, not 12 runs).
# Results and tables (synth --report) go to bench/results/<table>-protocol/.
set -euo pipefail
cd "$(dirname "$0")/.."
table=${1:?"usage: scripts/gpu_protocols.sh mad|regbench|mqar|parity|niah"}
minutes=${MINUTES:-9}
grid=${GRID:-1}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
[ "$gpus" -ge 1 ] || { echo "gpu_protocols.sh: no GPU (nvidia-smi -L lists none)" >&2; exit 1; }
all=mesa,gdn,deltanet,gla,mamba2,mha,swa,hawk,mlstm,longhorn,hawk+mesa,gdn+swa
case "$table" in
    mad) task=mad; mixers=$all; settings=baseline ;;
    regbench) task=regbench; mixers=mesa,gdn,mha,deltanet,mlstm,hawk; settings=full ;;
    mqar) task=mqar; mixers=$all; settings=full ;;
    parity) task=parity; mixers=gdn,gdn:neg,deltanet,deltanet:neg,mesa,mha,mlstm,hawk; settings=full ;;
    niah) task=niah; mixers=mesa,gdn,mha,swa,mlstm,hawk; settings=full ;;
    *) echo "gpu_protocols.sh: unknown table '$table' (mad, regbench, mqar, parity, niah)" >&2; exit 1 ;;
esac
out=bench/results/$table-protocol
build/mesanet synth "$task" --mixers "$mixers" --settings "$settings" --backend cuda --gpus "$gpus" \
    --parallel $((12 * gpus)) --grid "$grid" --time-limit "$minutes" --out "$out"
build/mesanet synth "$task" --mixers "$mixers" --settings "$settings" --report --out "$out" > "$out/report.txt"
echo "gpu_protocols.sh: $(grep -c . "$out/results.csv") lines in $out/results.csv; tables in $out/report.txt"
