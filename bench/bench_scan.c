/*
 * `mesanet bench scan`: the diagonal recurrences (ScanOps: RG-LRU, Longhorn with d_state 16) on the GPU
 * at BxTxC shapes, forward and forward+backward, against a device copy measured in the same run. Times
 * are medians of single calls each waited for on the host (bench_median_time). The bytes counted are
 * those a call must move at least: every input read once and every output written once (RG-LRU forward
 * x, r, i, y: 8 bytes a (b, t, c); forward+backward adds dy, the inputs again and dx, dr, di: 22;
 * Longhorn 6 and 16, plus k, q (and dk, dq) per token); what the kernels move beyond that (the backward's
 * checkpoint pass rereads the inputs) counts against them. "% copy" is the achieved rate over the
 * copy's (bytes read + written by be->copy of 1 GiB, bf16).
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
    ScanDims d;
    ScanFwd f;
    ScanBwd b;
    void *dst, *src;
    size_t n;
} SRun;

static int s_fwd(void *p) {
    SRun *r = p;
    return r->be->scan->fwd(r->be, &r->d, &r->f);
}
static int s_fwd_bwd(void *p) {
    SRun *r = p;
    MN_TRY(r->be->scan->fwd(r->be, &r->d, &r->f));
    return r->be->scan->bwd(r->be, &r->d, &r->b);
}
static int s_copy(void *p) {
    SRun *r = p;
    r->be->copy(r->be, r->dst, r->src, r->n, MEM_ACT);
    return MN_OK;
}

// "BxTxC[,BxTxC...]" into B, T, C (at most max): the count, or -1 where one is malformed.
static int parse_btc(const char *s, int (*out)[3], int max) {
    int n = 0;
    while (*s) {
        int b, t, c, used;
        if (n >= max || sscanf(s, "%dx%dx%d%n", &b, &t, &c, &used) != 3 || b < 1 || t < 1 || c < 1) return -1;
        out[n][0] = b, out[n][1] = t, out[n][2] = c;
        n++;
        s += used;
        if (*s == ',') s++;
        else if (*s) return -1;
    }
    return n;
}

int bench_scan(int argc, char **argv) {
    const char *shapes_s = "8x2048x2048,16x4096x1536", *kinds_s = "rglru,longhorn";
    int reps = 20, dstate = 16;
    Option opts[] = {
        {"shapes", OPT_STRING, &shapes_s, "BxTxC shapes (sequences x tokens x channels)"},
        {"kinds", OPT_STRING, &kinds_s, "rglru, longhorn or both (comma-separated)"},
        {"state", OPT_INT, &dstate, "Longhorn's d_state N", 1, 16},
        {"reps", OPT_INT, &reps, "timed repetitions", 1, 64},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    int shapes[8][3], ns = parse_btc(shapes_s, shapes, 8);
    if (ns <= 0) die("--shapes: expected BxTxC[,BxTxC...] with positive sizes, got \"%s\"", shapes_s);
    int want_rg = strstr(kinds_s, "rglru") != NULL, want_lh = strstr(kinds_s, "longhorn") != NULL;
    if (!want_rg && !want_lh) die("--kinds: expected rglru, longhorn or both, got \"%s\"", kinds_s);
    const Backend *be = backend_by_name("cuda");
    if (!be) die("%s", mn_last_error());
    if (!be->scan) die("bench scan: the cuda backend has no scan ops");

    // the device copy: 1 GiB of bf16 (512 Mi elements) read and written
    SRun cp = {be};
    cp.n = (size_t)1 << 29;
    cp.src = be->alloc(be, cp.n, MEM_ACT);
    cp.dst = be->alloc(be, cp.n, MEM_ACT);
    if (!cp.src || !cp.dst) die("%s", mn_last_error());
    const double tcopy = bench_median_time(be, reps, s_copy, &cp), copy_gbs = 2.0 * cp.n * 2 / tcopy / 1e9;
    be->free(be, cp.src);
    be->free(be, cp.dst);
    printf("device copy: %.1f GB/s (1 GiB bf16, read + write, %.3f ms)\n\n", copy_gbs, 1e3 * tcopy);
    printf("%-8s %-16s | %9s %8s %7s | %9s %8s %7s | %s\n", "kind", "B x T x C", "fwd ms", "GB/s", "% copy", "f+b ms",
           "GB/s", "% copy", "finite");
    for (int kind = 0; kind < 2; kind++) {
        if ((kind == 0 && !want_rg) || (kind == 1 && !want_lh)) continue;
        const int lh = kind == 1;
        for (int si = 0; si < ns; si++) {
            const int B = shapes[si][0], T = shapes[si][1], C = shapes[si][2], N = lh ? dstate : 1;
            const size_t nx = (size_t)B * T * C, nk = (size_t)B * T * N;
            SRun r = {be};
            ScanDims d = {lh ? SCAN_LONGHORN : SCAN_RGLRU, B, T, C, N, 0};
            r.d = d;
            void *x = bench_rand_buf(be, nx, MEM_ACT, -1, 1, 0, 1), *rr = bench_rand_buf(be, nx, MEM_ACT, -2, 2, 0, 2);
            void *dy = bench_rand_buf(be, nx, MEM_ACT, -1, 1, 0, 3), *w = bench_rand_buf(be, (size_t)C, MEM_PARAM, -2, 2, 0, 4);
            void *i = lh ? NULL : bench_rand_buf(be, nx, MEM_ACT, -2, 2, 0, 5);
            void *k = lh ? bench_rand_buf(be, nk, MEM_ACT, -1, 1, 0, 6) : NULL;
            void *q = lh ? bench_rand_buf(be, nk, MEM_ACT, -1, 1, 0, 7) : NULL;
            void *skip = lh ? bench_rand_buf(be, (size_t)C, MEM_PARAM, -1, 1, 0, 8) : NULL;
            void *y = be->alloc(be, nx, MEM_ACT), *dx = be->alloc(be, nx, MEM_ACT), *dr = be->alloc(be, nx, MEM_ACT);
            void *di = lh ? NULL : be->alloc(be, nx, MEM_ACT);
            void *dk = lh ? be->alloc(be, nk, MEM_ACT) : NULL, *dq = lh ? be->alloc(be, nk, MEM_ACT) : NULL;
            void *dw = be->alloc(be, (size_t)C, MEM_F32), *dskip = lh ? be->alloc(be, (size_t)C, MEM_F32) : NULL;
            if (!y || !dx || !dr || (!lh && !di) || (lh && (!dk || !dq || !dskip)) || !dw) die("%s", mn_last_error());
            ScanFwd f = {x, rr, i, k, q, w, skip, NULL, y, NULL};
            ScanBwd b = {x, rr, i, k, q, w, skip, dy, dx, dr, di, dk, dq, dw, dskip};
            r.f = f;
            r.b = b;
            const double tf = bench_median_time(be, reps, s_fwd, &r), tb = bench_median_time(be, reps, s_fwd_bwd, &r);
            const double bf = lh ? 6.0 * nx + 4.0 * nk : 8.0 * nx, bb = lh ? 16.0 * nx + 12.0 * nk : 22.0 * nx;
            const int fin = bench_all_finite(be, y, nx, MEM_ACT) && bench_all_finite(be, dx, nx, MEM_ACT) &&
                            bench_all_finite(be, dr, nx, MEM_ACT) && (lh ? bench_all_finite(be, dk, nk, MEM_ACT) : 1);
            char name[40];
            snprintf(name, sizeof name, "%dx%dx%d", B, T, C);
            printf("%-8s %-16s | %9.3f %8.0f %6.1f%% | %9.3f %8.0f %6.1f%% | %s\n", lh ? "longhorn" : "rglru", name,
                   1e3 * tf, bf / tf / 1e9, 100 * bf / tf / 1e9 / copy_gbs, 1e3 * tb, bb / tb / 1e9,
                   100 * bb / tb / 1e9 / copy_gbs, fin ? "yes" : "NO");
            fflush(stdout);
            void *bufs[] = {x, rr, dy, w, i, k, q, skip, y, dx, dr, di, dk, dq, dw, dskip};
            for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++)
                if (bufs[j]) be->free(be, bufs[j]);
        }
    }
    return 0;
}
