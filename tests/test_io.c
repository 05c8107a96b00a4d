// safetensors reader/writer and the 16-bit float conversions: round trips,
// the exact bytes of the format, and refusal of corrupt or truncated files.
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/half.h"
#include "core/safetensors.h"
#include "test.h"
#include "tmpdir.h"

static uint16_t bf16_of_bits(uint32_t u) { return f32_to_bf16(mn_bits_f32(u)); }

static int64_t numel(int ndim, const int64_t *shape) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    return n;
}

// Expected message fragments: the failing call's status and mn_last_error().
#define CHECK_FAILS(call, code, fragment)                                                            \
    do {                                                                                             \
        int s_ = (call);                                                                             \
        CHECK(s_ == (code), "%s: status %d, expected %d (%s)", #call, s_, (code), mn_last_error()); \
        CHECK(strstr(mn_last_error(), (fragment)), "%s: message \"%s\" lacks \"%s\"", #call,       \
              mn_last_error(), (fragment));                                                         \
    } while (0)

// ---------------------------------------------------------------------------
// Round trip

TEST(io_st_roundtrip) {
    TmpDir td;
    tmp_make(&td);
    float a[6] = {1.5f, -2.25f, 3e-8f, 1e30f, -0.0f, 7.0f};
    uint16_t b[4] = {f32_to_bf16(1.0f), f32_to_bf16(-3.5f), f32_to_bf16(0.1f), 0x7fc0};
    int64_t steps[3] = {0, -1, INT64_MAX};
    float scalar = 42.0f;
    int32_t ids[2] = {-7, INT32_MAX};
    double w64[2] = {0.1, -1e300};
    uint16_t h16[3] = {0x3c00, 0x0001, 0xc000};  // 1, 2^-24, -2
    StTensor t[] = {
        {"layers.0.w", ST_F32, 2, {2, 3}, a},
        {"b", ST_BF16, 1, {4}, b},
        {"opt.step", ST_I64, 1, {3}, steps},
        {"scalar", ST_F32, 0, {0}, &scalar},
        {"empty", ST_F32, 2, {0, 5}, NULL},
        {"ids", ST_I32, 1, {2}, ids},
        {"w64", ST_F64, 1, {2}, w64},
        {"h16", ST_F16, 1, {3}, h16},
    };
    int n = (int)(sizeof t / sizeof t[0]);
    StMeta meta[] = {{"format", "pt"}, {"config", "{\"d\": 64,\n\t\"name\": \"m\\\\x\"}"}, {"unicode", "\xce\xbb=0.5"}};
    const char *path = tmp_path(&td, "rt.safetensors");
    CHECK(!st_write(path, t, n, meta, 3), "st_write: %s", mn_last_error());

    StFile *f;
    if (st_open(path, &f)) {
        CHECK(0, "st_open: %s", mn_last_error());
        tmp_remove(&td);
        return;
    }
    CHECK(st_count(f) == n, "count %d != %d", st_count(f), n);
    for (int i = 0; i < n && i < st_count(f); i++) {
        const char *name;
        StDtype dt;
        int nd;
        const int64_t *shape;
        CHECK(!st_info(f, i, &name, &dt, &nd, &shape), "st_info %d", i);
        CHECK(!strcmp(name, t[i].name) && dt == t[i].dtype && nd == t[i].ndim, "tensor %d: %s %d %d", i, name, dt, nd);
        for (int d = 0; d < nd; d++) CHECK(shape[d] == t[i].shape[d], "%s dim %d", name, d);
        CHECK(st_find(f, t[i].name) == i, "st_find(%s)", t[i].name);
        size_t nb;
        const void *raw = st_data(f, i, &nb);
        size_t want = (size_t)numel(t[i].ndim, t[i].shape) * st_dtype_size(dt);
        CHECK(raw && nb == want && (!nb || !memcmp(raw, t[i].data, nb)), "%s: raw bytes differ", name);
    }
    CHECK(st_find(f, "missing") == -1, "st_find of an absent name");
    CHECK(st_info(f, n, NULL, NULL, NULL, NULL) == MN_ERR_ARG, "st_info out of range");

    float fa[6], fb[4], fs, f64[2], fh[3];
    int64_t shape_a[2] = {2, 3};
    CHECK(!st_read_f32(f, "layers.0.w", fa, 6, 2, shape_a), "%s", mn_last_error());
    CHECK(!memcmp(fa, a, sizeof a), "F32 values differ");
    CHECK(!st_read_f32(f, "b", fb, 4, 0, NULL), "%s", mn_last_error());
    CHECK(fb[0] == 1.0f && fb[1] == -3.5f && fb[2] == bf16_to_f32(f32_to_bf16(0.1f)) && isnan(fb[3]), "BF16 values");
    CHECK(!st_read_f32(f, "scalar", &fs, 1, 0, (const int64_t[1]){0}) && fs == 42.0f, "scalar: %s", mn_last_error());
    CHECK(!st_read_f32(f, "empty", NULL, 0, 2, (const int64_t[]){0, 5}), "empty: %s", mn_last_error());
    CHECK(!st_read_f32(f, "w64", f64, 2, 0, NULL) && f64[0] == 0.1f && isinf(f64[1]), "F64 -> float");
    CHECK(!st_read_f32(f, "h16", fh, 3, 0, NULL) && fh[0] == 1 && fh[1] == 0x1p-24f && fh[2] == -2, "F16 -> float");
    int64_t is[3], ii[2];
    CHECK(!st_read_i64(f, "opt.step", is, 3, 1, (const int64_t[]){3}) && !memcmp(is, steps, sizeof steps), "I64");
    CHECK(!st_read_i64(f, "ids", ii, 2, 0, NULL) && ii[0] == -7 && ii[1] == INT32_MAX, "I32 -> int64");

    // Mismatches are refused with a message naming the file and the tensor.
    CHECK_FAILS(st_read_f32(f, "layers.0.w", fa, 5, 0, NULL), MN_ERR_FORMAT, "has 6 elements");
    CHECK_FAILS(st_read_f32(f, "layers.0.w", fa, 6, 2, (const int64_t[]){3, 2}), MN_ERR_FORMAT,
                "has shape [2, 3], expected [3, 2]");
    CHECK(strstr(mn_last_error(), path) && strstr(mn_last_error(), "layers.0.w"), "message: %s", mn_last_error());
    CHECK_FAILS(st_read_f32(f, "nope", fa, 1, 0, NULL), MN_ERR_FORMAT, "tensor 'nope' not found");
    CHECK_FAILS(st_read_f32(f, "opt.step", fa, 3, 0, NULL), MN_ERR_FORMAT, "has dtype I64, expected a float dtype");
    CHECK_FAILS(st_read_i64(f, "b", is, 4, 0, NULL), MN_ERR_FORMAT, "has dtype BF16, expected an integer dtype");

    CHECK(st_meta_count(f) == 3, "meta count %d", st_meta_count(f));
    for (int i = 0; i < 3; i++) {
        const char *v = st_meta(f, meta[i].key), *k2, *v2;
        CHECK(v && !strcmp(v, meta[i].value), "meta %s = %s", meta[i].key, v ? v : "(null)");
        CHECK(!st_meta_at(f, i, &k2, &v2) && !strcmp(k2, meta[i].key) && !strcmp(v2, meta[i].value), "meta_at %d", i);
    }
    CHECK(st_meta(f, "absent") == NULL, "absent metadata key");
    st_close(f);
    tmp_remove(&td);
}

// ---------------------------------------------------------------------------
// The exact bytes of the format

// The file the reference implementation (Python safetensors 0.4) writes for
// save_file({"a": torch.tensor([1., 2.])}), metadata=None or {"format": "pt"}:
// the compact header padded with spaces to 56 / 88 bytes.
static const char REF_HEADER[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}  ";
static const char REF_HEADER_META[] =
    "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}   ";

static unsigned char *reference_file(const char *header, size_t *n) {
    size_t h = strlen(header);
    *n = 8 + h + 8;
    unsigned char *b = xcalloc(*n, 1);
    b[0] = (unsigned char)h;  // little-endian length; < 256 here
    memcpy(b + 8, header, h);
    const unsigned char data[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0x40};  // 1.0f, 2.0f
    memcpy(b + 8 + h, data, 8);
    return b;
}

TEST(io_st_reference_bytes) {
    TmpDir td;
    tmp_make(&td);
    CHECK(sizeof REF_HEADER - 1 == 56 && sizeof REF_HEADER_META - 1 == 88, "test headers not padded to 8");
    const char *headers[2] = {REF_HEADER, REF_HEADER_META};
    const float a[2] = {1, 2};
    StTensor t = {"a", ST_F32, 1, {2}, a};
    StMeta m = {"format", "pt"};
    for (int k = 0; k < 2; k++) {
        size_t n, got_n;
        unsigned char *ref = reference_file(headers[k], &n);
        // Ours reads theirs...
        const char *path = tmp_path(&td, "ref.safetensors");
        write_bytes(path, ref, n);
        StFile *f;
        float v[2] = {0, 0};
        CHECK(!st_open(path, &f), "st_open reference: %s", mn_last_error());
        if (f) {
            CHECK(!st_read_f32(f, "a", v, 2, 1, (const int64_t[]){2}) && v[0] == 1 && v[1] == 2, "values %g %g", v[0], v[1]);
            CHECK(k == 0 ? st_meta_count(f) == 0 : !strcmp(st_meta(f, "format"), "pt"), "metadata");
            st_close(f);
        }
        // ...and writes the same bytes.
        path = tmp_path(&td, "ours.safetensors");
        CHECK(!st_write(path, &t, 1, &m, k), "st_write: %s", mn_last_error());
        unsigned char *ours = read_bytes(path, &got_n);
        CHECK(ours && got_n == n && !memcmp(ours, ref, n), "written bytes differ from the reference (%zu vs %zu bytes)",
              got_n, n);
        free(ours);
        free(ref);
    }
    tmp_remove(&td);
}

// Header alignment, offsets contiguous in the given order, nothing after the data.
TEST(io_st_layout) {
    TmpDir td;
    tmp_make(&td);
    uint16_t b[3] = {1, 2, 3};
    float a[5] = {0};
    int64_t c[1] = {9};
    StTensor t[] = {{"z_first", ST_BF16, 1, {3}, b}, {"a_second", ST_F32, 2, {1, 5}, a}, {"c", ST_I64, 0, {0}, c}};
    const char *path = tmp_path(&td, "layout.safetensors");
    CHECK(!st_write(path, t, 3, NULL, 0), "%s", mn_last_error());
    size_t n;
    unsigned char *bytes = read_bytes(path, &n);
    if (!bytes || n < 8) {
        CHECK(0, "cannot read back %s", path);
        tmp_remove(&td);
        return;
    }
    uint64_t h = 0;
    for (int i = 7; i >= 0; i--) h = h << 8 | bytes[i];
    const char *want = "{\"z_first\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,6]},"
                       "\"a_second\":{\"dtype\":\"F32\",\"shape\":[1,5],\"data_offsets\":[6,26]},"
                       "\"c\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[26,34]}}";
    size_t wl = strlen(want);
    CHECK(h % 8 == 0 && h >= wl && h < wl + 8, "header length %" PRIu64 " for %zu bytes of JSON", h, wl);
    CHECK(n == 8 + h + 34, "file size %zu, expected %" PRIu64, n, 8 + h + 34);
    CHECK(h <= n - 8 && !memcmp(bytes + 8, want, wl), "header differs: %.*s", (int)(h <= n - 8 ? h : 0), bytes + 8);
    for (size_t i = wl; i < h && 8 + i < n; i++) CHECK(bytes[8 + i] == ' ', "padding byte %zu is %d", i, bytes[8 + i]);
    CHECK(n == 8 + h + 34 && !memcmp(bytes + 8 + h, b, 6) && !memcmp(bytes + 8 + h + 26, c, 8), "data section");
    free(bytes);
    tmp_remove(&td);
}

// ---------------------------------------------------------------------------
// 16-bit floats

TEST(io_bf16_rounding) {
    const struct {
        uint32_t in;
        uint16_t out;
        const char *what;
    } cases[] = {
        {0x3f800000, 0x3f80, "1.0"},
        {0x3f808000, 0x3f80, "1 + half ulp: tie to even (down)"},
        {0x3f818000, 0x3f82, "1 + 3 half ulps: tie to even (up)"},
        {0x3f808001, 0x3f81, "just above the tie"},
        {0x3f807fff, 0x3f80, "just below the tie"},
        {0xbf818000, 0xbf82, "negative tie"},
        {0x80000000, 0x8000, "-0"},
        {0x7f800000, 0x7f80, "+inf"},
        {0xff800000, 0xff80, "-inf"},
        {0x7f7fffff, 0x7f80, "FLT_MAX rounds to inf"},
        {0x7f7f7fff, 0x7f7f, "largest that stays finite"},
        {0x00010000, 0x0001, "smallest bf16 subnormal"},
        {0x00008000, 0x0000, "subnormal tie to even (zero)"},
        {0x00018000, 0x0002, "subnormal tie to even (up)"},
        {0x00000001, 0x0000, "smallest float subnormal"},
        {0x807fffff, 0x8080, "largest negative subnormal rounds to the smallest normal"},
        {0xffc00000, 0xffc0, "negative quiet NaN"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        uint16_t got = bf16_of_bits(cases[i].in);
        CHECK(got == cases[i].out, "%s: 0x%08x -> 0x%04x, expected 0x%04x", cases[i].what, cases[i].in, got, cases[i].out);
    }
    // NaNs whose payload lies only in the dropped bits stay NaN (not inf).
    uint32_t nans[] = {0x7f800001, 0xff800001, 0x7fbfffff, 0x7fc00000, 0x7f80ffff};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = bf16_of_bits(nans[i]);
        CHECK(isnan(bf16_to_f32(h)) && (h >> 15) == (nans[i] >> 31), "NaN 0x%08x -> 0x%04x", nans[i], h);
    }
    // Every bf16 widens exactly and narrows back to itself.
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = bf16_to_f32((uint16_t)h);
        if (mn_f32_bits(f) != h << 16) bad++;
        if (!isnan(f) && f32_to_bf16(f) != h) bad++;
    }
    CHECK(bad == 0, "%d bf16 values do not round-trip", bad);
    // Against a double-precision reference of round-to-nearest-even on random floats.
    MnRng r;
    mn_rng_seed(&r, 7);
    int wrong = 0;
    for (int i = 0; i < 100000; i++) {
        float f = mn_bits_f32((uint32_t)mn_rng_u64(&r));
        if (!isfinite(f)) continue;
        uint16_t h = f32_to_bf16(f);
        if (isinf(bf16_to_f32(h))) continue;  // overflow to inf: checked with FLT_MAX above
        double lo = bf16_to_f32(h), err = fabs((double)f - lo);
        // No neighbour may be closer; at a tie the chosen one must be even.
        uint16_t nb[2] = {(uint16_t)(h + 1), (uint16_t)(h - 1)};
        for (int k = 0; k < 2; k++) {
            float g = bf16_to_f32(nb[k]);
            if (isnan(g) || isinf(g) || ((nb[k] ^ h) & 0x8000)) continue;
            double e2 = fabs((double)f - g);
            if (e2 < err || (e2 == err && (h & 1))) wrong++;
        }
    }
    CHECK(wrong == 0, "%d random floats not rounded to nearest even", wrong);
}

TEST(io_f16_to_f32) {
    CHECK(f16_to_f32(0x3c00) == 1.0f && f16_to_f32(0xc000) == -2.0f && f16_to_f32(0x7bff) == 65504.0f, "normals");
    CHECK(f16_to_f32(0x0001) == 0x1p-24f && f16_to_f32(0x03ff) == 1023 * 0x1p-24f, "subnormals");
    CHECK(f16_to_f32(0x0400) == 0x1p-14f, "smallest normal");
    CHECK(signbit(f16_to_f32(0x8000)) && f16_to_f32(0x8000) == 0, "-0");
    CHECK(isinf(f16_to_f32(0x7c00)) && f16_to_f32(0xfc00) < 0 && isinf(f16_to_f32(0xfc00)), "inf");
    CHECK(isnan(f16_to_f32(0x7e00)) && isnan(f16_to_f32(0x7c01)) && isnan(f16_to_f32(0xfd00)), "NaN");
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        int e = (int)(h >> 10 & 31), m = (int)(h & 1023);
        if (e == 31) continue;
        double v = e ? ldexp(1024 + m, e - 25) : ldexp(m, -24);
        if (h & 0x8000) v = -v;
        if ((double)f16_to_f32((uint16_t)h) != v) bad++;
    }
    CHECK(bad == 0, "%d finite halves convert wrongly", bad);
}

// ---------------------------------------------------------------------------
// Refusal of corrupt files

// Writes an 8-byte length, the header (no padding needed) and ndata zero bytes.
static void write_raw(const char *path, const char *header, size_t ndata) {
    size_t h = strlen(header), n = 8 + h + ndata;
    unsigned char *b = xcalloc(n, 1);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    write_bytes(path, b, n);
    free(b);
}

TEST(io_st_refuses_corrupt) {
    TmpDir td;
    tmp_make(&td);
    const char *path = tmp_path(&td, "bad.safetensors");
#define T1(body) "{\"a\":" body "}"
#define OK_A "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
    const struct {
        const char *header;
        size_t ndata;
        const char *fragment;
    } cases[] = {
        {"not json", 8, "header is not valid JSON"},
        {"{\"a\":", 8, "header is not valid JSON"},
        {"[1,2]", 8, "header must be a JSON object"},
        {T1("5"), 8, "tensor 'a': entry must be an object"},
        {T1("{\"shape\":[2],\"data_offsets\":[0,8]}"), 8, "tensor 'a': missing \"dtype\""},
        {T1("{\"dtype\":\"F32\",\"data_offsets\":[0,8]}"), 8, "tensor 'a': missing \"shape\""},
        {T1("{\"dtype\":\"F32\",\"shape\":[2]}"), 8, "tensor 'a': missing \"data_offsets\""},
        {T1("{\"dtype\":4,\"shape\":[2],\"data_offsets\":[0,8]}"), 8, "\"dtype\" must be a string"},
        {T1("{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}"), 8, "\"shape\" must be an array"},
        {T1("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":\"0,8\"}"), 8, "\"data_offsets\" must be [begin, end]"},
        {T1("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}"), 9, "\"data_offsets\" must be [begin, end]"},
        {T1("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}"), 8, "\"data_offsets\" must be [begin, end]"},
        {T1("{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}"), 8, "unknown dtype \"U8\""},
        {T1("{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}"), 8, "negative dim"},
        {T1("{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,8]}"), 8, "shape[0] is not a non-negative integer"},
        {T1("{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,2],\"data_offsets\":[0,8]}"), 8, "9 dims"},
        {T1("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}"), 8, "begin > end"},
        {T1("{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}"), 8, "end 12 is beyond the data section (8 bytes)"},
        {T1("{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}"), 8, "span 8 bytes, but shape x F32 size needs 12"},
        {T1("{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,8]}"), 8, "too many elements"},
        {"{\"a\":" OK_A ",\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}", 12, "'a' and 'b' overlap"},
        {"{\"a\":" OK_A ",\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", 16, "duplicate tensor name 'a'"},
        {"{\"__metadata__\":[1],\"a\":" OK_A "}", 8, "\"__metadata__\" must be an object"},
        {"{\"__metadata__\":{\"k\":1},\"a\":" OK_A "}", 8, "__metadata__ value of 'k' must be a string"},
        {"{\"__metadata__\":{\"k\":\"1\",\"k\":\"2\"},\"a\":" OK_A "}", 8, "duplicate __metadata__ key 'k'"},
        {"{\"__metadata__\":{},\"__metadata__\":{},\"a\":" OK_A "}", 8, "duplicate \"__metadata__\""},
    };
#undef T1
#undef OK_A
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        write_raw(path, cases[i].header, cases[i].ndata);
        StFile *f = (StFile *)&td;  // must come back NULL
        int s = st_open(path, &f);
        const char *msg = mn_last_error();
        CHECK(s == MN_ERR_FORMAT && !f, "case %zu (%s): status %d", i, cases[i].header, s);
        CHECK(strstr(msg, cases[i].fragment) && strstr(msg, path), "case %zu: message \"%s\" lacks \"%s\"", i, msg,
              cases[i].fragment);
        if (!s) st_close(f);
    }

    // Damage to the length prefix itself.
    StFile *f;
    write_bytes(path, "\x10\0\0\0", 4);
    CHECK_FAILS(st_open(path, &f), MN_ERR_FORMAT, "file is 4 bytes, shorter than the 8-byte header length");
    unsigned char big[16] = {0xe8, 0x03};  // header length 1000 in a 16-byte file
    write_bytes(path, big, sizeof big);
    CHECK_FAILS(st_open(path, &f), MN_ERR_FORMAT, "header length 1000 exceeds the 8 bytes after it");
    unsigned char absurd[16] = {0, 0, 0, 0, 0, 1};  // 2^40
    write_bytes(path, absurd, sizeof absurd);
    CHECK_FAILS(st_open(path, &f), MN_ERR_FORMAT, "is absurd");
    CHECK_FAILS(st_open(tmp_path(&td, "no-such-file"), &f), MN_ERR_IO, "cannot open");
    tmp_remove(&td);
}

// Every proper prefix of a valid file is refused cleanly, and random byte
// damage never makes a read go out of bounds (run under ASan to see it).
TEST(io_st_truncated_and_damaged) {
    TmpDir td;
    tmp_make(&td);
    float a[7] = {1, 2, 3, 4, 5, 6, 7};
    uint16_t b[3] = {1, 2, 3};
    int64_t c = 5;
    StTensor t[] = {{"a", ST_F32, 1, {7}, a}, {"b", ST_BF16, 2, {3, 1}, b}, {"c", ST_I64, 0, {0}, &c}};
    StMeta m = {"note", "truncation test"};
    const char *path = tmp_path(&td, "full.safetensors");
    CHECK(!st_write(path, t, 3, &m, 1), "%s", mn_last_error());
    size_t n;
    unsigned char *full = read_bytes(path, &n);
    if (!full) {
        CHECK(0, "cannot read back %s", path);
        tmp_remove(&td);
        return;
    }
    char cut_path[256];
    snprintf(cut_path, sizeof cut_path, "%s", tmp_path(&td, "cut.safetensors"));
    int accepted = 0;
    for (size_t cut = 0; cut < n; cut++) {
        write_bytes(cut_path, full, cut);
        StFile *f;
        int s = st_open(cut_path, &f);
        if (!s) {
            accepted++;
            st_close(f);
        } else if (!strstr(mn_last_error(), cut_path)) {
            CHECK(0, "cut at %zu: message does not name the file: %s", cut, mn_last_error());
        }
    }
    CHECK(accepted == 0, "%d truncated files were accepted", accepted);

    MnRng r;
    mn_rng_seed(&r, 11);
    unsigned char *dam = xcalloc(n, 1);
    float buf[64];
    int64_t ibuf[64];
    for (int it = 0; it < 1500; it++) {
        memcpy(dam, full, n);
        for (int k = 0, nk = 1 + (int)(mn_rng_u64(&r) % 3); k < nk; k++)
            dam[mn_rng_u64(&r) % n] = (unsigned char)mn_rng_u64(&r);
        write_bytes(cut_path, dam, n);
        StFile *f;
        if (st_open(cut_path, &f)) continue;
        for (int i = 0; i < st_count(f); i++) {
            const char *name;
            int nd;
            const int64_t *shape;
            StDtype dt;
            st_info(f, i, &name, &dt, &nd, &shape);
            int64_t ne = numel(nd, shape);
            if (ne > 64) continue;
            if (st_read_f32(f, name, buf, ne, 0, NULL)) st_read_i64(f, name, ibuf, ne, 0, NULL);
        }
        st_close(f);
    }
    free(dam);
    free(full);
    tmp_remove(&td);
}

// ---------------------------------------------------------------------------
// Writing: atomicity and argument checks

static int file_exists(const char *p) { return access(p, F_OK) == 0; }

TEST(io_st_atomic_write) {
    TmpDir td;
    tmp_make(&td);
    char path[256], tmp[300];
    snprintf(path, sizeof path, "%s", tmp_path(&td, "ckpt.safetensors"));
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    float one[1] = {1}, two[2] = {2, 3};
    StTensor t1 = {"w", ST_F32, 1, {1}, one}, t2 = {"w", ST_F32, 1, {2}, two};
    CHECK(!st_write(path, &t1, 1, NULL, 0), "%s", mn_last_error());
    CHECK(file_exists(path) && !file_exists(tmp), "after a write: file present, no .tmp left");
    CHECK(!st_write(path, &t2, 1, NULL, 0), "overwrite: %s", mn_last_error());
    CHECK(!file_exists(tmp), "no .tmp left after an overwrite");
    StFile *f;
    float got[2] = {0, 0};
    CHECK(!st_open(path, &f) && !st_read_f32(f, "w", got, 2, 0, NULL) && got[1] == 3, "overwritten content");
    st_close(f);

    // Refused writes leave the existing file as it was and no temporary.
    size_t before_n, after_n;
    unsigned char *before = read_bytes(path, &before_n);
    StTensor dup[2] = {t1, t1};
    CHECK_FAILS(st_write(path, dup, 2, NULL, 0), MN_ERR_ARG, "duplicate tensor name 'w'");
    StTensor unnamed = {"", ST_F32, 1, {1}, one};
    CHECK_FAILS(st_write(path, &unnamed, 1, NULL, 0), MN_ERR_ARG, "empty name");
    StTensor reserved = {"__metadata__", ST_F32, 1, {1}, one};
    CHECK_FAILS(st_write(path, &reserved, 1, NULL, 0), MN_ERR_ARG, "reserved");
    StTensor neg = {"n", ST_F32, 1, {-1}, one};
    CHECK_FAILS(st_write(path, &neg, 1, NULL, 0), MN_ERR_ARG, "negative dim");
    StTensor nodata = {"n", ST_F32, 1, {3}, NULL};
    CHECK_FAILS(st_write(path, &nodata, 1, NULL, 0), MN_ERR_ARG, "data is NULL");
    StMeta dm[2] = {{"k", "1"}, {"k", "2"}};
    CHECK_FAILS(st_write(path, &t1, 1, dm, 2), MN_ERR_ARG, "duplicate metadata key 'k'");
    unsigned char *after = read_bytes(path, &after_n);
    CHECK(before && after && before_n == after_n && !memcmp(before, after, before_n), "refused writes changed the file");
    CHECK(!file_exists(tmp), "refused writes left a .tmp");
    free(before);
    free(after);

    // A directory that does not exist: a clean I/O error naming the path.
    const char *nowhere = tmp_path(&td, "no-such-dir/x.safetensors");
    CHECK_FAILS(st_write(nowhere, &t1, 1, NULL, 0), MN_ERR_IO, "no-such-dir/x.safetensors");
    CHECK(!file_exists(nowhere), "file appeared in a missing directory");
    tmp_remove(&td);
}
