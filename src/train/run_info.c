/*
 * run.json: a run's training settings (run_info.h).
 */
#include "run_info.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/atomic_file.h"
#include "core/common.h"
#include "core/json.h"

static void run_json_path(char *out, size_t n, const char *run_dir) { snprintf(out, n, "%s/run.json", run_dir); }

int run_info_exists(const char *run_dir) {
    char path[4096];
    run_json_path(path, sizeof path, run_dir);
    return access(path, F_OK) == 0;
}

// A string member into out[cap]; refused unless present, a string without NUL bytes and short enough.
static int get_string(const Json *j, const char *key, const char *name, char *out, size_t cap) {
    const Json *v = json_get(j, key);
    if (!v || v->type != JSON_STRING || v->string_len >= cap || strlen(v->string) != v->string_len)
        return mn_error(MN_ERR_FORMAT, "%s: \"%s\" must be a string shorter than %zu bytes", name, key, cap);
    memcpy(out, v->string, v->string_len + 1);
    return MN_OK;
}

// A whole-number member in [min, max] (checked before the conversion).
static int get_number(const Json *j, const char *key, const char *name, double min, double max, double *out) {
    const Json *v = json_get(j, key);
    if (!v || v->type != JSON_NUMBER || !(v->number >= min && v->number <= max) || v->number != (double)(int64_t)v->number)
        return mn_error(MN_ERR_FORMAT, "%s: \"%s\" must be a whole number from %.0f to %.0f", name, key, min, max);
    *out = v->number;
    return MN_OK;
}

int run_info_parse(const char *text, size_t len, const char *name, RunInfo *info) {
    memset(info, 0, sizeof *info);
    Json *j;
    MN_TRY(json_parse(text, len, name, &j));
    double seq = 0, batch = 0, accum = 0, tokens = 0;
    int s = j->type == JSON_OBJECT ? MN_OK : mn_error(MN_ERR_FORMAT, "%s: not a JSON object", name);
    if (!s) s = get_string(j, "config", name, info->config, sizeof info->config);
    if (!s) s = get_string(j, "data", name, info->data, sizeof info->data);
    if (!s) s = get_string(j, "data_given", name, info->data_given, sizeof info->data_given);
    if (!s) s = get_number(j, "seq", name, 1, 1 << 30, &seq);
    if (!s) s = get_number(j, "batch", name, 1, 1 << 30, &batch);
    if (!s) s = get_number(j, "accum", name, 1, 1 << 30, &accum);
    if (!s) s = get_number(j, "train_tokens", name, 0, 9007199254740992.0, &tokens);  // 2^53: exact in JSON's doubles
    json_free(j);
    if (s) {
        memset(info, 0, sizeof *info);
        return s;
    }
    info->seq = (int)seq;
    info->batch = (int)batch;
    info->accum = (int)accum;
    info->train_tokens = (uint64_t)tokens;
    return MN_OK;
}

int run_info_read(const char *run_dir, RunInfo *info) {
    char path[4096];
    run_json_path(path, sizeof path, run_dir);
    char *text;
    size_t n;
    memset(info, 0, sizeof *info);
    MN_TRY(file_read_all(path, 1 << 20, &text, &n));
    int s = run_info_parse(text, n, path, info);
    free(text);
    return s;
}

// s as a JSON string: quotes, backslashes and control characters escaped (paths may hold any byte
// but NUL; bytes of 0x80 and above pass as they are, UTF-8 or not, as the reader takes them).
static void put_json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') fprintf(f, "\\%c", *p);
        else if (*p < 0x20) fprintf(f, "\\u%04x", *p);
        else fputc(*p, f);
    }
    fputc('"', f);
}

int run_info_write(const char *run_dir, const RunInfo *info) {
    char path[4096];
    run_json_path(path, sizeof path, run_dir);
    AtomicFile af;
    MN_TRY(af_open(&af, path));
    FILE *f = af.f;
    fprintf(f, "{\n  \"config\": ");
    put_json_string(f, info->config);
    fprintf(f, ",\n  \"data\": ");
    put_json_string(f, info->data);
    fprintf(f, ",\n  \"data_given\": ");
    put_json_string(f, info->data_given);
    fprintf(f, ",\n  \"seq\": %d,\n  \"batch\": %d,\n  \"accum\": %d,\n  \"train_tokens\": %" PRIu64 "\n}\n", info->seq,
            info->batch, info->accum, info->train_tokens);
    return af_commit(&af);
}
