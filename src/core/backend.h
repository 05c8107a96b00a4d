/*
 * The op table every backend implements: the model and the mixers are written
 * once against it, and run on the float64 reference ("ref"), the float32 CPU
 * ("cpu") or the GPU ("cuda").
 *
 * Buffers are opaque pointers into the backend's memory, allocated by it. Their
 * element type depends on the backend and the buffer's kind: double on ref,
 * float on cpu; on cuda, MEM_ACT buffers are bfloat16 and MEM_F32 float32. The
 * model never dereferences them; it moves data in and out with the upload and
 * download functions, which convert from and to host float/double.
 *
 * Conventions: shapes are row-major; N is a count of rows (tokens, or tokens x
 * heads); outputs come first. Parameter gradients accumulate (+=), so that
 * micro-batches add up; activation gradients are overwritten unless the op
 * takes an `accum` flag, which makes it add instead (a tensor feeding several
 * ops receives the sum of their gradients).
 */
#ifndef MN_BACKEND_H
#define MN_BACKEND_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "mesanet.h"

typedef enum {
    MEM_PARAM,  // parameters (float64 ref, float32 cpu; cuda: float32 master with a hidden bf16 copy for products)
    MEM_ACT,    // activations and their gradients (bf16 on cuda)
    MEM_F32,    // at least float32 everywhere: parameter gradients, optimiser state, norm statistics, gates, losses
    MEM_I32,    // int32 (tokens, targets)
    MEM_F64,    // float64 everywhere: a training step's sums (loss, gradient norm), read back once a step
} MemKind;

enum { MN_GROUP_ID_BYTES = 256 };  // room for a group identifier (NCCL's: 128 bytes)

typedef struct Backend Backend;

// Causal softmax attention per head (docs/spec/mixers.md section 7), optionally within a window
// and with grouped key/value heads (query head h reads key/value head h / (H / Hkv)):
//   o[b,t,h] = sum_{s in S(t)} softmax_s(scale q[b,t,h] . k[b,s,h']) v[b,s,h'],
//   S(t) = {s <= t} (window 0), or {t - window < s <= t}.
typedef struct {
    int B, T, H, Hkv, D;  // sequences, tokens, query heads, key/value heads (divides H), head size
    int window;           // 0: full causal attention; w > 0: the last w tokens, the current one included
    float scale;          // usually D^-1/2
} AttnDims;

typedef struct {
    const void *q;     // [B,T,H,D]   MEM_ACT (after RoPE)
    const void *k;     // [B,T,Hkv,D] MEM_ACT (after RoPE)
    const void *v;     // [B,T,Hkv,D] MEM_ACT
    void *o;           // [B,T,H,D]   MEM_ACT
    void *lse;         // [B,T,H]     MEM_F32: each row's log-sum-exp of the scaled scores, for the backward
} AttnFwd;

typedef struct {
    const void *q, *k, *v, *o, *lse;  // the forward's
    const void *dout;                 // [B,T,H,D]
    void *dq, *dk, *dv;               // gradients, shapes of q, k, v (overwritten)
} AttnBwd;

// The sequence-mixer cores, one sub-table a family. Buffers are the backend's: q, k, v, x, o MEM_ACT
// or wider; g, beta, lambda, states MEM_F32; steps MEM_I32, so that counting them never waits for
// the device.

// The Mesa layer (docs/spec/mesa-layer.md sections 1-4): CG solves of (H_t + Lambda) x = q_t.
typedef struct {
    int (*fwd)(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaFwd *io);
    int (*bwd)(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaBwd *io);
    // Its ridge: lambda = softplus(p) + lo;  dp += dlambda * sigmoid(p)
    int (*softplus_fwd)(const Backend *be, void *y, const void *p, size_t n, float lo);
    int (*softplus_bwd)(const Backend *be, void *dp, const void *dy, const void *p, size_t n);
    int (*supports)(const Backend *be, const MnSeqDims *d);  // MN_ERR_UNSUPPORTED naming the size, or NULL
} MesaOps;

// The gated linear-attention family (MnLinRule: the GLA rule or the delta rule).
typedef struct {
    int (*fwd)(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinFwd *io);
    int (*bwd)(const Backend *be, const MnSeqDims *d, const MnLinOpts *o, const MnLinBwd *io);
    // The Gated DeltaNet paper's (Mamba2's) forget gate, per token n and head h of a [N,H] (MEM_ACT):
    // g[n,h] = -exp(A_log[h]) softplus(a[n,h] + dt_bias[h]) (g MEM_F32; A_log, dt_bias MEM_PARAM [H]).
    // NULL where the backend lacks it (gdn-paper is then refused; the other mixers run).
    int (*gdn_gate_fwd)(const Backend *be, void *g, const void *a, const void *A_log, const void *dt_bias, int N, int H);
    // da (=, MEM_ACT) = dg (-exp(A_log)) sigmoid(a + dt_bias);  dA_log += sum_n dg g;  ddt_bias += sum_n da
    // (dA_log, ddt_bias: MEM_F32 [H]; g recomputed from a).
    int (*gdn_gate_bwd)(const Backend *be, void *da, void *dA_log, void *ddt_bias, const void *dg, const void *a,
                        const void *A_log, const void *dt_bias, int N, int H);
    // Longhorn's implicit step size (the exact, matrix form's: mixers.md section 3), per token n and
    // head h of unnormalised keys k [N,H,Dk] (MEM_ACT), with kappa = |k[n,h,:]|^2:
    //   eps[n,h] = beta[n,h] / (1 + beta[n,h] kappa)      (beta, eps MEM_F32 [N,H])
    // the delta rule's beta for the closed-form minimiser of |s - s_prev|^2 + beta |s^T k - v|^2.
    // NULL where the backend lacks it (longhorn-exact is then refused).
    int (*longhorn_eps_fwd)(const Backend *be, void *eps, const void *beta, const void *k, int N, int H, int Dk);
    // dbeta (=, MEM_F32; may alias deps) = deps / (1 + beta kappa)^2;  dk (+=, MEM_ACT) -= 2 deps eps^2 k
    int (*longhorn_eps_bwd)(const Backend *be, void *dbeta, void *dk, const void *deps, const void *beta, const void *k,
                            int N, int H, int Dk);
    int (*supports)(const Backend *be, const MnSeqDims *d);  // MN_ERR_UNSUPPORTED naming the size, or NULL
} LinOps;

// Softmax attention (AttnDims above).
typedef struct {
    int (*fwd)(const Backend *be, const AttnDims *d, const AttnFwd *io);
    int (*bwd)(const Backend *be, const AttnDims *d, const AttnBwd *io);
    // Decoding with a key/value cache: o[b,h] = softmax_s(scale q[b,h] . k[b,s,h/g]) v[b,s,h/g] over
    // the cache's first n slots (s < n <= cap; no mask: the cache holds only the visible tokens, and
    // the softmax does not depend on their order, so a sliding window's ring buffer needs none).
    // q, o [B,H,D]; kc, vc [B,cap,Hkv,D] (all MEM_ACT).
    int (*decode)(const Backend *be, const AttnDims *d, int n, int cap, const void *q, const void *kc, const void *vc,
                  void *o);
    // Rotary position embedding in place on the first `rot` features of each head of x [N, H, D]
    // (MEM_ACT; rot even, 0 < rot <= D; pairs (i, i + rot/2), fla's and Hugging Face Llama's "rotate
    // half" layout within them): rotates by pos[n] theta^(-2i/rot); features rot..D-1 pass as they are
    // (rot < D: partial rotary, RecurrentGemma's half). inverse = 1 rotates back (the backward).
    // pos [N] MEM_I32.
    int (*rope)(const Backend *be, void *x, const void *pos, int N, int H, int D, int rot, float theta, int inverse);
    int (*supports)(const Backend *be, const AttnDims *d);  // MN_ERR_UNSUPPORTED naming the size, or NULL
} AttnOps;

// The mLSTM core (docs/spec/mixers.md section 4; docs/spec/reference/xlstm-notes.md 2.2-2.6): per head
// a state (C [Dv,Dk], n [Dk], m), stabilised, from m_0 = 0 (or the given state):
//   m_t = max(f_t + m_{t-1}, i_t);   a_t = exp(f_t + m_{t-1} - m_t),  b_t = exp(i_t - m_t)
//   C_t = a_t C_{t-1} + b_t v_t k_t^T;   n_t = a_t n_{t-1} + b_t k_t
//   h_t = s C_t q_t / (max(|s n_t^T q_t|, exp(-m_t)) + eps)
// with f_t = log sigmoid(f~_t) <= 0 and i_t = i~_t given (MlstmOps.gates_fwd makes them from the
// pre-activations) and s the q.k scale. Every form computes this m_t exactly (the chunkwise one
// from its carried m), so forms agree to rounding even where eps matters. The backward is the
// exact gradient of this function, m's path included: the output depends on m_t through eps alone
// (xlstm-notes.md 1.3's stop-gradient is exact for eps = 0 only), dL/dm_t = -(dh_t . h_t) eps / den_t,
// carried back through m_t's max to the winning gate.
typedef struct {
    float scale;  // s (Dk^-1/2)
    float eps;    // added to the denominator (1e-6, NX-AI's)
    MnForm form;  // chunkwise or recurrent; AUTO picks the faster
    int chunk;    // chunk size of the chunkwise form (0: the backend's best)
} MlstmOpts;

typedef struct {
    const void *q, *k;           // [B,T,H,Dk] MEM_ACT
    const void *v;               // [B,T,H,Dv] MEM_ACT
    const void *fg, *ig;         // [B,T,H] MEM_F32: log forget gate f_t <= 0, input gate pre-activation i_t
    const void *c0, *n0, *m0;    // initial state [B,H,Dv,Dk], [B,H,Dk], [B,H] MEM_F32, or all NULL (zero)
    void *h;                     // [B,T,H,Dv] MEM_ACT
    void *nq, *m;                // [B,T,H] MEM_F32: s n_t^T q_t and m_t, kept for the backward (NULL: not kept)
    void *cT, *nT, *mT;          // final state, or all NULL (may alias the initial)
} MlstmFwd;

typedef struct {
    const void *q, *k, *v, *fg, *ig;  // the forward's (from a zero state)
    const void *h, *nq, *m;           // the forward's outputs
    const void *dh;                   // [B,T,H,Dv] MEM_ACT
    void *dq, *dk, *dv;               // MEM_ACT, shapes of q, k, v (=)
    void *dfg, *dig;                  // [B,T,H] MEM_F32 (=)
} MlstmBwd;

typedef struct {
    int (*fwd)(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmFwd *io);
    int (*bwd)(const Backend *be, const MnSeqDims *d, const MlstmOpts *o, const MlstmBwd *io);
    // The gates from their pre-activations a (forget), b (input) [n] MEM_ACT, soft-capped by c
    // (c = 0: no cap; xLSTM-7B's 15): fg = logsigmoid(c tanh(a / c)), ig = c tanh(b / c) (MEM_F32);
    // bwd: da, db (=, MEM_ACT) from dfg, dig.
    int (*gates_fwd)(const Backend *be, void *fg, void *ig, const void *a, const void *b, size_t n, float cap);
    int (*gates_bwd)(const Backend *be, void *da, void *db, const void *dfg, const void *dig, const void *a,
                     const void *b, size_t n, float cap);
    int (*supports)(const Backend *be, const MnSeqDims *d);  // MN_ERR_UNSUPPORTED naming the size, or NULL
} MlstmOps;

// The sLSTM core (docs/spec/mixers.md section 5; xlstm-notes.md 1.3-1.4): D = H Dh scalar cells
// in H heads, mixed within a head through the recurrent kernel R. Per step, gates g in order
// i, f, z, o:
//   r[g,h,j] = x_t[g,h,j] + sum_i h_{t-1}[h,i] R[h,i,g,j]
//   m_t = max(logsigmoid(r_f) + m_{t-1}, r_i)   (m_t = r_i where n_{t-1} = 0: the first step)
//   i' = exp(r_i - m_t),  f' = exp(logsigmoid(r_f) + m_{t-1} - m_t)
//   c_t = f' c_{t-1} + i' tanh(r_z);  n_t = f' n_{t-1} + i';  h_t = sigmoid(r_o) c_t / n_t
// (NX-AI's vanilla and CUDA sLSTM, min(1, .) clamps on i', f' included).
typedef struct {
    int B, T, H, Dh;  // sequences, tokens, heads, cells per head (D = H Dh)
    float clip;       // the backward clips the gradient flowing back through R h_{t-1} to [-clip, clip]; 0: none
} SlstmDims;

typedef struct {
    const void *x;      // [B,T,4,D] MEM_ACT: the input pre-activations (biases included), gates i, f, z, o
    const void *r;      // [H,Dh,4,Dh] MEM_PARAM: the recurrent kernel
    const void *s0;     // [B,4,D] MEM_F32: initial (h, c, n, m), or NULL (zero)
    void *h;            // [B,T,D] MEM_ACT
    void *cache;        // [B,T,4,D] MEM_F32: (h, c, n, m) of every step, for the backward (NULL: not kept)
    void *sT;           // [B,4,D] MEM_F32 final (h, c, n, m), or NULL (may alias s0)
} SlstmFwd;

typedef struct {
    const void *x, *r, *cache;  // the forward's (from a zero state)
    const void *dh;             // [B,T,D] MEM_ACT
    void *dx;                   // [B,T,4,D] MEM_ACT (=)
    void *dr;                   // [H,Dh,4,Dh] MEM_F32 (+=)
} SlstmBwd;

typedef struct {
    int (*fwd)(const Backend *be, const SlstmDims *d, const SlstmFwd *io);
    int (*bwd)(const Backend *be, const SlstmDims *d, const SlstmBwd *io);
    int (*supports)(const Backend *be, const SlstmDims *d);  // MN_ERR_UNSUPPORTED naming the size, or NULL
} SlstmOps;

// The diagonal recurrences (docs/spec/mixers.md sections 3 and 6; spec/reference/gdn-longhorn-notes.md
// part B): per sequence, channel c < C and state slot j < N, a float32 state h[c,j] from h_0 (zero, or
// the given state), element-wise:
//   h_t[c,j] = a_t[c,j] h_{t-1}[c,j] + b_t[c,j],   y_t[c] = read-out of h_t[c,:]
// One scan machinery serves every kind; the kind's gate arithmetic makes (a, b) and the read-out
// inside the scan, so that the gates are never written to memory and read back.
//
//   SCAN_RGLRU (Griffin's RG-LRU, Hawk; N = 1), with r = sigmoid(r~), i = sigmoid(i~):
//     log a_t = -8 r_t softplus(w[c]),  b_t = sqrt(1 - a_t^2) i_t x_t,  y_t = h_t
//     and, where `reset` is set, t = 0 is the sequence's first position: a_0 = 0 (the state before it
//     is dropped) and b_0 = i_0 x_0 (no input scaling) -- transformers' RecurrentGemma. The backward
//     bounds d sqrt(u)/du at 1000 as transformers' SqrtBoundDerivative does (u >= 2.5e-7 exact).
//   SCAN_LONGHORN (N = d_state, 16), with beta = sigmoid(r~ + w[c]), kappa_t = |k_t|^2:
//     Delta_t = beta_t / (1 + beta_t kappa_t),  a_t[c,j] = 1 - Delta_t[c] k_t[j]^2,
//     b_t[c,j] = Delta_t[c] x_t[c] k_t[j],  y_t[c] = sum_j h_t[c,j] q_t[j] + skip[c] x_t[c]
typedef enum { SCAN_RGLRU, SCAN_LONGHORN } ScanKind;

typedef struct {
    ScanKind kind;
    int B, T, C;  // sequences, tokens, channels
    int N;        // state slots per channel: 1 (RG-LRU), d_state (Longhorn)
    int reset;    // SCAN_RGLRU: t = 0 starts every sequence (see above); 0: it continues the given state
    int w_seqs;   // 0: w and skip serve every sequence; > 0 (dividing B): each group of that many sequences
                  // has its own, w_stride elements after the group before's (dw and dskip likewise): the runs
    size_t w_stride;  //   of a model of several (core/runs.h)
} ScanDims;

// Where sequence b's w and skip (and dw, dskip) begin: its group's (ScanDims.w_seqs), or 0.
static inline size_t scan_w_at(const ScanDims *d, int b) {
    return d->w_seqs > 0 ? (size_t)(b / d->w_seqs) * d->w_stride : 0;
}

typedef struct {
    const void *x;       // [B,T,C] MEM_ACT: the input
    const void *r;       // [B,T,C] MEM_ACT: RG-LRU's recurrence-gate pre-activation; Longhorn's delta (beta's, before its bias)
    const void *i;       // [B,T,C] MEM_ACT: RG-LRU's input-gate pre-activation; Longhorn: NULL
    const void *k, *q;   // [B,T,N] MEM_ACT: Longhorn's key and query (B and C in Mamba's names); RG-LRU: NULL
    const void *w;       // [C] MEM_PARAM: RG-LRU's Lambda; Longhorn's beta bias
    const void *skip;    // [C] MEM_PARAM: Longhorn's D; RG-LRU: NULL
    const void *s0;      // [B,C,N] MEM_F32: the initial state, or NULL (zero)
    void *y;             // [B,T,C] MEM_ACT
    void *sT;            // [B,C,N] MEM_F32: the final state, or NULL (may alias s0)
} ScanFwd;

typedef struct {
    const void *x, *r, *i, *k, *q, *w, *skip;  // the forward's (from a zero state, `reset` as there)
    const void *dy;                            // [B,T,C] MEM_ACT
    void *dx, *dr, *di;                        // MEM_ACT, shapes of x, r, i (=; di NULL where i is)
    void *dk, *dq;                             // [B,T,N] MEM_ACT (=), Longhorn
    void *dw, *dskip;                          // [C] MEM_F32 (+=; dskip NULL where skip is)
} ScanBwd;

typedef struct {
    // The backward recomputes what it needs of the forward (the states at its chunks' boundaries):
    // the scans are bound by memory traffic, and rereading the inputs costs less than storing T states.
    int (*fwd)(const Backend *be, const ScanDims *d, const ScanFwd *io);
    int (*bwd)(const Backend *be, const ScanDims *d, const ScanBwd *io);
    int (*supports)(const Backend *be, const ScanDims *d);  // MN_ERR_UNSUPPORTED naming the size, or NULL
} ScanOps;

// The optimiser's constants (train/optim.h) and its slabs for Backend.adamw.
typedef struct {
    float beta1, beta2, eps;  // moment decays, denominator guard
    float wd;                 // decoupled weight decay, on the elements whose decay bit is set
    float clip;               // global gradient-norm clip; 0: none
} AdamwOpts;

typedef struct {
    void *p;             // [n] MEM_PARAM: the parameter slab
    const void *g;       // [n] MEM_F32: its gradients
    void *m, *v;         // [n] MEM_F32: the moments
    size_t n;
    const void *decay;   // [(n + 255) / 256] MEM_I32: bit j of word w set: elements 8 (32 w + j) .. + 7 decay
                         // (tensors start at multiples of 8 elements: model.h)
    const void *sched;   // [2] MEM_F32: this update's learning rate and step t (1-based; exact in float)
    void *stats;         // [2] MEM_F64: the gradients' sum of squares (sumsq's; read), refused flag (written)
} AdamwIo;

struct Backend {
    const char *name;
    void *ctx;  // backend-private (cuda: stream, cuBLAS handles)
    int runs;   // copies of a model whose ops it serves at once (core/runs.h: R); 0 (a plain backend): one

    // --- memory ---------------------------------------------------------------
    size_t (*elem_size)(const Backend *be, MemKind kind);  // bytes per element (for views into a slab)
    void *(*alloc)(const Backend *be, size_t n, MemKind kind);  // zeroed; NULL + mn_error on failure
    void (*free)(const Backend *be, void *p);
    void (*zero)(const Backend *be, void *p, size_t n, MemKind kind);
    void (*copy)(const Backend *be, void *dst, const void *src, size_t n, MemKind kind);
    // `rows` copies of n elements: row r from src + r src_stride to dst + r dst_stride (strides in
    // elements; rows do not overlap). One call where a loop of copy would launch one per row on a
    // device (attention's cache takes a token of every sequence per decoding step).
    void (*copy_rows)(const Backend *be, void *dst, size_t dst_stride, const void *src, size_t src_stride, size_t rows,
                      size_t n, MemKind kind);
    int (*upload)(const Backend *be, void *dst, const double *src, size_t n, MemKind kind);
    int (*download)(const Backend *be, double *dst, const void *src, size_t n, MemKind kind);
    int (*upload_f32)(const Backend *be, void *dst, const float *src, size_t n, MemKind kind);
    int (*download_f32)(const Backend *be, float *dst, const void *src, size_t n, MemKind kind);
    int (*upload_i32)(const Backend *be, void *dst, const int32_t *src, size_t n);
    int (*download_i32)(const Backend *be, int32_t *dst, const void *src, size_t n);
    // sum[n] += x[n], count[n] += 1 (MEM_I32): counters kept where they are made, read back when
    // wanted
    int (*tally_i32)(const Backend *be, void *sum, void *count, const void *x, size_t n);
    int (*sync)(const Backend *be);  // waits for queued work; reports asynchronous errors
    // Device memory in use (bytes), or NULL where memory is the host's (then see getrusage).
    size_t (*device_mem_used)(const Backend *be);
    // Bytes this backend can still allocate: the device's free memory on cuda, what the host can
    // still give this process on the host backends (host_mem_available); SIZE_MAX when unknown.
    // For refusing work that cannot fit before allocating it (model.h: model_check_batch).
    size_t (*mem_available)(const Backend *be);

    // --- dense layers -------------------------------------------------------------
    // y[N,nout] = x[N,nin] W[nout,nin]^T + bias[nout] (bias may be NULL)
    int (*linear_fwd)(const Backend *be, void *y, const void *x, const void *w, const void *bias, int N, int nin,
                      int nout);
    // dx[N,nin] (=, or += with accum; NULL: skipped) = dy W;  dw += dy^T x;  dbias += sum_n dy
    int (*linear_bwd)(const Backend *be, void *dx, void *dw, void *dbias, const void *dy, const void *x,
                      const void *w, int N, int nin, int nout, int accum);
    // R products of one shape at once (a model of several runs, core/runs.h): for r < R,
    //   y_r[n,nout] = x_r W_r^T + b_r,   x_r = x + r n nin, y_r = y + r n nout (the runs' rows one
    //   after the other), W_r = w + r ws, b_r = bias + r ws (run r's tensor ws elements after run 0's),
    // and the backward of each, dW_r and db_r ws elements apart in the gradient slab. Optional (NULL:
    // linear_fwd / linear_bwd once a run): one batched product where one run's is too small to fill
    // the device.
    int (*linear_runs_fwd)(const Backend *be, void *y, const void *x, const void *w, const void *bias, int R, int n,
                           int nin, int nout, size_t ws);
    int (*linear_runs_bwd)(const Backend *be, void *dx, void *dw, void *dbias, const void *dy, const void *x,
                           const void *w, int R, int n, int nin, int nout, size_t ws, int accum);

    // --- normalisation and activations ----------------------------------------------
    // RMSNorm over groups of `group` features of each row of D (group divides D):
    // y = x / rms(x) * w, w of length wlen = group (shared by the groups) or D.
    // rstd[N * D/group] (MEM_F32) keeps 1/rms for the backward.
    int (*rmsnorm_fwd)(const Backend *be, void *y, void *rstd, const void *x, const void *w, int N, int D, int group,
                       int wlen, float eps);
    int (*rmsnorm_bwd)(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w,
                       const void *rstd, int N, int D, int group, int wlen, int accum);
    // LayerNorm over groups of `group` features, without bias (xLSTM's LayerNorm and its per-head
    // GroupNorm): y = (x - mean) rstd w, w of wlen = group or D; mean, rstd [N * D/group] MEM_F32.
    int (*layernorm_fwd)(const Backend *be, void *y, void *mean, void *rstd, const void *x, const void *w, int N,
                         int D, int group, int wlen, float eps);
    int (*layernorm_bwd)(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w,
                         const void *mean, const void *rstd, int N, int D, int group, int wlen, int accum);
    // L2 normalisation over groups: y = x / ||x||, inv[N * D/group] (MEM_F32) = 1/||x||.
    int (*l2norm_fwd)(const Backend *be, void *y, void *inv, const void *x, int N, int D, int group, float eps);
    int (*l2norm_bwd)(const Backend *be, void *dx, const void *dy, const void *y, const void *inv, int N, int D,
                      int group);
    // y = silu(x) = x sigmoid(x), elementwise over n.
    int (*silu_fwd)(const Backend *be, void *y, const void *x, size_t n);
    int (*silu_bwd)(const Backend *be, void *dx, const void *dy, const void *x, size_t n);
    // y = gelu(x) = x Phi(x) = x (1 + erf(x / sqrt 2)) / 2 (exact, torch's nn.GELU()), elementwise over n;
    // dx = dy gelu'(x) (dx may alias dy). The autoencoder head's decoder (model/autoencoder.c).
    int (*gelu_fwd)(const Backend *be, void *y, const void *x, size_t n);
    int (*gelu_bwd)(const Backend *be, void *dx, const void *dy, const void *x, size_t n);
    // y = gelu_tanh(x) = x (1 + tanh(k (x + 0.044715 x^3))) / 2, k = sqrt(2 / pi): GELU's tanh
    // approximation (torch's gelu(approximate='tanh'), Hugging Face's "gelu_pytorch_tanh"; Griffin's
    // and RecurrentGemma's); dx = dy gelu_tanh'(x) (dx may alias dy).
    int (*gelu_tanh_fwd)(const Backend *be, void *y, const void *x, size_t n);
    int (*gelu_tanh_bwd)(const Backend *be, void *dx, const void *dy, const void *x, size_t n);
    // The autoencoder head's pooling (MEM_ACT, [B,T,D]): z[b,t,:] = x[b,T-1,:] + pe[t,:], every position
    // gets the last position's vector plus MAD's fixed sin-cos embedding of t (mn_posemb below);
    // its backward dx[b,T-1,:] = sum_t dz[b,t,:], dx = 0 at t < T-1 (overwritten).
    int (*pool_last_fwd)(const Backend *be, void *z, const void *x, int B, int T, int D);
    int (*pool_last_bwd)(const Backend *be, void *dx, const void *dz, int B, int T, int D);
    // h = gelu(g) (.) u, GELU exact as gelu_fwd (the GELU-gated MLP, model/ffn.c); dg, du (=).
    // Optional: NULL where the backend has none (a block with that MLP is then refused on it).
    int (*geglu_fwd)(const Backend *be, void *h, const void *g, const void *u, size_t n);
    int (*geglu_bwd)(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n);
    // h = gelu_tanh(g) (.) u (hawk's output gate, RecurrentGemma's MLP: model/ffn.c's FFN_GEGLU_TANH); dg, du (=).
    int (*geglu_tanh_fwd)(const Backend *be, void *h, const void *g, const void *u, size_t n);
    int (*geglu_tanh_bwd)(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u,
                          size_t n);
    // h = sigmoid(g) (.) u (xLSTM-7B's output gate); dg, du (=). Optional (NULL: the layer is refused).
    int (*sigmoid_gate_fwd)(const Backend *be, void *h, const void *g, const void *u, size_t n);
    int (*sigmoid_gate_bwd)(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u,
                            size_t n);
    // h = silu(g) (.) u (SwiGLU; also the output gate).
    int (*swiglu_fwd)(const Backend *be, void *h, const void *g, const void *u, size_t n);
    int (*swiglu_bwd)(const Backend *be, void *dg, void *du, const void *dh, const void *g, const void *u, size_t n);
    // A block-diagonal projection (xLSTM's headwise q/k/v and sLSTM gate projections): x [N,nb,bin],
    // w [nb,bout,bin] MEM_PARAM, y [N,nb,bout]: y[n,b,o] = sum_i w[b,o,i] x[n,b,i].
    int (*headwise_fwd)(const Backend *be, void *y, const void *x, const void *w, int N, int nb, int bin, int bout);
    // dx (=, or += with accum) = dy w;  dw += dy^T x (per block)
    int (*headwise_bwd)(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int N,
                        int nb, int bin, int bout, int accum);
    // y[n,c] = a[n,c] + s[c] b[n,c] over rows of C (s MEM_PARAM [C]; y may alias a): xLSTM's learnable skip.
    int (*scale_add_fwd)(const Backend *be, void *y, const void *a, const void *s, const void *b, int N, int C);
    // db (=, or += with accum) = dy (.) s;  ds += sum_n dy (.) b   (da = dy is the caller's)
    int (*scale_add_bwd)(const Backend *be, void *db, void *ds, const void *dy, const void *b, const void *s, int N,
                         int C, int accum);
    // y[n,c] += b[c] over rows of C (b MEM_PARAM): a bias after an op that has none (the short
    // convolution, the block-diagonal projections).
    int (*bias_fwd)(const Backend *be, void *y, const void *b, int N, int C);
    // db[c] (MEM_F32) += sum_n dy[n,c]   (the input's gradient is dy itself: the caller's)
    int (*bias_bwd)(const Backend *be, void *db, const void *dy, int N, int C);
    // x += y
    int (*add)(const Backend *be, void *x, const void *y, size_t n);
    // x = cap tanh(x / cap) in place (the soft cap of decoded logits; training's is inside xent)
    int (*softcap)(const Backend *be, void *x, size_t n, float cap);

    // --- sequence ops -------------------------------------------------------------------
    // Causal depthwise convolution over time: y[b,t,c] = sum_j w[c,j] x[b, t-K+1+j, c], x of [B,T,C],
    // w [C,K]. Inputs before t = 0 come from state_in[B,K-1,C] (zeros if NULL); state_out
    // (if not NULL) receives the last K-1 inputs, for decoding. state_out may alias state_in.
    int (*conv_fwd)(const Backend *be, void *y, const void *x, const void *w, int B, int T, int C, int K,
                    const void *state_in, void *state_out);
    // dx = (=) gradient for x; dw += gradient for w. No gradient flows into state_in.
    int (*conv_bwd)(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int B, int T,
                    int C, int K, const void *state_in);
    // x[N,D] = scale * E[tokens[n]];  dE[tokens[n]] += scale * dx[n]
    int (*embed_fwd)(const Backend *be, void *x, const void *tokens, const void *e, int N, int D, float scale);
    int (*embed_bwd)(const Backend *be, void *de, const void *dx, const void *tokens, int N, int D, float scale);
    // Cross-entropy of softcapped logits, cap * tanh(z / cap) (cap = 0: none). losses[N] (MEM_F32)
    // gets -log p(target); rows with target < 0 get 0. If grad_scale != 0, logits is overwritten by
    // grad_scale * dloss/dz (0 in ignored rows). grad_scale_at (MEM_F32 [1], or NULL): the scale is
    // read from there instead (grad_scale then only says that a gradient is wanted): a recorded
    // training step's, which changes from step to step.
    int (*xent)(const Backend *be, void *logits, void *losses, const void *targets, int N, int V, float cap,
                float grad_scale, const void *grad_scale_at);

    // --- gates of the recurrent mixers (elementwise; the shared parameterisation's, mixers/shell.h) ---
    // From the projections a, b [N,H]: beta = sigmoid(b), log gamma = g = min(logsigmoid(a),
    // log(1 - beta / hmax)) (the forget-gate bound; hmax = 0: none). MEM_F32.
    int (*gates_fwd)(const Backend *be, void *g, void *beta, const void *a, const void *b, size_t n, float hmax);
    // da, db (=) from dg, dbeta
    int (*gates_bwd)(const Backend *be, void *da, void *db, const void *dg, const void *dbeta, const void *a,
                     const void *b, size_t n, float hmax);
    // x *= s elementwise (MEM_F32): the delta rules' beta = 2 sigmoid(.) with negative eigenvalues
    // (mixers/shell.c), and its gradient.
    int (*scale_f32)(const Backend *be, void *x, size_t n, float s);
    // --- sequence-mixer cores: one sub-table a family (below) ---------------------------------
    // What a backend points to here is what it runs; NULL makes the model refuse that family's
    // mixers on the backend, naming them (their create); a sub-table's `supports` (NULL: every
    // shape) refuses a layer's sizes the backend's kernels do not take, also when the model is made.
    const MesaOps *mesa;  // mesa
    const LinOps *lin;    // mamba2, gla, deltanet, gdn, gdn-paper, deltanet-paper, longhorn-exact
    const AttnOps *attn;  // mha, swa
    const MlstmOps *mlstm;  // mlstm, mlstm-block, the xlstm architecture's layers
    const SlstmOps *slstm;  // slstm-block
    const ScanOps *scan;    // longhorn, hawk, the recurrent_gemma architecture's recurrent layers
    // --- optimiser, and the training step's sums ----------------------------------------------
    // A training step leaves its scalars on the backend (MEM_F64 sums, the learning rate in
    // MEM_F32), so that it needs no host transfer between its ops and can be recorded (graph ops
    // below); the host reads them once the step is done. Sums run in a fixed order: the same
    // result for any thread count.
    // sum[0] (MEM_F64) += sum_i x[i] over x [n] (MEM_F32: the per-token losses)
    int (*sum_f32)(const Backend *be, void *sum, const void *x, size_t n);
    // out[0] (MEM_F64) = sum_i x[i]^2 over x [n] (MEM_F32: the parameter gradients)
    int (*sumsq)(const Backend *be, void *out, const void *x, size_t n);
    // AdamW over a whole parameter slab in one pass (AdamwIo), its gradients clipped by the norm in
    // stats[0]: with norm = sqrt(stats[0]) finite, gscale = clip > 0 && norm > clip ? clip / norm : 1,
    // and per element (wd_i = wd where its decay bit is set, else 0; c1 = 1 - beta1^t, c2 = 1 - beta2^t)
    //   g = gscale g_i;  m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
    //   p -= lr (m / c1 / (sqrt(v / c2) + eps) + wd_i p)
    // and stats[1] = 0. A non-finite norm changes nothing and sets stats[1] = 1 (the host refuses the
    // step when it reads the stats).
    int (*adamw)(const Backend *be, const AdamwOpts *o, const AdamwIo *io);

    // --- data parallelism (optional: NULL where the backend has no collective of its own; the
    // ranks then sum through the host, train/dist.h) -------------------------------------------
    // group_id makes a group's identifier (in one rank; at most MN_GROUP_ID_BYTES bytes), which the
    // launcher hands to the others; group_join joins that group as `rank` of `size` and returns
    // once all have joined.
    int (*group_id)(const Backend *be, void *id);
    int (*group_join)(const Backend *be, const void *id, int rank, int size);
    // x[n] (MEM_F32) = its sum over the group, in place; every rank gets the same numbers. It runs
    // after the work queued so far and beside what is queued next (a stream of its own on cuda):
    // allreduce_wait orders all later work after every reduction begun.
    int (*allreduce)(const Backend *be, void *x, size_t n);
    int (*allreduce_wait)(const Backend *be);

    // --- recorded launches (optional: NULL where ops run as they are called) ---------------------
    // Between graph_begin and graph_end the ops are recorded instead of run; graph_run replays them
    // on the buffers' contents of that moment. For decoding and training steps of small models,
    // where launching costs more than the work. Recorded ops must not read back, allocate or wait; the recording holds the buffer
    // addresses it saw, so it must be remade when any of them is reallocated. graph_run returns
    // MN_ERR_ARG when the backend's own scratch has moved since (the caller records again).
    int (*graph_begin)(const Backend *be);
    int (*graph_end)(const Backend *be, void **graph);  // *graph: the recording (graph_free it)
    int (*graph_run)(const Backend *be, void *graph);
    void (*graph_free)(const Backend *be, void *graph);
};

// MAD's fixed sin-cos position embedding (posemb_sincos_1d, D >= 4): with h = D/2 and
// f_i = exp(-i log(10000) / (h - 1)), pe[t, i] = sin(t f_i) and pe[t, h + i] = cos(t f_i) for i < h,
// and 0 in the last column of an odd D.
static inline double mn_posemb(int t, int i, int D) {
    int h = D / 2;
    if (i >= 2 * h) return 0;
    int j = i < h ? i : i - h;
    double a = (double)t * exp(-(double)j * log(10000.0) / (double)(h - 1));
    return i < h ? sin(a) : cos(a);
}

// What the host can still give this process, in bytes: the kernel's MemAvailable, or less where a
// memory cgroup (a container's limit) or the address-space limit (ulimit -v) leaves less;
// SIZE_MAX when none of them can be read. The mem_available op of the host backends.
size_t host_mem_available(void);
size_t host_mem_available_op(const Backend *be);

// Ops recorded once and replayed (backends with graph ops; core/backend.c): recorded_run runs
// ops(arg) eagerly on its first call after a reset, so that every kernel is loaded and every
// buffer and workspace has grown before recording; records them on the second call and replays the
// recording from then on. A recording the backend calls stale (graph_run: its scratch moved) is
// dropped, that call runs eagerly and the next records again. The caller resets it when anything
// the ops were recorded with changes (buffer addresses, sizes, settings passed by value).
typedef struct {
    void *graph;  // the recording, or NULL
    int warm;     // the ops ran eagerly since the last reset
    long replays; // calls the recording served (for tests and profiles)
} Recorded;

int recorded_run(Recorded *r, const Backend *be, int (*ops)(void *arg), void *arg);
void recorded_reset(Recorded *r, const Backend *be);

// Whether slab element i decays under AdamwIo.decay's mask (the host backends' reading of it).
static inline int adamw_decays(const void *mask, size_t i) {
    return (int)(((uint32_t)((const int32_t *)mask)[i >> 8] >> ((i >> 3) & 31)) & 1u);
}

// The int32 ops of backends whose buffers are host memory (ref, cpu).
int host_upload_i32(const Backend *be, void *dst, const int32_t *src, size_t n);
int host_download_i32(const Backend *be, int32_t *dst, const void *src, size_t n);
int host_tally_i32(const Backend *be, void *sum, void *count, const void *x, size_t n);

#endif
