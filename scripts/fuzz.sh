#!/usr/bin/env bash
# Runs the libFuzzer harnesses that `make fuzz` built (fuzz/fuzz_*.c), each for SECONDS:
#
#     scripts/fuzz.sh BUILD_DIR SECONDS [TARGET...]      (all targets without any)
#
# `make fuzz FUZZ_TIME=60` builds them and calls this. Each target starts from seeds that
# BUILD_DIR/fuzz_seeds writes (valid files as the library writes them), the hand-made edge cases
# of fuzz/edge/TARGET/, and what earlier runs found (BUILD_DIR/fuzz-corpus/TARGET/, kept between
# runs). A crash, a leak, undefined behaviour, an input that runs over 10 s or allocates over
# 512 MB is a failure: the input lands in BUILD_DIR/fuzz-crashes/ and the script exits 1 after
# running the other targets. Reproduce one with `BUILD_DIR/fuzz-TARGET FILE`.
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 2 ]; then
    echo "usage: $0 BUILD_DIR SECONDS [TARGET...]" >&2
    exit 2
fi
build=$1 secs=$2
shift 2
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    for f in fuzz/fuzz_*.c; do
        t=${f#fuzz/fuzz_}
        targets+=("${t%.c}")
    done
fi

# The parsers have no parallel parts: one thread, no pools. Symbolized reports where the
# symbolizer is installed (scripts/install-deps.sh --clang).
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}

seeds=$build/fuzz-seeds
rm -rf "$seeds"
if ! "$build/fuzz_seeds" "$seeds"; then
    echo "fuzz: writing the seeds failed" >&2
    exit 1
fi
mkdir -p "$build/fuzz-crashes"

failed=()
for t in "${targets[@]}"; do
    bin=$build/fuzz-$t
    if [ ! -x "$bin" ]; then
        echo "fuzz: $bin is not built (make fuzz builds it)" >&2
        failed+=("$t")
        continue
    fi
    corpus=$build/fuzz-corpus/$t
    mkdir -p "$corpus" "$seeds/$t"
    dirs=("$corpus" "$seeds/$t")
    [ -d "fuzz/edge/$t" ] && dirs+=("fuzz/edge/$t")
    opts=(-max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=512
          -artifact_prefix="$build/fuzz-crashes/$t-" -print_final_stats=1)
    [ -f "fuzz/$t.dict" ] && opts+=(-dict="fuzz/$t.dict")
    log=$build/fuzz-$t.log
    start=$(date +%s)
    "$bin" "${opts[@]}" "${dirs[@]}" >"$log" 2>&1
    rc=$?
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    printf 'fuzz %-12s %4ds  %s runs, %s, corpus %s files' "$t" "$(($(date +%s) - start))" "${runs:-?}" "${cov:-cov: ?}" \
        "$(find "$corpus" -type f | wc -l)"
    if [ $rc -ne 0 ]; then
        printf '  FAILED (exit %d)\n' $rc
        grep -E 'ERROR|SUMMARY|runtime error|Test unit written|^==.*(leak|deadly|timeout)' "$log" | head -20 | sed 's/^/    /'
        echo "    full report: $log"
        failed+=("$t")
    else
        printf '  ok\n'
    fi
done

if [ ${#failed[@]} -gt 0 ]; then
    echo "fuzz: failures in: ${failed[*]} (inputs in $build/fuzz-crashes/)"
    exit 1
fi
echo "fuzz: ${#targets[@]} targets, ${secs}s each, no failures"
