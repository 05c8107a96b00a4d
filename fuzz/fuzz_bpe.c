/*
 * Fuzzes loading a GPT-2 style byte-level BPE (src/data/bpe.h): encoder.json
 * (token -> id in GPT-2's byte alphabet) and vocab.bpe (the merges).
 *
 * Input: encoder.json FUZZ_SEP vocab.bpe (fuzz.h); a missing part is a
 * missing file. A tokenizer that bpe_load accepts must encode any bytes to ids
 * in [0, vocab) that decode to those bytes again: it encodes a fixed sample
 * and the input itself. Seeds: a small BPE that bpe_train writes
 * (fuzz/seeds.c) and fuzz/edge/bpe/.
 *
 *     make fuzz FUZZ_TARGETS=bpe FUZZ_TIME=60
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/bpe.h"
#include "fuzz.h"

static const char SAMPLE[] = "Hello world, it's 2024!  Numbers 12345 and \xc3\xa9t\xc3\xa9 \xe4\xb8\xad\xe6\x96\x87 \xff\xfe"
                             "<|endoftext|>\n\n  tabs\tand 'll 've 're\r\n";

static void roundtrip(const Bpe *bpe, const unsigned char *text, size_t len) {
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    if (bpe_encode(bpe, text, len, &ids, &n, &cap)) abort();
    int V = bpe_vocab_size(bpe);
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V) abort();
    unsigned char *out = NULL;
    size_t out_len = 0;
    if (bpe_decode(bpe, ids, n, &out, &out_len)) abort();
    if (out_len != len || (len && memcmp(out, text, len))) {
        fprintf(stderr, "decode(encode(x)) != x\n");
        abort();
    }
    free(out);
    free(ids);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *part[2];
    size_t len[2];
    int np = fuzz_split(data, size, part, len, 2);
    char enc[512], voc[512];
    fuzz_write(enc, sizeof enc, "encoder.json", part[0], len[0]);
    if (np > 1) fuzz_write(voc, sizeof voc, "vocab.bpe", part[1], len[1]);
    else fuzz_unlink("vocab.bpe"), fuzz_path(voc, sizeof voc, "vocab.bpe");
    Bpe *bpe = NULL;
    if (bpe_load(&bpe, enc, voc)) return 0;
    int V = bpe_vocab_size(bpe), eot = bpe_eot(bpe);
    if (V < 256 || eot < -1 || eot >= V) abort();
    for (int id = 0; id < V; id++) {
        const unsigned char *b;
        size_t bl;
        if (bpe_token_bytes(bpe, id, &b, &bl) || bl == 0) abort();
    }
    roundtrip(bpe, (const unsigned char *)SAMPLE, sizeof SAMPLE - 1);
    roundtrip(bpe, data, size < 4096 ? size : 4096);
    bpe_free(bpe);
    return 0;
}
