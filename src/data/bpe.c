/*
 * Byte-level BPE in GPT-2's format: loading encoder.json + vocab.bpe, GPT-2's
 * pre-tokenizer on UTF-8, encoding, decoding, and writing the two files
 * (bpe_write.c).
 *
 * Encoding a pre-token runs BPE on its bytes with a linked list of symbols and
 * a min-heap of candidate merges keyed by (rank, position): the same result as
 * encoder.py's loop "merge every occurrence of the lowest-ranked pair, left to
 * right", in O(n log n) instead of O(n^2) per pre-token, so that long runs
 * (a megabyte of spaces) cost no more than they should. Pre-tokens repeat a lot
 * in real text, so each bpe_encode call keeps a cache of pre-token -> ids, as
 * encoder.py does.
 *
 * The rank order is only the same as encoder.py's if every merge of vocab.bpe
 * uses tokens that exist by then and makes a token that no other merge makes
 * (so a merge never creates a pair ranked below itself); the loader checks
 * both, GPT-2's files and the trainer's satisfy both.
 */
#include "bpe.h"

#include <stdlib.h>
#include <string.h>

#include "bpe_internal.h"
#include "core/atomic_file.h"
#include "core/common.h"
#include "core/json.h"
#include "unicode_tables.h"

struct Bpe {
    int n;                 // vocabulary size; ids are 0..n-1
    int eot;               // id of "<|endoftext|>", or -1
    unsigned char *bytes;  // the bytes of all tokens, in id order
    size_t *off;           // [n + 1] token i is bytes[off[i] .. off[i + 1])
    int32_t byte_id[256];  // the token of each single byte
    int nmerges;
    int32_t *merges;       // [nmerges][3] left, right and result ids, in rank order
    PairMap ranks;         // (left, right) -> rank
};

static const char EOT_TEXT[] = "<|endoftext|>";

// ---------------------------------------------------------------------------
// GPT-2's byte alphabet (bytes_to_unicode in encoder.py). The printable bytes
// are 33..126, 161..172 and 174..255; the others, 0..32, 127..160 and 173, are
// spelled 256 + their index among the non-printable bytes.

uint32_t bpe_byte_char(int b) {
    if (b <= 32) return 256 + (uint32_t)b;
    if (b >= 127 && b <= 160) return 256 + 33 + (uint32_t)(b - 127);
    if (b == 173) return 256 + 67;
    return (uint32_t)b;
}

int bpe_char_byte(uint32_t cp) {
    if (cp < 256) return (cp <= 32 || (cp >= 127 && cp <= 160) || cp == 173) ? -1 : (int)cp;
    if (cp < 256 + 33) return (int)cp - 256;
    if (cp < 256 + 67) return (int)cp - 256 - 33 + 127;
    if (cp == 256 + 67) return 173;
    return -1;
}

int bpe_byte_rank(int b) {
    if (b >= 33 && b <= 126) return b - 33;
    if (b >= 161 && b <= 172) return 94 + b - 161;
    if (b >= 174) return 106 + b - 174;
    return 188 + (int)bpe_byte_char(b) - 256;
}

// ---------------------------------------------------------------------------
// Hash maps

// FNV-1a with a final mix (FNV's low bits are weak), never 0.
uint64_t bytes_hash(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    h ^= h >> 29;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 32;
    return h ? h : 1;
}

// The smallest power of two >= 2 * expected (load factor <= 1/2), at least 16.
static size_t table_size(size_t expected) {
    size_t n = 16;
    while (n < 2 * expected) n *= 2;
    return n;
}

int bytemap_init(ByteMap *m, const unsigned char *const *base, size_t expected) {
    size_t n = table_size(expected);
    m->slots = mn_calloc(n, sizeof *m->slots);
    if (!m->slots) return MN_ERR_NOMEM;
    m->mask = n - 1;
    m->count = 0;
    m->base = base;
    return MN_OK;
}

void bytemap_free(ByteMap *m) {
    mn_free(m->slots);
    m->slots = NULL;
}

int32_t bytemap_get(const ByteMap *m, const unsigned char *key, size_t len, uint64_t hash) {
    for (size_t i = hash & m->mask;; i = (i + 1) & m->mask) {
        const ByteMapSlot *s = &m->slots[i];
        if (!s->hash) return -1;
        if (s->hash == hash && s->len == len && !memcmp(*m->base + s->off, key, len)) return s->value;
    }
}

static void bytemap_insert(ByteMapSlot *slots, size_t mask, const ByteMapSlot *s) {
    size_t i = s->hash & mask;
    while (slots[i].hash) i = (i + 1) & mask;
    slots[i] = *s;
}

int bytemap_put(ByteMap *m, size_t off, size_t len, uint64_t hash, int32_t value) {
    if (2 * (m->count + 1) > m->mask + 1) {
        size_t n = 2 * (m->mask + 1);
        ByteMapSlot *slots = mn_calloc(n, sizeof *slots);
        if (!slots) return MN_ERR_NOMEM;
        for (size_t i = 0; i <= m->mask; i++)
            if (m->slots[i].hash) bytemap_insert(slots, n - 1, &m->slots[i]);
        mn_free(m->slots);
        m->slots = slots;
        m->mask = n - 1;
    }
    ByteMapSlot s = {hash, off, len, value};
    bytemap_insert(m->slots, m->mask, &s);
    m->count++;
    return MN_OK;
}

int pairmap_init(PairMap *m, size_t expected) {
    size_t n = table_size(expected);
    m->keys = mn_calloc(n, sizeof *m->keys);
    m->values = mn_calloc(n, sizeof *m->values);
    if (!m->keys || !m->values) {
        pairmap_free(m);
        return MN_ERR_NOMEM;
    }
    memset(m->keys, 0xff, n * sizeof *m->keys);  // PAIR_EMPTY
    m->mask = n - 1;
    m->count = 0;
    m->shift = 64 - __builtin_ctzll(n);
    return MN_OK;
}

void pairmap_free(PairMap *m) {
    mn_free(m->keys);
    mn_free(m->values);
    m->keys = NULL;
    m->values = NULL;
}

static inline size_t pair_home(const PairMap *m, uint64_t key) {
    return (size_t)((key * 0x9e3779b97f4a7c15ull) >> m->shift);
}

int32_t pairmap_get(const PairMap *m, uint64_t key) {
    for (size_t i = pair_home(m, key);; i = (i + 1) & m->mask) {
        if (m->keys[i] == key) return m->values[i];
        if (m->keys[i] == PAIR_EMPTY) return -1;
    }
}

static int pairmap_grow(PairMap *m) {
    PairMap g;
    if (pairmap_init(&g, m->mask + 1)) return MN_ERR_NOMEM;
    for (size_t i = 0; i <= m->mask; i++) {
        if (m->keys[i] == PAIR_EMPTY) continue;
        size_t j = pair_home(&g, m->keys[i]);
        while (g.keys[j] != PAIR_EMPTY) j = (j + 1) & g.mask;
        g.keys[j] = m->keys[i];
        g.values[j] = m->values[i];
    }
    g.count = m->count;
    pairmap_free(m);
    *m = g;
    return MN_OK;
}

int32_t *pairmap_slot(PairMap *m, uint64_t key, int32_t init) {
    if (2 * (m->count + 1) > m->mask + 1 && pairmap_grow(m)) return NULL;
    size_t i = pair_home(m, key);
    for (; m->keys[i] != PAIR_EMPTY; i = (i + 1) & m->mask)
        if (m->keys[i] == key) return &m->values[i];
    m->keys[i] = key;
    m->values[i] = init;
    m->count++;
    return &m->values[i];
}

// ---------------------------------------------------------------------------
// Characters and the pre-tokenizer

enum { CH_OTHER, CH_LETTER, CH_NUMBER, CH_SPACE };
#define NOT_A_CHAR 0x110000u  // what an invalid UTF-8 byte decodes to

static inline int cont_in(const unsigned char *s, size_t n, size_t i, int lo, int hi) {
    return i < n && s[i] >= lo && s[i] <= hi;
}

// Decodes the character at s[0..n), n >= 1: returns its length in bytes and
// sets *cp. A byte that does not start a valid sequence (strict UTF-8: no
// overlongs, no surrogates, nothing above U+10FFFF) is a character of its own,
// NOT_A_CHAR.
static size_t utf8_char(const unsigned char *s, size_t n, uint32_t *cp) {
    unsigned b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    if (b >= 0xC2 && b < 0xE0 && cont_in(s, n, 1, 0x80, 0xBF)) {
        *cp = (b & 0x1F) << 6 | (s[1] & 0x3F);
        return 2;
    }
    if (b >= 0xE0 && b < 0xF0) {
        int lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;  // no overlongs, no surrogates
        if (cont_in(s, n, 1, lo, hi) && cont_in(s, n, 2, 0x80, 0xBF)) {
            *cp = (b & 0x0F) << 12 | (uint32_t)(s[1] & 0x3F) << 6 | (s[2] & 0x3F);
            return 3;
        }
    }
    if (b >= 0xF0 && b < 0xF5) {
        int lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;  // no overlongs, <= U+10FFFF
        if (cont_in(s, n, 1, lo, hi) && cont_in(s, n, 2, 0x80, 0xBF) && cont_in(s, n, 3, 0x80, 0xBF)) {
            *cp = (b & 0x07) << 18 | (uint32_t)(s[1] & 0x3F) << 12 | (uint32_t)(s[2] & 0x3F) << 6 | (s[3] & 0x3F);
            return 4;
        }
    }
    *cp = NOT_A_CHAR;
    return 1;
}

static int in_ranges(const UniRange *r, int n, uint32_t cp) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid].lo) hi = mid - 1;
        else if (cp > r[mid].hi) lo = mid + 1;
        else return 1;
    }
    return 0;
}

static int char_class(uint32_t cp) {
    if (cp < 128) {
        if ((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z') return CH_LETTER;
        if (cp >= '0' && cp <= '9') return CH_NUMBER;
        if (cp == ' ' || (cp >= 9 && cp <= 13)) return CH_SPACE;
        return CH_OTHER;
    }
    if (in_ranges(uni_letter, uni_letter_count, cp)) return CH_LETTER;
    if (in_ranges(uni_number, uni_number_count, cp)) return CH_NUMBER;
    if (in_ranges(uni_space, uni_space_count, cp)) return CH_SPACE;
    return CH_OTHER;  // includes NOT_A_CHAR
}

// The class of the character at text[pos] (pos < len); its length in *n.
static inline int class_at(const unsigned char *text, size_t len, size_t pos, size_t *n) {
    uint32_t cp;
    *n = utf8_char(text + pos, len - pos, &cp);
    return char_class(cp);
}

// The end of the run of characters of class cls that starts at pos.
static size_t run_end(const unsigned char *text, size_t len, size_t pos, int cls) {
    size_t n;
    while (pos < len && class_at(text, len, pos, &n) == cls) pos += n;
    return pos;
}

// The regex's alternatives in order; the first that matches at pos wins:
//   's|'t|'re|'ve|'m|'ll|'d     contractions (ASCII apostrophe, lower case)
//   ' ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+'   a run of one class, with one optional leading space
//   \s+(?!\S)   whitespace up to the end, or all but the last whitespace
//               character before a non-space (which then joins the next token)
//   \s+         a single whitespace character before a non-space
size_t bpe_pretoken_end(const unsigned char *text, size_t len, size_t pos) {
    if (pos >= len) return len;
    const unsigned char *t = text + pos;
    size_t rest = len - pos, n;
    if (t[0] == '\'' && rest >= 2) {
        if (t[1] == 's' || t[1] == 't' || t[1] == 'm' || t[1] == 'd') return pos + 2;
        if (rest >= 3 && ((t[1] == 'r' && t[2] == 'e') || (t[1] == 'v' && t[2] == 'e') || (t[1] == 'l' && t[2] == 'l')))
            return pos + 3;
    }
    if (t[0] == ' ' && rest >= 2) {
        int cls = class_at(text, len, pos + 1, &n);
        if (cls != CH_SPACE) return run_end(text, len, pos + 1, cls);
    }
    int cls = class_at(text, len, pos, &n);
    if (cls != CH_SPACE) return run_end(text, len, pos, cls);
    size_t last = pos, end = pos + n;  // last: where the run's last character starts
    while (end < len && class_at(text, len, end, &n) == CH_SPACE) {
        last = end;
        end += n;
    }
    if (end == len || last == pos) return end;
    return last;
}

// ---------------------------------------------------------------------------
// Loading

// Converts s[0..n), characters of GPT-2's byte alphabet in UTF-8, to the bytes
// they spell (out may be NULL to count them). Returns the number of bytes, or
// -1 with *bad set to the first character outside the alphabet.
static long spelled_bytes(const unsigned char *s, size_t n, unsigned char *out, uint32_t *bad) {
    long k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_char(s + i, n - i, &cp);
        int b = bpe_char_byte(cp);
        if (b < 0) {
            *bad = cp;
            return -1;
        }
        if (out) out[k] = (unsigned char)b;
        k++;
    }
    return k;
}

// Reads encoder.json into bpe->n, bytes and off.
static int read_encoder(Bpe *bpe, const char *path) {
    Json *root;
    MN_TRY(json_parse_file(path, &root));
    int s = MN_OK, n = root->count;
    if (root->type != JSON_OBJECT || n < 256) {
        s = mn_error(MN_ERR_FORMAT, "%s: expected a JSON object of at least 256 token strings -> ids, got %s", path,
                     root->type == JSON_OBJECT ? "fewer members" : "another JSON value");
        json_free(root);
        return s;
    }
    int32_t *member = malloc(sizeof(int32_t) * (size_t)n);  // member of each id, -1 if none yet
    bpe->off = mn_calloc((size_t)n + 1, sizeof *bpe->off);
    if (!member || !bpe->off) s = mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
    for (int i = 0; !s && i < n; i++) member[i] = -1;
    for (int i = 0; !s && i < n; i++) {
        const Json *m = &root->items[i];
        double v = m->number;
        if (m->type != JSON_NUMBER || !(v >= 0 && v < n) || v != (double)(int)v) {
            s = mn_error(MN_ERR_FORMAT, "%s:%d: token \"%s\": expected an integer id in [0, %d)", path, m->line, m->key,
                         n);
            break;
        }
        int id = (int)v;
        if (member[id] >= 0) {
            s = mn_error(MN_ERR_FORMAT, "%s:%d: id %d is given to two tokens (\"%s\" and \"%s\")", path, m->line, id,
                         root->items[member[id]].key, m->key);
            break;
        }
        member[id] = i;
        uint32_t bad;
        long k = spelled_bytes((const unsigned char *)m->key, strlen(m->key), NULL, &bad);
        if (k <= 0) {
            s = k < 0 ? mn_error(MN_ERR_FORMAT, "%s:%d: token \"%s\" has the character U+%04X, which is not in GPT-2's "
                                 "byte alphabet", path, m->line, m->key, bad)
                      : mn_error(MN_ERR_FORMAT, "%s:%d: empty token (id %d)", path, m->line, id);
            break;
        }
        bpe->off[id + 1] = (size_t)k;
    }
    if (!s) {  // n distinct ids in [0, n): every id has a token
        for (int i = 0; i < n; i++) bpe->off[i + 1] += bpe->off[i];
        bpe->n = n;
        bpe->bytes = malloc(bpe->off[n]);
        if (!bpe->bytes) s = mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
    }
    for (int id = 0; !s && id < n; id++) {
        const char *key = root->items[member[id]].key;
        uint32_t bad;
        spelled_bytes((const unsigned char *)key, strlen(key), bpe->bytes + bpe->off[id], &bad);
    }
    free(member);
    json_free(root);
    return s;
}

// Indexes the tokens by their bytes (into *map) and finds the byte tokens and EOT.
static int index_tokens(Bpe *bpe, ByteMap *map, const char *path) {
    MN_TRY(bytemap_init(map, (const unsigned char *const *)&bpe->bytes, (size_t)bpe->n));
    for (int id = 0; id < bpe->n; id++) {
        const unsigned char *p = bpe->bytes + bpe->off[id];
        size_t len = bpe->off[id + 1] - bpe->off[id];
        uint64_t h = bytes_hash(p, len);
        int32_t other = bytemap_get(map, p, len, h);
        if (other >= 0) return mn_error(MN_ERR_FORMAT, "%s: ids %d and %d are the same token", path, other, id);
        MN_TRY(bytemap_put(map, bpe->off[id], len, h, id));
    }
    for (int b = 0; b < 256; b++) {
        unsigned char c = (unsigned char)b;
        bpe->byte_id[b] = bytemap_get(map, &c, 1, bytes_hash(&c, 1));
        if (bpe->byte_id[b] < 0)
            return mn_error(MN_ERR_FORMAT, "%s: no token for the byte 0x%02X (spelled U+%04X)", path, b,
                            bpe_byte_char(b));
    }
    const unsigned char *eot = (const unsigned char *)EOT_TEXT;
    bpe->eot = bytemap_get(map, eot, sizeof EOT_TEXT - 1, bytes_hash(eot, sizeof EOT_TEXT - 1));
    return MN_OK;
}

// Looks up the token spelled by s[0..n) (a field of vocab.bpe); tmp has room.
static int merge_part(const ByteMap *map, const unsigned char *s, size_t n, unsigned char *tmp, int32_t *id,
                      const char *path, int line, const char *encoder_path) {
    uint32_t bad;
    long k = spelled_bytes(s, n, tmp, &bad);
    if (k < 0)
        return mn_error(MN_ERR_FORMAT, "%s:%d: the character U+%04X is not in GPT-2's byte alphabet", path, line, bad);
    *id = bytemap_get(map, tmp, (size_t)k, bytes_hash(tmp, (size_t)k));
    if (*id < 0)
        return mn_error(MN_ERR_FORMAT, "%s:%d: unknown token \"%.*s\" (not in %s)", path, line, (int)n, s,
                        encoder_path);
    return MN_OK;
}

// Reads vocab.bpe: one merge "LEFT RIGHT" per line after the "#version" line.
static int read_merges(Bpe *bpe, const ByteMap *map, const char *path, const char *encoder_path) {
    unsigned char *text = NULL, *tmp = NULL;
    size_t len = 0;
    int *made_at = NULL;  // line of the merge that makes each token; -1 for bytes, 0 if none
    char *raw = NULL;  // the whole of vocab.bpe (GPT-2's is 456 KB), NUL-terminated
    MN_TRY(file_read_all(path, (size_t)1 << 30, &raw, &len));
    text = (unsigned char *)raw;
    size_t lines = 0;
    for (size_t i = 0; i < len; i++) lines += text[i] == '\n';
    int s = MN_OK;
    tmp = malloc(len + 1);
    made_at = calloc((size_t)bpe->n, sizeof *made_at);
    bpe->merges = malloc(3 * sizeof(int32_t) * (lines + 1));
    if (!tmp || !made_at || !bpe->merges || pairmap_init(&bpe->ranks, lines))
        s = mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
    if (!s && (len < 8 || memcmp(text, "#version", 8)))
        s = mn_error(MN_ERR_FORMAT, "%s:1: expected a \"#version\" line first", path);
    for (int b = 0; !s && b < 256; b++) made_at[bpe->byte_id[b]] = -1;
    const unsigned char *p = text + len, *first_eol = s ? NULL : memchr(text, '\n', len);
    if (first_eol) p = first_eol + 1;  // the merges start on line 2
    for (int line = 2; !s && p < text + len; line++) {
        const unsigned char *eol = memchr(p, '\n', (size_t)(text + len - p));
        if (!eol) {
            s = mn_error(MN_ERR_FORMAT, "%s:%d: the last line has no newline (truncated file?)", path, line);
            break;
        }
        const unsigned char *sp = memchr(p, ' ', (size_t)(eol - p));
        if (!sp || sp == p || sp + 1 == eol || memchr(sp + 1, ' ', (size_t)(eol - sp - 1))) {
            s = mn_error(MN_ERR_FORMAT, "%s:%d: expected two tokens separated by one space", path, line);
            break;
        }
        int32_t a, b, c;
        s = merge_part(map, p, (size_t)(sp - p), tmp, &a, path, line, encoder_path);
        if (!s) s = merge_part(map, sp + 1, (size_t)(eol - sp - 1), tmp, &b, path, line, encoder_path);
        if (s) break;
        size_t la = bpe->off[a + 1] - bpe->off[a], lb = bpe->off[b + 1] - bpe->off[b];
        memcpy(tmp, bpe->bytes + bpe->off[a], la);
        memcpy(tmp + la, bpe->bytes + bpe->off[b], lb);
        c = bytemap_get(map, tmp, la + lb, bytes_hash(tmp, la + lb));
        if (!made_at[a] || !made_at[b])
            s = mn_error(MN_ERR_FORMAT, "%s:%d: token \"%.*s\" is used before a merge makes it", path, line,
                         !made_at[a] ? (int)(sp - p) : (int)(eol - sp - 1), !made_at[a] ? p : sp + 1);
        else if (c < 0)
            s = mn_error(MN_ERR_FORMAT, "%s:%d: the merge \"%.*s\" makes a token that is not in %s", path, line,
                         (int)(eol - p), p, encoder_path);
        else if (made_at[c])  // > 0: a merge never makes a single byte
            s = mn_error(MN_ERR_FORMAT, "%s:%d: the merge \"%.*s\" makes token %d, already made by line %d", path,
                         line, (int)(eol - p), p, c, made_at[c]);
        if (s) break;
        made_at[c] = line;
        int32_t r = bpe->nmerges++;
        bpe->merges[3 * r] = a;
        bpe->merges[3 * r + 1] = b;
        bpe->merges[3 * r + 2] = c;
        if (!pairmap_slot(&bpe->ranks, pair_key(a, b), r)) s = mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
        p = eol + 1;
    }
    free(text);
    free(tmp);
    free(made_at);
    return s;
}

int bpe_load(Bpe **out, const char *encoder_json_path, const char *vocab_bpe_path) {
    if (!out || !encoder_json_path || !vocab_bpe_path) return mn_error(MN_ERR_ARG, "bpe_load: NULL argument");
    *out = NULL;
    Bpe *bpe = calloc(1, sizeof *bpe);
    if (!bpe) return mn_error(MN_ERR_NOMEM, "bpe_load: out of memory");
    ByteMap map = {0};
    int s = read_encoder(bpe, encoder_json_path);
    if (!s) s = index_tokens(bpe, &map, encoder_json_path);
    if (!s) s = read_merges(bpe, &map, vocab_bpe_path, encoder_json_path);
    bytemap_free(&map);
    if (s) {
        bpe_free(bpe);
        return s;
    }
    *out = bpe;
    return MN_OK;
}

void bpe_free(Bpe *bpe) {
    if (!bpe) return;
    free(bpe->bytes);
    mn_free(bpe->off);
    free(bpe->merges);
    pairmap_free(&bpe->ranks);
    free(bpe);
}

int bpe_vocab_size(const Bpe *bpe) { return bpe ? bpe->n : -1; }
int bpe_eot(const Bpe *bpe) { return bpe ? bpe->eot : -1; }

// ---------------------------------------------------------------------------
// Encoding

typedef struct {  // a candidate merge of the symbols at pos and next[pos]
    int32_t rank, pos, left, right;
} Cand;

#define CACHE_MAX_WORD 64       // longer pre-tokens are rare and not cached
#define CACHE_MAX_WORDS (1 << 20)  // bounds the cache's memory (~100 MB)

typedef struct {  // the scratch space of one bpe_encode call
    int32_t *id, *next, *prev;  // [cap] the symbols of a pre-token, a linked list; id -1 once merged away
    Cand *heap;                 // [3 cap] candidate merges, a min-heap on (rank, pos)
    size_t cap, nheap;
    const unsigned char *text;  // the text being encoded, base of the cache's keys
    ByteMap cache;              // pre-token (offset, length in text) -> offset in cached
    int32_t *cached;            // ids of the cached pre-tokens, each run preceded by its length
    size_t ncached, capcached;
} Encoder;

static int grow_ids(int32_t **ids, size_t *cap, size_t need) {
    if (need <= *cap) return MN_OK;
    size_t c = *cap ? *cap : 256;
    while (c < need) c *= 2;
    int32_t *p = realloc(*ids, c * sizeof *p);
    if (!p) return mn_error(MN_ERR_NOMEM, "bpe_encode: out of memory for %zu ids", c);
    *ids = p;
    *cap = c;
    return MN_OK;
}

static int append_ids(int32_t **ids, size_t *n, size_t *cap, const int32_t *src, size_t k) {
    MN_TRY(grow_ids(ids, cap, *n + k));
    memcpy(*ids + *n, src, k * sizeof *src);
    *n += k;
    return MN_OK;
}

static int encoder_reserve(Encoder *e, size_t n) {
    if (n <= e->cap) return MN_OK;
    size_t c = e->cap ? 2 * e->cap : 64;
    while (c < n) c *= 2;
    free(e->id);
    free(e->next);
    free(e->prev);
    free(e->heap);
    e->id = malloc(c * sizeof *e->id);
    e->next = malloc(c * sizeof *e->next);
    e->prev = malloc(c * sizeof *e->prev);
    e->heap = malloc(3 * c * sizeof *e->heap);
    e->cap = c;
    if (!e->id || !e->next || !e->prev || !e->heap) {
        e->cap = 0;
        return mn_error(MN_ERR_NOMEM, "bpe_encode: out of memory for a pre-token of %zu bytes", n);
    }
    return MN_OK;
}

static void encoder_free(Encoder *e) {
    free(e->id);
    free(e->next);
    free(e->prev);
    free(e->heap);
    bytemap_free(&e->cache);
    free(e->cached);
}

static inline int cand_less(const Cand *a, const Cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

// Pushes the pair (pos, next[pos]) onto the heap if it has a merge.
static void push_cand(const Bpe *bpe, Encoder *e, int32_t pos) {
    int32_t q = e->next[pos];
    if (q < 0) return;
    int32_t rank = pairmap_get(&bpe->ranks, pair_key(e->id[pos], e->id[q]));
    if (rank < 0) return;
    Cand c = {rank, pos, e->id[pos], e->id[q]};
    size_t i = e->nheap++;
    while (i > 0 && cand_less(&c, &e->heap[(i - 1) / 2])) {
        e->heap[i] = e->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    e->heap[i] = c;
}

static Cand pop_cand(Encoder *e) {
    Cand top = e->heap[0], last = e->heap[--e->nheap];
    size_t i = 0, n = e->nheap;
    for (;;) {
        size_t k = 2 * i + 1;
        if (k >= n) break;
        if (k + 1 < n && cand_less(&e->heap[k + 1], &e->heap[k])) k++;
        if (!cand_less(&e->heap[k], &last)) break;
        e->heap[i] = e->heap[k];
        i = k;
    }
    if (n) e->heap[i] = last;
    return top;
}

// BPE on the bytes w[0..n), n >= 1: leaves the ids in e->id[0..], returns how many.
// A popped candidate is stale when either symbol has changed since it was
// pushed; tokens only grow, so a changed symbol never has its old id again.
static size_t merge_word(const Bpe *bpe, Encoder *e, const unsigned char *w, size_t n) {
    for (size_t i = 0; i < n; i++) {
        e->id[i] = bpe->byte_id[w[i]];
        e->prev[i] = (int32_t)i - 1;
        e->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    e->nheap = 0;
    for (size_t i = 0; i + 1 < n; i++) push_cand(bpe, e, (int32_t)i);
    while (e->nheap) {
        Cand c = pop_cand(e);
        int32_t p = c.pos, q = e->next[p];
        if (e->id[p] != c.left || q < 0 || e->id[q] != c.right) continue;
        e->id[p] = bpe->merges[3 * c.rank + 2];
        e->id[q] = -1;
        e->next[p] = e->next[q];
        if (e->next[q] >= 0) e->prev[e->next[q]] = p;
        if (e->prev[p] >= 0) push_cand(bpe, e, e->prev[p]);
        push_cand(bpe, e, p);
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = e->next[i]) e->id[k++] = e->id[i];
    return k;
}

// Appends the ids of the pre-token text[pos .. pos + n).
static int encode_word(const Bpe *bpe, Encoder *e, size_t pos, size_t n, int32_t **ids, size_t *nids, size_t *cap) {
    const unsigned char *w = e->text + pos;
    if (n == 1) return append_ids(ids, nids, cap, &bpe->byte_id[w[0]], 1);
    int cacheable = n <= CACHE_MAX_WORD && e->cache.count < CACHE_MAX_WORDS;
    uint64_t h = 0;
    if (cacheable) {
        h = bytes_hash(w, n);
        int32_t at = bytemap_get(&e->cache, w, n, h);
        if (at >= 0) return append_ids(ids, nids, cap, e->cached + at + 1, (size_t)e->cached[at]);
    }
    if (n > INT32_MAX / 4)
        return mn_error(MN_ERR_UNSUPPORTED, "bpe_encode: a pre-token of %zu bytes is longer than supported", n);
    MN_TRY(encoder_reserve(e, n));
    size_t k = merge_word(bpe, e, w, n);
    if (cacheable && e->ncached + k + 1 < INT32_MAX) {
        size_t at = e->ncached;
        MN_TRY(grow_ids(&e->cached, &e->capcached, at + k + 1));
        e->cached[at] = (int32_t)k;
        memcpy(e->cached + at + 1, e->id, k * sizeof *e->id);
        e->ncached += k + 1;
        if (bytemap_put(&e->cache, pos, n, h, (int32_t)at))
            return mn_error(MN_ERR_NOMEM, "bpe_encode: out of memory for the cache");
    }
    return append_ids(ids, nids, cap, e->id, k);
}

int bpe_encode(const Bpe *bpe, const unsigned char *text, size_t len, int32_t **ids, size_t *n, size_t *cap) {
    if (!bpe || !ids || !n || !cap || (!text && len)) return mn_error(MN_ERR_ARG, "bpe_encode: NULL argument");
    if (*n > *cap || (!*ids && *cap)) return mn_error(MN_ERR_ARG, "bpe_encode: bad id array (n %zu, cap %zu)", *n, *cap);
    Encoder e = {.text = text};
    int s = bytemap_init(&e.cache, &e.text, len < 4096 ? 16 : 1024);
    // Roughly one id per 3-4 bytes of text: reserving up front saves reallocs.
    if (!s) s = grow_ids(ids, cap, *n + len / 4 + 1);
    for (size_t pos = 0; !s && pos < len;) {
        size_t end = bpe_pretoken_end(text, len, pos);
        s = encode_word(bpe, &e, pos, end - pos, ids, n, cap);
        pos = end;
    }
    encoder_free(&e);
    return s;
}

// ---------------------------------------------------------------------------
// Decoding

int bpe_token_bytes(const Bpe *bpe, int32_t id, const unsigned char **bytes, size_t *len) {
    if (!bpe || !bytes || !len) return mn_error(MN_ERR_ARG, "bpe_token_bytes: NULL argument");
    if (id < 0 || id >= bpe->n) return mn_error(MN_ERR_ARG, "bpe_token_bytes: id %d is not in [0, %d)", id, bpe->n);
    *bytes = bpe->bytes + bpe->off[id];
    *len = bpe->off[id + 1] - bpe->off[id];
    return MN_OK;
}

int bpe_decode(const Bpe *bpe, const int32_t *ids, size_t n, unsigned char **out, size_t *out_len) {
    if (!bpe || !out || !out_len || (!ids && n)) return mn_error(MN_ERR_ARG, "bpe_decode: NULL argument");
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= bpe->n)
            return mn_error(MN_ERR_ARG, "bpe_decode: ids[%zu] = %d is not in [0, %d)", i, ids[i], bpe->n);
        total += bpe->off[ids[i] + 1] - bpe->off[ids[i]];
    }
    unsigned char *buf = malloc(total + 1);  // + 1: never malloc(0)
    if (!buf) return mn_error(MN_ERR_NOMEM, "bpe_decode: out of memory for %zu bytes", total);
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = bpe->off[ids[i] + 1] - bpe->off[ids[i]];
        memcpy(buf + at, bpe->bytes + bpe->off[ids[i]], k);
        at += k;
    }
    *out = buf;
    *out_len = total;
    return MN_OK;
}

int bpe_save(const Bpe *bpe, const char *out_dir) {
    if (!bpe || !out_dir) return mn_error(MN_ERR_ARG, "bpe_save: NULL argument");
    int32_t *pairs = malloc(2 * sizeof(int32_t) * ((size_t)bpe->nmerges + 1));
    if (!pairs) return mn_error(MN_ERR_NOMEM, "bpe_save: out of memory");
    for (int r = 0; r < bpe->nmerges; r++) {
        pairs[2 * r] = bpe->merges[3 * r];
        pairs[2 * r + 1] = bpe->merges[3 * r + 1];
    }
    int s = bpe_write_files(out_dir, bpe->bytes, bpe->off, bpe->n, pairs, bpe->nmerges);
    free(pairs);
    return s;
}
