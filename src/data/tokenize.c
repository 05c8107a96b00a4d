#include "tokenize.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "data/bpe.h"
#include "data/shard.h"

typedef struct {
    char *text;      // the document's bytes
    size_t len;
    int valid;       // held out for validation
} Doc;

typedef struct {
    Doc *docs;
    int n, cap;
    char **files;
    int nfiles, fcap;
} Corpus;

static int push_file(Corpus *c, const char *path) {
    if (c->nfiles == c->fcap) {
        int nc = c->fcap ? 2 * c->fcap : 64;
        char **nf = realloc(c->files, sizeof(char *) * (size_t)nc);
        if (!nf) return mn_error(MN_ERR_NOMEM, "out of memory");
        c->files = nf;
        c->fcap = nc;
    }
    c->files[c->nfiles] = strdup(path);
    if (!c->files[c->nfiles]) return mn_error(MN_ERR_NOMEM, "out of memory");
    c->nfiles++;
    return MN_OK;
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

// Adds `path` if it is a file, or every *.txt below it if it is a directory.
static int collect(Corpus *c, const char *path) {
    struct stat st;
    if (stat(path, &st)) return mn_error(MN_ERR_IO, "%s: no such file or directory", path);
    if (!S_ISDIR(st.st_mode)) return push_file(c, path);
    DIR *d = opendir(path);
    if (!d) return mn_error(MN_ERR_IO, "%s: cannot list the directory", path);
    struct dirent *e;
    int s = MN_OK;
    while (!s && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/%s", path, e->d_name);
        struct stat es;
        if (stat(sub, &es)) continue;
        if (S_ISDIR(es.st_mode))
            s = collect(c, sub);
        else if (ends_with(e->d_name, ".txt"))
            s = push_file(c, sub);
    }
    closedir(d);
    return s;
}

static int by_path(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int read_file(const char *path, char **out, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return mn_error(MN_ERR_IO, "%s: cannot open", path);
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) free(buf);
        buf = nb;
    }
    int err = ferror(f);
    fclose(f);
    if (!buf) return mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
    if (err) {
        free(buf);
        return mn_error(MN_ERR_IO, "%s: read error", path);
    }
    *out = buf;
    *len = n;
    return MN_OK;
}

static uint64_t fnv1a(const char *s, uint64_t h) {
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

static int push_doc(Corpus *c, char *text, size_t len, const char *name, int part, double valid_frac) {
    if (c->n == c->cap) {
        int nc = c->cap ? 2 * c->cap : 256;
        Doc *nd = realloc(c->docs, sizeof(Doc) * (size_t)nc);
        if (!nd) return mn_error(MN_ERR_NOMEM, "out of memory");
        c->docs = nd;
        c->cap = nc;
    }
    char key[32];
    snprintf(key, sizeof key, "#%d", part);
    // The split depends on the document's name only: adding files elsewhere never moves a document.
    uint64_t h = fnv1a(key, fnv1a(name, 0xcbf29ce484222325ull));
    Doc *d = &c->docs[c->n++];
    d->text = text;
    d->len = len;
    d->valid = (double)(h % 1000000) < valid_frac * 1e6;
    return MN_OK;
}

// Splits a file's text into documents at lines equal to sep (or keeps it whole).
static int add_documents(Corpus *c, const char *path, char *text, size_t len, const char *sep, double valid_frac) {
    if (!sep) return push_doc(c, text, len, path, 0, valid_frac);
    size_t sl = strlen(sep), start = 0;
    int part = 0;
    for (size_t i = 0; i <= len; i++) {
        int at_line = i == 0 || text[i - 1] == '\n';
        if (i < len && !(at_line && i + sl <= len && !memcmp(text + i, sep, sl) && (i + sl == len || text[i + sl] == '\n')))
            continue;
        if (i > start) {
            char *doc = malloc(i - start + 1);
            if (!doc) return mn_error(MN_ERR_NOMEM, "out of memory");
            memcpy(doc, text + start, i - start);
            MN_TRY(push_doc(c, doc, i - start, path, part++, valid_frac));
        }
        start = i + sl + 1;
        i += sl;
    }
    free(text);
    return MN_OK;
}

// One document alone cannot be split by documents: cut it at a line break.
static int ensure_both_splits(Corpus *c, double valid_frac) {
    int nvalid = 0;
    for (int i = 0; i < c->n; i++) nvalid += c->docs[i].valid;
    if (valid_frac <= 0 || (nvalid > 0 && nvalid < c->n)) return MN_OK;
    if (c->n >= 2) {  // all on one side: move the last document across
        for (int i = 0; i < c->n - 1; i++) c->docs[i].valid = 0;
        c->docs[c->n - 1].valid = 1;
        return MN_OK;
    }
    Doc *d = &c->docs[0];
    size_t cut = (size_t)((1 - valid_frac) * (double)d->len);
    while (cut < d->len && d->text[cut] != '\n') cut++;
    if (cut >= d->len) return mn_error(MN_ERR_ARG, "one document without line breaks cannot be split into train and validation");
    char *rest = malloc(d->len - cut);
    if (!rest) return mn_error(MN_ERR_NOMEM, "out of memory");
    memcpy(rest, d->text + cut + 1, d->len - cut - 1);
    size_t rest_len = d->len - cut - 1;
    d->len = cut;
    d->valid = 0;
    MN_TRY(push_doc(c, rest, rest_len, "split", 0, 0));
    c->docs[1].valid = 1;
    return MN_OK;
}

static void corpus_free(Corpus *c) {
    for (int i = 0; i < c->n; i++) free(c->docs[i].text);
    for (int i = 0; i < c->nfiles; i++) free(c->files[i]);
    free(c->docs);
    free(c->files);
}

// [BOS doc BOS doc ...] of one split.
static int encode_split(const Bpe *bpe, const Corpus *c, int valid, int32_t **ids, size_t *n) {
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    int32_t bos = bpe_eot(bpe);
    for (int i = 0; i < c->n; i++) {
        if (c->docs[i].valid != valid) continue;
        if (*n == cap) {
            size_t nc = cap ? 2 * cap : 1024;
            int32_t *ni = realloc(*ids, sizeof(int32_t) * nc);
            if (!ni) return mn_error(MN_ERR_NOMEM, "out of memory");
            *ids = ni;
            cap = nc;
        }
        (*ids)[(*n)++] = bos;
        MN_TRY(bpe_encode(bpe, (const unsigned char *)c->docs[i].text, c->docs[i].len, ids, n, &cap));
    }
    return MN_OK;
}

int tokenize_run(const TokenizeOptions *o, FILE *log) {
    if (o->ninputs <= 0) return mn_error(MN_ERR_ARG, "tokenize: no input files");
    if (!(o->valid_frac >= 0 && o->valid_frac < 1))
        return mn_error(MN_ERR_ARG, "tokenize: valid_frac = %g must be in [0, 1)", o->valid_frac);
    if (o->vocab == 0 && !o->bpe_dir) return mn_error(MN_ERR_ARG, "tokenize: give a vocabulary size or a BPE directory");
    if (o->vocab < 0 || (o->vocab > 0 && o->vocab < 257))
        return mn_error(MN_ERR_ARG, "tokenize: vocabulary size %d must be at least 257 (256 bytes + EOT)", o->vocab);
    MN_TRY(mn_mkdirs(o->out_dir));  // with its parents (data/ on a fresh clone)
    Corpus c = {0};
    Bpe *bpe = NULL;
    int32_t *ids = NULL;
    int s = MN_OK;
    for (int i = 0; i < o->ninputs && !s; i++) s = collect(&c, o->inputs[i]);
    if (!s && c.nfiles == 0) s = mn_error(MN_ERR_ARG, "tokenize: no .txt files found in the inputs");
    if (!s) qsort(c.files, (size_t)c.nfiles, sizeof(char *), by_path);
    size_t bytes = 0;
    for (int i = 0; i < c.nfiles && !s; i++) {
        char *text = NULL;
        size_t len = 0;
        if (!(s = read_file(c.files[i], &text, &len))) s = add_documents(&c, c.files[i], text, len, o->doc_sep, o->valid_frac);
        bytes += len;
    }
    if (!s) s = ensure_both_splits(&c, o->valid_frac);
    if (s) goto done;
    fprintf(log, "tokenize: %d file%s, %d document%s, %.1f MB\n", c.nfiles, plural_s(c.nfiles), c.n, plural_s(c.n), (double)bytes / 1e6);
    char enc[4096], merges[4096];
    snprintf(enc, sizeof enc, "%s/encoder.json", o->out_dir);
    snprintf(merges, sizeof merges, "%s/vocab.bpe", o->out_dir);
    if (o->vocab > 0) {
        size_t tl = 0;
        for (int i = 0; i < c.n; i++) tl += c.docs[i].valid ? 0 : c.docs[i].len + 1;
        char *train_text = malloc(tl ? tl : 1), *p = train_text;
        if (!train_text) {
            s = mn_error(MN_ERR_NOMEM, "out of memory");
            goto done;
        }
        for (int i = 0; i < c.n; i++)
            if (!c.docs[i].valid) {
                memcpy(p, c.docs[i].text, c.docs[i].len);
                p += c.docs[i].len;
                *p++ = '\n';
            }
        double t = mn_now();
        s = bpe_train((unsigned char *)train_text, tl, o->vocab, o->out_dir);
        free(train_text);
        if (s) goto done;
        fprintf(log, "tokenize: trained a %d-token BPE on the training documents in %.1f s\n", o->vocab, mn_now() - t);
        if ((s = bpe_load(&bpe, enc, merges))) goto done;
    } else {
        char e2[4096], m2[4096];
        snprintf(e2, sizeof e2, "%s/encoder.json", o->bpe_dir);
        snprintf(m2, sizeof m2, "%s/vocab.bpe", o->bpe_dir);
        if ((s = bpe_load(&bpe, e2, m2)) || (s = bpe_save(bpe, o->out_dir))) goto done;
    }
    if (bpe_eot(bpe) < 0) {
        s = mn_error(MN_ERR_FORMAT, "%s: the vocabulary has no <|endoftext|> token to separate documents", enc);
        goto done;
    }
    const char *names[2] = {"train", "valid"};
    for (int split = 0; split < 2 && !s; split++) {
        size_t n;
        double t = mn_now();
        if ((s = encode_split(bpe, &c, split, &ids, &n))) break;
        char path[4096];
        snprintf(path, sizeof path, "%s/%s.bin", o->out_dir, names[split]);
        s = shard_write(path, ids, n, (uint32_t)bpe_vocab_size(bpe), (uint32_t)bpe_eot(bpe));
        size_t split_bytes = 0;
        int ndocs = 0;
        for (int i = 0; i < c.n; i++)
            if (c.docs[i].valid == split) {
                split_bytes += c.docs[i].len;
                ndocs++;
            }
        if (!s)
            fprintf(log, "tokenize: %s: %d document%s, %zu tokens (%.2f bytes/token) -> %s (%.1f s)\n", names[split],
                    ndocs, plural_s(ndocs), n, n ? (double)split_bytes / (double)n : 0.0, path, mn_now() - t);
        free(ids);
        ids = NULL;
    }
done:
    free(ids);
    bpe_free(bpe);
    corpus_free(&c);
    return s;
}
