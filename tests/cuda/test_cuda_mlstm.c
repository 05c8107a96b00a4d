// The mLSTM core on the GPU (src/cuda/mlstm_cuda.cu, mlstm_chunk.cuh: the backend's mlstm->fwd, bwd)
// against the CPU backend's (src/cpu/mlstm.c, float32), through the op tables, on awkward shapes:
// T not a multiple of the chunk (1, 67, 75, 130, 200), B 2, H 3, heads of 16, 17, 24, 64, 128, 256 and
// Dk != Dv, heads above 256 (320 x 448, 384, 512, 64 x 384: the chunkwise forward's and the backward's
// walks in two slices of a contraction over 256, ml_walk2's float32 partials), hard gates (input
// gates up to +-20, forget gates near 1: sigmoid(6 +- 2)), and eps 0.5 and 0.05, where the backward's exact gradient through the stabiliser m (core/backend.h: dL/dm_t =
// -(dh_t . h_t) eps / den_t, back through m_t's max to the winning gate) is a large part of dfg and dig
// (the CPU emulation without it: dfg off by 0.76, dig by 0.39). Both get the same inputs, q, k, v, dh
// rounded to bf16 first (what the GPU holds); each backward gets its own forward's h, nq, m. Every GPU output is poisoned with NaN before the call (an element never written
// shows as NaN, which fails every comparison).
//
// Tolerances (relative L2 over the tensor). The GPU's products take bf16 operands with float32 sums:
// the scores and the state term exact in float32 (bf16 x bf16 products), but the masked weights P,
// the state's bf16 copy for the next chunk's A X^T and the update's scaled C each carry bf16's 2^-9
// relative rounding, and the bf16 outputs their own (2^-9 per element, ~1.1e-3 in the L2 sense). The
// CPU emulation of these kernels (scripts/cuda_emulate.sh mlstm) measured 1.6e-3 .. 2.9e-3 for h and
// 2.2e-3 .. 5.3e-3 for dq, dk, dv against float64 (the larger with hard gates), so BF16_TOL = 1.5e-2
// leaves 3x; a wrong index or a missing term is O(0.1 .. 1). nq and the normaliser n are float32
// sums of exact products (emulation: 1e-7 .. 2.3e-6): NQ_TOL = 1e-3 (the CPU's own float32 order
// differs too). m is a float32 cumulative sum and a max (emulation 4e-7): M_TOL = 1e-5. The state C
// accumulates the update's bf16 operands (emulation 4.6e-4 .. 1.3e-3): C_TOL = 1e-2. dig = k . dk and
// dfg (a reverse cumulative sum of q . dq - k . dk, which cancels) from float32 dq, dk carrying the
// products' rounding (emulation 1.2e-3 .. 4.5e-3; an H200 3.1e-3): GATE_TOL = 2.5e-2, dfg's error
// measured against max(||dfg||, ||dig||), the scale of its terms (at T = 1 dfg is 0 exactly).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/half.h"
#include "../fd.h"
#include "../test.h"

#define BF16_TOL 1.5e-2
#define NQ_TOL 1e-3
#define M_TOL 1e-5
#define C_TOL 1e-2
#define GATE_TOL 2.5e-2

static const Backend *G;

static int setup(void) {
    G = backend_cuda();
    if (!G) test_fail(__FILE__, __LINE__, "no CUDA backend: %s", mn_last_error());
    if (G && (!G->mlstm || !G->mlstm->fwd || !G->mlstm->bwd)) {
        test_fail(__FILE__, __LINE__, "the CUDA backend has no mLSTM core");
        return 0;
    }
    return G != NULL;
}

static void round_act(double *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(f32_to_bf16((float)x[i]));
}
static void round_f32(double *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = (double)(float)x[i];
}

static void *up(const Backend *be, const double *h, size_t n, MemKind k) {
    if (!h) return NULL;
    void *p = be->alloc(be, n, k);
    if (!p || be->upload(be, p, h, n, k)) die("%s", mn_last_error());
    return p;
}
// A buffer of n NaN (poisoned: every element must be written)
static void *poisoned(const Backend *be, size_t n, MemKind k) {
    double *h = xcalloc(n ? n : 1, sizeof(double));
    for (size_t i = 0; i < n; i++) h[i] = NAN;
    void *p = up(be, h, n, k);
    free(h);
    return p;
}
static double *down(const Backend *be, const void *p, size_t n, MemKind k) {
    double *h = xcalloc(n ? n : 1, sizeof(double));
    if (be->download(be, h, p, n, k)) die("%s", mn_last_error());
    return h;
}

typedef struct {
    int B, T, H, Dk, Dv, hard;
    double eps;  // 0: NX-AI's 1e-6
} MShape;

typedef struct {
    MnSeqDims d;
    float eps;
    size_t nq, nv, nt, ns, np;  // elements of q/k, v/h, the gates, C, the pairs
    double *q, *k, *v, *fg, *ig, *dh, *c0, *n0, *m0;
} MCase;

static void mcase_init(MCase *c, const MShape *s, unsigned long long seed) {
    memset(c, 0, sizeof *c);
    MnSeqDims d = {s->B, s->T, s->H, s->Dk, s->Dv};
    c->d = d;
    c->eps = s->eps > 0 ? (float)s->eps : 1e-6f;
    c->nt = (size_t)s->B * s->T * s->H;
    c->nq = c->nt * s->Dk;
    c->nv = c->nt * s->Dv;
    c->np = (size_t)s->B * s->H;
    c->ns = c->np * s->Dv * s->Dk;
    c->q = rand_doubles(seed, c->nq, -1, 1);
    c->k = rand_doubles(seed + 1, c->nq, -1, 1);
    c->v = rand_doubles(seed + 2, c->nv, -1, 1);
    c->dh = rand_doubles(seed + 3, c->nv, -1, 1);
    c->fg = rand_doubles(seed + 4, c->nt, s->hard ? 4 : 0, s->hard ? 8 : 4);  // pre-activations, then log sigmoid
    for (size_t i = 0; i < c->nt; i++) c->fg[i] = -log1p(exp(-c->fg[i]));
    c->ig = rand_doubles(seed + 5, c->nt, s->hard ? -20 : -2, s->hard ? 20 : 2);
    c->c0 = rand_doubles(seed + 6, c->ns, -1, 1);
    c->n0 = rand_doubles(seed + 7, c->np * s->Dk, -1, 1);
    c->m0 = rand_doubles(seed + 8, c->np, -3, 3);
    round_act(c->q, c->nq);
    round_act(c->k, c->nq);
    round_act(c->v, c->nv);
    round_act(c->dh, c->nv);
    round_f32(c->fg, c->nt);
    round_f32(c->ig, c->nt);
    round_f32(c->c0, c->ns);
    round_f32(c->n0, c->np * s->Dk);
    round_f32(c->m0, c->np);
}

static void mcase_free(MCase *c) {
    free(c->q); free(c->k); free(c->v); free(c->fg); free(c->ig); free(c->dh); free(c->c0); free(c->n0); free(c->m0);
}

typedef struct {
    double *h, *nq, *m, *cT, *nT, *mT, *dq, *dk, *dv, *dfg, *dig;
} MOuts;

static void mouts_free(MOuts *r) {
    free(r->h); free(r->nq); free(r->m); free(r->cT); free(r->nT); free(r->mT);
    free(r->dq); free(r->dk); free(r->dv); free(r->dfg); free(r->dig);
    memset(r, 0, sizeof *r);
}

static MlstmOpts mopts(const MCase *c, MnForm form) {
    MlstmOpts o = {(float)(1.0 / sqrt((double)c->d.Dk)), c->eps, form, 0};
    return o;
}

// A forward on be (from c's state where state), its final state, and (from a zero state only) the
// backward with its own h, nq, m.
static int run_on(const Backend *be, const MCase *c, MnForm form, int state, MOuts *r) {
    memset(r, 0, sizeof *r);
    const MnSeqDims *d = &c->d;
    MlstmOpts o = mopts(c, form);
    void *q = up(be, c->q, c->nq, MEM_ACT), *k = up(be, c->k, c->nq, MEM_ACT), *v = up(be, c->v, c->nv, MEM_ACT);
    void *fg = up(be, c->fg, c->nt, MEM_F32), *ig = up(be, c->ig, c->nt, MEM_F32), *dh = up(be, c->dh, c->nv, MEM_ACT);
    void *c0 = state ? up(be, c->c0, c->ns, MEM_F32) : NULL, *n0 = state ? up(be, c->n0, c->np * d->Dk, MEM_F32) : NULL;
    void *m0 = state ? up(be, c->m0, c->np, MEM_F32) : NULL;
    void *h = poisoned(be, c->nv, MEM_ACT), *nq = poisoned(be, c->nt, MEM_F32), *m = poisoned(be, c->nt, MEM_F32);
    void *cT = poisoned(be, c->ns, MEM_F32), *nT = poisoned(be, c->np * d->Dk, MEM_F32), *mT = poisoned(be, c->np, MEM_F32);
    void *dq = poisoned(be, c->nq, MEM_ACT), *dk = poisoned(be, c->nq, MEM_ACT), *dv = poisoned(be, c->nv, MEM_ACT);
    void *dfg = poisoned(be, c->nt, MEM_F32), *dig = poisoned(be, c->nt, MEM_F32);
    MlstmFwd f = {q, k, v, fg, ig, c0, n0, m0, h, nq, m, cT, nT, mT};
    int rc = be->mlstm->fwd(be, d, &o, &f);
    if (!rc && !state) {
        MlstmBwd b = {q, k, v, fg, ig, h, nq, m, dh, dq, dk, dv, dfg, dig};
        rc = be->mlstm->bwd(be, d, &o, &b);
    }
    if (!rc) rc = be->sync(be);
    if (!rc) {
        r->h = down(be, h, c->nv, MEM_ACT), r->nq = down(be, nq, c->nt, MEM_F32), r->m = down(be, m, c->nt, MEM_F32);
        r->cT = down(be, cT, c->ns, MEM_F32), r->nT = down(be, nT, c->np * d->Dk, MEM_F32);
        r->mT = down(be, mT, c->np, MEM_F32);
        if (!state) {
            r->dq = down(be, dq, c->nq, MEM_ACT), r->dk = down(be, dk, c->nq, MEM_ACT), r->dv = down(be, dv, c->nv, MEM_ACT);
            r->dfg = down(be, dfg, c->nt, MEM_F32), r->dig = down(be, dig, c->nt, MEM_F32);
        }
    }
    void *bufs[] = {q, k, v, fg, ig, dh, c0, n0, m0, h, nq, m, cT, nT, mT, dq, dk, dv, dfg, dig};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    return rc;
}

static double worst[11];
static const char *const names[11] = {"h", "nq", "m", "cT", "nT", "mT", "dq", "dk", "dv", "dfg", "dig"};

// ||got - want|| / max(||want||, floor): floor 0 but for dfg, whose terms q . dq - k . dk cancel (at
// T = 1 exactly: dq = P k, dk = P q), so that its rounding is measured against the terms' scale,
// ||dig||, instead of a sum that can be 0 (its relative error is then noise over noise).
static double rel_floor(const double *got, const double *want, size_t n, double floor) {
    double e = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        e += (got[i] - want[i]) * (got[i] - want[i]);
        r += want[i] * want[i];
    }
    r = fmax(sqrt(r), floor);
    return r > 0 ? sqrt(e) / r : sqrt(e);
}

static double norm2(const double *x, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += x[i] * x[i];
    return sqrt(s);
}

static void cmp_floor(const char *tag, int i, const double *got, const double *want, size_t n, double tol, double floor) {
    if (!got || !want) return;
    double e = rel_floor(got, want, n, floor);
    if (e > worst[i] || isnan(e)) worst[i] = isnan(e) ? INFINITY : e;
    test_note("%-46s %-4s rel err %.2e", tag, names[i], e);
    if (!(e <= tol)) test_fail(__FILE__, __LINE__, "%s %s: rel err %.3g > %.3g", tag, names[i], e, tol);
}

static void cmp(const char *tag, int i, const double *got, const double *want, size_t n, double tol) {
    cmp_floor(tag, i, got, want, n, tol, 0);
}

static void cmp_outs(const char *tag, const MCase *c, const MOuts *g, const MOuts *w) {
    cmp(tag, 0, g->h, w->h, c->nv, BF16_TOL);
    cmp(tag, 1, g->nq, w->nq, c->nt, NQ_TOL);
    cmp(tag, 2, g->m, w->m, c->nt, M_TOL);
    cmp(tag, 3, g->cT, w->cT, c->ns, C_TOL);
    cmp(tag, 4, g->nT, w->nT, c->np * c->d.Dk, NQ_TOL);
    cmp(tag, 5, g->mT, w->mT, c->np, M_TOL);
    cmp(tag, 6, g->dq, w->dq, c->nq, BF16_TOL);
    cmp(tag, 7, g->dk, w->dk, c->nq, BF16_TOL);
    cmp(tag, 8, g->dv, w->dv, c->nv, BF16_TOL);
    cmp_floor(tag, 9, g->dfg, w->dfg, c->nt, GATE_TOL, w->dig ? norm2(w->dig, c->nt) : 0);
    cmp(tag, 10, g->dig, w->dig, c->nt, GATE_TOL);
}

// Every shape in both GPU forms (the backward has one), from a zero state and from a given one,
// against the CPU's chunkwise form.
TEST(cuda_mlstm_matches_cpu) {
    if (!setup()) return;
    const Backend *cpu = backend_cpu();
    if (!cpu->mlstm || !cpu->mlstm->fwd) {
        test_fail(__FILE__, __LINE__, "the CPU backend has no mLSTM core to compare with");
        return;
    }
    static const MShape shapes[] = {
        {2, 67, 3, 16, 16, 0},    // B 2, H 3, heads of 16, a chunk and 3 tokens
        {2, 130, 2, 64, 64, 0},   // three chunks, the last of 2 tokens
        {1, 130, 2, 128, 128, 1}, // heads of 128, hard gates
        {2, 67, 1, 17, 24, 1},    // odd Dk (rows loaded through registers), Dk != Dv, hard gates
        {1, 200, 1, 256, 48, 0},  // the widest contraction (256), Dv 48
        {2, 1, 2, 32, 32, 0},     // a single token (AUTO would decode it)
        {1, 64, 3, 128, 64, 1},   // one whole chunk, Dv < Dk
        {2, 130, 2, 32, 32, 1, 0.5},  // eps 0.5: m's path in the backward is then O(1) of dfg, dig
        {1, 67, 1, 64, 64, 0, 0.05},  //         and eps 0.05
        {2, 75, 2, 320, 448, 0},      // heads above 256: Dk 320, Dv 448
        {1, 130, 2, 384, 384, 1},     // the xLSTM 125M model's heads, hard gates
        {1, 70, 1, 512, 512, 0},      // the 350M model's
        {1, 67, 2, 64, 384, 0, 0.5},  // Dk 64 (the chunkwise forward), Dv 384 (dq, dk in two slices); eps 0.5
    };
    memset(worst, 0, sizeof worst);
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const MShape *s = &shapes[i];
        MCase c;
        mcase_init(&c, s, 100 + 13 * i);
        for (int state = 0; state < 2; state++) {
            MOuts want;
            CHECK(!run_on(cpu, &c, MN_FORM_CHUNK, state, &want), "cpu: %s", mn_last_error());
            for (int form = MN_FORM_CHUNK; form <= MN_FORM_RECURRENT; form++) {
                char tag[96];
                snprintf(tag, sizeof tag, "%s B%d T%d H%d Dk%d Dv%d%s%s eps %g", form == MN_FORM_CHUNK ? "chunk" : "rec  ",
                         s->B, s->T, s->H, s->Dk, s->Dv, s->hard ? " hard" : "", state ? " s0" : "", (double)c.eps);
                MOuts got;
                int rc = run_on(G, &c, (MnForm)form, state, &got);
                CHECK(!rc, "%s: %s", tag, mn_last_error());
                if (!rc) cmp_outs(tag, &c, &got, &want);
                mouts_free(&got);
            }
            mouts_free(&want);
        }
        mcase_free(&c);
    }
    test_note("worst: h %.2e nq %.2e m %.2e cT %.2e nT %.2e mT %.2e dq %.2e dk %.2e dv %.2e dfg %.2e dig %.2e",
              worst[0], worst[1], worst[2], worst[3], worst[4], worst[5], worst[6], worst[7], worst[8], worst[9],
              worst[10]);
}

// Rows t0 .. t0 + n - 1 of x [B,T,H,D] as [B,n,H,D].
static double *rows_of(const double *x, int B, int T, int H, int D, int t0, int n) {
    double *y = xcalloc((size_t)B * n * H * D, sizeof(double));
    for (int b = 0; b < B; b++)
        memcpy(y + (size_t)b * n * H * D, x + ((size_t)b * T + t0) * H * D, sizeof(double) * n * H * D);
    return y;
}

// A forward over T tokens at once against the same tokens in parts with the state handed on (c0 /
// cT, n0 / nT, m0 / mT aliasing one buffer each): a chunkwise prefill of 70 tokens, 5 tokens decoded
// one call each (the recurrent form, as AUTO picks for T = 1), the remaining 55 as one more chunkwise
// call from the state. h within BF16_TOL, the final states within C_TOL, NQ_TOL, M_TOL.
static void prefill_decode(const MShape s) {
    MCase c;
    mcase_init(&c, &s, 7);
    MOuts full;
    CHECK(!run_on(G, &c, MN_FORM_CHUNK, 0, &full), "%s", mn_last_error());
    const int B = s.B, H = s.H, Dk = s.Dk, Dv = s.Dv;
    void *C = G->alloc(G, c.ns, MEM_F32), *n = G->alloc(G, c.np * Dk, MEM_F32), *m = G->alloc(G, c.np, MEM_F32);
    double *h = xcalloc(c.nv, sizeof(double));
    const int parts[][2] = {{0, 70}, {70, 1}, {71, 1}, {72, 1}, {73, 1}, {74, 1}, {75, 55}};
    for (size_t p = 0; p < sizeof parts / sizeof parts[0]; p++) {
        const int t0 = parts[p][0], len = parts[p][1];
        MnSeqDims d = {B, len, H, Dk, Dv};
        double *q = rows_of(c.q, B, s.T, H, Dk, t0, len), *k = rows_of(c.k, B, s.T, H, Dk, t0, len);
        double *v = rows_of(c.v, B, s.T, H, Dv, t0, len), *fg = rows_of(c.fg, B, s.T, H, 1, t0, len);
        double *ig = rows_of(c.ig, B, s.T, H, 1, t0, len);
        size_t nt = (size_t)B * len * H;
        void *gq = up(G, q, nt * Dk, MEM_ACT), *gk = up(G, k, nt * Dk, MEM_ACT), *gv = up(G, v, nt * Dv, MEM_ACT);
        void *gf = up(G, fg, nt, MEM_F32), *gi = up(G, ig, nt, MEM_F32), *gh = poisoned(G, nt * Dv, MEM_ACT);
        MlstmOpts o = mopts(&c, len > 1 ? MN_FORM_CHUNK : MN_FORM_AUTO);
        MlstmFwd f = {gq, gk, gv, gf, gi, p ? C : NULL, p ? n : NULL, p ? m : NULL, gh, NULL, NULL, C, n, m};
        CHECK(!G->mlstm->fwd(G, &d, &o, &f), "part %zu: %s", p, mn_last_error());
        double *hp = down(G, gh, nt * Dv, MEM_ACT);
        for (int b = 0; b < B; b++)
            memcpy(h + ((size_t)b * s.T + t0) * H * Dv, hp + (size_t)b * len * H * Dv, sizeof(double) * len * H * Dv);
        free(hp); free(q); free(k); free(v); free(fg); free(ig);
        void *bufs[] = {gq, gk, gv, gf, gi, gh};
        for (size_t i = 0; i < 6; i++) G->free(G, bufs[i]);
    }
    double *cT = down(G, C, c.ns, MEM_F32), *nT = down(G, n, c.np * Dk, MEM_F32), *mT = down(G, m, c.np, MEM_F32);
    memset(worst, 0, sizeof worst);
    char tag[96];
    snprintf(tag, sizeof tag, "prefill 70 + 5 decoded + 55, Dk %d Dv %d", Dk, Dv);
    cmp(tag, 0, h, full.h, c.nv, BF16_TOL);
    cmp(tag, 3, cT, full.cT, c.ns, C_TOL);
    cmp(tag, 4, nT, full.nT, c.np * Dk, NQ_TOL);
    cmp(tag, 5, mT, full.mT, c.np, M_TOL);
    free(h); free(cT); free(nT); free(mT);
    G->free(G, C); G->free(G, n); G->free(G, m);
    mouts_free(&full);
    mcase_free(&c);
}

TEST(cuda_mlstm_prefill_decode_matches_forward) {
    if (!setup()) return;
    prefill_decode((MShape){2, 130, 2, 64, 48, 1});
    prefill_decode((MShape){1, 130, 2, 384, 320, 0});  // heads above 256: the state's two column slices
}

// MN_FORM_AUTO takes the chunkwise form from T = 16 on, heads above 256 included: its h is the
// chunkwise form's bit for bit (the walks are deterministic), and the recurrent form's differs (by
// rounding), so that the comparison tells the forms apart.
TEST(cuda_mlstm_auto_takes_the_chunkwise_form) {
    if (!setup()) return;
    static const MShape shapes[] = {{1, 67, 2, 64, 64, 0}, {1, 130, 2, 384, 384, 0}, {1, 16, 1, 512, 320, 0}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const MShape *s = &shapes[i];
        MCase c;
        mcase_init(&c, s, 300 + i);
        MOuts a, ch, rec;
        memset(&a, 0, sizeof a), memset(&ch, 0, sizeof ch), memset(&rec, 0, sizeof rec);
        int rc = run_on(G, &c, MN_FORM_AUTO, 1, &a);
        rc = rc ? rc : run_on(G, &c, MN_FORM_CHUNK, 1, &ch);
        rc = rc ? rc : run_on(G, &c, MN_FORM_RECURRENT, 1, &rec);
        CHECK(!rc, "T %d Dk %d Dv %d: %s", s->T, s->Dk, s->Dv, mn_last_error());
        if (!rc) {
            CHECK(!memcmp(a.h, ch.h, sizeof(double) * c.nv), "T %d Dk %d Dv %d: AUTO's h is not the chunkwise form's",
                  s->T, s->Dk, s->Dv);
            CHECK(memcmp(rec.h, ch.h, sizeof(double) * c.nv) != 0,
                  "T %d Dk %d Dv %d: the recurrent and chunkwise forms' h are identical (the test cannot tell them "
                  "apart)",
                  s->T, s->Dk, s->Dv);
        }
        mouts_free(&a); mouts_free(&ch); mouts_free(&rec);
        mcase_free(&c);
    }
}

// Heads over 512 are refused by supports, naming the size; 512 is taken.
TEST(cuda_mlstm_refuses_wide_heads) {
    if (!setup()) return;
    MnSeqDims ok = {1, 8, 1, 512, 512}, wide = {1, 8, 1, 64, 576};
    CHECK(G->mlstm->supports(G, &ok) == MN_OK, "512 refused: %s", mn_last_error());
    CHECK(G->mlstm->supports(G, &wide) == MN_ERR_UNSUPPORTED, "Dv 576 taken");
    CHECK(strstr(mn_last_error(), "576") != NULL, "the message does not name the size: %s", mn_last_error());
}
