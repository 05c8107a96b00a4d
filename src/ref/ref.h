/*
 * Float64 references: every op of the library written the plainest way, in
 * double precision, straight from the spec. They are the ground truth the fast
 * paths are tested against, and they are themselves tested against finite
 * differences and the golden file. Speed is not a goal here.
 */
#ifndef MN_REF_H
#define MN_REF_H

#include "core/backend.h"
#include "mesanet.h"

// ---------------------------------------------------------------------------
// Dense linear algebra on small double matrices (row-major n x n).

// Cholesky factorisation in place (lower triangle); MN_ERR_NUMERIC if the
// matrix is not positive definite.
int ref_cholesky(double *a, int n);
// Solves L L^T x = b for x, given the factor from ref_cholesky.
void ref_cholesky_solve(const double *l, int n, const double *b, double *x);

// Conjugate gradient on one system A x = q, A symmetric positive definite
// (n x n), following the spec's pseudo-code exactly. x0 is the initial guess
// for MN_CG_INIT_GIVEN. Returns the steps taken.
int ref_cg(const double *a, int n, const double *q, const double *x0, const MnSolver *s, double *x);

// ---------------------------------------------------------------------------
// The Mesa core, recurrent form, float64. Same shapes as MnMesaFwd/MnMesaBwd.

typedef struct {
    const double *q, *k, *v, *g, *beta, *lambda, *h0, *g0, *x0;
    double *o, *x, *hT, *gT;
    int *steps;
    int lambda_seqs;  // as MnMesaFwd's
} MesaFwd64;

typedef struct {
    const double *q, *k, *v, *g, *beta, *lambda, *h0, *g0, *x, *o, *dout, *dhT, *dgT;
    double *dq, *dk, *dv, *dg, *dbeta, *dlambda, *dh0, *dg0;
    int lambda_seqs;  // as MnMesaBwd's
} MesaBwd64;

// solver == NULL: exact solve by Cholesky per token (the reference of the
// spec); otherwise float64 CG with that solver's settings.
int ref_mesa_forward(const MnSeqDims *d, const MnSolver *solver, const MesaFwd64 *io);
int ref_mesa_backward(const MnSeqDims *d, const MnSolver *solver, const MesaBwd64 *io);

// ---------------------------------------------------------------------------
// The gated linear-attention family (GLA / Mamba2, DeltaNet / Gated DeltaNet),
// recurrent form, float64. Same shapes and NULL conventions as MnLinFwd/MnLinBwd.

typedef struct {
    const double *q, *k, *v, *g, *beta, *s0;
    double *o, *sT;
} LinFwd64;

typedef struct {
    const double *q, *k, *v, *g, *beta, *s0, *dout, *dsT;
    double *dq, *dk, *dv, *dg, *dbeta, *ds0;
} LinBwd64;

// The opts' form and chunk are ignored (there is one form); rule and scale are used.
int ref_lin_forward(const MnSeqDims *d, const MnLinOpts *opts, const LinFwd64 *io);
int ref_lin_backward(const MnSeqDims *d, const MnLinOpts *opts, const LinBwd64 *io);

// ---------------------------------------------------------------------------
// The attention family (attn_ref.c): the backend slots of core/backend.h
// themselves, on double buffers (int32 positions). The backward recomputes P
// from q and k (the forward's lse is not read).

int ref_attn_check(const char *fn, const AttnDims *d);  // MN_ERR_ARG, named, for bad dims
int ref_attn_fwd(const Backend *be, const AttnDims *d, const AttnFwd *io);
int ref_attn_bwd(const Backend *be, const AttnDims *d, const AttnBwd *io);
int ref_attn_decode(const Backend *be, const AttnDims *d, int n, int cap, const void *q, const void *kc,
                    const void *vc, void *o);
// MN_ERR_ARG, named, unless N, H > 0, 0 < rot <= D with rot even, theta > 0, and x and pos are given.
int ref_rope_check(const void *x, const void *pos, int N, int H, int D, int rot, float theta);
int ref_rope(const Backend *be, void *x, const void *pos, int N, int H, int D, int rot, float theta, int inverse);

// ---------------------------------------------------------------------------
// The mLSTM core (mlstm_ref.c; core/backend.h's MlstmOps), float64. Same shapes and NULL
// conventions as MlstmFwd / MlstmBwd; the opts' form and chunk are ignored.

typedef struct {
    const double *q, *k, *v, *fg, *ig, *c0, *n0, *m0;
    double *h, *nq, *m, *cT, *nT, *mT;
} MlstmFwd64;

typedef struct {
    const double *q, *k, *v, *fg, *ig, *dh;
    double *dq, *dk, *dv, *dfg, *dig;
} MlstmBwd64;

// The stabilised recurrence, from the given state or zero.
int ref_mlstm_forward(const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd64 *io);
// The parallel (quadratic) form, from a zero state (c0 and cT must be NULL): m_t the row maximum
// with the m_0 = 0 path included, so that it equals the recurrence to rounding, eps included.
int ref_mlstm_parallel(const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd64 *io);
// Without the stabiliser, from a zero state: h only (nq, m and the states must be NULL), with the
// floor 1 in place of exp(-m_t); equal to the others for eps = 0 while exp(i_t) etc. do not overflow.
int ref_mlstm_unstabilised(const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd64 *io);
// The backward from a zero state, m held constant (stop-gradient): dq, dk, dv, dfg, dig (=).
int ref_mlstm_backward(const MnSeqDims *d, const MlstmOpts *o, const MlstmBwd64 *io);
// fg = logsigmoid(cap tanh(a / cap)), ig = cap tanh(b / cap) (cap 0: no cap); da, db (=) from dfg, dig.
void ref_mlstm_gates_fwd(double *fg, double *ig, const double *a, const double *b, size_t n, double cap);
void ref_mlstm_gates_bwd(double *da, double *db, const double *dfg, const double *dig, const double *a,
                         const double *b, size_t n, double cap);
// The backend's table of these (ref_backend.c).
extern const MlstmOps ref_mlstm;

// The sLSTM core (slstm_ref.c): the backend slots of core/backend.h's SlstmOps
// themselves, on double buffers; ref_slstm is the sub-table (supports NULL).

int ref_slstm_check(const char *fn, const SlstmDims *d);  // MN_ERR_ARG, named, for bad dims
int ref_slstm_fwd(const Backend *be, const SlstmDims *d, const SlstmFwd *io);
int ref_slstm_bwd(const Backend *be, const SlstmDims *d, const SlstmBwd *io);
extern const SlstmOps ref_slstm;

// The diagonal recurrences (scan_ref.c): core/backend.h's ScanOps slots themselves, on double
// buffers; ref_scan is the sub-table (supports NULL). The checks (MN_ERR_ARG, named) are shared
// with the other backends: the dims alone, and with the buffers each kind needs.
int ref_scan_check(const char *fn, const ScanDims *d);
int ref_scan_check_fwd(const char *fn, const ScanDims *d, const ScanFwd *io);
int ref_scan_check_bwd(const char *fn, const ScanDims *d, const ScanBwd *io);
int ref_scan_fwd(const Backend *be, const ScanDims *d, const ScanFwd *io);
int ref_scan_bwd(const Backend *be, const ScanDims *d, const ScanBwd *io);
extern const ScanOps ref_scan;

#endif
