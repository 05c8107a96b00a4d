/*
 * `mesanet bench attn`: the softmax-attention core of the mha / swa mixers (core/backend.h:
 * attn_fwd, attn_bwd, attn_decode) on a backend: forward and forward+backward at one shape
 * (--shape B,T,H,D; --kv for grouped key/value heads, --window for a sliding window), the median
 * of --reps calls each waited for after one warm-up (bench_median_time), and TFLOP/s; then a
 * decode step (attn_decode: one query per sequence against a --cache-slot key/value cache) at the
 * --decode batch sizes, calls back to back with one wait at the end (bench_stream_time), tokens/s.
 *
 * Flops, as FlashAttention counts them: 4 D per visible (query, key) pair for the forward (Q K^T
 * and P V), 2.5x that for the backward (dV, dP, dQ, dK and S again), so forward+backward = 3.5x;
 * the visible pairs of a causal row t are min(t + 1, window). On cuda the inputs are bf16 (what the
 * model holds); compare with torch SDPA (bench/ scripts) numbers on the same card.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "tools/commands.h"

typedef struct {
    const Backend *be;
    AttnDims d;
    AttnFwd f;
    AttnBwd b;
    int n, cap;              // decode: visible slots, cache capacity
    void *dq, *dkc, *dvc, *dout;  // decode: q, caches, output
} Ctx;

static int run_fwd(void *p) {
    Ctx *c = p;
    return c->be->attn->fwd(c->be, &c->d, &c->f);
}

static int run_fwd_bwd(void *p) {
    Ctx *c = p;
    int rc = c->be->attn->fwd(c->be, &c->d, &c->f);
    return rc ? rc : c->be->attn->bwd(c->be, &c->d, &c->b);
}

static int run_decode(void *p) {
    Ctx *c = p;
    return c->be->attn->decode(c->be, &c->d, c->n, c->cap, c->dq, c->dkc, c->dvc, c->dout);
}

// n random numbers in [-1, 1) on the backend
static void *rand_buf(const Backend *be, size_t n, MemKind k, uint64_t seed) {
    double *h = xcalloc(n ? n : 1, sizeof(double));
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (double)(s >> 11) / 9007199254740992.0 * 2 - 1;
    }
    void *p = be->alloc(be, n, k);
    if (!p || be->upload(be, p, h, n, k)) die("%s", mn_last_error());
    free(h);
    return p;
}

static void *alloc_or_die(const Backend *be, size_t n, MemKind k) {
    void *p = be->alloc(be, n ? n : 1, k);
    if (!p) die("%s", mn_last_error());
    return p;
}

int bench_attn(int argc, char **argv) {
    const char *backend = "cpu", *shape_s = NULL, *decode_s = "1,16,128";
    int window = 0, kv = 0, reps = 0, cache = 2048;
    Option opts[] = {
        {"backend", OPT_STRING, &backend, "cpu or cuda"},
        {"shape", OPT_STRING, &shape_s, "B,T,H,D (default 8,2048,16,128 on cuda, 2,512,4,64 on cpu)"},
        {"kv", OPT_INT, &kv, "key/value heads (grouped-query attention; 0: H)", 0, 1 << 16},
        {"window", OPT_INT, &window, "sliding window (0: full causal attention)", 0, 1 << 30},
        {"decode", OPT_STRING, &decode_s, "batch sizes of the decode step, comma-separated, or \"\""},
        {"cache", OPT_INT, &cache, "key/value cache slots of the decode step", 1, 1 << 24},
        {"reps", OPT_INT, &reps, "timed repetitions, median reported (0: 10 on cuda, 3 on cpu; at most 64)", 0, 64},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    int cuda = !strcmp(backend, "cuda");
    if (!cuda && strcmp(backend, "cpu")) {
        fprintf(stderr, "mesanet bench attn: --backend: expected cpu or cuda, got '%s'\n", backend);
        return 1;
    }
    int sh[4] = {8, 2048, 16, 128};
    if (!cuda) sh[0] = 2, sh[1] = 512, sh[2] = 4, sh[3] = 64;
    if (shape_s && bench_parse_ints(shape_s, sh, 4) != 4) {
        fprintf(stderr, "mesanet bench attn: --shape: expected B,T,H,D, got '%s'\n", shape_s);
        return 1;
    }
    if (!kv) kv = sh[2];
    if (sh[2] % kv) {
        fprintf(stderr, "mesanet bench attn: --kv %d does not divide H = %d\n", kv, sh[2]);
        return 1;
    }
    int bs[8], nb = *decode_s ? bench_parse_ints(decode_s, bs, 8) : 0;
    if (nb < 0) {
        fprintf(stderr, "mesanet bench attn: --decode: expected comma-separated batch sizes, or \"\"\n");
        return 1;
    }
    if (!reps) reps = cuda ? 10 : 3;
    const Backend *be = backend_by_name(backend);
    if (!be) die("%s", mn_last_error());
    if (!be->attn->fwd || !be->attn->bwd || !be->attn->decode) die("the %s backend has no attention core", backend);

    int B = sh[0], T = sh[1], H = sh[2], D = sh[3];
    Ctx c = {be, {B, T, H, kv, D, window, (float)(1 / sqrt((double)D))}};
    size_t nq = (size_t)B * T * H * D, nk = (size_t)B * T * kv * D, rows = (size_t)B * T * H;
    void *q = rand_buf(be, nq, MEM_ACT, 1), *k = rand_buf(be, nk, MEM_ACT, 2), *v = rand_buf(be, nk, MEM_ACT, 3);
    void *dout = rand_buf(be, nq, MEM_ACT, 4), *o = alloc_or_die(be, nq, MEM_ACT), *lse = alloc_or_die(be, rows, MEM_F32);
    void *dq = alloc_or_die(be, nq, MEM_ACT), *dk = alloc_or_die(be, nk, MEM_ACT), *dv = alloc_or_die(be, nk, MEM_ACT);
    c.f = (AttnFwd){q, k, v, o, lse};
    c.b = (AttnBwd){q, k, v, o, lse, dout, dq, dk, dv};
    double pairs = 0;  // visible (query, key) pairs of one sequence and head
    for (long t = 0; t < T; t++) pairs += window && window < t + 1 ? window : t + 1;
    double fl = 4.0 * D * pairs * B * H;
    double tf = bench_median_time(be, reps, run_fwd, &c), tfb = bench_median_time(be, reps, run_fwd_bwd, &c);
    printf("softmax attention on %s: B %d, T %d, H %d, Hkv %d, D %d, window %d; median of %d\n", backend, B, T, H, kv,
           D, window, reps);
    printf("  fwd      %9.3f ms  %8.2f TFLOP/s\n", tf * 1e3, fl / tf * 1e-12);
    printf("  fwd+bwd  %9.3f ms  %8.2f TFLOP/s  (bwd %.3f ms)\n", tfb * 1e3, 3.5 * fl / tfb * 1e-12, (tfb - tf) * 1e3);
    void *bufs[] = {q, k, v, dout, o, lse, dq, dk, dv};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);

    for (int i = 0; i < nb; i++) {
        int Bd = bs[i];
        Ctx dc = {be, {Bd, 1, H, kv, D, 0, (float)(1 / sqrt((double)D))}};
        dc.n = dc.cap = cache;
        size_t nqd = (size_t)Bd * H * D, nc = (size_t)Bd * cache * kv * D;
        dc.dq = rand_buf(be, nqd, MEM_ACT, 5);
        dc.dkc = rand_buf(be, nc, MEM_ACT, 6);
        dc.dvc = rand_buf(be, nc, MEM_ACT, 7);
        dc.dout = alloc_or_die(be, nqd, MEM_ACT);
        double td = bench_stream_time(be, cuda ? 200 : 10, run_decode, &dc);
        // bytes read: the caches (2 Hkv D per slot) at the element size of MEM_ACT
        double gbs = 2.0 * Bd * cache * kv * D * be->elem_size(be, MEM_ACT) / td * 1e-9;
        printf("  decode B %4d, %d-slot cache: %9.1f us/step  %10.0f tokens/s  %7.0f GB/s of cache\n", Bd, cache,
               td * 1e6, Bd / td, gbs);
        be->free(be, dc.dq);
        be->free(be, dc.dkc);
        be->free(be, dc.dvc);
        be->free(be, dc.dout);
    }
    return 0;
}
