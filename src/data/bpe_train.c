/*
 * Training a byte-level BPE in GPT-2's format (bpe_train in bpe.h).
 *
 * The text is split with GPT-2's pre-tokenizer and reduced to its unique
 * pre-tokens ("words") with their counts; merges never cross words. Then, until
 * the vocabulary is full: take the adjacent pair with the highest count
 * (weighted by word counts), make it a token, and rewrite the words that
 * contain it. Pair counts are kept incrementally: every pair knows the words it
 * occurs in, so a merge only touches those words, never the whole corpus. The
 * best pair comes from a max-heap with lazy deletion: counts that dropped are
 * corrected when their entry surfaces; counts that grew (only pairs with the
 * new token) get a fresh entry.
 *
 * Ids: 0..255 are the bytes in GPT-2's order (so they equal GPT-2's ids), then
 * one token per merge in merge order, then "<|endoftext|>". Ties in count go to
 * the pair seen first, so training is deterministic. A pair whose merge would
 * spell an existing token (two routes to the same bytes, "ab"+"c" = "a"+"bc")
 * is skipped: every merge makes a new token, which is what makes encoding with
 * the written files reproduce the training segmentation exactly.
 */
#include <stdlib.h>
#include <string.h>

#include "bpe.h"
#include "bpe_internal.h"
#include "core/common.h"

typedef struct {
    int32_t a, b;         // left and right token ids
    int64_t count;        // occurrences in the corpus (word occurrences x word counts)
    int32_t *words;       // words that contain the pair or once did (stale entries are skipped)
    int32_t nwords, capwords;
    int32_t pushed_at;    // the last merge step that gave it a heap entry
    int banned;           // its merge would spell an existing token
} Pair;

typedef struct {
    int64_t count;  // the pair's count when pushed
    int32_t pair;   // index into pairs
} HeapItem;

typedef struct {
    // Words: the unique pre-tokens, each a run of symbols in sym.
    const unsigned char *text;
    int32_t nwords, capwords;
    int64_t *wcount;      // [nwords] occurrences in the text
    size_t *wstart;       // [nwords] first symbol in sym
    int32_t *wlen;        // [nwords] symbols now
    int32_t *wstamp;      // [nwords] the last merge step that rewrote the word
    int32_t *sym;         // the symbols (token ids) of all words
    // Tokens: token i is bytes[off[i] .. off[i + 1]).
    unsigned char *bytes;
    size_t *off, capbytes;
    int32_t ntok, captok;
    ByteMap tokens;       // token bytes -> id
    int32_t *merges;      // [nmerges][2] left, right
    int32_t nmerges, capmerges;
    // Pairs.
    PairMap pair_index;   // (a, b) -> index into pairs
    Pair *pairs;
    int32_t npairs, cappairs;
    HeapItem *heap;
    size_t nheap, capheap;
    int32_t *fresh;       // pairs with the newest token, to push after a merge step
    int32_t nfresh, capfresh;
} Trainer;

// Grows *p (elements of `size` bytes, *cap of them) to hold `need`.
static int grow(void **p, size_t size, int32_t *cap, size_t need) {
    if (need <= (size_t)*cap) return MN_OK;
    size_t c = *cap ? (size_t)*cap : 64;
    while (c < need) c *= 2;
    if (c > INT32_MAX) return mn_error(MN_ERR_NOMEM, "bpe_train: more than 2^31 items");
    void *q = realloc(*p, c * size);
    if (!q) return mn_error(MN_ERR_NOMEM, "bpe_train: out of memory");
    *p = q;
    *cap = (int32_t)c;
    return MN_OK;
}

// ---------------------------------------------------------------------------
// Words

// Splits the text into pre-tokens and counts the unique ones.
static int count_words(Trainer *t, size_t len) {
    ByteMap seen;
    MN_TRY(bytemap_init(&seen, &t->text, 1 << 16));
    int s = MN_OK;
    size_t nsym = 0;
    for (size_t pos = 0; pos < len && !s;) {
        size_t end = bpe_pretoken_end(t->text, len, pos), n = end - pos;
        uint64_t h = bytes_hash(t->text + pos, n);
        int32_t w = bytemap_get(&seen, t->text + pos, n, h);
        if (w < 0) {
            w = t->nwords;
            if (n > INT32_MAX) s = mn_error(MN_ERR_UNSUPPORTED, "bpe_train: a pre-token of %zu bytes", n);
            if (!s) s = grow((void **)&t->wcount, sizeof *t->wcount, &t->capwords, (size_t)w + 1);
            if (!s) s = bytemap_put(&seen, pos, n, h, w);
            if (s) break;
            t->wcount[w] = 0;
            t->nwords++;
            nsym += n;
        }
        t->wcount[w]++;
        pos = end;
    }
    // The symbols: each word's bytes as byte tokens, in the order of first appearance.
    size_t nw = (size_t)t->nwords + 1;
    t->wstart = s ? NULL : malloc(nw * sizeof *t->wstart);
    t->wlen = s ? NULL : malloc(nw * sizeof *t->wlen);
    t->wstamp = s ? NULL : malloc(nw * sizeof *t->wstamp);
    t->sym = s ? NULL : malloc((nsym + 1) * sizeof *t->sym);
    if (!s && (!t->wstart || !t->wlen || !t->wstamp || !t->sym)) s = mn_error(MN_ERR_NOMEM, "bpe_train: out of memory");
    for (size_t i = 0, at = 0; !s && i <= seen.mask; i++) {
        const ByteMapSlot *slot = &seen.slots[i];
        if (!slot->hash) continue;
        int32_t w = slot->value;
        t->wlen[w] = (int32_t)slot->len;
        t->wstamp[w] = -1;
        t->wstart[w] = at;
        for (size_t k = 0; k < slot->len; k++) t->sym[at + k] = bpe_byte_rank(t->text[slot->off + k]);
        at += slot->len;
    }
    bytemap_free(&seen);
    return s;
}

// ---------------------------------------------------------------------------
// Tokens

static int add_token(Trainer *t, const unsigned char *p, size_t n, uint64_t h) {
    int32_t id = t->ntok;
    MN_TRY(grow((void **)&t->off, sizeof *t->off, &t->captok, (size_t)id + 2));
    size_t at = t->off[id];
    if (at + n > t->capbytes) {
        size_t c = t->capbytes ? 2 * t->capbytes : 4096;
        while (c < at + n) c *= 2;
        unsigned char *q = realloc(t->bytes, c);
        if (!q) return mn_error(MN_ERR_NOMEM, "bpe_train: out of memory");
        t->bytes = q;
        t->capbytes = c;
    }
    memcpy(t->bytes + at, p, n);
    t->off[id + 1] = at + n;
    MN_TRY(bytemap_put(&t->tokens, at, n, h, id));
    t->ntok++;
    return MN_OK;
}

// The 256 byte tokens in GPT-2's order.
static int add_byte_tokens(Trainer *t) {
    MN_TRY(bytemap_init(&t->tokens, (const unsigned char *const *)&t->bytes, 4096));
    MN_TRY(grow((void **)&t->off, sizeof *t->off, &t->captok, 257));
    t->off[0] = 0;
    unsigned char order[256];
    for (int b = 0; b < 256; b++) order[bpe_byte_rank(b)] = (unsigned char)b;
    for (int r = 0; r < 256; r++) MN_TRY(add_token(t, &order[r], 1, bytes_hash(&order[r], 1)));
    return MN_OK;
}

// ---------------------------------------------------------------------------
// Pairs and the heap

static int heap_before(const HeapItem *x, const HeapItem *y) {
    return x->count > y->count || (x->count == y->count && x->pair < y->pair);
}

static int heap_push(Trainer *t, int32_t pair) {
    Pair *p = &t->pairs[pair];
    if (p->banned || p->count <= 0) return MN_OK;
    if (t->nheap == t->capheap) {
        size_t c = t->capheap ? 2 * t->capheap : 1024;
        HeapItem *h = realloc(t->heap, c * sizeof *h);
        if (!h) return mn_error(MN_ERR_NOMEM, "bpe_train: out of memory");
        t->heap = h;
        t->capheap = c;
    }
    HeapItem it = {p->count, pair};
    size_t i = t->nheap++;
    while (i > 0 && heap_before(&it, &t->heap[(i - 1) / 2])) {
        t->heap[i] = t->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    t->heap[i] = it;
    return MN_OK;
}

static HeapItem heap_pop(Trainer *t) {
    HeapItem top = t->heap[0], last = t->heap[--t->nheap];
    size_t i = 0, n = t->nheap;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= n) break;
        if (k + 1 < n && heap_before(&t->heap[k + 1], &t->heap[k])) k++;
        if (!heap_before(&t->heap[k], &last)) break;
        t->heap[i] = t->heap[k];
        i = k;
    }
    if (n) t->heap[i] = last;
    return top;
}

// Adds delta to the count of pair (a, b), creating it if new; records word w
// (unless w < 0) among its words. *index receives the pair's index.
static int pair_add(Trainer *t, int32_t a, int32_t b, int64_t delta, int32_t w, int32_t *index) {
    int32_t *slot = pairmap_slot(&t->pair_index, pair_key(a, b), t->npairs);
    if (!slot) return mn_error(MN_ERR_NOMEM, "bpe_train: out of memory");
    if (*slot == t->npairs) {
        MN_TRY(grow((void **)&t->pairs, sizeof *t->pairs, &t->cappairs, (size_t)t->npairs + 1));
        t->pairs[t->npairs++] = (Pair){.a = a, .b = b, .pushed_at = -1};
    }
    Pair *p = &t->pairs[*slot];
    p->count += delta;
    if (w >= 0 && (p->nwords == 0 || p->words[p->nwords - 1] != w)) {
        MN_TRY(grow((void **)&p->words, sizeof *p->words, &p->capwords, (size_t)p->nwords + 1));
        p->words[p->nwords++] = w;
    }
    *index = *slot;
    return MN_OK;
}

static int count_pairs(Trainer *t) {
    MN_TRY(pairmap_init(&t->pair_index, 1 << 16));
    for (int32_t w = 0; w < t->nwords; w++) {
        const int32_t *s = t->sym + t->wstart[w];
        for (int32_t i = 0; i + 1 < t->wlen[w]; i++) {
            int32_t index;
            MN_TRY(pair_add(t, s[i], s[i + 1], t->wcount[w], w, &index));
        }
    }
    for (int32_t i = 0; i < t->npairs; i++) MN_TRY(heap_push(t, i));
    return MN_OK;
}

// ---------------------------------------------------------------------------
// Merging

// Rewrites word w with (a, b) -> id, left to right as the encoder does, and
// moves the counts of its pairs from the old symbols to the new ones.
static int merge_in_word(Trainer *t, int32_t w, int32_t a, int32_t b, int32_t id, int32_t step) {
    int32_t *s = t->sym + t->wstart[w], n = t->wlen[w], index;
    int64_t c = t->wcount[w];
    int found = 0;
    for (int32_t i = 0; i + 1 < n && !found; i++) found = s[i] == a && s[i + 1] == b;
    if (!found) return MN_OK;  // a stale entry in the pair's word list
    for (int32_t i = 0; i + 1 < n; i++) MN_TRY(pair_add(t, s[i], s[i + 1], -c, -1, &index));
    int32_t m = 0;
    for (int32_t i = 0; i < n;) {
        if (i + 1 < n && s[i] == a && s[i + 1] == b) {
            s[m++] = id;
            i += 2;
        } else {
            s[m++] = s[i++];
        }
    }
    t->wlen[w] = m;
    for (int32_t i = 0; i + 1 < m; i++) {
        int is_new = s[i] == id || s[i + 1] == id;
        MN_TRY(pair_add(t, s[i], s[i + 1], c, is_new ? w : -1, &index));
        if (is_new && t->pairs[index].pushed_at != step) {
            t->pairs[index].pushed_at = step;
            MN_TRY(grow((void **)&t->fresh, sizeof *t->fresh, &t->capfresh, (size_t)t->nfresh + 1));
            t->fresh[t->nfresh++] = index;
        }
    }
    return MN_OK;
}

// The pair to merge next into *best, or -1 when no pair is left.
static int best_pair(Trainer *t, int32_t *best) {
    *best = -1;
    while (t->nheap) {
        HeapItem it = heap_pop(t);
        const Pair *p = &t->pairs[it.pair];
        if (p->banned || p->count <= 0) continue;
        if (it.count == p->count) {
            *best = it.pair;
            return MN_OK;
        }
        if (it.count > p->count) MN_TRY(heap_push(t, it.pair));  // dropped since pushed: reinsert
        // it.count < p->count: it grew since, and the newer entry is in the heap
    }
    return MN_OK;
}

static int train_merges(Trainer *t, int vocab_size) {
    for (int32_t step = 0; t->ntok < vocab_size - 1; step++) {
        int32_t pi;
        MN_TRY(best_pair(t, &pi));
        if (pi < 0)
            return mn_error(MN_ERR_ARG, "bpe_train: the text allows only %d tokens, %d asked for", t->ntok + 1,
                            vocab_size);
        int32_t a = t->pairs[pi].a, b = t->pairs[pi].b;
        size_t la = t->off[a + 1] - t->off[a], lb = t->off[b + 1] - t->off[b];
        unsigned char *tmp = malloc(la + lb);
        if (!tmp) return mn_error(MN_ERR_NOMEM, "bpe_train: out of memory");
        memcpy(tmp, t->bytes + t->off[a], la);
        memcpy(tmp + la, t->bytes + t->off[b], lb);
        uint64_t h = bytes_hash(tmp, la + lb);
        int exists = bytemap_get(&t->tokens, tmp, la + lb, h) >= 0;
        int s = exists ? MN_OK : add_token(t, tmp, la + lb, h);
        free(tmp);
        MN_TRY(s);
        if (exists) {
            t->pairs[pi].banned = 1;
            continue;
        }
        int32_t id = t->ntok - 1;
        MN_TRY(grow((void **)&t->merges, 2 * sizeof *t->merges, &t->capmerges, (size_t)t->nmerges + 1));
        t->merges[2 * t->nmerges] = a;
        t->merges[2 * t->nmerges + 1] = b;
        t->nmerges++;
        // The pair's word list does not change during the step: only pairs
        // with the new token gain words.
        const int32_t *words = t->pairs[pi].words, nwords = t->pairs[pi].nwords;
        t->nfresh = 0;
        for (int32_t k = 0; k < nwords; k++) {
            int32_t w = words[k];
            if (t->wstamp[w] == step) continue;
            t->wstamp[w] = step;
            MN_TRY(merge_in_word(t, w, a, b, id, step));
        }
        for (int32_t k = 0; k < t->nfresh; k++) MN_TRY(heap_push(t, t->fresh[k]));
    }
    return MN_OK;
}

static void trainer_free(Trainer *t) {
    free(t->wcount);
    free(t->wstart);
    free(t->wlen);
    free(t->wstamp);
    free(t->sym);
    free(t->bytes);
    free(t->off);
    bytemap_free(&t->tokens);
    free(t->merges);
    pairmap_free(&t->pair_index);
    for (int32_t i = 0; i < t->npairs; i++) free(t->pairs[i].words);
    free(t->pairs);
    free(t->heap);
    free(t->fresh);
}

int bpe_train(const unsigned char *text, size_t len, int vocab_size, const char *out_dir) {
    if ((!text && len) || !out_dir) return mn_error(MN_ERR_ARG, "bpe_train: NULL argument");
    if (vocab_size < 257)
        return mn_error(MN_ERR_ARG, "bpe_train: vocab_size %d < 257 (256 bytes + <|endoftext|>)", vocab_size);
    Trainer t = {.text = text};
    int s = count_words(&t, len);
    if (!s) s = add_byte_tokens(&t);
    if (!s) s = count_pairs(&t);
    if (!s) s = train_merges(&t, vocab_size);
    if (!s) {
        static const char eot[] = "<|endoftext|>";
        const unsigned char *e = (const unsigned char *)eot;
        uint64_t h = bytes_hash(e, sizeof eot - 1);
        if (bytemap_get(&t.tokens, e, sizeof eot - 1, h) >= 0)
            s = mn_error(MN_ERR_ARG, "bpe_train: a merge made \"%s\"", eot);  // the pre-tokenizer never allows it
        else
            s = add_token(&t, e, sizeof eot - 1, h);
    }
    if (!s) s = bpe_write_files(out_dir, t.bytes, t.off, t.ntok, t.merges, t.nmerges);
    trainer_free(&t);
    if (s) return s;
    // The promise is that bpe_load reads the files back: keep it checked.
    Bpe *check;
    char enc[4096], voc[4096];
    snprintf(enc, sizeof enc, "%s/encoder.json", out_dir);
    snprintf(voc, sizeof voc, "%s/vocab.bpe", out_dir);
    MN_TRY(bpe_load(&check, enc, voc));
    s = bpe_vocab_size(check) == vocab_size && bpe_eot(check) == vocab_size - 1
            ? MN_OK
            : mn_error(MN_ERR_FORMAT, "bpe_train: %s reads back as %d tokens, EOT %d", out_dir, bpe_vocab_size(check),
                       bpe_eot(check));
    bpe_free(check);
    return s;
}
