#!/usr/bin/env bash
# Checks that the code's folders include one another in one direction only: each folder's files
# may include its own folder's and those of the layers below it, never a layer above nor one beside
# it (two folders on one layer know nothing of each other), and no file's includes go round in a
# circle. Reads the `#include "..."` lines of src/, tools/ and bench/ (the CLI's bench commands);
# tests/ and fuzz/ sit above everything and are not checked. Prints every offending include and
# exits 1, or prints nothing and exits 0.
#
# The layers, lowest first:
#   0  include   the public C API (mesanet.h)
#   1  core      the backend op table, argument checks, common utilities, file formats (JSON,
#                safetensors, atomic files, plots and CSV tables), the config and parameter types
#   2  ref       the float64 reference backend, the ground truth the others are checked against
#   3  cpu cuda  the float32 CPU and the GPU backends (both may call the reference's helpers)
#   4  backends  the registry of the backends above: by name, or backend_cpu() and the others
#   5  mixers    the sequence mixers, written once against the op table
#   6  model     configs, presets, the backbone and its blocks, the autoencoder head
#   7  data      tokenizers, token shards, the batch loader
#   8  eval      evaluation of a model on data, sampling
#   9  train     the trainer, its optimiser, checkpoints, logs and data parallelism
#  10  synth     the synthetic tasks and their training protocols (they train models)
#  11  tools     the mesanet CLI
#  12  bench     the CLI's bench commands (they register with tools/commands.h)
# A new folder gets its line here and in the table of the awk program below.
set -euo pipefail
cd "$(dirname "$0")/.."

files=$(ls src/*/*.c src/*/*.h src/*/*.cu src/*/*.cuh tools/*.c tools/*.h bench/*.c bench/*.h 2>/dev/null)
edges=$(mktemp)
trap 'rm -f "$edges" "$edges.err"' EXIT

# Every include line as "file name", resolved as the compiler does (the including file's own
# folder, then the Makefile's -Iinclude -Isrc -I.), its edge written to $edges and checked.
fail=0
{ find include src tools bench -type f | sed 's/^/exists /'; grep -HE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"' $files; } |
    awk -v edges="$edges" '
    BEGIN {
        split("include 0 core 1 ref 2 cpu 3 cuda 3 backends 4 mixers 5 model 6 data 7 eval 8 train 9 " \
              "synth 10 tools 11 bench 12", w, " ")
        for (i = 1; i in w; i += 2) rank[w[i]] = w[i + 1]
    }
    function folder(path) { return path ~ /^src\// ? substr(path, 5, index(substr(path, 5), "/") - 1) : substr(path, 1, index(path, "/") - 1) }
    function tidy(path,    n, p, out, i, k) {  # a/b/../c -> a/c, ./a -> a
        n = split(path, p, "/"); k = 0
        for (i = 1; i <= n; i++) {
            if (p[i] == "." || p[i] == "") continue
            if (p[i] == ".." && k > 0 && out[k] != "..") { k--; continue }
            out[++k] = p[i]
        }
        path = out[1]; for (i = 2; i <= k; i++) path = path "/" out[i]
        return path
    }
    $1 == "exists" { have[$2] = 1; next }
    {
        file = substr($0, 1, index($0, ":") - 1)
        name = $0; sub(/^[^"]*"/, "", name); sub(/".*/, "", name)
        dir = file; sub(/\/[^\/]*$/, "", dir)
        target = ""
        split(dir " include src .", tries, " ")
        for (i = 1; i <= 4 && target == ""; i++) if (have[tidy(tries[i] "/" name)]) target = tidy(tries[i] "/" name)
        if (target == "") { printf "%s: #include \"%s\": no such file in its folder, include/, src/ or the root\n", file, name > "/dev/stderr"; bad = 1; next }
        print file, target > edges
        from = folder(file); to = folder(target)
        if (from == to) next
        if (!(from in rank) || !(to in rank)) {
            printf "%s: folder %s has no layer: add it to scripts/check_layers.sh\n", file, (from in rank) ? to : from > "/dev/stderr"
            bad = 1; next
        }
        if (rank[to] + 0 >= rank[from] + 0) {
            printf "%s includes %s: %s is %s %s (layers: scripts/check_layers.sh)\n", file, target, to,
                   rank[to] == rank[from] ? "beside" : "above", from > "/dev/stderr"
            bad = 1
        }
    }
    END { exit bad }' || fail=1

# A circle of files: tsort names it. (The layers rule out one between folders.)
if ! tsort "$edges" >/dev/null 2>"$edges.err"; then
    echo "include cycle:" >&2
    cat "$edges.err" >&2
    fail=1
fi
exit "$fail"
