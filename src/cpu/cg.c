#include "cg.h"

#include <string.h>

#include "vec.h"

// A row also stops when its residual reaches float32 rounding level: past
// ||r|| ~ u ||q|| (u = 2^-24) CG in float32 no longer improves x, and its
// recursively updated residual shrinks into denormals where alpha = r.z / p.Ap
// loses all precision and the iteration blows up (seen at 128+ steps).
#define RESIDUAL_FLOOR (4.0f / 16777216.0f)

size_t cg_work_floats(int n, int D) { return 5 * (size_t)n * D + 3 * (size_t)n; }

void cg_work_init(CgWork *w, float *mem, int n, int D) {
    size_t nd = (size_t)n * D;
    w->r = mem;
    w->z = w->r + nd;
    w->p = w->z + nd;
    w->pc = w->p + nd;
    w->apc = w->pc + nd;
    w->rz = w->apc + nd;
    w->thresh = w->rz + n;
    w->active = (int *)(w->thresh + n);  // an int fits a float's slot
}

// z = M^{-1} r for one row (M = I or M = diag(A)).
static inline void precondition(float *z, const float *r, const float *diag, int D) {
    if (diag)
        for (int i = 0; i < D; i++) z[i] = r[i] / diag[i];
    else
        memcpy(z, r, sizeof(float) * D);
}

// Initial guess and residual for every row; returns the number of rows that
// still need steps (listed in w->active).
static int cg_start(CgApply apply, void *ctx, int n, int D, const MnSolver *s, const float *q, const float *diag,
                    const float *x0, float *x, CgWork *w) {
    size_t nd = (size_t)n * D;
    if (s->init == MN_CG_INIT_ZERO) {
        memset(x, 0, sizeof(float) * nd);
        memcpy(w->r, q, sizeof(float) * nd);
    } else {
        for (size_t i = 0; i < nd; i++) x[i] = s->init == MN_CG_INIT_JACOBI ? q[i] / diag[i] : x0[i];
        for (int j = 0; j < n; j++) w->active[j] = j;
        apply(ctx, x, w->active, n, w->apc);
        for (size_t i = 0; i < nd; i++) w->r[i] = q[i] - w->apc[i];
    }
    const float *pre = s->precond == MN_PRECOND_JACOBI ? diag : NULL;
    float tol = s->tol > RESIDUAL_FLOOR ? s->tol : RESIDUAL_FLOOR, tol2 = tol * tol;
    int m = 0;
    for (int j = 0; j < n; j++) {
        const float *qj = q + (size_t)j * D, *rj = w->r + (size_t)j * D;
        w->thresh[j] = tol2 * vdot(qj, qj, D);
        if (!(vdot(rj, rj, D) > w->thresh[j])) continue;  // already solved (q = 0, or a perfect guess)
        float *zj = w->z + (size_t)j * D;
        precondition(zj, rj, pre ? pre + (size_t)j * D : NULL, D);
        memcpy(w->p + (size_t)j * D, zj, sizeof(float) * D);
        w->rz[j] = vdot(rj, zj, D);
        w->active[m++] = j;
    }
    return m;
}

void cg_solve(CgApply apply, void *ctx, int n, int D, const MnSolver *s, const float *q, const float *diag,
              const float *x0, float *x, int *steps, CgWork *w) {
    if (steps) memset(steps, 0, sizeof(int) * n);
    int m = cg_start(apply, ctx, n, D, s, q, diag, x0, x, w);
    const float *pre = s->precond == MN_PRECOND_JACOBI ? diag : NULL;
    for (int step = 1; step <= s->max_steps && m > 0; step++) {
        for (int a = 0; a < m; a++) memcpy(w->pc + (size_t)a * D, w->p + (size_t)w->active[a] * D, sizeof(float) * D);
        apply(ctx, w->pc, w->active, m, w->apc);
        int still = 0;
        for (int a = 0; a < m; a++) {
            int j = w->active[a];
            float *xj = x + (size_t)j * D, *rj = w->r + (size_t)j * D, *pj = w->p + (size_t)j * D;
            float *zj = w->z + (size_t)j * D;
            const float *apj = w->apc + (size_t)a * D;
            float pap = vdot(pj, apj, D);
            if (!(pap > 0) || !(w->rz[j] > 0)) continue;  // exact convergence or non-finite input
            float alpha = w->rz[j] / pap;
            for (int i = 0; i < D; i++) {
                xj[i] += alpha * pj[i];
                rj[i] -= alpha * apj[i];
            }
            if (steps) steps[j] = step;
            if (!(vdot(rj, rj, D) > w->thresh[j])) continue;  // met the tolerance
            precondition(zj, rj, pre ? pre + (size_t)j * D : NULL, D);
            float rz_new = vdot(rj, zj, D);
            float beta = rz_new / w->rz[j];
            for (int i = 0; i < D; i++) pj[i] = zj[i] + beta * pj[i];
            w->rz[j] = rz_new;
            w->active[still++] = j;
        }
        m = still;
    }
}
