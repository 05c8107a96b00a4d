#include "json.h"

#include <float.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "atomic_file.h"
#include "common.h"

// The largest JSON file json_parse_file reads (configs are tiny; GPT-2's encoder.json is 1 MB).
#define JSON_MAX_FILE ((size_t)1 << 30)

typedef struct {
    const char *s, *end, *name;
    int line;
} Parser;

static int fail(Parser *p, const char *what) {
    return mn_error(MN_ERR_FORMAT, "%s:%d: %s", p->name, p->line, what);
}

static void skip_space(Parser *p) {
    while (p->s < p->end && (*p->s == ' ' || *p->s == '\t' || *p->s == '\n' || *p->s == '\r')) {
        if (*p->s == '\n') p->line++;
        p->s++;
    }
}

static int parse_value(Parser *p, Json *out, int depth);

static int hex4(Parser *p, unsigned *u) {
    if (p->end - p->s < 4) return fail(p, "truncated \\u escape");
    *u = 0;
    for (int i = 0; i < 4; i++) {
        char c = *p->s++;
        *u <<= 4;
        if (c >= '0' && c <= '9') *u |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') *u |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') *u |= (unsigned)(c - 'A' + 10);
        else return fail(p, "bad hex digit in \\u escape");
    }
    return MN_OK;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18)); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

// Parses a string starting after its opening quote; the result never grows
// beyond the source length, so one allocation of that size is enough.
static int parse_string(Parser *p, char **out, size_t *out_len) {
    const char *start = p->s;
    while (p->s < p->end && *p->s != '"') p->s += (*p->s == '\\') ? 2 : 1;
    if (p->s >= p->end) return fail(p, "unterminated string");
    char *o = malloc((size_t)(p->s - start) + 1);
    if (!o) return mn_error(MN_ERR_NOMEM, "out of memory parsing %s", p->name);
    size_t n = 0;
    p->s = start;
    while (*p->s != '"') {
        char c = *p->s++;
        if (c != '\\') { o[n++] = c; continue; }
        c = *p->s++;
        switch (c) {
        case '"': o[n++] = '"'; break;
        case '\\': o[n++] = '\\'; break;
        case '/': o[n++] = '/'; break;
        case 'b': o[n++] = '\b'; break;
        case 'f': o[n++] = '\f'; break;
        case 'n': o[n++] = '\n'; break;
        case 'r': o[n++] = '\r'; break;
        case 't': o[n++] = '\t'; break;
        case 'u': {
            unsigned u;
            if (hex4(p, &u)) { free(o); return MN_ERR_FORMAT; }
            if (u >= 0xD800 && u < 0xDC00 && p->end - p->s >= 6 && p->s[0] == '\\' && p->s[1] == 'u') {
                unsigned lo;
                p->s += 2;
                if (hex4(p, &lo)) { free(o); return MN_ERR_FORMAT; }
                if (lo >= 0xDC00 && lo < 0xE000) u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
                else { n += put_utf8(o + n, u); u = lo; }
            }
            n += put_utf8(o + n, u);
            break;
        }
        default: free(o); return fail(p, "bad escape in string");
        }
    }
    p->s++;
    o[n] = 0;
    *out = o;
    *out_len = n;
    return MN_OK;
}

static int push(Json **items, int *count, int *cap, Json **slot) {
    if (*count == *cap) {
        if (*cap > INT_MAX / 2) return mn_error(MN_ERR_FORMAT, "JSON array or object of more than %d values", *cap);
        int nc = *cap ? 2 * *cap : 4;
        Json *ni = realloc(*items, sizeof(Json) * (size_t)nc);
        if (!ni) return mn_error(MN_ERR_NOMEM, "out of memory parsing JSON");
        *items = ni;
        *cap = nc;
    }
    *slot = &(*items)[(*count)++];
    memset(*slot, 0, sizeof **slot);
    return MN_OK;
}

static int parse_container(Parser *p, Json *out, int depth, char close) {
    int cap = 0;
    p->s++;
    skip_space(p);
    if (p->s < p->end && *p->s == close) { p->s++; return MN_OK; }
    for (;;) {
        Json *slot = NULL;
        MN_TRY(push(&out->items, &out->count, &cap, &slot));
        skip_space(p);
        if (close == '}') {
            if (p->s >= p->end || *p->s != '"') return fail(p, "expected a member name in quotes");
            p->s++;
            size_t kl;
            MN_TRY(parse_string(p, &slot->key, &kl));
            skip_space(p);
            if (p->s >= p->end || *p->s != ':') return fail(p, "expected ':' after a member name");
            p->s++;
        }
        char *key = slot->key;
        MN_TRY(parse_value(p, slot, depth + 1));
        slot->key = key;
        skip_space(p);
        if (p->s < p->end && *p->s == ',') { p->s++; continue; }
        if (p->s < p->end && *p->s == close) { p->s++; return MN_OK; }
        return fail(p, close == '}' ? "expected ',' or '}' in object" : "expected ',' or ']' in array");
    }
}

static int parse_value(Parser *p, Json *out, int depth) {
    if (depth > 200) return fail(p, "nesting too deep");
    skip_space(p);
    if (p->s >= p->end) return fail(p, "unexpected end of input");
    out->line = p->line;
    char c = *p->s;
    if (c == '{') { out->type = JSON_OBJECT; return parse_container(p, out, depth, '}'); }
    if (c == '[') { out->type = JSON_ARRAY; return parse_container(p, out, depth, ']'); }
    if (c == '"') { out->type = JSON_STRING; p->s++; return parse_string(p, &out->string, &out->string_len); }
    static const struct { const char *word; JsonType type; double value; } words[] = {
        {"true", JSON_BOOL, 1}, {"false", JSON_BOOL, 0}, {"null", JSON_NULL, 0}};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(words[i].word);
        if ((size_t)(p->end - p->s) >= n && !memcmp(p->s, words[i].word, n)) {
            out->type = words[i].type;
            out->number = words[i].value;
            p->s += n;
            return MN_OK;
        }
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        char buf[64];
        size_t n = 0;
        while (p->s + n < p->end && n < sizeof buf - 1 && strchr("+-0123456789.eE", p->s[n])) n++;
        memcpy(buf, p->s, n);
        buf[n] = 0;
        char *e;
        out->number = strtod(buf, &e);
        if (e != buf + n) return fail(p, "bad number");
        out->type = JSON_NUMBER;
        p->s += n;
        return MN_OK;
    }
    return fail(p, "unexpected character");
}

int json_parse(const char *text, size_t len, const char *name, Json **out) {
    Parser p = {text, text + len, name ? name : "<json>", 1};
    Json *root = calloc(1, sizeof *root);
    if (!root) return mn_error(MN_ERR_NOMEM, "out of memory");
    int s = parse_value(&p, root, 0);
    if (!s) {
        skip_space(&p);
        if (p.s != p.end) s = fail(&p, "trailing characters after the JSON value");
    }
    if (s) { json_free(root); return s; }
    *out = root;
    return MN_OK;
}

int json_parse_file(const char *path, Json **out) {
    char *text;
    size_t n;
    // A regular file (a directory is refused as one, not read as a huge size) of sane size.
    MN_TRY(file_read_all(path, JSON_MAX_FILE, &text, &n));
    int s = json_parse(text, n, path, out);
    free(text);
    return s;
}

static void free_node(Json *j) {
    for (int i = 0; i < j->count; i++) free_node(&j->items[i]);
    free(j->items);
    free(j->string);
    free(j->key);
}

void json_free(Json *j) {
    if (!j) return;
    free_node(j);
    free(j);
}

const Json *json_get(const Json *obj, const char *key) {
    if (!obj || obj->type != JSON_OBJECT) return NULL;
    for (int i = 0; i < obj->count; i++)
        if (!strcmp(obj->items[i].key, key)) return &obj->items[i];
    return NULL;
}

static int flatten(const Json *j, double *out, size_t n, size_t *at) {
    if (j->type == JSON_NUMBER) {
        if (*at < n) out[*at] = j->number;
        (*at)++;
        return MN_OK;
    }
    if (j->type != JSON_ARRAY) return MN_ERR_FORMAT;
    for (int i = 0; i < j->count; i++) MN_TRY(flatten(&j->items[i], out, n, at));
    return MN_OK;
}

int json_numbers(const Json *j, double *out, size_t n, const char *what) {
    size_t at = 0;
    if (!j) return mn_error(MN_ERR_FORMAT, "%s: missing", what);
    if (flatten(j, out, n, &at)) return mn_error(MN_ERR_FORMAT, "%s (line %d): expected numbers", what, j->line);
    if (at != n) return mn_error(MN_ERR_FORMAT, "%s (line %d): expected %zu numbers, found %zu", what, j->line, n, at);
    return MN_OK;
}

// Checked to be a whole number within the int range before the conversion (which is undefined
// behaviour outside it).
int json_int(const Json *v, const char *key, const char *where, int *out) {
    if (v->type != JSON_NUMBER && v->type != JSON_BOOL)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be a number", where, v->line, key);
    double x = v->number;
    if (!(x == floor(x) && fabs(x) <= 1e9))  // (NaN fails the comparison)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be an integer of at most 1e9 in size, got %g", where, v->line,
                        key, x);
    *out = (int)x;
    return MN_OK;
}

// Refused unless finite and within the float range: converting a larger double is undefined
// behaviour, and an infinity would be saved as a config that cannot be read.
int json_float(const Json *v, const char *key, const char *where, float *out) {
    if (v->type != JSON_NUMBER)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be a number", where, v->line, key);
    if (!isfinite(v->number) || fabs(v->number) > FLT_MAX)
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" = %g is not a finite number in the float range", where, v->line, key,
                        v->number);
    *out = (float)v->number;
    return MN_OK;
}

int json_flag(const Json *v, const char *key, const char *where, int *out) {
    if ((v->type != JSON_BOOL && v->type != JSON_NUMBER) || !(v->number == 0 || v->number == 1))
        return mn_error(MN_ERR_FORMAT, "%s:%d: \"%s\" must be true or false", where, v->line, key);
    *out = v->number == 1;
    return MN_OK;
}

void json_float_text(char *buf, size_t n, double v, int single) {
    for (int digits = 1; digits <= 17; digits++) {
        snprintf(buf, n, "%.*g", digits, v);
        if (single ? strtof(buf, NULL) == (float)v : strtod(buf, NULL) == v) break;
    }
    if (!strpbrk(buf, ".eEn")) snprintf(buf + strlen(buf), n - strlen(buf), ".0");
}
