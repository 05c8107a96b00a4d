/*
 * safetensors reader and writer (format in safetensors.h).
 *
 * st_open reads the whole file into memory and validates it before anything
 * is handed out; each check names the file and what is wrong:
 *   - the file holds at least the 8-byte header length;
 *   - the header length is at most ST_MAX_HEADER and fits in the file;
 *   - the header is JSON, and an object;
 *   - "__metadata__", if present, is an object of strings;
 *   - every other member is an object with "dtype" (a known name), "shape"
 *     (at most 8 non-negative integers) and "data_offsets" ([begin, end],
 *     integers, begin <= end <= size of the data section);
 *   - end - begin == product(shape) * dtype size;
 *   - no two tensors share bytes, and no name appears twice.
 * After that every tensor's bytes lie inside the buffer, and reads need no
 * further bounds checks.
 *
 * Numbers are stored little-endian; this code assumes a little-endian host
 * (x86-64, ARM64) and says so at compile time.
 */
#include "safetensors.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "atomic_file.h"
#include "common.h"
#include "half.h"
#include "json.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors.c assumes a little-endian host"
#endif

static const struct {
    const char *name;
    size_t size;
} dtypes[] = {[ST_F32] = {"F32", 4}, [ST_F16] = {"F16", 2}, [ST_BF16] = {"BF16", 2},
              [ST_F64] = {"F64", 8}, [ST_I32] = {"I32", 4}, [ST_I64] = {"I64", 8}};
#define N_DTYPES ((int)(sizeof dtypes / sizeof dtypes[0]))

size_t st_dtype_size(StDtype d) { return (unsigned)d < (unsigned)N_DTYPES ? dtypes[d].size : 0; }

// Integers in JSON are doubles; 2^53 is where they stop being exact, far
// beyond any real size.
#define MAX_JSON_INT 9007199254740992.0

// A name and where it sits (in header order), sorted by name for lookups and
// for finding duplicates.
typedef struct {
    const char *name;
    int index;
} Named;

static int by_name(const void *a, const void *b) { return strcmp(((const Named *)a)->name, ((const Named *)b)->name); }

// Sorts a[0..n) by name; returns the first name that appears twice, or NULL.
static const char *sort_names(Named *a, int n) {
    qsort(a, (size_t)n, sizeof *a, by_name);
    for (int i = 1; i < n; i++)
        if (!strcmp(a[i - 1].name, a[i].name)) return a[i].name;
    return NULL;
}

static int find_name(const Named *a, int n, const char *name) {
    Named key = {name, -1};
    const Named *hit = bsearch(&key, a, (size_t)n, sizeof *a, by_name);
    return hit ? hit->index : -1;
}

// Product of dims, or -1 if it exceeds INT64_MAX / elem_size (so that the
// byte count fits too).
static int64_t count_elems(const int64_t *shape, int ndim, size_t elem_size) {
    int64_t n = 1, limit = INT64_MAX / (int64_t)elem_size;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] != 0 && n > limit / shape[d]) return -1;
        n *= shape[d];
    }
    return n;
}

// ===========================================================================
// Reading

typedef struct {
    const char *name;  // points into the parsed header
    StDtype dtype;
    int ndim;
    int64_t shape[ST_MAX_DIMS];
    int64_t numel;
    uint64_t begin, end;  // byte range in the data section
} Entry;

struct StFile {
    char *path;         // for messages
    Json *header;       // the parsed header; owns the names and metadata strings
    uint8_t *data;      // the data section
    uint64_t data_size;
    Entry *t;           // tensors in header order
    int n;
    Named *sorted;      // tensors sorted by name
    const Json *meta;   // the "__metadata__" object, or NULL
    Named *meta_sorted; // its keys sorted
};

// Reads a whole-number JSON value in [0, 2^53] into *v; 0 if it is not one.
static int json_uint(const Json *j, uint64_t *v) {
    if (!j || j->type != JSON_NUMBER || !(j->number >= 0 && j->number <= MAX_JSON_INT) ||
        j->number != (double)(uint64_t)j->number)
        return 0;
    *v = (uint64_t)j->number;
    return 1;
}

static int parse_dtype(const StFile *f, const char *tname, const Json *j, StDtype *out) {
    if (!j) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': missing \"dtype\"", f->path, tname);
    if (j->type != JSON_STRING) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': \"dtype\" must be a string", f->path, tname);
    for (int d = 0; d < N_DTYPES; d++)
        if (!strcmp(j->string, dtypes[d].name)) {
            *out = (StDtype)d;
            return MN_OK;
        }
    return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': unknown dtype \"%.32s\" (supported: F32, F16, BF16, F64, I32, I64)",
                    f->path, tname, j->string);
}

static int parse_shape(const StFile *f, const char *tname, const Json *j, Entry *e) {
    if (!j) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': missing \"shape\"", f->path, tname);
    if (j->type != JSON_ARRAY) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': \"shape\" must be an array", f->path, tname);
    if (j->count > ST_MAX_DIMS)
        return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': shape has %d dims, at most %d are supported", f->path, tname,
                        j->count, ST_MAX_DIMS);
    e->ndim = j->count;
    for (int d = 0; d < j->count; d++) {
        const Json *x = &j->items[d];
        if (x->type == JSON_NUMBER && x->number < 0)
            return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': negative dim %g in shape", f->path, tname, x->number);
        uint64_t v;
        if (!json_uint(x, &v))
            return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer", f->path, tname, d);
        e->shape[d] = (int64_t)v;
    }
    e->numel = count_elems(e->shape, e->ndim, dtypes[e->dtype].size);
    if (e->numel < 0) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': shape has too many elements", f->path, tname);
    return MN_OK;
}

static int parse_offsets(const StFile *f, const char *tname, const Json *j, Entry *e) {
    if (!j) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': missing \"data_offsets\"", f->path, tname);
    if (j->type != JSON_ARRAY || j->count != 2 || !json_uint(&j->items[0], &e->begin) || !json_uint(&j->items[1], &e->end))
        return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" must be [begin, end] with non-negative integers",
                        f->path, tname);
    if (e->begin > e->end)
        return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] has begin > end", f->path,
                        tname, e->begin, e->end);
    if (e->end > f->data_size)
        return mn_error(MN_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets end %" PRIu64 " is beyond the data section (%" PRIu64 " bytes)",
                        f->path, tname, e->end, f->data_size);
    uint64_t want = (uint64_t)e->numel * dtypes[e->dtype].size;
    if (e->end - e->begin != want)
        return mn_error(MN_ERR_FORMAT,
                        "%s: tensor '%s': data_offsets span %" PRIu64 " bytes, but shape x %s size needs %" PRIu64,
                        f->path, tname, e->end - e->begin, dtypes[e->dtype].name, want);
    return MN_OK;
}

static int parse_entry(const StFile *f, const Json *j, Entry *e) {
    const char *tname = j->key;
    e->name = tname;
    if (j->type != JSON_OBJECT) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s': entry must be an object", f->path, tname);
    MN_TRY(parse_dtype(f, tname, json_get(j, "dtype"), &e->dtype));
    MN_TRY(parse_shape(f, tname, json_get(j, "shape"), e));
    return parse_offsets(f, tname, json_get(j, "data_offsets"), e);
}

static int parse_meta(StFile *f, const Json *j) {
    if (f->meta) return mn_error(MN_ERR_FORMAT, "%s: duplicate \"__metadata__\" in header", f->path);
    if (j->type != JSON_OBJECT) return mn_error(MN_ERR_FORMAT, "%s: \"__metadata__\" must be an object", f->path);
    f->meta = j;
    f->meta_sorted = malloc(sizeof(Named) * (size_t)(j->count + 1));
    if (!f->meta_sorted) return mn_error(MN_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < j->count; i++) {
        if (j->items[i].type != JSON_STRING)
            return mn_error(MN_ERR_FORMAT, "%s: __metadata__ value of '%s' must be a string", f->path, j->items[i].key);
        f->meta_sorted[i] = (Named){j->items[i].key, i};
    }
    const char *dup = sort_names(f->meta_sorted, j->count);
    if (dup) return mn_error(MN_ERR_FORMAT, "%s: duplicate __metadata__ key '%s'", f->path, dup);
    return MN_OK;
}

// Byte ranges sorted by start; two non-empty tensors may not share a byte.
typedef struct {
    uint64_t begin, end;
    int index;
} Span;

static int by_begin(const void *a, const void *b) {
    const Span *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int check_overlaps(const StFile *f) {
    Span *s = malloc(sizeof(Span) * (size_t)(f->n + 1));
    if (!s) return mn_error(MN_ERR_NOMEM, "%s: out of memory", f->path);
    int m = 0;
    for (int i = 0; i < f->n; i++)
        if (f->t[i].end > f->t[i].begin) s[m++] = (Span){f->t[i].begin, f->t[i].end, i};
    qsort(s, (size_t)m, sizeof *s, by_begin);
    int status = MN_OK;
    for (int i = 1; i < m && !status; i++)
        if (s[i].begin < s[i - 1].end)
            status = mn_error(MN_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap in the data section", f->path,
                              f->t[s[i - 1].index].name, f->t[s[i].index].name);
    free(s);
    return status;
}

static int parse_header(StFile *f) {
    const Json *h = f->header;
    if (h->type != JSON_OBJECT) return mn_error(MN_ERR_FORMAT, "%s: header must be a JSON object", f->path);
    f->t = calloc((size_t)h->count + 1, sizeof(Entry));
    f->sorted = malloc(sizeof(Named) * ((size_t)h->count + 1));
    if (!f->t || !f->sorted) return mn_error(MN_ERR_NOMEM, "%s: out of memory", f->path);
    for (int i = 0; i < h->count; i++) {
        if (!strcmp(h->items[i].key, "__metadata__")) {
            MN_TRY(parse_meta(f, &h->items[i]));
            continue;
        }
        MN_TRY(parse_entry(f, &h->items[i], &f->t[f->n]));
        f->sorted[f->n] = (Named){f->t[f->n].name, f->n};
        f->n++;
    }
    const char *dup = sort_names(f->sorted, f->n);
    if (dup) return mn_error(MN_ERR_FORMAT, "%s: duplicate tensor name '%s'", f->path, dup);
    return check_overlaps(f);
}

static int read_exact(FILE *fp, const char *path, void *buf, uint64_t n, const char *what) {
    if (n && fread(buf, 1, (size_t)n, fp) != (size_t)n)
        return mn_error(MN_ERR_IO, "%s: short read of the %s (%" PRIu64 " bytes)", path, what, n);
    return MN_OK;
}

// Reads the header and data section of an open file into f.
static int load(StFile *f, FILE *fp) {
    struct stat sb;
    if (fstat(fileno(fp), &sb)) return mn_error(MN_ERR_IO, "%s: cannot stat: %s", f->path, strerror(errno));
    uint64_t size = (uint64_t)sb.st_size;
    if (size < 8)
        return mn_error(MN_ERR_FORMAT, "%s: file is %" PRIu64 " bytes, shorter than the 8-byte header length", f->path, size);
    uint8_t len8[8];
    MN_TRY(read_exact(fp, f->path, len8, 8, "header length"));
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | len8[i];
    if (hlen > ST_MAX_HEADER)
        return mn_error(MN_ERR_FORMAT, "%s: header length %" PRIu64 " is absurd (limit %u bytes): not a safetensors file?",
                        f->path, hlen, ST_MAX_HEADER);
    if (hlen > size - 8)
        return mn_error(MN_ERR_FORMAT, "%s: header length %" PRIu64 " exceeds the %" PRIu64 " bytes after it (truncated?)",
                        f->path, hlen, size - 8);
    char *text = malloc((size_t)hlen + 1);
    if (!text) return mn_error(MN_ERR_NOMEM, "%s: out of memory for the header", f->path);
    int s = read_exact(fp, f->path, text, hlen, "header");
    if (!s && json_parse(text, (size_t)hlen, f->path, &f->header)) {
        char why[512];
        snprintf(why, sizeof why, "%s", mn_last_error());
        s = mn_error(MN_ERR_FORMAT, "%s: header is not valid JSON: %s", f->path, why);
    }
    free(text);
    MN_TRY(s);
    f->data_size = size - 8 - hlen;
    f->data = mn_calloc((size_t)f->data_size, 1);
    if (!f->data) return MN_ERR_NOMEM;
    MN_TRY(read_exact(fp, f->path, f->data, f->data_size, "data section"));
    return parse_header(f);
}

int st_open(const char *path, StFile **out) {
    if (!path || !out) return mn_error(MN_ERR_ARG, "st_open: path and out must not be NULL");
    *out = NULL;
    StFile *f = calloc(1, sizeof *f);
    if (!f || !(f->path = strdup(path))) {
        free(f);
        return mn_error(MN_ERR_NOMEM, "%s: out of memory", path);
    }
    FILE *fp = fopen(path, "rb");
    if (!fp) {
        int e = errno;
        st_close(f);
        return mn_error(MN_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    int s = load(f, fp);
    fclose(fp);  // read-only: a failing close loses nothing
    if (s) {
        st_close(f);
        return s;
    }
    *out = f;
    return MN_OK;
}

void st_close(StFile *f) {
    if (!f) return;
    json_free(f->header);
    mn_free(f->data);
    free(f->t);
    free(f->sorted);
    free(f->meta_sorted);
    free(f->path);
    free(f);
}

int st_count(const StFile *f) { return f ? f->n : 0; }

int st_info(const StFile *f, int i, const char **name, StDtype *dtype, int *ndim, const int64_t **shape) {
    if (!f || i < 0 || i >= f->n) return mn_error(MN_ERR_ARG, "st_info: tensor index %d out of range [0, %d)", i, f ? f->n : 0);
    const Entry *e = &f->t[i];
    if (name) *name = e->name;
    if (dtype) *dtype = e->dtype;
    if (ndim) *ndim = e->ndim;
    if (shape) *shape = e->shape;
    return MN_OK;
}

int st_find(const StFile *f, const char *name) { return f && name ? find_name(f->sorted, f->n, name) : -1; }

const void *st_data(const StFile *f, int i, size_t *nbytes) {
    if (!f || i < 0 || i >= f->n) return NULL;
    if (nbytes) *nbytes = (size_t)(f->t[i].end - f->t[i].begin);
    return f->data + f->t[i].begin;
}

const char *st_meta(const StFile *f, const char *key) {
    if (!f || !f->meta || !key) return NULL;
    int i = find_name(f->meta_sorted, f->meta->count, key);
    return i < 0 ? NULL : f->meta->items[i].string;
}

int st_meta_count(const StFile *f) { return f && f->meta ? f->meta->count : 0; }

int st_meta_at(const StFile *f, int i, const char **key, const char **value) {
    int n = st_meta_count(f);
    if (i < 0 || i >= n) return mn_error(MN_ERR_ARG, "st_meta_at: index %d out of range [0, %d)", i, n);
    if (key) *key = f->meta->items[i].key;
    if (value) *value = f->meta->items[i].string;
    return MN_OK;
}

static void format_shape(char *buf, size_t cap, int ndim, const int64_t *shape) {
    size_t at = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < ndim && at < cap; d++)
        at += (size_t)snprintf(buf + at, cap - at, "%s%" PRId64, d ? ", " : "", shape[d]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

// Finds tensor `name` and checks it against what the caller expects: one of
// the dtypes allowed by the mask (bit d = StDtype d), n elements, and the
// shape if given.
static int lookup(const StFile *f, const char *name, unsigned dtype_mask, const char *kind, int64_t n, int ndim,
                  const int64_t *shape, const Entry **out) {
    if (!f || !name) return mn_error(MN_ERR_ARG, "st_read: file and name must not be NULL");
    int i = st_find(f, name);
    if (i < 0) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s' not found", f->path, name);
    const Entry *e = &f->t[i];
    if (!(dtype_mask >> e->dtype & 1u))
        return mn_error(MN_ERR_FORMAT, "%s: tensor '%s' has dtype %s, expected %s", f->path, name, dtypes[e->dtype].name, kind);
    char have[160], want[160];
    format_shape(have, sizeof have, e->ndim, e->shape);
    if (e->numel != n) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s' has %" PRId64 " elements (shape %s), expected %" PRId64,
                                       f->path, name, e->numel, have, n);
    if (shape) {
        int same = e->ndim == ndim;
        for (int d = 0; same && d < ndim; d++) same = e->shape[d] == shape[d];
        if (ndim < 0 || ndim > ST_MAX_DIMS) ndim = 0;
        format_shape(want, sizeof want, ndim, shape);
        if (!same) return mn_error(MN_ERR_FORMAT, "%s: tensor '%s' has shape %s, expected %s", f->path, name, have, want);
    }
    *out = e;
    return MN_OK;
}

int st_read_f32(const StFile *f, const char *name, float *out, int64_t n, int ndim, const int64_t *shape) {
    const Entry *e;
    unsigned mask = 1u << ST_F32 | 1u << ST_F16 | 1u << ST_BF16 | 1u << ST_F64;
    MN_TRY(lookup(f, name, mask, "a float dtype (F32, F16, BF16, F64)", n, ndim, shape, &e));
    if (n > 0 && !out) return mn_error(MN_ERR_ARG, "st_read_f32: out is NULL for tensor '%s'", name);
    const uint8_t *p = f->data + e->begin;  // not necessarily aligned: memcpy each element
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        double d;
        switch (e->dtype) {
        case ST_F32: memcpy(&out[i], p + 4 * i, 4); break;
        case ST_F16: memcpy(&h, p + 2 * i, 2); out[i] = f16_to_f32(h); break;
        case ST_BF16: memcpy(&h, p + 2 * i, 2); out[i] = bf16_to_f32(h); break;
        case ST_F64: memcpy(&d, p + 8 * i, 8); out[i] = (float)d; break;
        default: break;  // excluded by the mask
        }
    }
    return MN_OK;
}

int st_read_i64(const StFile *f, const char *name, int64_t *out, int64_t n, int ndim, const int64_t *shape) {
    const Entry *e;
    MN_TRY(lookup(f, name, 1u << ST_I32 | 1u << ST_I64, "an integer dtype (I32, I64)", n, ndim, shape, &e));
    if (n > 0 && !out) return mn_error(MN_ERR_ARG, "st_read_i64: out is NULL for tensor '%s'", name);
    const uint8_t *p = f->data + e->begin;
    if (e->dtype == ST_I64) {
        if (n > 0) memcpy(out, p, (size_t)n * 8);
        return MN_OK;
    }
    for (int64_t i = 0; i < n; i++) {
        int32_t v;
        memcpy(&v, p + 4 * i, 4);
        out[i] = v;
    }
    return MN_OK;
}

// ===========================================================================
// Writing

// A growing string; `failed` is sticky so that appends need no checks and the
// caller tests once at the end.
typedef struct {
    char *p;
    size_t len, cap;
    int failed;
} Buf;

static void buf_put(Buf *b, const char *s, size_t n) {
    if (b->failed) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

static void buf_printf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(Buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) b->failed = 1;  // only used for short numeric pieces
    else buf_put(b, tmp, (size_t)n);
}

// A JSON string literal, escaped as serde_json (the reference writer) does.
static void buf_json_string(Buf *b, const char *s) {
    buf_put(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        const char *esc = c == '"' ? "\\\"" : c == '\\' ? "\\\\" : c == '\n' ? "\\n" : c == '\r' ? "\\r"
                        : c == '\t' ? "\\t" : c == '\b' ? "\\b" : c == '\f' ? "\\f" : NULL;
        if (esc) buf_put(b, esc, 2);
        else if (c < 0x20) buf_printf(b, "\\u%04x", c);
        else buf_put(b, (const char *)&c, 1);
    }
    buf_put(b, "\"", 1);
}

static int check_write_args(const char *path, const StTensor *t, int n, const StMeta *meta, int nmeta) {
    if (!path || n < 0 || nmeta < 0 || (n > 0 && !t) || (nmeta > 0 && !meta))
        return mn_error(MN_ERR_ARG, "st_write %s: bad arguments (n=%d, nmeta=%d)", path ? path : "(null path)", n, nmeta);
    for (int i = 0; i < n; i++) {
        const char *name = t[i].name;
        if (!name || !name[0]) return mn_error(MN_ERR_ARG, "st_write %s: tensor %d has an empty name", path, i);
        if (!strcmp(name, "__metadata__"))
            return mn_error(MN_ERR_ARG, "st_write %s: \"__metadata__\" is reserved, not a tensor name", path);
        if ((unsigned)t[i].dtype >= (unsigned)N_DTYPES)
            return mn_error(MN_ERR_ARG, "st_write %s: tensor '%s': unknown dtype %d", path, name, (int)t[i].dtype);
        if (t[i].ndim < 0 || t[i].ndim > ST_MAX_DIMS)
            return mn_error(MN_ERR_ARG, "st_write %s: tensor '%s': ndim %d outside [0, %d]", path, name, t[i].ndim, ST_MAX_DIMS);
        for (int d = 0; d < t[i].ndim; d++)
            if (t[i].shape[d] < 0)
                return mn_error(MN_ERR_ARG, "st_write %s: tensor '%s': negative dim %" PRId64, path, name, t[i].shape[d]);
        int64_t numel = count_elems(t[i].shape, t[i].ndim, dtypes[t[i].dtype].size);
        if (numel < 0) return mn_error(MN_ERR_ARG, "st_write %s: tensor '%s': too many elements", path, name);
        if (numel > 0 && !t[i].data) return mn_error(MN_ERR_ARG, "st_write %s: tensor '%s': data is NULL", path, name);
    }
    for (int i = 0; i < nmeta; i++)
        if (!meta[i].key || !meta[i].key[0] || !meta[i].value)
            return mn_error(MN_ERR_ARG, "st_write %s: metadata entry %d has an empty key or a NULL value", path, i);
    return MN_OK;
}

// Fails on the first name that appears twice among the n names get(i) returns.
static int check_unique(const char *path, const char *what, int n, const char *(*get)(const void *, int), const void *arr) {
    Named *a = malloc(sizeof(Named) * (size_t)(n + 1));
    if (!a) return mn_error(MN_ERR_NOMEM, "st_write %s: out of memory", path);
    for (int i = 0; i < n; i++) a[i] = (Named){get(arr, i), i};
    const char *dup = sort_names(a, n);
    int s = dup ? mn_error(MN_ERR_ARG, "st_write %s: duplicate %s '%s'", path, what, dup) : MN_OK;
    free(a);
    return s;
}

static const char *tensor_name(const void *a, int i) { return ((const StTensor *)a)[i].name; }
static const char *meta_key(const void *a, int i) { return ((const StMeta *)a)[i].key; }

// The header JSON, compact like the reference writer, padded with spaces to a
// multiple of 8 bytes; sizes[i] receives tensor i's byte count.
static void build_header(Buf *b, const StTensor *t, int n, const StMeta *meta, int nmeta, uint64_t *sizes) {
    buf_put(b, "{", 1);
    if (nmeta > 0) {
        buf_put(b, "\"__metadata__\":{", 16);
        for (int i = 0; i < nmeta; i++) {
            if (i) buf_put(b, ",", 1);
            buf_json_string(b, meta[i].key);
            buf_put(b, ":", 1);
            buf_json_string(b, meta[i].value);
        }
        buf_put(b, "}", 1);
    }
    uint64_t offset = 0;
    for (int i = 0; i < n; i++) {
        if (i || nmeta > 0) buf_put(b, ",", 1);
        buf_json_string(b, t[i].name);
        buf_printf(b, ":{\"dtype\":\"%s\",\"shape\":[", dtypes[t[i].dtype].name);
        for (int d = 0; d < t[i].ndim; d++) buf_printf(b, "%s%" PRId64, d ? "," : "", t[i].shape[d]);
        sizes[i] = (uint64_t)count_elems(t[i].shape, t[i].ndim, 1) * dtypes[t[i].dtype].size;
        buf_printf(b, "],\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}", offset, offset + sizes[i]);
        offset += sizes[i];
    }
    buf_put(b, "}", 1);
    while (!b->failed && b->len % 8) buf_put(b, " ", 1);
}

static int write_file(const char *path, const Buf *header, const StTensor *t, int n, const uint64_t *sizes) {
    uint8_t len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (uint8_t)((uint64_t)header->len >> (8 * i));
    AtomicFile af;
    MN_TRY(af_open(&af, path));
    int s = af_write(&af, len8, 8);
    if (!s) s = af_write(&af, header->p, header->len);
    for (int i = 0; i < n && !s; i++) s = af_write(&af, t[i].data, (size_t)sizes[i]);
    if (s) {
        af_abort(&af);
        return s;
    }
    return af_commit(&af);
}

int st_write(const char *path, const StTensor *t, int n, const StMeta *meta, int nmeta) {
    MN_TRY(check_write_args(path, t, n, meta, nmeta));
    MN_TRY(check_unique(path, "tensor name", n, tensor_name, t));
    MN_TRY(check_unique(path, "metadata key", nmeta, meta_key, meta));
    Buf header = {0};
    uint64_t *sizes = calloc((size_t)n + 1, sizeof *sizes);
    if (sizes) build_header(&header, t, n, meta, nmeta, sizes);
    int s = !sizes || header.failed ? mn_error(MN_ERR_NOMEM, "st_write %s: out of memory for the header", path)
                                    : write_file(path, &header, t, n, sizes);
    free(header.p);
    free(sizes);
    return s;
}
