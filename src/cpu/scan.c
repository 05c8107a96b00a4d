/*
 * The diagonal recurrences, float32 (core/backend.h's ScanOps; the algebra, forward and backward,
 * is in the float64 reference's header, src/ref/scan_ref.c).
 *
 * The work is cut into tasks of one sequence and a block of CB channels, spread over the threads;
 * a task walks time in chunks of CH steps. Per chunk its inputs are gathered into tiles [CH][CB]
 * padded with zeros, the gates are computed over whole rows of CB lanes, and the scan runs step by
 * step over the block's states [N][CB], vectorised over channels. Every lane of every row goes
 * through the same (vector) code, whichever block, chunk or thread it falls in, so the results
 * are the same bits for any thread count and for a forward cut into pieces. Padded lanes see zero
 * inputs: their states and gradients stay zero and add nothing to the sums over channels.
 *
 * The backward runs the forward first, keeping the state at each chunk's start, then goes back
 * chunk by chunk: it recomputes the chunk's states from the kept one and runs the reverse scan
 * (dS_t = dy_t q_t + a_{t+1} dS_{t+1}) with the carried a_{t+1} dS_{t+1}. Longhorn's dq, dk and
 * kappa paths sum over channels: each task writes its block's sums (a fixed order within the
 * block), which are then added up in block order; dw and dskip sum over sequences likewise.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "core/common.h"
#include "ref/ref.h"
#include "scan_cpu.h"
#include "vec.h"
#include "vmath.h"
#include "workspace.h"

// CB channels a task (a multiple of every vector width); CH steps a chunk: a chunk's Longhorn
// states, CH N CB floats, stay in the L2 cache (128 KiB at N = 16).
enum { CB = 64, CH = 32 };
// transformers' SqrtBoundDerivative(max_grad = 1000): d sqrt(u)/du taken at max(u, 1/(4 1000^2)).
#define SQRT_U_MIN 2.5e-7f

typedef struct {
    const ScanDims *d;
    const float *x, *r, *i, *k, *q, *w, *skip, *s0, *dy;
    float *y, *sT;               // forward
    float *dx, *dr, *di;         // backward
    float *part;                 // Longhorn backward: [nblk][B T][2N+1] the blocks' sums dq, dk, dkappa
    double *dwp, *dskp;          // backward: [B][C] each sequence's dw, dskip
    int nblk, nchunks, nt;       // channel blocks, chunks, threads
    size_t per;                  // floats of workspace a thread
} Job;

// A task's workspace; every array starts on a 64-byte boundary.
typedef struct {
    float *x, *r, *i, *dy;       // [CH][CB] the chunk's inputs (i: RG-LRU)
    float *ga, *gb, *gc;         // [CH][CB] gates: RG-LRU a, b = m i x; Longhorn Delta, Delta x, beta
    float *dx, *dr, *di;         // [CH][CB] the chunk's gradients
    float *h, *h2;               // [N][CB] the running state (two: each step writes the other)
    float *S, *g;                // [CH][N][CB] the chunk's states; [N][CB] a_{t+1} dS_{t+1}
    float *bnd;                  // [nchunks][N][CB] the states at the chunks' starts (backward)
    float *w, *sp, *sg, *skip;   // [CB] w; RG-LRU softplus(w), sigmoid(w); Longhorn skip
    float *dd, *dxa, *tmp;       // [CB] Longhorn's dDelta, dx and a scratch row
    float *kap;                  // [CH] Longhorn's kappa = |k_t|^2
    double *dw, *dsk;            // [CB] the task's dw, dskip
} Tile;

// The workspace carved in blocks of 16 floats (64 bytes: doubles and cache lines stay aligned, the
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

// Carves t from work (both NULL: counts only); returns the floats used.
static size_t carve(Tile *t, float *work, int N, int nchunks) {
    Carve cv = {work, 0}, *p = &cv;
    size_t tile = (size_t)CH * CB, st = (size_t)N * CB;
    Tile z;
    if (!t) t = &z;
    t->x = take(p, tile); t->r = take(p, tile); t->i = take(p, tile); t->dy = take(p, tile);
    t->ga = take(p, tile); t->gb = take(p, tile); t->gc = take(p, tile);
    t->dx = take(p, tile); t->dr = take(p, tile); t->di = take(p, tile);
    t->h = take(p, st); t->h2 = take(p, st); t->g = take(p, st);
    t->S = take(p, (size_t)CH * st);
    t->bnd = take(p, (size_t)nchunks * st);
    t->w = take(p, CB); t->sp = take(p, CB); t->sg = take(p, CB); t->skip = take(p, CB);
    t->dd = take(p, CB); t->dxa = take(p, CB); t->tmp = take(p, CB);
    t->kap = take(p, CH);
    t->dw = (double *)(void *)take(p, 2 * CB);
    t->dsk = (double *)(void *)take(p, 2 * CB);
    return cv.used;
}

// Rows [t0, t0 + n) of channels [c0, c0 + cw) of sequence b of a [B,T,C] tensor into tile [CH][CB],
// zero-padded.
static void gather(float *restrict tile, const float *restrict src, const ScanDims *d, int b, int t0, int n, int c0,
                   int cw) {
    for (int tt = 0; tt < n; tt++) {
        const float *s = src + ((size_t)b * d->T + t0 + tt) * d->C + c0;
        float *o = tile + (size_t)tt * CB;
        memcpy(o, s, sizeof(float) * cw);
        memset(o + cw, 0, sizeof(float) * (CB - cw));
    }
}

static void scatter(float *restrict dst, const float *restrict tile, const ScanDims *d, int b, int t0, int n, int c0,
                    int cw) {
    for (int tt = 0; tt < n; tt++)
        memcpy(dst + ((size_t)b * d->T + t0 + tt) * d->C + c0, tile + (size_t)tt * CB, sizeof(float) * cw);
}

// 1 - sigmoid(z) is taken as sigmoid(-z): the difference would cancel for large z (beta near 1).
static inline float sigmoidf_(float x) { return 1 / (1 + expf(-x)); }

// The block's parameters: w, skip (zero-padded) and the RG-LRU's softplus(w), sigmoid(w).
static void load_params(Tile *t, const Job *jb, int b, int c0, int cw) {
    const size_t wo = scan_w_at(jb->d, b) + (size_t)c0;  // sequence b's group's
    for (int c = 0; c < CB; c++) {
        t->w[c] = c < cw ? jb->w[wo + c] : 0;
        t->skip[c] = c < cw && jb->skip ? jb->skip[wo + c] : 0;
    }
    for (int c = 0; c < CB; c++) {
        float w = t->w[c];
        t->sp[c] = (w > 0 ? w : 0) + log1pf(expf(-fabsf(w)));
        t->sg[c] = sigmoidf_(w);
    }
}

// The chunk [t0, t0 + n): its inputs gathered, kappa, and the gates of every row.
static void chunk_gates(Tile *t, const Job *jb, int b, int t0, int n, int c0, int cw) {
    const ScanDims *d = jb->d;
    gather(t->x, jb->x, d, b, t0, n, c0, cw);
    gather(t->r, jb->r, d, b, t0, n, c0, cw);
    if (d->kind == SCAN_RGLRU) {
        gather(t->i, jb->i, d, b, t0, n, c0, cw);
        for (int tt = 0; tt < n; tt++) {
            const float *restrict x = t->x + tt * CB, *restrict r = t->r + tt * CB, *restrict ig = t->i + tt * CB;
            const float *restrict sp = t->sp;
            float *restrict a = t->ga + tt * CB, *restrict bb = t->gb + tt * CB;
            if (d->reset && t0 + tt == 0) {  // the sequence's first position: a = 0, multiplier 1
                for (int c = 0; c < CB; c++) {
                    a[c] = 0;
                    bb[c] = sigmoidf_(ig[c]) * x[c];
                }
                continue;
            }
            for (int c = 0; c < CB; c++) {
                float la = -8 * sigmoidf_(r[c]) * sp[c];
                a[c] = expf(la);
                bb[c] = sqrtf(-expm1f(2 * la)) * sigmoidf_(ig[c]) * x[c];
            }
        }
        return;
    }
    int N = d->N;
    for (int tt = 0; tt < n; tt++) {
        const float *k = jb->k + ((size_t)b * d->T + t0 + tt) * N;
        float kap = 0;
        for (int j = 0; j < N; j++) kap += k[j] * k[j];
        t->kap[tt] = kap;
        const float *restrict x = t->x + tt * CB, *restrict r = t->r + tt * CB, *restrict w = t->w;
        float *restrict dl = t->ga + tt * CB, *restrict dlx = t->gb + tt * CB, *restrict be = t->gc + tt * CB;
        for (int c = 0; c < CB; c++) {
            float beta = sigmoidf_(r[c] + w[c]), delta = beta / (1 + beta * kap);
            be[c] = beta;
            dl[c] = delta;
            dlx[c] = delta * x[c];
        }
    }
}

// One step, row tt of the chunk at step t of sequence b: hout = a hin + b (states [N][CB]); y (if
// not NULL) [CB] receives the read-out.
static void step(const Tile *t, const Job *jb, int b, int tstep, int tt, const float *restrict hin,
                 float *restrict hout, float *restrict y) {
    const ScanDims *d = jb->d;
    const float *restrict ga = t->ga + tt * CB, *restrict gb = t->gb + tt * CB;
    if (d->kind == SCAN_RGLRU) {
        for (int c = 0; c < CB; c++) hout[c] = ga[c] * hin[c] + gb[c];
        if (y) memcpy(y, hout, sizeof(float) * CB);
        return;
    }
    int N = d->N;
    const float *k = jb->k + ((size_t)b * d->T + tstep) * N, *q = jb->q + ((size_t)b * d->T + tstep) * N;
    const float *restrict x = t->x + tt * CB, *restrict skip = t->skip;
    float yl[CB];
    for (int c = 0; c < CB; c++) yl[c] = skip[c] * x[c];
    for (int j = 0; j < N; j++) {
        float kj = k[j], kj2 = kj * kj, qj = q[j];
        const float *restrict hi = hin + (size_t)j * CB;
        float *restrict ho = hout + (size_t)j * CB;
        for (int c = 0; c < CB; c++) {
            ho[c] = (1 - ga[c] * kj2) * hi[c] + gb[c] * kj;
            yl[c] += ho[c] * qj;
        }
    }
    if (y) memcpy(y, yl, sizeof(float) * CB);
}

static void task_block(const Job *jb, int task, int *b, int *c0, int *cw) {
    *b = task / jb->nblk;
    *c0 = task % jb->nblk * CB;
    *cw = mn_min(CB, jb->d->C - *c0);
}

static void fwd_task(const Job *jb, int task, float *work) {
    const ScanDims *d = jb->d;
    int N = d->N, T = d->T, b, c0, cw;
    task_block(jb, task, &b, &c0, &cw);
    Tile t;
    carve(&t, work, N, 0);
    load_params(&t, jb, b, c0, cw);
    size_t st = (size_t)N * CB;
    memset(t.h, 0, sizeof(float) * st);
    if (jb->s0)
        for (int c = 0; c < cw; c++)
            for (int j = 0; j < N; j++) t.h[(size_t)j * CB + c] = jb->s0[((size_t)b * d->C + c0 + c) * N + j];
    float *h = t.h, *h2 = t.h2;
    for (int t0 = 0; t0 < T; t0 += CH) {
        int n = mn_min(CH, T - t0);
        chunk_gates(&t, jb, b, t0, n, c0, cw);
        for (int tt = 0; tt < n; tt++) {
            step(&t, jb, b, t0 + tt, tt, h, h2, t.dx + (size_t)tt * CB);  // the outputs into the dx tile
            float *s = h;
            h = h2;
            h2 = s;
        }
        scatter(jb->y, t.dx, d, b, t0, n, c0, cw);
    }
    if (jb->sT)  // (a task writes the part of s0 it alone has read: sT may alias s0)
        for (int c = 0; c < cw; c++)
            for (int j = 0; j < N; j++) jb->sT[((size_t)b * d->C + c0 + c) * N + j] = h[(size_t)j * CB + c];
}

// max(u, SQRT_U_MIN) without a comparison, which kept GCC from vectorising the loop ("control
// flow"): u exactly where u >= SQRT_U_MIN (e - |e| = 0, e = u - SQRT_U_MIN), SQRT_U_MIN to rounding
// below.
static inline float maxumin(float u) {
    float e = u - SQRT_U_MIN;
    return u - 0.5f * (e - fabsf(e));
}

// The RG-LRU's step back over a row of the block (hp: the state before it; a: the row's decay):
// dx, dr, di; g carries a_{t+1} dh_{t+1} and is updated; dw accumulates. At a reset position
// (first) a = 0 and the multiplier 1 are constants: nothing reaches r, w or the state before.
// (The kernels of the backward take their rows as restrict parameters: GCC ignores restrict on
// local pointers, and would not vectorise these loops for the alias checks they need.)
static void rglru_back_row(const float *restrict x, const float *restrict r, const float *restrict ig,
                           const float *restrict dy, const float *restrict a, const float *restrict hp,
                           const float *restrict sp, const float *restrict sg, float *restrict dx, float *restrict dr,
                           float *restrict di, float *restrict g, double *restrict dw, int first) {
    if (first) {
        for (int c = 0; c < CB; c++) {
            float dh = dy[c] + g[c], i = sigmoidf_(ig[c]);
            dx[c] = dh * i;
            di[c] = dh * x[c] * i * sigmoidf_(-ig[c]);
            dr[c] = 0;
            g[c] = 0;
        }
        return;
    }
    for (int c = 0; c < CB; c++) {
        float dh = dy[c] + g[c], i = sigmoidf_(ig[c]), rg = sigmoidf_(r[c]);
        float u = -expm1f(-16 * rg * sp[c]), m = sqrtf(u), ub = maxumin(u);
        dx[c] = dh * m * i;
        di[c] = dh * m * x[c] * i * sigmoidf_(-ig[c]);
        float du = dh * i * x[c] / (2 * sqrtf(ub));
        float dla = dh * hp[c] * a[c] - 2 * a[c] * a[c] * du;
        dr[c] = -8 * sp[c] * dla * rg * sigmoidf_(-r[c]);
        dw[c] += (double)(-8 * rg * dla * sg[c]);
        g[c] = a[c] * dh;
    }
}

// Slot j of Longhorn's step back over a row of the block (dl: Delta; hp: the slot's state before
// the step): ds = dy q_j + g, g updated to a ds; dDelta and dx accumulate into dd and dxa; tmp
// receives the terms of dk_j.
static void lh_back_slot(const float *restrict x, const float *restrict dy, const float *restrict dl,
                         const float *restrict hp, float *restrict g, float *restrict dd, float *restrict dxa,
                         float *restrict tmp, float kj, float qj) {
    float kj2 = kj * kj;
    for (int c = 0; c < CB; c++) {
        float ds = dy[c] * qj + g[c];
        dd[c] += ds * (x[c] * kj - hp[c] * kj2);
        tmp[c] = ds * dl[c] * (x[c] - 2 * hp[c] * kj);
        dxa[c] += ds * dl[c] * kj;
        g[c] = (1 - dl[c] * kj2) * ds;
    }
}

// The end of Longhorn's step back over a row (be: beta; the slots' dd, dxa summed): dx, dr; dw
// and dskip accumulate; tmp receives the terms of dkappa.
static void lh_back_end(const float *restrict x, const float *restrict dy, const float *restrict r,
                        const float *restrict w, const float *restrict dl, const float *restrict be,
                        const float *restrict dd, const float *restrict dxa, float kap, float *restrict dx,
                        float *restrict dr, float *restrict tmp, double *restrict dw, double *restrict dsk) {
    for (int c = 0; c < CB; c++) {
        float den = 1 + be[c] * kap, drc = dd[c] / (den * den) * be[c] * sigmoidf_(-(r[c] + w[c]));
        tmp[c] = -dd[c] * dl[c] * dl[c];
        dx[c] = dxa[c];
        dr[c] = drc;
        dw[c] += (double)drc;
        dsk[c] += (double)dy[c] * x[c];
    }
}

// The sum of CB floats in a fixed order (16 partial sums, as vdot).
static inline float sum_cb(const float *restrict v) {
    float acc[16] = {0};
    for (int i = 0; i < CB; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += v[i + l];
    for (int l = 0; l < 8; l++) acc[l] += acc[l + 8];
    for (int l = 0; l < 4; l++) acc[l] += acc[l + 4];
    return (acc[0] + acc[2]) + (acc[1] + acc[3]);
}

// Longhorn's step back at row tt of sequence b's step tstep (hp, ht: the states before and after
// it): dx, dr rows; g updated; dw, dskip accumulate; part [2N+1] receives the block's sums dq, dk
// (without the kappa path) and dkappa.
static void longhorn_back_row(Tile *t, const Job *jb, int b, int tstep, int tt, const float *hp, const float *ht,
                              float *part) {
    int N = jb->d->N;
    const float *k = jb->k + ((size_t)b * jb->d->T + tstep) * N, *q = jb->q + ((size_t)b * jb->d->T + tstep) * N;
    const float *x = t->x + tt * CB, *dy = t->dy + tt * CB, *dl = t->ga + tt * CB;
    for (int c = 0; c < CB; c++) {
        t->dd[c] = 0;
        t->dxa[c] = t->skip[c] * dy[c];
    }
    for (int j = 0; j < N; j++) {
        part[j] = vdot(ht + (size_t)j * CB, dy, CB);
        lh_back_slot(x, dy, dl, hp + (size_t)j * CB, t->g + (size_t)j * CB, t->dd, t->dxa, t->tmp, k[j], q[j]);
        part[N + j] = sum_cb(t->tmp);
    }
    lh_back_end(x, dy, t->r + tt * CB, t->w, dl, t->gc + tt * CB, t->dd, t->dxa, t->kap[tt], t->dx + tt * CB,
                t->dr + tt * CB, t->tmp, t->dw, t->dsk);
    part[2 * N] = sum_cb(t->tmp);
}

static void bwd_task(const Job *jb, int task, float *work) {
    const ScanDims *d = jb->d;
    int N = d->N, T = d->T, b, c0, cw, lh = d->kind == SCAN_LONGHORN;
    task_block(jb, task, &b, &c0, &cw);
    Tile t;
    carve(&t, work, N, jb->nchunks);
    load_params(&t, jb, b, c0, cw);
    size_t st = (size_t)N * CB;
    // the states at the chunks' starts, from zero
    memset(t.bnd, 0, sizeof(float) * st);
    for (int ci = 0; ci + 1 < jb->nchunks; ci++) {
        int t0 = ci * CH;
        chunk_gates(&t, jb, b, t0, CH, c0, cw);
        const float *h = t.bnd + ci * st;
        for (int tt = 0; tt < CH; tt++) {
            float *o = tt + 1 < CH ? t.S + tt * st : t.bnd + (ci + 1) * st;
            step(&t, jb, b, t0 + tt, tt, h, o, NULL);
            h = o;
        }
    }
    memset(t.g, 0, sizeof(float) * st);
    for (int c = 0; c < CB; c++) t.dw[c] = t.dsk[c] = 0;
    for (int ci = jb->nchunks - 1; ci >= 0; ci--) {
        int t0 = ci * CH, n = mn_min(CH, T - t0);
        chunk_gates(&t, jb, b, t0, n, c0, cw);
        gather(t.dy, jb->dy, d, b, t0, n, c0, cw);
        const float *h0 = t.bnd + ci * st;
        for (int tt = 0; tt < n; tt++) step(&t, jb, b, t0 + tt, tt, tt ? t.S + (tt - 1) * st : h0, t.S + tt * st, NULL);
        for (int tt = n - 1; tt >= 0; tt--) {
            const float *hp = tt ? t.S + (tt - 1) * st : h0;
            if (!lh) {
                size_t o = (size_t)tt * CB;
                rglru_back_row(t.x + o, t.r + o, t.i + o, t.dy + o, t.ga + o, hp, t.sp, t.sg, t.dx + o, t.dr + o,
                               t.di + o, t.g, t.dw, d->reset && t0 + tt == 0);
                continue;
            }
            float *part = jb->part + (((size_t)(task % jb->nblk) * d->B + b) * T + t0 + tt) * (2 * N + 1);
            longhorn_back_row(&t, jb, b, t0 + tt, tt, hp, t.S + tt * st, part);
        }
        scatter(jb->dx, t.dx, d, b, t0, n, c0, cw);
        scatter(jb->dr, t.dr, d, b, t0, n, c0, cw);
        if (!lh) scatter(jb->di, t.di, d, b, t0, n, c0, cw);
    }
    for (int c = 0; c < cw; c++) {
        jb->dwp[(size_t)b * d->C + c0 + c] = t.dw[c];
        if (lh) jb->dskp[(size_t)b * d->C + c0 + c] = t.dsk[c];
    }
}

typedef void (*TaskFn)(const Job *jb, int task, float *work);

// The workspace of a run over every (sequence, channel block) task: `extra` floats (zeroed) for
// the caller, then jb->per floats for each of up to that many threads. NULL where out of memory.
static float *job_workspace(Job *jb, size_t extra) {
    const ScanDims *d = jb->d;
    jb->nblk = (d->C + CB - 1) / CB;
    jb->nt = mn_max(1, mn_min(omp_get_max_threads(), d->B * jb->nblk));
    jb->per = carve(NULL, NULL, d->N, jb->nchunks);
    float *work = cpu_workspace(extra + (size_t)jb->nt * jb->per);
    if (work) memset(work, 0, sizeof(float) * extra);
    return work;
}

static void job_run(const Job *jb, TaskFn fn, float *work) {
#pragma omp parallel for num_threads(jb->nt) schedule(dynamic, 1)
    for (int task = 0; task < jb->d->B * jb->nblk; task++) fn(jb, task, work + (size_t)omp_get_thread_num() * jb->per);
}

static int c_scan_fwd(const Backend *be, const ScanDims *d, const ScanFwd *io) {
    MN_TRY(ref_scan_check_fwd("scan_fwd", d, io));
    Job jb = {.d = d, .x = io->x, .r = io->r, .i = io->i, .k = io->k, .q = io->q, .w = io->w, .skip = io->skip,
              .s0 = io->s0, .y = io->y, .sT = io->sT};
    float *work = job_workspace(&jb, 0);
    if (!work) return MN_ERR_NOMEM;
    job_run(&jb, fwd_task, work);
    return MN_OK;
}

static int c_scan_bwd(const Backend *be, const ScanDims *d, const ScanBwd *io) {
    MN_TRY(ref_scan_check_bwd("scan_bwd", d, io));
    int B = d->B, T = d->T, C = d->C, N = d->N, lh = d->kind == SCAN_LONGHORN, nblk = (C + CB - 1) / CB;
    Job jb = {.d = d, .x = io->x, .r = io->r, .i = io->i, .k = io->k, .q = io->q, .w = io->w, .skip = io->skip,
              .dy = io->dy, .dx = io->dx, .dr = io->dr, .di = io->di, .nchunks = (T + CH - 1) / CH};
    // the caller's part of the workspace: dwp, dskp [B][C] doubles, then (Longhorn) the blocks' sums
    size_t bt = (size_t)B * T, nw = (size_t)B * C, np = lh ? (size_t)nblk * bt * (2 * N + 1) : 0;
    size_t extra = (4 * nw + np + 15) & ~(size_t)15;
    float *work = job_workspace(&jb, extra);
    if (!work) return MN_ERR_NOMEM;
    jb.dwp = (double *)(void *)work;
    jb.dskp = jb.dwp + nw;
    jb.part = work + 4 * nw;
    job_run(&jb, bwd_task, work + extra);
    // the sums over sequences, then over channel blocks, in order
    float *dw = io->dw, *dskip = io->dskip, *dk = io->dk, *dq = io->dq;
    const float *k = io->k;
    const int per = d->w_seqs > 0 ? d->w_seqs : B;  // a group's sequences, summed in order into its dw, dskip
    for (int b0 = 0; b0 < B; b0 += per) {
        const size_t wo = scan_w_at(d, b0);
        for (int c = 0; c < C; c++) {
            double sw = 0, ss = 0;
            for (int b = b0; b < b0 + per; b++) {
                sw += jb.dwp[(size_t)b * C + c];
                ss += jb.dskp[(size_t)b * C + c];
            }
            dw[wo + c] += (float)sw;
            if (lh) dskip[wo + c] += (float)ss;
        }
    }
    if (!lh) return MN_OK;
    size_t stride = 2 * (size_t)N + 1;
#pragma omp parallel for num_threads(jb.nt) if (np > 32768)
    for (size_t n = 0; n < bt; n++) {
        float dkap = 0;
        for (int blk = 0; blk < nblk; blk++) dkap += jb.part[((size_t)blk * bt + n) * stride + 2 * N];
        for (int j = 0; j < N; j++) {
            float sq = 0, sk = 0;
            for (int blk = 0; blk < nblk; blk++) {
                const float *p = jb.part + ((size_t)blk * bt + n) * stride;
                sq += p[j];
                sk += p[N + j];
            }
            dq[n * N + j] = sq;
            dk[n * N + j] = sk + 2 * k[n * N + j] * dkap;
        }
    }
    return MN_OK;
}

const ScanOps cpu_scan = {.fwd = c_scan_fwd, .bwd = c_scan_bwd};
