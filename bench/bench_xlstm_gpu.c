/*
 * `mesanet bench xlstm-gpu`: the xLSTM cores on the GPU (the cuda backend). The mLSTM core's forward
 * and forward+backward at BxTxHxD shapes (Dk = Dv = D; chunkwise form), its decode step (T = 1 after
 * the state of a prefill), and the sLSTM core's forward and forward+backward at BxTxHxDh. Times as
 * `bench mesa-gpu`: "ms" the median of single calls each waited for on the host, "strm" the mean over
 * calls launched back to back with one wait at the end (launch overheads included, host waits not).
 * Inputs are random (q, k, v, dh uniform in +-1; forget gates log sigmoid(U(0, 4)); input gates
 * U(-2, 2)); the last outputs are checked to be finite.
 *
 * The mLSTM's chunkwise FLOPs a head and chunk (C = 64, causal products counted whole): forward
 * 2 C^2 Dk + 2 C^2 Dv + 2 C Dk Dv (the state term) + 2 C Dk Dv (the update); the backward's three
 * walks have the same shape each (dq, dk, dv), 3x the forward.
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
    MnSeqDims d;
    MlstmOpts o;
    MlstmFwd f;
    MlstmBwd b;
    SlstmDims sd;
    SlstmFwd sf;
    SlstmBwd sb;
} XRun;

static int m_fwd(void *p) {
    XRun *r = p;
    return r->be->mlstm->fwd(r->be, &r->d, &r->o, &r->f);
}
static int m_fwd_bwd(void *p) {
    XRun *r = p;
    MN_TRY(r->be->mlstm->fwd(r->be, &r->d, &r->o, &r->f));
    return r->be->mlstm->bwd(r->be, &r->d, &r->o, &r->b);
}
static int s_fwd(void *p) {
    XRun *r = p;
    return r->be->slstm->fwd(r->be, &r->sd, &r->sf);
}
static int s_fwd_bwd(void *p) {
    XRun *r = p;
    MN_TRY(r->be->slstm->fwd(r->be, &r->sd, &r->sf));
    return r->be->slstm->bwd(r->be, &r->sd, &r->sb);
}

int bench_xlstm_gpu(int argc, char **argv) {
    const char *mshapes_s = "8x2048x16x128,16x2048x8x64", *sshapes_s = "16x1024x4x192", *decode_s = "8,64";
    int reps = 20;
    Option opts[] = {
        {"mlstm", OPT_STRING, &mshapes_s, "the mLSTM core's BxTxHxD shapes (Dk = Dv = D), or \"\""},
        {"slstm", OPT_STRING, &sshapes_s, "the sLSTM core's BxTxHxDh shapes, or \"\""},
        {"decode", OPT_STRING, &decode_s, "batch sizes of the mLSTM decode step (H=16, D=128), or \"\""},
        {"reps", OPT_INT, &reps, "timed repetitions", 1, 64},
    };
    int st = parse_args(argc, argv, "[options]", opts, sizeof opts / sizeof opts[0], NULL, NULL, 0);
    if (st) return st == 2 ? 0 : 1;
    const Backend *be = backend_by_name("cuda");
    if (!be) die("%s", mn_last_error());
    BenchShape shapes[8];
    int ns = *mshapes_s ? bench_parse_shapes(mshapes_s, shapes, 8) : 0;
    if (ns < 0) die("--mlstm: expected BxTxHxD[,BxTxHxD...]");
    if (ns) printf("mLSTM core, chunkwise (cuda backend)\n%-16s | %9s %9s %8s | %9s %9s %8s | %s\n", "B x T x H x D",
                   "fwd ms", "fwd strm", "TFLOP/s", "f+b ms", "f+b strm", "TFLOP/s", "finite");
    for (int si = 0; si < ns; si++) {
        BenchShape sh = shapes[si];
        MnSeqDims d = {sh.B, sh.T, sh.H, sh.D, sh.D};
        size_t nt = (size_t)sh.B * sh.T * sh.H, nk = nt * sh.D;
        XRun r = {be, d, {(float)(1 / sqrt((double)sh.D)), 1e-6f, MN_FORM_CHUNK, 0}};
        void *q = bench_rand_buf(be, nk, MEM_ACT, -1, 1, 0, 1), *k = bench_rand_buf(be, nk, MEM_ACT, -1, 1, 0, 2);
        void *v = bench_rand_buf(be, nk, MEM_ACT, -1, 1, 0, 3), *dh = bench_rand_buf(be, nk, MEM_ACT, -1, 1, 0, 4);
        void *fg = bench_rand_buf(be, nt, MEM_F32, 0, 4, 1, 5), *ig = bench_rand_buf(be, nt, MEM_F32, -2, 2, 0, 6);
        void *h = be->alloc(be, nk, MEM_ACT), *nq = be->alloc(be, nt, MEM_F32), *m = be->alloc(be, nt, MEM_F32);
        void *dq = be->alloc(be, nk, MEM_ACT), *dk = be->alloc(be, nk, MEM_ACT), *dv = be->alloc(be, nk, MEM_ACT);
        void *dfg = be->alloc(be, nt, MEM_F32), *dig = be->alloc(be, nt, MEM_F32);
        MlstmFwd f = {q, k, v, fg, ig, NULL, NULL, NULL, h, nq, m, NULL, NULL, NULL};
        MlstmBwd b = {q, k, v, fg, ig, h, nq, m, dh, dq, dk, dv, dfg, dig};
        r.f = f;
        r.b = b;
        double tf = bench_median_time(be, reps, m_fwd, &r), tfs = bench_stream_time(be, reps, m_fwd, &r);
        double tb = bench_median_time(be, reps, m_fwd_bwd, &r), tbs = bench_stream_time(be, reps, m_fwd_bwd, &r);
        double C = 64, D = sh.D, flops = (double)sh.B * sh.H * ceil(sh.T / C) * (4 * C * C * D + 4 * C * D * D);
        int fin = bench_all_finite(be, h, nk, MEM_ACT) && bench_all_finite(be, dq, nk, MEM_ACT) && bench_all_finite(be, dk, nk, MEM_ACT) &&
                  bench_all_finite(be, dv, nk, MEM_ACT) && bench_all_finite(be, dfg, nt, MEM_F32);
        char name[40];
        snprintf(name, sizeof name, "%dx%dx%dx%d", sh.B, sh.T, sh.H, sh.D);
        printf("%-16s | %9.3f %9.3f %8.1f | %9.3f %9.3f %8.1f | %s\n", name, 1e3 * tf, 1e3 * tfs, flops / tfs / 1e12,
               1e3 * tb, 1e3 * tbs, 4 * flops / tbs / 1e12, fin ? "yes" : "NO");
        fflush(stdout);
        void *bufs[] = {q, k, v, dh, fg, ig, h, nq, m, dq, dk, dv, dfg, dig};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    }
    // decode: a token for B sequences (H = 16, D = 128) from a state (the recurrent form, T = 1)
    int bs[8], nb = *decode_s ? bench_parse_ints(decode_s, bs, 8) : 0;
    if (nb < 0) die("--decode: expected comma-separated positive batch sizes, or \"\"");
    if (nb) printf("\nmLSTM decode step (H=16, D=128, state in place)\n%6s | %10s %12s\n", "B", "ms/token", "tokens/s");
    for (int bi = 0; bi < nb; bi++) {
        int B = bs[bi], H = 16, D = 128;
        size_t nt = (size_t)B * H, nk = nt * D;
        XRun r = {be, {B, 1, H, D, D}, {(float)(1 / sqrt((double)D)), 1e-6f, MN_FORM_AUTO, 0}};
        void *q = bench_rand_buf(be, nk, MEM_ACT, -1, 1, 0, 1), *k = bench_rand_buf(be, nk, MEM_ACT, -1, 1, 0, 2);
        void *v = bench_rand_buf(be, nk, MEM_ACT, -1, 1, 0, 3), *fg = bench_rand_buf(be, nt, MEM_F32, 0, 4, 1, 5);
        void *ig = bench_rand_buf(be, nt, MEM_F32, -2, 2, 0, 6), *h = be->alloc(be, nk, MEM_ACT);
        void *C = bench_rand_buf(be, nk * D, MEM_F32, -1, 1, 0, 7), *n = bench_rand_buf(be, nk, MEM_F32, -1, 1, 0, 8);
        void *m = bench_rand_buf(be, nt, MEM_F32, 0, 1, 0, 9);
        MlstmFwd f = {q, k, v, fg, ig, C, n, m, h, NULL, NULL, C, n, m};
        r.f = f;
        double t = bench_stream_time(be, 10 * reps, m_fwd, &r);
        printf("%6d | %10.4f %12.0f\n", B, 1e3 * t, B / t);
        void *bufs[] = {q, k, v, fg, ig, h, C, n, m};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    }
    ns = *sshapes_s ? bench_parse_shapes(sshapes_s, shapes, 8) : 0;
    if (ns < 0) die("--slstm: expected BxTxHxDh[,...]");
    if (ns) printf("\nsLSTM core (cuda backend)\n%-16s | %9s %9s | %9s %9s | %s\n", "B x T x H x Dh", "fwd ms", "fwd strm",
                   "f+b ms", "f+b strm", "finite");
    for (int si = 0; si < ns; si++) {
        BenchShape sh = shapes[si];
        const int D = sh.H * sh.D;
        size_t nh = (size_t)sh.B * sh.T * D, nr = (size_t)sh.H * sh.D * 4 * sh.D;
        XRun r = {be};
        SlstmDims sd = {sh.B, sh.T, sh.H, sh.D, 0.0f};
        r.sd = sd;
        void *x = bench_rand_buf(be, 4 * nh, MEM_ACT, -2, 2, 0, 11), *R = bench_rand_buf(be, nr, MEM_PARAM, -0.07, 0.07, 0, 12);
        void *dh = bench_rand_buf(be, nh, MEM_ACT, -1, 1, 0, 13), *h = be->alloc(be, nh, MEM_ACT);
        void *cache = be->alloc(be, 4 * nh, MEM_F32), *dx = be->alloc(be, 4 * nh, MEM_ACT), *dR = be->alloc(be, nr, MEM_F32);
        SlstmFwd f = {x, R, NULL, h, cache, NULL};
        SlstmBwd b = {x, R, cache, dh, dx, dR};
        r.sf = f;
        r.sb = b;
        double tf = bench_median_time(be, reps, s_fwd, &r), tfs = bench_stream_time(be, reps, s_fwd, &r);
        double tb = bench_median_time(be, reps, s_fwd_bwd, &r), tbs = bench_stream_time(be, reps, s_fwd_bwd, &r);
        int fin = bench_all_finite(be, h, nh, MEM_ACT) && bench_all_finite(be, dx, 4 * nh, MEM_ACT) && bench_all_finite(be, dR, nr, MEM_F32);
        char name[40];
        snprintf(name, sizeof name, "%dx%dx%dx%d", sh.B, sh.T, sh.H, sh.D);
        printf("%-16s | %9.3f %9.3f | %9.3f %9.3f | %s\n", name, 1e3 * tf, 1e3 * tfs, 1e3 * tb, 1e3 * tbs,
               fin ? "yes" : "NO");
        fflush(stdout);
        void *bufs[] = {x, R, dh, h, cache, dx, dR};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    }
    return 0;
}
