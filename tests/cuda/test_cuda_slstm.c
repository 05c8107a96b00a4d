// The sLSTM core on the GPU (src/cuda/slstm_cuda.cu, slstm_cluster.cu: the backend's slstm->fwd, bwd)
// against the CPU backend's (src/cpu/slstm.c, float32), through the op tables, both kernel families
// (on Hopper the cluster kernels, then MESANET_SLSTM=single's): heads of 5, 17, 64, 192 and 256 cells
// (one padded tile; two batch slices of 8; clusters of 1, 4 blocks; in the single-block kernels R's
// fragments in registers and shared memory, at 256 some read from global memory each step), several
// heads, the recurrent gradient clipped or not, and the state handed on between calls. x and dh are rounded to bf16 first (what the GPU holds); R goes up
// as a parameter (float32, the GPU's products reading its bf16 copy). GPU outputs are poisoned with
// NaN first; dR is accumulated onto random values on both (the += is checked, and compared net).
//
// Tolerances (relative L2). The GPU's step product r = x + R^T h_{t-1} takes R and h_{t-1} in bf16
// with float32 sums (2^-9 relative on each term), the CPU float32 throughout; the cell state, m and
// the normaliser stay float32 on both. The CPU emulation of these kernels (scripts/cuda_emulate.sh
// slstm) measured against float64: h 1.6e-3 .. 1.8e-3 (its own bf16 rounding dominates), the cache
// and the final state 2e-4 .. 5.7e-4, dx 1.7e-3 .. 2e-3 (bf16 output), dR 1.9e-3 .. 2.6e-3 (bf16
// operands of its product). Over the 20 - 40 steps here the rounding of r is carried by the
// recurrence (contracting: sigmoid and tanh gates, R of norm ~1): BF16_TOL = 1e-2 for h and dx,
// F32_TOL = 5e-3 for the cache and the state, DR_TOL = 1e-2. A wrong index, gate or missing term is
// O(0.1 .. 1).
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backends/registry.h"
#include "core/backend.h"
#include "core/common.h"
#include "core/half.h"
#include "../fd.h"
#include "../test.h"

#define BF16_TOL 1e-2
#define F32_TOL 5e-3
#define DR_TOL 1e-2

static const Backend *G;

static int setup(void) {
    G = backend_cuda();
    if (!G) test_fail(__FILE__, __LINE__, "no CUDA backend: %s", mn_last_error());
    if (G && (!G->slstm || !G->slstm->fwd || !G->slstm->bwd)) {
        test_fail(__FILE__, __LINE__, "the CUDA backend has no sLSTM core");
        return 0;
    }
    return G != NULL;
}

static void *up(const Backend *be, const double *h, size_t n, MemKind k) {
    if (!h) return NULL;
    void *p = be->alloc(be, n, k);
    if (!p || be->upload(be, p, h, n, k)) die("%s", mn_last_error());
    return p;
}
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
    int B, T, H, Dh;
    float clip;
    double rscale;  // R's entries uniform in +-rscale / sqrt(Dh)
} SShape;

typedef struct {
    SlstmDims d;
    size_t nx, nh, nr, ns;
    double *x, *r, *s0, *dh, *dr0;
} SCase;

static void scase_init(SCase *c, const SShape *s, unsigned long long seed) {
    memset(c, 0, sizeof *c);
    SlstmDims d = {s->B, s->T, s->H, s->Dh, s->clip};
    c->d = d;
    const int D = s->H * s->Dh;
    c->nh = (size_t)s->B * s->T * D;
    c->nx = 4 * c->nh;
    c->nr = (size_t)s->H * s->Dh * 4 * s->Dh;
    c->ns = (size_t)s->B * 4 * D;
    c->x = rand_doubles(seed, c->nx, -2, 2);
    for (size_t i = 0; i < c->nx; i++)
        if (i / D % 4 == 1) c->x[i] += 2;  // forget gates mostly open
    c->r = rand_doubles(seed + 1, c->nr, -s->rscale / sqrt((double)s->Dh), s->rscale / sqrt((double)s->Dh));
    c->dh = rand_doubles(seed + 2, c->nh, -1, 1);
    c->dr0 = rand_doubles(seed + 3, c->nr, -1, 1);
    c->s0 = rand_doubles(seed + 4, c->ns, -1, 1);
    for (int b = 0; b < s->B; b++)  // a state a step could have left: n > 0
        for (int k = 0; k < D; k++) c->s0[(size_t)b * 4 * D + 2 * D + k] = 1 + 0.5 * c->s0[(size_t)b * 4 * D + 2 * D + k];
    for (size_t i = 0; i < c->nx; i++) c->x[i] = bf16_to_f32(f32_to_bf16((float)c->x[i]));
    for (size_t i = 0; i < c->nh; i++) c->dh[i] = bf16_to_f32(f32_to_bf16((float)c->dh[i]));
    for (size_t i = 0; i < c->nr; i++) c->r[i] = (float)c->r[i], c->dr0[i] = (float)c->dr0[i];
    for (size_t i = 0; i < c->ns; i++) c->s0[i] = (float)c->s0[i];
}

static void scase_free(SCase *c) { free(c->x); free(c->r); free(c->s0); free(c->dh); free(c->dr0); }

typedef struct {
    double *h, *cache, *sT, *dx, *dr;
} SOuts;

static void souts_free(SOuts *o) { free(o->h); free(o->cache); free(o->sT); free(o->dx); free(o->dr); memset(o, 0, sizeof *o); }

// A forward (from s0 where state) and, from a zero state, the backward with its own cache; dr the
// net accumulation (dR after minus dr0).
static int srun_on(const Backend *be, const SCase *c, int state, SOuts *o) {
    memset(o, 0, sizeof *o);
    void *x = up(be, c->x, c->nx, MEM_ACT), *r = up(be, c->r, c->nr, MEM_PARAM), *dh = up(be, c->dh, c->nh, MEM_ACT);
    void *s0 = state ? up(be, c->s0, c->ns, MEM_F32) : NULL, *dr = up(be, c->dr0, c->nr, MEM_F32);
    void *h = poisoned(be, c->nh, MEM_ACT), *cache = poisoned(be, 4 * c->nh, MEM_F32), *sT = poisoned(be, c->ns, MEM_F32);
    void *dx = poisoned(be, c->nx, MEM_ACT);
    SlstmFwd f = {x, r, s0, h, cache, sT};
    int rc = be->slstm->fwd(be, &c->d, &f);
    if (!rc && !state) {
        SlstmBwd b = {x, r, cache, dh, dx, dr};
        rc = be->slstm->bwd(be, &c->d, &b);
    }
    if (!rc) rc = be->sync(be);
    if (!rc) {
        o->h = down(be, h, c->nh, MEM_ACT), o->cache = down(be, cache, 4 * c->nh, MEM_F32), o->sT = down(be, sT, c->ns, MEM_F32);
        if (!state) {
            o->dx = down(be, dx, c->nx, MEM_ACT);
            o->dr = down(be, dr, c->nr, MEM_F32);
            for (size_t i = 0; i < c->nr; i++) o->dr[i] -= c->dr0[i];
        }
    }
    void *bufs[] = {x, r, dh, s0, dr, h, cache, sT, dx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    return rc;
}

static double worst[5];
static const char *const names[5] = {"h", "cache", "sT", "dx", "dR"};

static void cmp(const char *tag, int i, const double *got, const double *want, size_t n, double tol) {
    if (!got || !want) return;
    double e = rel_err64(got, want, n);
    if (e > worst[i] || isnan(e)) worst[i] = isnan(e) ? INFINITY : e;
    test_note("%-40s %-5s rel err %.2e", tag, names[i], e);
    if (!(e <= tol)) test_fail(__FILE__, __LINE__, "%s %s: rel err %.3g > %.3g", tag, names[i], e, tol);
}

TEST(cuda_slstm_matches_cpu) {
    if (!setup()) return;
    const Backend *cpu = backend_cpu();
    if (!cpu->slstm || !cpu->slstm->fwd) {
        test_fail(__FILE__, __LINE__, "the CPU backend has no sLSTM core to compare with");
        return;
    }
    static const SShape shapes[] = {
        {3, 40, 2, 5, 0.0f, 1.0},    // Dh 5: one tile of 4 cells and one of 1, padded
        {9, 33, 1, 17, 0.5f, 2.0},   // two batch slices (8 + 1), odd Dh, the recurrent gradient clipped
        {2, 30, 2, 64, 0.0f, 1.0},   // Dh 64: all of R in registers
        {2, 20, 4, 192, 0.0f, 1.0},  // the speed shape's heads (hidden 768): registers + shared memory
        {1, 12, 1, 256, 0.0f, 1.0},  // Dh 256: part of R read from global memory each step
    };
    memset(worst, 0, sizeof worst);
    // both kernel families: the Hopper cluster kernels (the default there), then the single-block ones
    for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const SShape *s = &shapes[i];
        SCase c;
        scase_init(&c, s, 300 + 17 * i);
        if (pass) setenv("MESANET_SLSTM", "single", 1);
        for (int state = 0; state < 2; state++) {
            char tag[80];
            snprintf(tag, sizeof tag, "%s B%d T%d H%d Dh%d clip %g%s", pass ? "single " : "default", s->B, s->T, s->H,
                     s->Dh, (double)s->clip, state ? " s0" : "");
            SOuts want, got;
            CHECK(!srun_on(cpu, &c, state, &want), "cpu: %s", mn_last_error());
            int rc = srun_on(G, &c, state, &got);
            CHECK(!rc, "%s: %s", tag, mn_last_error());
            if (!rc) {
                cmp(tag, 0, got.h, want.h, c.nh, BF16_TOL);
                cmp(tag, 1, got.cache, want.cache, 4 * c.nh, F32_TOL);
                cmp(tag, 2, got.sT, want.sT, c.ns, F32_TOL);
                cmp(tag, 3, got.dx, want.dx, c.nx, BF16_TOL);
                cmp(tag, 4, got.dr, want.dr, c.nr, DR_TOL);
            }
            souts_free(&want);
            souts_free(&got);
        }
        scase_free(&c);
    }
    unsetenv("MESANET_SLSTM");
    test_note("worst: h %.2e cache %.2e sT %.2e dx %.2e dR %.2e", worst[0], worst[1], worst[2], worst[3], worst[4]);
}

// T steps at once against a call of T0 steps and then T - T0 single steps, the state handed on
// (s0 and sT one buffer): h within BF16_TOL, the final state within F32_TOL.
TEST(cuda_slstm_state_handoff_matches_forward) {
    if (!setup()) return;
    const SShape s = {3, 24, 2, 64, 0.0f, 1.0};
    SCase c;
    scase_init(&c, &s, 5);
    SOuts full;
    CHECK(!srun_on(G, &c, 0, &full), "%s", mn_last_error());
    const int B = s.B, T = s.T, D = s.H * s.Dh, T0 = 19;
    void *st = G->alloc(G, c.ns, MEM_F32), *r = up(G, c.r, c.nr, MEM_PARAM);
    double *h = xcalloc(c.nh, sizeof(double));
    for (int t0 = 0; t0 < T; t0 += t0 ? 1 : T0) {
        const int len = t0 ? 1 : T0;
        SlstmDims d = {B, len, s.H, s.Dh, 0.0f};
        double *x = xcalloc((size_t)B * len * 4 * D, sizeof(double));
        for (int b = 0; b < B; b++)
            memcpy(x + (size_t)b * len * 4 * D, c.x + ((size_t)b * T + t0) * 4 * D, sizeof(double) * len * 4 * D);
        void *gx = up(G, x, (size_t)B * len * 4 * D, MEM_ACT), *gh = poisoned(G, (size_t)B * len * D, MEM_ACT);
        SlstmFwd f = {gx, r, t0 ? st : NULL, gh, NULL, st};
        CHECK(!G->slstm->fwd(G, &d, &f), "t0 %d: %s", t0, mn_last_error());
        double *hp = down(G, gh, (size_t)B * len * D, MEM_ACT);
        for (int b = 0; b < B; b++)
            memcpy(h + ((size_t)b * T + t0) * D, hp + (size_t)b * len * D, sizeof(double) * len * D);
        free(hp);
        free(x);
        G->free(G, gx);
        G->free(G, gh);
    }
    double *sT = down(G, st, c.ns, MEM_F32);
    memset(worst, 0, sizeof worst);
    cmp("19 steps + 5 single steps", 0, h, full.h, c.nh, BF16_TOL);
    cmp("19 steps + 5 single steps", 2, sT, full.sT, c.ns, F32_TOL);
    free(h);
    free(sT);
    G->free(G, st);
    G->free(G, r);
    souts_free(&full);
    scase_free(&c);
}

TEST(cuda_slstm_refuses_wide_heads) {
    if (!setup()) return;
    SlstmDims ok = {1, 4, 4, 256, 0.0f}, wide = {1, 4, 2, 384, 0.0f};
    CHECK(G->slstm->supports(G, &ok) == MN_OK, "256 refused: %s", mn_last_error());
    CHECK(G->slstm->supports(G, &wide) == MN_ERR_UNSUPPORTED, "Dh 384 taken");
    CHECK(strstr(mn_last_error(), "384") != NULL, "the message does not name the size: %s", mn_last_error());
}
