/*
 * Fuzzes token shards (src/data/shard.h) and the data loader on top of them
 * (src/data/loader.h): the training data of every run.
 *
 * Input: the bytes of a shard file. A shard that shard_read accepts must hold
 * only ids below its vocab_size and exactly the tokens its header counts; the
 * loader then opens it for a small batch shape (where it holds enough tokens),
 * draws batches across an epoch boundary and moves to a saved position. Seeds:
 * shards shard_write makes (2- and 4-byte ids, fuzz/seeds.c) and
 * fuzz/edge/shard/.
 *
 *     make fuzz FUZZ_TARGETS=shard FUZZ_TIME=60
 */
#include <stdlib.h>
#include <string.h>

#include "data/loader.h"
#include "data/shard.h"
#include "fuzz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    fuzz_init();
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fuzz_write(path, sizeof path, "shard.bin", data, size);
    TokenShard s;
    if (shard_read(path, &s)) {
        if (s.tokens || s.n_tokens) abort();  // documented: left empty on failure
        return 0;
    }
    if (size != SHARD_HEADER_BYTES + s.n_tokens * shard_bytes_per_token(s.vocab_size) || s.bos_id >= s.vocab_size) abort();
    for (uint64_t i = 0; i < s.n_tokens; i++)
        if (s.tokens[i] < 0 || (uint32_t)s.tokens[i] >= s.vocab_size) abort();
    uint64_t n = s.n_tokens;
    shard_free(&s);

    const int B = 2, T = 3;
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        DataLoader dl;
        int st = loader_open(&dl, path, B, T, 7, shuffle);
        if ((st == 0) != (n >= (uint64_t)T + 1)) abort();
        if (st) continue;
        int32_t in[B * T], tg[B * T];
        uint64_t nseq = loader_num_sequences(&dl);
        for (uint64_t k = 0; k <= nseq / B + 1 && k < 64; k++) {
            if (loader_next(&dl, in, tg)) abort();
            for (int i = 0; i < B * T; i++)
                if (in[i] < 0 || (uint32_t)in[i] >= dl.shard.vocab_size || tg[i] < -1 ||
                    (tg[i] >= 0 && (uint32_t)tg[i] >= dl.shard.vocab_size))
                    abort();
        }
        uint64_t e, ix;
        loader_get_position(&dl, &e, &ix);
        if (loader_set_position(&dl, e + 3, nseq - 1) || loader_next(&dl, in, tg)) abort();
        if (!loader_set_position(&dl, 0, nseq)) abort();  // out of range: refused
        loader_close(&dl);
    }
    return 0;
}
