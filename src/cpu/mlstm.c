/*
 * The mLSTM core, float32 on the CPU (core/backend.h's MlstmOps; docs/spec/mixers.md section 4,
 * docs/spec/reference/xlstm-notes.md 2.2-2.6), one (sequence, head) pair at a time on
 * cpu_for_pairs. The state is kept augmented: Caug = [C; n^T], (Dv+1) x Dk, with the values
 * augmented likewise, vt = [v, 1], so that every product gives the numerator and nq = s n . q
 * at once (its last column).
 *
 * Recurrent form (decoding, short inputs), per token, m carried in float:
 *     m_t = max(f_t + m_{t-1}, i_t);  Caug = a_t Caug + b_t vt_t k_t^T;  [num; nq] = s Caug q_t
 *     h_t = num / (max(|nq|, exp(-m_t)) + eps)
 * Chunkwise form, per chunk of n <= C tokens with the carried stabilised (Caug, m_prev), b the
 * chunk-local inclusive cumulative sum of f:
 *     stab_tau = max(m_prev + b_tau, max_{sigma<=tau} (b_tau - b_sigma + i_sigma))     (= the recurrent m)
 *     W = s (Q K^T) (.) exp(b_tau - b_sigma + i_sigma - stab_tau) [sigma <= tau]
 *     [num; nq] = W Vt + diag(s exp(m_prev + b - stab)) Q Caug^T
 *     m_new = max(g + m_prev, max_sigma a_sigma),  a_sigma = i_sigma + g - b_sigma,  g = b_n
 *     Caug = exp(g + m_prev - m_new) Caug + Vt^T diag(exp(a - m_new)) K
 * Every weight is the exponential of a difference taken in double (b, and i - b, are summed in
 * double from the float gates) that is <= 0 up to rounding, so nothing overflows and long runs of
 * large gates lose no digits to a float sum; the m's themselves are floats (as stored and handed
 * on), and each exponent is formed from the m's actually used, so the state stays consistent with
 * them to rounding. The floor exp(-m) is formed in float from the float m, as stored, so that the
 * backward sees the forward's (+inf, and h = 0, where m < -88).
 *
 * Backward (either form asked: one algorithm), from a zero state: the exact gradient of
 * src/ref/mlstm_ref.c, evaluated chunk by chunk: first with m held constant (the forward's m_t per
 * token, the carried m at chunk ends), then m's own path. With do_t = [dh_t / den_t, dnq_t],
 * E_tj = exp(cs_t - cs_j + i_j - m_t) and R_tj = dL/d log E_tj:
 *   pass 1: the chunk-start states (Caug, m) again, as the forward;
 *   pass 2, chunks in reverse, carrying dS = s sum_{t > e} exp(cs_t - cs_e - m_t + M_e) do_t q_t^T
 *   ([Dv+1, Dk], e the chunk's last token, M_e the carried m there; every exponent <= 0):
 *     W = s E (.) (Q K^T)                             (the forward's)
 *     G = Do Vt^T, P = s E (.) G                      (dL/dW, dL/d(q_t . k_j) inside the chunk)
 *     R = G (.) W                                     (in double, from the float G and W)
 *     dQ = diag(s w') Do Caug_prev + P K,             w'_t = exp(M_prev + b_t - m_t)
 *     dK = diag(wl) Vt dS + P^T Q,                    wl_j = exp(g - b_j + i_j - M_e) <= 1
 *     dV = W^T dNum + diag(wl) K dS[:Dv]^T
 *     dig_j = sum_t R_tj + k_j . dK'_j                (dK' the state term alone: the later chunks' R_tj)
 *     dcs_t = sum_j R_tj + q_t . dQ'_t - dig_t        (dQ' likewise: the earlier chunks' R_tj)
 *     dfg_t = sum_{u >= t in the chunk} dcs_u + <dS, Caug_end>
 *     dS <- exp(g + M_prev - M_e) dS + (diag(s w') Do)^T Q
 *   The last term of dfg is the sum of the later tokens' dcs (the part over t > e, j <= e of the
 *   sum of R_tj), taken from the state rather than as a running sum over the sequence, which would
 *   gather the rounding of every later token's terms (they cancel in part); at T <= 1000 the two
 *   measured alike.
 *   m's path (xlstm-notes aside: h_t depends on m_t through eps alone): dL/dm_t = -(dh_t . h_t) eps
 *   / den_t, carried back through m_t = max(f_t + m_{t-1}, i_t) by one reverse scan over the pair's
 *   tokens: g_t = dL/dm_t + what m_{t+1} passed down; where i_t won (i_t >= f_t + m_{t-1}, from the
 *   stored m; m_{-1} = 0) dig_t += g_t and nothing passes on, else dfg_t += g_t and g_t passes on.
 *   The input gates' sum: an input-gate bias's gradient is sum_j dig_j, structurally small (moving
 *   every i alike moves m alike and leaves h, eps included, but at tokens on the floor), a sum of
 *   terms that cancel to ~1e-2 and below of their size, so float32 rounding of the terms shows in it
 *   as ~1e-7 of the terms (k . dk and the R_tj alike: up to 570 x the reference's own sensitivity in
 *   tests/test_mlstm.c's mlstm_cpu_matches_ref). But the same sum is also sum_t rho_t, rho_t =
 *   sum_j R_tj = do_t . [num_t, nq_t] = (dh_t . h_t) eps / den_t (dh_t . h_t on the floor), each
 *   formed from the forward's outputs without cancellation, and cancelling m's path exactly where
 *   that is exact. So the pair's sum is set to it: the difference, the rounding of the R_tj, is
 *   spread over the tokens in proportion to the size of their terms (sum_t |R_tj| + |k_j| |dK'_j|),
 *   a change within each token's own rounding. That leaves sum_j dig_j within 4.5 x the sensitivity
 *   there, about the rounding of dig's float32 outputs. (Inside a layer whose output is normalised
 *   per head, dh_t . h_t is itself ~0 and the float32 rounding of the core's inputs moves the sum by
 *   1e-5 to 3e-4: the exact float64 core on a float32 layer's inputs is as far off as this one.)
 */
#include <math.h>
#include <string.h>

#include "blas.h"
#include "chunk.h"
#include "core/common.h"
#include "core/seq_args.h"
#include "mlstm_cpu.h"
#include "pairs.h"
#include "vec.h"
#include "vmath.h"

// C = 64 as the linear-attention cores (lin.c): products of C x D by D x D pay for BLAS, and the
// C x C work stays below the state's at head sizes >= 64.
enum { MLSTM_DEFAULT_CHUNK = 64 };

// AUTO: the recurrent form below this many tokens (decoding, and the shortest prompts). One core,
// Dk = Dv = 64, 8 heads: the chunkwise forward took 2.1 us a token and head at T = 2 (recurrent
// 1.9), 1.4 at T = 4 (recurrent 1.8), 0.7-1.2 from T = 16 on (recurrent 1.6-2.2). (At head size
// 16 the recurrent form stays as fast at every length.)
enum { MLSTM_RECURRENT_BELOW = 4 };

// ---------------------------------------------------------------------------------------------
// Workspace, carved in blocks of 16 floats (64 bytes: doubles and cache lines stay aligned, the
// base from cpu_workspace being 64-byte aligned). A carve with a NULL base only counts.

typedef struct {
    float *base;
    size_t used;
} Carve;

static float *take(Carve *c, size_t floats) {
    float *p = c->base ? c->base + c->used : NULL;
    c->used += (floats + 15) & ~(size_t)15;
    return p;
}

static double *take64(Carve *c, size_t n) { return (double *)(void *)take(c, 2 * n); }

// One chunk's scratch: tokens as rows, gathered contiguous.
typedef struct {
    int C, n, dk, dv, dv1;
    double *b, *ib, *stab;         // [C] cumulative f, i - b, and (forward) the stabiliser
    float *mt, *wq, *wl, *x;       // [C] per-token m, row weights s w', key weights wl, exponent scratch
    float *q, *k, *qw, *kw;        // [C x Dk]
    float *v, *out, *dov, *vw;     // [C x (Dv+1)]: Vt, [num, nq] (forward) / Do (backward), diag(s w') Do, diag(wl) Vt
    float *gq, *gk, *gv;           // [C x Dk], [C x Dk], [C x Dv]: dQ, dK, dV
    float *e, *w, *p;              // [C x C]: E, W = s E (.) Q K^T, P
    double *rrow, *rcol, *rabs;    // [C] (backward): R's row and column sums, the column sums of |R|
    double *xq, *xk, *dm;          // [C] (backward): the state terms q . dq', k . dk', dL/dm
} Chunk;

static void chunk_carve(Chunk *c, Carve *cv, int C, int dk, int dv, int backward) {
    size_t cd = (size_t)C * dk, cv1 = (size_t)C * (dv + 1), cc = (size_t)C * C;
    c->C = C;
    c->dk = dk;
    c->dv = dv;
    c->dv1 = dv + 1;
    c->b = take64(cv, C);
    c->ib = take64(cv, C);
    c->stab = take64(cv, C);
    c->mt = take(cv, C);
    c->wq = take(cv, C);
    c->wl = take(cv, C);
    c->x = take(cv, C);
    c->q = take(cv, cd);
    c->k = take(cv, cd);
    c->qw = take(cv, cd);
    c->kw = take(cv, cd);
    c->v = take(cv, cv1);
    c->out = take(cv, cv1);
    c->w = take(cv, cc);
    if (backward) {
        c->dov = take(cv, cv1);
        c->vw = take(cv, cv1);
        c->gq = take(cv, cd);
        c->gk = take(cv, cd);
        c->gv = take(cv, (size_t)C * dv);
        c->e = take(cv, cc);
        c->p = take(cv, cc);
        c->rrow = take64(cv, C);
        c->rcol = take64(cv, C);
        c->rabs = take64(cv, C);
        c->xq = take64(cv, C);
        c->xk = take64(cv, C);
        c->dm = take64(cv, C);
    }
}

static void gather(float *dst, const float *src, const SeqPair *p, int t0, int n, int d, int ld) {
    for (int t = 0; t < n; t++) memcpy(dst + (size_t)t * ld, src + pair_tok(p, t0 + t) * d, sizeof(float) * d);
}

// Tokens t0 .. t0+n-1: K, Vt, b, i - b, and Q if wanted.
static void load_chunk(Chunk *c, const SeqPair *p, int t0, int n, const float *q, const float *k, const float *v,
                       const float *fg, const float *ig) {
    int dk = c->dk, dv = c->dv, dv1 = c->dv1;
    c->n = n;
    if (q) gather(c->q, q, p, t0, n, dk, dk);
    gather(c->k, k, p, t0, n, dk, dk);
    gather(c->v, v, p, t0, n, dv, dv1);
    double acc = 0;
    for (int t = 0; t < n; t++) {
        size_t ti = pair_tok(p, t0 + t);
        c->v[(size_t)t * dv1 + dv] = 1;
        c->b[t] = acc += fg[ti];
        c->ib[t] = (double)ig[ti] - c->b[t];
    }
}

// The state across the chunk: Caug = exp(g + m - m_new) Caug + Vt^T diag(exp(a - m_new)) K, *m = m_new.
static void advance(Chunk *c, float *caug, float *m) {
    int n = c->n, dk = c->dk;
    double g = c->b[n - 1], mnew = g + *m;
    for (int s = 0; s < n; s++) mnew = fmax(mnew, g + c->ib[s]);
    float mf = (float)mnew;
    for (int s = 0; s < n; s++) {
        float w = (float)exp(g + c->ib[s] - mf);
        for (int j = 0; j < dk; j++) c->kw[(size_t)s * dk + j] = w * c->k[(size_t)s * dk + j];
    }
    state_advance(caug, (float)exp(g + *m - mf), c->v, c->kw, n, c->dv1, dk);
    *m = mf;
}

// Row tau of exp(b_tau - b_sigma + i_sigma - mrow) for sigma <= tau (0 above), times row[] if mul.
static void decay_row(Chunk *c, float *row, int tau, double mrow, int mul) {
    double bt = c->b[tau] - mrow;
    float *x = c->x;
    for (int s = 0; s <= tau; s++) x[s] = (float)(bt + c->ib[s]);
    if (mul)
        for (int s = 0; s <= tau; s++) row[s] *= expf(x[s]);
    else
        for (int s = 0; s <= tau; s++) row[s] = expf(x[s]);
    for (int s = tau + 1; s < c->n; s++) row[s] = 0;
}

static inline const float *cf(const void *p) { return p; }
static inline float *wf(void *p) { return p; }

// The pair's entry state (Caug, m), or zero.
static void load_state(float *caug, float *m, const MlstmFwd *io, int bh, int dk, int dv) {
    size_t ss = (size_t)dv * dk;
    if (io->c0) {
        memcpy(caug, cf(io->c0) + bh * ss, sizeof(float) * ss);
        memcpy(caug + ss, cf(io->n0) + (size_t)bh * dk, sizeof(float) * dk);
        *m = cf(io->m0)[bh];
    } else {
        memset(caug, 0, sizeof(float) * (ss + dk));
        *m = 0;
    }
}

static void store_state(const float *caug, float m, const MlstmFwd *io, int bh, int dk, int dv) {
    if (!io->cT) return;
    size_t ss = (size_t)dv * dk;
    memcpy(wf(io->cT) + bh * ss, caug, sizeof(float) * ss);
    memcpy(wf(io->nT) + (size_t)bh * dk, caug + ss, sizeof(float) * dk);
    wf(io->mT)[bh] = m;
}

// ---------------------------------------------------------------------------------------------
// Forward

static size_t rec_fwd_floats(const MnSeqDims *d) {
    Carve cv = {NULL, 0};
    take(&cv, (size_t)(d->Dv + 1) * d->Dk);
    take(&cv, (size_t)d->Dv + 1);
    return cv.used;
}

static void rec_forward(const SeqPair *p, const MlstmOpts *o, const MlstmFwd *io, int bh, float *work) {
    int dk = p->Dk, dv = p->Dv;
    Carve cv = {work, 0};
    float *caug = take(&cv, (size_t)(dv + 1) * dk), *out = take(&cv, (size_t)dv + 1), m;
    const float *Q = cf(io->q), *K = cf(io->k), *V = cf(io->v), *F = cf(io->fg), *I = cf(io->ig);
    float s = o->scale, eps = o->eps;
    load_state(caug, &m, io, bh, dk, dv);
    for (int t = 0; t < p->T; t++) {
        size_t ti = pair_tok(p, t);
        const float *q = Q + ti * dk, *k = K + ti * dk, *v = V + ti * dv;
        float f = F[ti], i = I[ti], mt = fmaxf(f + m, i);
        float a = (float)exp((double)f + m - mt), b = (float)exp((double)i - mt);
        m = mt;
        for (int r = 0; r <= dv; r++) {
            float *restrict row = caug + (size_t)r * dk, bv = b * (r < dv ? v[r] : 1);
            for (int j = 0; j < dk; j++) row[j] = a * row[j] + bv * k[j];
            out[r] = vdot(row, q, dk);
        }
        float nq = s * out[dv], den = fmaxf(fabsf(nq), expf(-m)) + eps;
        float *h = wf(io->h) + ti * dv;
        for (int r = 0; r < dv; r++) h[r] = s * out[r] / den;
        if (io->nq) wf(io->nq)[ti] = nq;
        if (io->m) wf(io->m)[ti] = m;
    }
    store_state(caug, m, io, bh, dk, dv);
}

static size_t chunk_fwd_floats(const MnSeqDims *d, int C) {
    Carve cv = {NULL, 0};
    Chunk c;
    take(&cv, (size_t)(d->Dv + 1) * d->Dk);
    chunk_carve(&c, &cv, C, d->Dk, d->Dv, 0);
    return cv.used;
}

static void chunk_forward(const SeqPair *p, const MlstmOpts *o, const MlstmFwd *io, int bh, float *work) {
    int dk = p->Dk, dv = p->Dv, dv1 = dv + 1;
    Carve cv = {work, 0};
    float *caug = take(&cv, (size_t)dv1 * dk), m;
    Chunk c;
    chunk_carve(&c, &cv, p->C, dk, dv, 0);
    float s = o->scale, eps = o->eps;
    load_state(caug, &m, io, bh, dk, dv);
    int zero = !io->c0;  // the state term vanishes until the first chunk has been added
    for (int t0 = 0; t0 < p->T; t0 += p->C) {
        int n = mn_min(p->C, p->T - t0);
        load_chunk(&c, p, t0, n, cf(io->q), cf(io->k), cf(io->v), cf(io->fg), cf(io->ig));
        double *stab = c.stab, run = -INFINITY;
        for (int t = 0; t < n; t++) {
            run = fmax(run, c.ib[t]);
            stab[t] = fmax(m + c.b[t], c.b[t] + run);
        }
        // W = s Q K^T (.) the decays; [num, nq] = W Vt + diag(s w') Q Caug^T
        gemm(0, 1, n, n, dk, s, c.q, dk, c.k, dk, 0, c.w, n);
        for (int t = 0; t < n; t++) decay_row(&c, c.w + (size_t)t * n, t, stab[t], 1);
        gemm(0, 0, n, dv1, n, 1, c.w, n, c.v, dv1, 0, c.out, dv1);
        if (!zero) {
            for (int t = 0; t < n; t++) c.wq[t] = s * (float)exp(m + c.b[t] - stab[t]);
            scale_rows(c.qw, c.q, c.wq, n, dk);
            gemm(0, 1, n, dv1, dk, 1, c.qw, dk, caug, dk, 1, c.out, dv1);
        }
        for (int t = 0; t < n; t++) {
            size_t ti = pair_tok(p, t0 + t);
            const float *o_t = c.out + (size_t)t * dv1;
            float mt = (float)stab[t], nq = o_t[dv], den = fmaxf(fabsf(nq), expf(-mt)) + eps;
            float *h = wf(io->h) + ti * dv;
            for (int r = 0; r < dv; r++) h[r] = o_t[r] / den;
            if (io->nq) wf(io->nq)[ti] = nq;
            if (io->m) wf(io->m)[ti] = mt;
        }
        advance(&c, caug, &m);
        zero = 0;
    }
    store_state(caug, m, io, bh, dk, dv);
}

// ---------------------------------------------------------------------------------------------
// Backward

static size_t chunk_bwd_floats(const MnSeqDims *d, int C) {
    size_t nch = (size_t)(d->T + C - 1) / C, sa = (size_t)(d->Dv + 1) * d->Dk;
    Carve cv = {NULL, 0};
    Chunk c;
    take(&cv, (nch + 1) * sa);
    take(&cv, nch + 1);
    take(&cv, sa);
    take64(&cv, 2 * (size_t)d->T);
    chunk_carve(&c, &cv, C, d->Dk, d->Dv, 1);
    return cv.used;
}

static double dot64(const float *a, const float *b, size_t n) {
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static void chunk_backward(const SeqPair *p, const MlstmOpts *o, const MlstmBwd *io, int bh, float *work) {
    int dk = p->Dk, dv = p->Dv, dv1 = dv + 1, T = p->T, C = p->C, nch = (T + C - 1) / C;
    size_t sa = (size_t)dv1 * dk;
    Carve cv = {work, 0};
    float *states = take(&cv, (size_t)(nch + 1) * sa), *ms = take(&cv, (size_t)nch + 1), *ds = take(&cv, sa);
    double *dig_raw = take64(&cv, 2 * (size_t)T), *dig_scale = dig_raw + T;
    Chunk c;
    chunk_carve(&c, &cv, C, dk, dv, 1);
    const float *Q = cf(io->q), *K = cf(io->k), *V = cf(io->v), *F = cf(io->fg), *I = cf(io->ig);
    const float *Hh = cf(io->h), *NQ = cf(io->nq), *M = cf(io->m), *DH = cf(io->dh);
    float s = o->scale, eps = o->eps;

    // pass 1: the state entering every chunk, and the final one
    memset(states, 0, sizeof(float) * sa);
    ms[0] = 0;
    for (int ci = 0; ci < nch; ci++) {
        int t0 = ci * C, n = mn_min(C, T - t0);
        load_chunk(&c, p, t0, n, NULL, K, V, F, I);
        memcpy(states + (size_t)(ci + 1) * sa, states + (size_t)ci * sa, sizeof(float) * sa);
        ms[ci + 1] = ms[ci];
        advance(&c, states + (size_t)(ci + 1) * sa, &ms[ci + 1]);
    }

    // pass 2
    memset(ds, 0, sizeof(float) * sa);
    double carry = 0;  // dL/dm passed down from m_{t0+n} to m_{t0+n-1}
    double sum_rho = 0, sum_r = 0, sum_scale = 0;
    for (int ci = nch - 1; ci >= 0; ci--) {
        int t0 = ci * C, n = mn_min(C, T - t0);
        const float *cp = states + (size_t)ci * sa, *ce = cp + sa;
        float mp = ms[ci], me = ms[ci + 1];
        load_chunk(&c, p, t0, n, Q, K, V, F, I);
        double g = c.b[n - 1];
        // do_t = [dh_t / den_t, dnq_t]; dL/dm_t = -(dh_t . h_t) eps / den_t
        for (int t = 0; t < n; t++) {
            size_t ti = pair_tok(p, t0 + t);
            const float *dh = DH + ti * dv, *h = Hh + ti * dv;
            float nq = NQ[ti], mt = M[ti], floor_ = expf(-mt), den = fmaxf(fabsf(nq), floor_) + eps;
            float *dot_ = c.out + (size_t)t * dv1;
            double dhh = dot64(dh, h, dv);
            for (int r = 0; r < dv; r++) dot_[r] = dh[r] / den;
            dot_[dv] = fabsf(nq) > floor_ ? (float)(-dhh / den) * (nq > 0 ? 1 : -1) : 0;
            c.dm[t] = -dhh * eps / den;
            sum_rho += fabsf(nq) > floor_ ? -c.dm[t] : dhh;  // the row's sum of R
            c.mt[t] = mt;
            c.wq[t] = s * (float)exp((double)mp + c.b[t] - mt);
            c.wl[t] = (float)exp(g + c.ib[t] - me);
        }
        float *Do = c.out;
        // E; W = s E (.) Q K^T; G = Do Vt^T (dL/dW), then R = G (.) W (dL/d log E, in double) and P = s E (.) G
        for (int t = 0; t < n; t++) decay_row(&c, c.e + (size_t)t * n, t, c.mt[t], 0);
        gemm(0, 1, n, n, dk, s, c.q, dk, c.k, dk, 0, c.w, n);
        gemm(0, 1, n, n, dv1, 1, Do, dv1, c.v, dv1, 0, c.p, n);
        for (int j = 0; j < n; j++) c.rcol[j] = c.rabs[j] = 0;
        for (int t = 0; t < n; t++) {
            float *w = c.w + (size_t)t * n, *pr = c.p + (size_t)t * n;
            const float *e = c.e + (size_t)t * n;
            double row = 0;
            for (int j = 0; j <= t; j++) {
                w[j] *= e[j];
                double r = (double)pr[j] * w[j];
                row += r;
                c.rcol[j] += r;
                c.rabs[j] += fabs(r);
                pr[j] *= s * e[j];
            }
            for (int j = t + 1; j < n; j++) w[j] = pr[j] = 0;
            c.rrow[t] = row;
        }
        scale_rows(c.dov, Do, c.wq, n, dv1);   // diag(s w') Do
        scale_rows(c.vw, c.v, c.wl, n, dv1);   // diag(wl) Vt
        scale_rows(c.kw, c.k, c.wl, n, dk);    // diag(wl) K
        // the state terms first, each dotted with its token's q or k on its own
        gemm(0, 0, n, dk, dv1, 1, c.dov, dv1, cp, dk, 0, c.gq, dk);       // dQ = diag(s w') Do Caug_prev
        gemm(0, 0, n, dk, dv1, 1, c.vw, dv1, ds, dk, 0, c.gk, dk);        // dK = diag(wl) Vt dS
        for (int t = 0; t < n; t++) {
            const float *k = c.k + (size_t)t * dk, *gk = c.gk + (size_t)t * dk;
            c.xq[t] = dot64(c.q + (size_t)t * dk, c.gq + (size_t)t * dk, dk);
            c.xk[t] = dot64(k, gk, dk);
            c.rabs[t] += sqrt((double)vdot(k, k, dk) * vdot(gk, gk, dk));  // |k| |dk'|: the scale of k . dk''s rounding
        }
        gemm(0, 0, n, dk, n, 1, c.p, n, c.k, dk, 1, c.gq, dk);            //    + P K
        gemm(1, 0, n, dk, n, 1, c.p, n, c.q, dk, 1, c.gk, dk);            //    + P^T Q
        gemm(1, 0, n, dv, n, 1, c.w, n, Do, dv1, 0, c.gv, dv);            // dV = W^T dNum
        gemm(0, 1, n, dv, dk, 1, c.kw, dk, ds, dk, 1, c.gv, dv);          //    + diag(wl) K dS[:Dv]^T
        double acc = dot64(ds, ce, sa);  // the later chunks' share of dfg
        for (int t = n - 1; t >= 0; t--) {
            size_t ti = pair_tok(p, t0 + t);
            memcpy(wf(io->dq) + ti * dk, c.gq + (size_t)t * dk, sizeof(float) * dk);
            memcpy(wf(io->dk) + ti * dk, c.gk + (size_t)t * dk, sizeof(float) * dk);
            memcpy(wf(io->dv) + ti * dv, c.gv + (size_t)t * dv, sizeof(float) * dv);
            double dig = c.rcol[t] + c.xk[t];
            acc += c.rrow[t] + c.xq[t] - dig;
            sum_r += dig;
            sum_scale += dig_scale[t0 + t] = c.rabs[t];
            double dfg = acc;
            // m's path: m_{t-1} (the stored one; 0 before the first token) decides which argument won
            double mprev = t0 + t > 0 ? M[pair_tok(p, t0 + t - 1)] : 0;
            carry += c.dm[t];
            if ((double)I[ti] >= (double)F[ti] + mprev) {
                dig += carry;
                carry = 0;
            } else {
                dfg += carry;
            }
            dig_raw[t0 + t] = dig;
            wf(io->dfg)[ti] = (float)dfg;
        }
        // dS to the previous chunk's end
        state_advance(ds, (float)exp(g + (double)mp - me), c.dov, c.q, n, dv1, dk);
    }
    // dig: sum_j dig_j (R's part) = sum_t rho_t exactly; what the rounding left of the difference, spread
    // over the tokens in proportion to the size of their terms
    double fix = sum_scale > 0 ? (sum_rho - sum_r) / sum_scale : 0;
    for (int t = 0; t < T; t++) wf(io->dig)[pair_tok(p, t)] = (float)(dig_raw[t] + fix * dig_scale[t]);
}

// ---------------------------------------------------------------------------------------------
// Checks and the pairs

static int check_opts(const char *fn, const MnSeqDims *d, const MlstmOpts *o, const void *io) {
    MN_TRY(seq_check_dims(d));
    if (!o) return mn_error(MN_ERR_ARG, "%s: opts is NULL", fn);
    if (!io) return mn_error(MN_ERR_ARG, "%s: io is NULL", fn);
    if (!isfinite(o->scale)) return mn_error(MN_ERR_ARG, "%s: scale must be finite, got %g", fn, (double)o->scale);
    if (!(o->eps >= 0) || !isfinite(o->eps)) return mn_error(MN_ERR_ARG, "%s: eps must be >= 0, got %g", fn, (double)o->eps);
    if (o->form != MN_FORM_AUTO && o->form != MN_FORM_CHUNK && o->form != MN_FORM_RECURRENT)
        return mn_error(MN_ERR_ARG, "%s: unknown form %d", fn, (int)o->form);
    if (o->chunk < 0) return mn_error(MN_ERR_ARG, "%s: chunk = %d, must be >= 0", fn, o->chunk);
    return MN_OK;
}

// The chunk size: the asked or the default, at most T (a chunk holds no more tokens than there are).
static int chunk_of(const MnSeqDims *d, const MlstmOpts *o) {
    return mn_min(o->chunk ? o->chunk : MLSTM_DEFAULT_CHUNK, d->T);
}

typedef struct {
    const MlstmOpts *o;
    const MlstmFwd *fwd;
    const MlstmBwd *bwd;
    MnForm form;
} MlstmRun;

static void fwd_pair(void *ctx, const SeqPair *p, int bh, float *work) {
    const MlstmRun *r = ctx;
    if (r->form == MN_FORM_CHUNK) chunk_forward(p, r->o, r->fwd, bh, work);
    else rec_forward(p, r->o, r->fwd, bh, work);
}

static void bwd_pair(void *ctx, const SeqPair *p, int bh, float *work) {
    const MlstmRun *r = ctx;
    chunk_backward(p, r->o, r->bwd, bh, work);
}

static int c_mlstm_fwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd *io) {
    const char *fn = "cpu mlstm fwd";
    MN_TRY(check_opts(fn, d, o, io));
    if (!io->q || !io->k || !io->v || !io->fg || !io->ig || !io->h)
        return mn_error(MN_ERR_ARG, "%s: q, k, v, fg, ig and h are required", fn);
    int n0 = !!io->c0 + !!io->n0 + !!io->m0, nT = !!io->cT + !!io->nT + !!io->mT;
    if (n0 == 1 || n0 == 2) return mn_error(MN_ERR_ARG, "%s: the initial state c0, n0, m0 is given in part", fn);
    if (nT == 1 || nT == 2) return mn_error(MN_ERR_ARG, "%s: the final state cT, nT, mT is asked for in part", fn);
    MnForm form = o->form != MN_FORM_AUTO ? o->form : d->T < MLSTM_RECURRENT_BELOW ? MN_FORM_RECURRENT : MN_FORM_CHUNK;
    int C = chunk_of(d, o);
    size_t per = form == MN_FORM_CHUNK ? chunk_fwd_floats(d, C) : rec_fwd_floats(d);
    MlstmRun r = {o, io, NULL, form};
    return cpu_for_pairs(d, C, per, 0, NULL, fwd_pair, &r);
}

static int c_mlstm_bwd(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmBwd *io) {
    const char *fn = "cpu mlstm bwd";
    MN_TRY(check_opts(fn, d, o, io));
    if (!io->q || !io->k || !io->v || !io->fg || !io->ig || !io->h || !io->nq || !io->m || !io->dh || !io->dq ||
        !io->dk || !io->dv || !io->dfg || !io->dig)
        return mn_error(MN_ERR_ARG, "%s: q, k, v, fg, ig, h, nq, m, dh, dq, dk, dv, dfg and dig are required", fn);
    int C = chunk_of(d, o);
    MlstmRun r = {o, NULL, io, MN_FORM_CHUNK};
    return cpu_for_pairs(d, C, chunk_bwd_floats(d, C), 0, NULL, bwd_pair, &r);
}

// ---------------------------------------------------------------------------------------------
// The gates: fg = logsigmoid(x), x = cap tanh(a / cap) (a where cap = 0); ig = cap tanh(b / cap).

static inline float log_sigmoidf_(float x) { return x >= 0 ? -log1pf(expf(-x)) : x - log1pf(expf(x)); }
static inline float sigmoidf_(float x) {
    float e = expf(-fabsf(x));
    return x >= 0 ? 1 / (1 + e) : e / (1 + e);
}

enum { GATES_PAR_MIN = 32768 };

static int c_mlstm_gates_fwd(const Backend *be, void *fg_, void *ig_, const void *a_, const void *b_, size_t n,
                             float cap) {
    float *fg = fg_, *ig = ig_;
    const float *a = a_, *b = b_;
#pragma omp parallel for schedule(static, 4096) if (n > GATES_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        fg[i] = log_sigmoidf_(cap != 0 ? cap * tanhf(a[i] / cap) : a[i]);
        ig[i] = cap != 0 ? cap * tanhf(b[i] / cap) : b[i];
    }
    return MN_OK;
}

static int c_mlstm_gates_bwd(const Backend *be, void *da_, void *db_, const void *dfg_, const void *dig_,
                             const void *a_, const void *b_, size_t n, float cap) {
    float *da = da_, *db = db_;
    const float *dfg = dfg_, *dig = dig_, *a = a_, *b = b_;
#pragma omp parallel for schedule(static, 4096) if (n > GATES_PAR_MIN)
    for (size_t i = 0; i < n; i++) {
        if (cap != 0) {
            float ta = tanhf(a[i] / cap), tb = tanhf(b[i] / cap);
            da[i] = dfg[i] * sigmoidf_(-cap * ta) * (1 - ta * ta);
            db[i] = dig[i] * (1 - tb * tb);
        } else {
            da[i] = dfg[i] * sigmoidf_(-a[i]);
            db[i] = dig[i];
        }
    }
    return MN_OK;
}

const MlstmOps cpu_mlstm = {.fwd = c_mlstm_fwd, .bwd = c_mlstm_bwd, .gates_fwd = c_mlstm_gates_fwd,
                            .gates_bwd = c_mlstm_gates_bwd};
