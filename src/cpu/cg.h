/*
 * Conjugate gradient for many independent systems at once (spec section 2).
 *
 * Each row r of the n x D right-hand side is its own system A_r x_r = q_r with
 * its own scalars alpha and beta. Only the product with A is supplied by the
 * caller: the chunkwise form applies all of a chunk's operators with matrix
 * products, the recurrent form applies one token's dense matrix. Rows that
 * meet the tolerance drop out, and the operator is applied to the remaining
 * rows only (compacted), so tolerance mode saves work in proportion.
 */
#ifndef MN_CG_H
#define MN_CG_H

#include <stddef.h>

#include "mesanet.h"

// AP[j] = A_{rows[j]} P[j] for j < m; P and AP are compact m x D.
typedef void (*CgApply)(void *ctx, const float *p, const int *rows, int m, float *ap);

typedef struct {
    float *r, *z, *p, *pc, *apc;  // [n*D] residuals, preconditioned residuals, directions, compact P, compact AP
    float *rz, *thresh;           // [n] r.z, and the squared residual at which a row stops
    int *active;                  // [n] rows still iterating
} CgWork;

// Scratch for up to n systems of size D, carved from `mem` (cg_work_floats floats).
size_t cg_work_floats(int n, int D);
void cg_work_init(CgWork *w, float *mem, int n, int D);

// Solves the n systems. diag [n*D] (the diagonal of each A_r) is needed for
// Jacobi preconditioning or initial guess, else may be NULL; x0 [n*D] for
// MN_CG_INIT_GIVEN. x [n*D] receives the solutions, steps [n] (or NULL) the
// steps each row took. Never divides by zero: a row whose p.Ap or r.z is not
// positive has converged (or its input was not finite) and stops; so does a
// row whose residual reached float32 rounding level, ||r|| <= 2.4e-7 ||q||.
void cg_solve(CgApply apply, void *ctx, int n, int D, const MnSolver *s, const float *q, const float *diag,
              const float *x0, float *x, int *steps, CgWork *w);

#endif
