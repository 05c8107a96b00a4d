/*
 * mesanet: MesaNet and the linear-RNN language models it is compared with,
 * in C. This is the public interface of libmesanet.
 *
 * Conventions
 * - Every function returns a status: MN_OK (0) or one of the MN_ERR_* codes,
 *   with a human-readable message in mn_last_error() (per thread).
 * - Tensors are row-major with the token-major layout [B, T, H, D]: B
 *   sequences, T tokens, H heads, D features per head (fla's layout).
 */
#ifndef MESANET_H
#define MESANET_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MN_OK = 0,
    MN_ERR_ARG = 1,          // a bad argument: size, shape, null pointer, option
    MN_ERR_NOMEM = 2,        // an allocation failed
    MN_ERR_IO = 3,           // a file could not be opened, read or written
    MN_ERR_FORMAT = 4,       // a file's content is not what was expected
    MN_ERR_NUMERIC = 5,      // NaN or infinity where finite numbers are required
    MN_ERR_UNSUPPORTED = 6,  // valid, but not available in this build or backend
};

// The message of the last error on this thread.
const char *mn_last_error(void);

// ---------------------------------------------------------------------------
// The Mesa layer core (paper section 3; docs/spec/mesa-layer.md)
//
// Per head and sequence, with states H (Dk x Dk) and G (Dv x Dk):
//     H_t = gamma_t H_{t-1} + beta_t k_t k_t^T
//     G_t = gamma_t G_{t-1} + beta_t v_t k_t^T
//     x_t = (H_t + diag(lambda))^{-1} q_t        (conjugate gradient)
//     o_t = G_t x_t
// The forget gate enters in log form, g_t = log gamma_t <= 0.

typedef enum { MN_CG_INIT_ZERO = 0, MN_CG_INIT_JACOBI = 1, MN_CG_INIT_GIVEN = 2 } MnCgInit;
typedef enum { MN_PRECOND_NONE = 0, MN_PRECOND_JACOBI = 1 } MnPrecond;
typedef enum { MN_FORM_AUTO = 0, MN_FORM_CHUNK = 1, MN_FORM_RECURRENT = 2 } MnForm;
// The products of the lin family's GPU chunk kernels (mamba2, gla, deltanet, gdn and the layers built
// on them; the CPU computes in float32 whatever this says): SPLIT, every rounded operand (state, V', W,
// U, Tt) split into bf16 hi + lo, about float32's accuracy; BF16, one bf16 product with float32 sums
// each, as fla's kernels (faster: gdn forward+backward 0.53x the time); AUTO, the backend's choice
// (CUDA: BF16 for the GLA rule, SPLIT for the delta rule, by the errors measured against fla's,
// docs/cuda.md).
typedef enum { MN_PREC_AUTO = 0, MN_PREC_SPLIT = 1, MN_PREC_BF16 = 2 } MnPrecision;

typedef struct {
    int max_steps;      // CG steps at most (the paper trains with 30)
    float tol;          // 0: always max_steps; > 0: stop a system when ||r|| <= tol ||q||
    MnPrecond precond;  // plain CG or Jacobi-preconditioned CG
    MnCgInit init;      // initial guess: zero, q / diag(H + Lambda), or given (x0)
    MnForm form;    // chunkwise-parallel or recurrent; AUTO picks the faster
    int chunk;          // chunk size C of the chunkwise form (0: the backend's best)
    MnPrecision precision;  // the lin family's GPU products (MnPrecision)
    int check;          // nonzero: fail with MN_ERR_NUMERIC on non-finite inputs or outputs
} MnSolver;

// 30 steps, no tolerance, no preconditioner, zero initial guess, AUTO form and chunk.
MnSolver mn_solver_default(void);

typedef struct {
    int B, T, H;  // sequences, tokens per sequence, heads
    int Dk, Dv;   // query/key size and value size per head
} MnSeqDims;

typedef struct {
    const float *q;       // [B,T,H,Dk] queries
    const float *k;       // [B,T,H,Dk] keys
    const float *v;       // [B,T,H,Dv] values
    const float *g;       // [B,T,H]    log forget gate, <= 0
    const float *beta;    // [B,T,H]    input gate
    const float *lambda;  // [H,Dk]     ridge, > 0
    const float *h0;      // [B,H,Dk,Dk] initial H, or NULL for zero
    const float *g0;      // [B,H,Dv,Dk] initial G, or NULL for zero
    const float *x0;      // [B,T,H,Dk] initial guesses, only for MN_CG_INIT_GIVEN
    float *o;             // [B,T,H,Dv] output
    float *x;             // [B,T,H,Dk] solutions, kept for the backward
    float *hT;            // [B,H,Dk,Dk] final H, or NULL (may alias h0)
    float *gT;            // [B,H,Dv,Dk] final G, or NULL (may alias g0)
    int *steps;           // [B,T,H] CG steps used per system, or NULL
    int lambda_seqs;      // 0: lambda [H,Dk] serves every sequence; > 0 (dividing B): each group of that many
                          // sequences has its own, lambda [B/lambda_seqs, H, Dk] (the runs of a model of several)
} MnMesaFwd;

typedef struct {
    const float *q, *k, *v, *g, *beta, *lambda, *h0, *g0;  // the forward's inputs
    const float *x;       // [B,T,H,Dk] the forward's solutions
    const float *o;       // [B,T,H,Dv] the forward's output (read by the float64 reference only)
    const float *dout;    // [B,T,H,Dv] dL/do
    const float *dhT;     // [B,H,Dk,Dk] dL/dH_T, or NULL
    const float *dgT;     // [B,H,Dv,Dk] dL/dG_T, or NULL
    float *dq, *dk, *dv;  // gradients, same shapes as the inputs (overwritten)
    float *dg, *dbeta;    // [B,T,H]
    float *dlambda;       // [H,Dk], summed over the batch (lambda's shape: summed over each group)
    float *dh0, *dg0;     // [B,H,Dk,Dk], [B,H,Dv,Dk], or NULL
    int *steps;           // [B,T,H] CG steps of the backward solve, or NULL
    int lambda_seqs;      // as MnMesaFwd's
} MnMesaBwd;

// Where the ridge of sequence b and head h begins in lambda (and dlambda): row (b / lambda_seqs, h)
// of [B / lambda_seqs, H, Dk], or row h of [H, Dk] where lambda_seqs is 0; and lambda's length.
static inline size_t mn_mesa_lambda_at(int lambda_seqs, int H, int Dk, int b, int h) {
    return ((size_t)(lambda_seqs > 0 ? b / lambda_seqs : 0) * (size_t)H + (size_t)h) * (size_t)Dk;
}
static inline size_t mn_mesa_lambda_len(const MnSeqDims *d, int lambda_seqs) {
    return (size_t)(lambda_seqs > 0 ? d->B / lambda_seqs : 1) * (size_t)d->H * (size_t)d->Dk;
}

// Forward and backward (implicit differentiation: a second CG solve with the
// same matrices; spec section 4). dh0 is the gradient with respect to H_0 as a
// general matrix (not symmetrised), as in fla.
int mn_mesa_forward(const MnSeqDims *dims, const MnSolver *solver, const MnMesaFwd *io);
int mn_mesa_backward(const MnSeqDims *dims, const MnSolver *solver, const MnMesaBwd *io);

// ---------------------------------------------------------------------------
// The gated linear-attention family (docs/spec/mixers.md sections 1-2)
//
// Per head and sequence, with one state S (Dv x Dk) and read-out o_t = scale S_t q_t:
//     MN_LIN_GLA:    S_t = gamma_t S_{t-1} + beta_t v_t k_t^T                 (GLA; Mamba2: beta = 1)
//     MN_LIN_DELTA:  S_t = gamma_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
//                                                      (Gated DeltaNet; DeltaNet: gamma = 1)
// g_t = log gamma_t <= 0 (g NULL: no decay, gamma = 1); beta NULL: beta = 1. The forms agree:
// a recurrent one for decoding and short inputs, a chunkwise one (the WY/UT transform for the
// delta rule) for training and prefill. Layout as the Mesa core's: [B,T,H,D], token-major.

typedef enum { MN_LIN_GLA = 0, MN_LIN_DELTA = 1 } MnLinRule;

typedef struct {
    MnLinRule rule;
    float scale;      // read-out scale (1, or Dk^-1/2 for the Gated DeltaNet paper's layer)
    MnForm form;  // chunkwise or recurrent; AUTO picks the faster
    int chunk;        // chunk size C of the chunkwise form (0: the backend's best)
    MnPrecision precision;  // the GPU chunk kernels' products (AUTO: the backend's choice)
} MnLinOpts;

typedef struct {
    const float *q, *k;  // [B,T,H,Dk]
    const float *v;      // [B,T,H,Dv]
    const float *g;      // [B,T,H] log forget gate <= 0, or NULL (none)
    const float *beta;   // [B,T,H] input gate / delta-rule step size, or NULL (1)
    const float *s0;     // [B,H,Dv,Dk] initial state, or NULL for zero
    float *o;            // [B,T,H,Dv] output
    float *sT;           // [B,H,Dv,Dk] final state, or NULL (may alias s0)
} MnLinFwd;

typedef struct {
    const float *q, *k, *v, *g, *beta, *s0;  // the forward's inputs
    const float *dout;                        // [B,T,H,Dv] dL/do
    const float *dsT;                         // [B,H,Dv,Dk] dL/dS_T, or NULL
    float *dq, *dk, *dv;                      // gradients, same shapes as the inputs (overwritten)
    float *dg, *dbeta;                        // [B,T,H] (NULL where the forward's g / beta was NULL)
    float *ds0;                               // [B,H,Dv,Dk], or NULL
} MnLinBwd;

MnLinOpts mn_lin_opts_default(MnLinRule rule);  // scale 1, AUTO form, chunk and precision
int mn_lin_forward(const MnSeqDims *dims, const MnLinOpts *opts, const MnLinFwd *io);
int mn_lin_backward(const MnSeqDims *dims, const MnLinOpts *opts, const MnLinBwd *io);

#ifdef __cplusplus
}
#endif
#endif
