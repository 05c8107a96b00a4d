/*
 * Softmax attention (causal, or within a sliding window; grouped key/value heads) through cuDNN's
 * fused flash attention, for the backend slots attn_fwd and attn_bwd: cuda_attn_fwd / cuda_attn_bwd
 * (attn_cuda.cu) call cuda_attn_fwd_cudnn / cuda_attn_bwd_cudnn first and run their own kernels
 * when these decline. Contracts as core/backend.h: q [B,T,H,D], k, v [B,T,Hkv,D] bf16, o bf16, lse
 * [B,T,H] float32, the natural-log log-sum-exp of the scaled scores; window 0 causal, w > 0 the
 * last w tokens including the current one.
 *
 * Selection, read on every call: MESANET_ATTN unset (or "auto"): cuDNN where this build has it and
 * it accepts the shape, our kernels otherwise; MESANET_ATTN=own: our kernels; MESANET_ATTN=cudnn:
 * cuDNN or an error (MN_ERR_UNSUPPORTED naming cuDNN's reason), for the tests. A stream being
 * captured into a CUDA graph runs a plan built before (by an eager call of the same shape: a
 * recorded training step's warm-up) and takes our kernels where there is none (building a plan is
 * not capturable). Without cuDNN
 * at build time (make CUDNN=0, or no cudnn.h beside the CUDA headers: MN_HAVE_CUDNN unset) this
 * file keeps only the selection, which then always declines.
 *
 * The graphs are cuDNN's backend API (cudnn_graph.h, plain C) built the way cudnn-frontend's SDPA
 * nodes lower (include/cudnn_frontend/node/scaled_dot_product_flash_attention.h, CompositeSDPANode
 * and CompositeSDPABackwardNode; the masks as utils/attn_score_modifiers.h's sliding_window_mask
 * and node/diagonal_band_mask.h's composite form; softmax as node/softmax.h), so that the
 * heuristics recognise the pattern and hand it to the fused flash-attention engine:
 *   forward: S = Q K^T (matmul; K as K^T by swapping its last two dims and strides), S *= scale
 *     (a by-value scalar), the causal mask (GEN_INDEX row and column, row >= col, BINARY_SELECT
 *     with -inf), for a window w < T a second one (col + w > row), then softmax as the frontend
 *     builds it: M = max (reduction), E = exp(S - M), L = sum E (reduction), Stats = M + log L,
 *     P = E / L (a bf16 virtual tensor: the engine wants bmm2's A in the I/O type; as float32 the
 *     heuristics find no engine); O = P V (matmul). Stats is always an output (into the scratch
 *     when the caller passes no lse), so that one graph, the one tested, serves both.
 *   backward: softmax_sum = rowsum(dO o O) (pointwise, reduction, x 1), S = scale Q K^T - Stats,
 *     the same masks, P = exp(S); dV = P^T dO (P reshaped to its transpose, bf16); dP = dO V^T;
 *     dS = (dP - softmax_sum) P scale; dK = dS^T Q; dQ = dS K (into a float32 dQ_accum, then
 *     IDENTITY to bf16). With grouped heads dK, dV are products over all H heads reduced to Hkv.
 *     softmax_sum and dQ_accum are non-virtual float32 tensors placed in the workspace (cuDNN >=
 *     9.6 needs no memset of dQ_accum), as the frontend does.
 * Logical dims are cuDNN's [B,H,T,D]: our [B,T,H,D] buffers are described by their strides
 * (T H D, D, H D, 1), no copies; lse [B,T,H] is Stats [B,H,T,1] with strides (T H, 1, H, 1). Should
 * the engine refuse those strides, the graph is built again with Stats [B,H,T] contiguous in the
 * scratch and a transposition kernel (stats_bhs).
 *
 * Plans: one per (device, direction, B, T, H, Hkv, D, window < T ? window : 0), built on
 * first use (heuristics mode A, then FALLBACK; the first engine config whose plan finalizes) and
 * kept in a fixed table for the life of the process (plans are never destroyed: a queued kernel may
 * belong to one); a shape cuDNN refuses is remembered too, so that it is tried once. The scale is a
 * by-value operand, not part of the key. One cudnnHandle_t per device, bound to the context's stream
 * (cudnnSetStream) before each execution; a mutex covers the table and the handles. Workspace: the
 * backend's scratch (cuda_scratch). A refusal (any failure while building: CUDNN_STATUS_NOT_SUPPORTED,
 * an engine that does not support the device, a cuDNN older than 9.0) leaves no mn_error message
 * and clears any CUDA error cuDNN's probing left; a CUDA error pending before the attempt, or a
 * failing execution, is returned as an error.
 *
 * cuDNN's fused kernels are faster than ours, forward and backward, at every shape measured
 * (docs/cuda.md has the figures), so cuDNN is the default where it is present. Building a plan
 * compiles its engine at run time, which is why a plan is built once per shape and direction and
 * kept. Its accuracy against the float64 reference is that of ours (tests/cuda/test_cuda_attn.c:
 * every path and the two mixes).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_common.cuh"
#include "attn_cudnn.h"

static thread_local const char *attn_path = "none";

extern "C" const char *cuda_attn_path(void) { return attn_path; }

enum { SEL_AUTO, SEL_OWN, SEL_CUDNN, SEL_BAD };

static int attn_select(void) {
    const char *e = getenv("MESANET_ATTN");
    if (!e || !*e || !strcmp(e, "auto")) return SEL_AUTO;
    if (!strcmp(e, "own")) return SEL_OWN;
    if (!strcmp(e, "cudnn")) return SEL_CUDNN;
    return SEL_BAD;
}

static int bad_select(const char *fn) {
    return mn_error(MN_ERR_ARG, "%s: MESANET_ATTN=%s: expected own, cudnn or auto", fn, getenv("MESANET_ATTN"));
}

#ifndef MN_HAVE_CUDNN

extern "C" int cuda_attn_cudnn_version(void) { return 0; }

static int declined(const char *fn) {
    int sel = attn_select();
    if (sel == SEL_BAD) return bad_select(fn);
    if (sel == SEL_CUDNN)
        return mn_error(MN_ERR_UNSUPPORTED, "%s: MESANET_ATTN=cudnn, but this build has no cuDNN (cudnn.h not found, or CUDNN=0)",
                        fn);
    attn_path = "own";
    return ATTN_CUDNN_DECLINED;
}

extern "C" int cuda_attn_fwd_cudnn(const Backend *be, const AttnDims *d, const AttnFwd *io) {
    (void)be, (void)d, (void)io;
    return declined("attn_fwd");
}

extern "C" int cuda_attn_bwd_cudnn(const Backend *be, const AttnDims *d, const AttnBwd *io) {
    (void)be, (void)d, (void)io;
    return declined("attn_bwd");
}

#else  // MN_HAVE_CUDNN

#include <cudnn.h>
#include <float.h>
#include <pthread.h>

extern "C" int cuda_attn_cudnn_version(void) { return (int)cudnnGetVersion(); }

// ---- graph building: descriptors collected in a pool, the first failure sticky

#define MAXDESC 128
#define MAXOPS 48

typedef struct {
    cudnnBackendDescriptor_t d[MAXDESC];
    int n;
    cudnnBackendDescriptor_t ops[MAXOPS];
    int nops;
    int64_t next_uid;      // virtual tensors
    cudnnStatus_t st;      // the first failure
    char why[320];         // what failed, with cuDNN's message
} Gb;

static void gb_fail(Gb *g, cudnnStatus_t s, const char *what, long attr) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    g->st = s;
    char msg[200];
    msg[0] = 0;
    cudnnGetLastErrorString(msg, sizeof msg);
    snprintf(g->why, sizeof g->why, "%s (%ld): %s%s%s", what, attr, cudnnGetErrorString(s), msg[0] ? ": " : "", msg);
}

static cudnnBackendDescriptor_t gb_new(Gb *g, cudnnBackendDescriptorType_t t) {
    if (g->st != CUDNN_STATUS_SUCCESS) return NULL;
    if (g->n == MAXDESC) {
        gb_fail(g, CUDNN_STATUS_INTERNAL_ERROR, "too many descriptors", (long)t);
        return NULL;
    }
    cudnnBackendDescriptor_t d = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(t, &d);
    if (s != CUDNN_STATUS_SUCCESS) {
        gb_fail(g, s, "create descriptor", (long)t);
        return NULL;
    }
    g->d[g->n++] = d;
    return d;
}

static void gb_set(Gb *g, cudnnBackendDescriptor_t d, cudnnBackendAttributeName_t a, cudnnBackendAttributeType_t t,
                   int64_t n, const void *v) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t s = cudnnBackendSetAttribute(d, a, t, n, v);
    if (s != CUDNN_STATUS_SUCCESS) gb_fail(g, s, "set attribute", (long)a);
}

static void gb_fin(Gb *g, cudnnBackendDescriptor_t d, const char *what) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    cudnnStatus_t s = cudnnBackendFinalize(d);
    if (s != CUDNN_STATUS_SUCCESS) gb_fail(g, s, what, 0);
}

static void gb_free(Gb *g) {
    for (int i = g->n - 1; i >= 0; i--) cudnnBackendDestroyDescriptor(g->d[i]);
    g->n = 0;
}

static cudnnBackendDescriptor_t gb_tensor(Gb *g, int64_t uid, cudnnDataType_t dt, const int64_t *dim,
                                          const int64_t *str, int virt, int byval) {
    cudnnBackendDescriptor_t t = gb_new(g, CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    int64_t align = 16;
    bool v = virt != 0, bv = byval != 0;
    gb_set(g, t, CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &dt);
    gb_set(g, t, CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dim);
    gb_set(g, t, CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, str);
    gb_set(g, t, CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, 1, &uid);
    gb_set(g, t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, 1, &align);
    gb_set(g, t, CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, 1, &v);
    if (byval) gb_set(g, t, CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, 1, &bv);
    gb_fin(g, t, "tensor");
    return t;
}

static cudnnBackendDescriptor_t gb_virt(Gb *g, cudnnDataType_t dt, const int64_t *dim, const int64_t *str) {
    return gb_tensor(g, g->next_uid++, dt, dim, str, 1, 0);
}

static const int64_t ONES4[4] = {1, 1, 1, 1};

static cudnnBackendDescriptor_t gb_scalar(Gb *g, int64_t uid) {
    return gb_tensor(g, uid, CUDNN_DATA_FLOAT, ONES4, ONES4, 0, 1);
}

static void gb_op(Gb *g, cudnnBackendDescriptor_t op) {
    if (g->st != CUDNN_STATUS_SUCCESS) return;
    if (g->nops == MAXOPS) {
        gb_fail(g, CUDNN_STATUS_INTERNAL_ERROR, "too many operations", 0);
        return;
    }
    g->ops[g->nops++] = op;
}

// y = mode(x[, b[, t]]); axis >= 0 for GEN_INDEX
static void gb_pw(Gb *g, cudnnPointwiseMode_t mode, cudnnDataType_t prec, int64_t axis, cudnnBackendDescriptor_t x,
                  cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t t, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t pw = gb_new(g, CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, 1, &mode);
    gb_set(g, pw, CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, 1, &prec);
    if (axis >= 0) gb_set(g, pw, CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, 1, &axis);
    gb_fin(g, pw, "pointwise descriptor");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &pw);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    if (b) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    if (t) gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &t);
    gb_set(g, op, CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    gb_fin(g, op, "pointwise operation");
    gb_op(g, op);
}

static void gb_matmul(Gb *g, cudnnBackendDescriptor_t a, cudnnBackendDescriptor_t b, cudnnBackendDescriptor_t c) {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t mm = gb_new(g, CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    gb_set(g, mm, CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    gb_fin(g, mm, "matmul descriptor");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &a);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &b);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &c);
    gb_set(g, op, CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &mm);
    gb_fin(g, op, "matmul operation");
    gb_op(g, op);
}

static void gb_reduce(Gb *g, cudnnReduceTensorOp_t mode, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnDataType_t comp = CUDNN_DATA_FLOAT;
    cudnnBackendDescriptor_t r = gb_new(g, CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    gb_set(g, r, CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, 1, &mode);
    gb_set(g, r, CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, 1, &comp);
    gb_fin(g, r, "reduction descriptor");
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    gb_set(g, op, CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &r);
    gb_fin(g, op, "reduction operation");
    gb_op(g, op);
}

static void gb_reshape(Gb *g, cudnnBackendDescriptor_t x, cudnnBackendDescriptor_t y) {
    cudnnBackendDescriptor_t op = gb_new(g, CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &x);
    gb_set(g, op, CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &y);
    gb_fin(g, op, "reshape operation");
    gb_op(g, op);
}

// ---- the attention graphs

enum {
    UID_Q = 1, UID_K, UID_V, UID_O, UID_STATS, UID_SCALE, UID_NINF, UID_WINDOW,
    UID_DO, UID_DQ, UID_DK, UID_DV, UID_ONE, UID_SOFTMAX_SUM, UID_DQ_ACCUM,
    UID_VIRTUAL = 100
};

typedef struct {
    int dev, bwd, B, T, H, Hkv, D, window, lse;  // the key; window 0 when >= T
} AttnKey;

typedef struct {
    AttnKey key;
    int state;       // 1: plan ready; -1: refused (why)
    int stats_bhs;   // Stats as [B,H,T] in the scratch, transposed to / from lse
    cudnnBackendDescriptor_t plan;
    int64_t ws;      // the plan's workspace bytes
    char why[400];
} AttnPlan;

// Scores [B,H,T,T] and the masks of the frontend's sliding_window_mask (top-left diagonal):
// right bound 0 (row >= col), and for a window a left bound (col + w > row). Returns the masked S.
static cudnnBackendDescriptor_t build_masks(Gb *g, const AttnKey *k, cudnnBackendDescriptor_t s,
                                            const int64_t *sdim, const int64_t *sstr) {
    cudnnBackendDescriptor_t ninf = gb_scalar(g, UID_NINF);
    {
        cudnnBackendDescriptor_t row = gb_virt(g, CUDNN_DATA_INT32, sdim, sstr), col = gb_virt(g, CUDNN_DATA_INT32, sdim, sstr);
        cudnnBackendDescriptor_t keep = gb_virt(g, CUDNN_DATA_BOOLEAN, sdim, sstr), y = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr);
        gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, s, NULL, NULL, row);
        gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, s, NULL, NULL, col);
        gb_pw(g, CUDNN_POINTWISE_CMP_GE, CUDNN_DATA_BOOLEAN, -1, row, col, NULL, keep);
        gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, ninf, keep, y);
        s = y;
    }
    if (k->window > 0) {
        cudnnBackendDescriptor_t w = gb_scalar(g, UID_WINDOW);
        cudnnBackendDescriptor_t row = gb_virt(g, CUDNN_DATA_INT32, sdim, sstr), col = gb_virt(g, CUDNN_DATA_INT32, sdim, sstr);
        cudnnBackendDescriptor_t colw = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr);
        cudnnBackendDescriptor_t keep = gb_virt(g, CUDNN_DATA_BOOLEAN, sdim, sstr), y = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr);
        gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 2, s, NULL, NULL, row);
        gb_pw(g, CUDNN_POINTWISE_GEN_INDEX, CUDNN_DATA_FLOAT, 3, s, NULL, NULL, col);
        gb_pw(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, -1, col, w, NULL, colw);
        gb_pw(g, CUDNN_POINTWISE_CMP_GT, CUDNN_DATA_BOOLEAN, -1, colw, row, NULL, keep);
        gb_pw(g, CUDNN_POINTWISE_BINARY_SELECT, CUDNN_DATA_FLOAT, -1, s, ninf, keep, y);
        s = y;
    }
    return s;
}

static void build_fwd(Gb *g, const AttnKey *k, int stats_bhs) {
    const int64_t B = k->B, T = k->T, H = k->H, G = k->Hkv, D = k->D;
    const int64_t qdim[4] = {B, H, T, D}, qstr[4] = {T * H * D, D, H * D, 1};
    const int64_t ktdim[4] = {B, G, D, T}, ktstr[4] = {T * G * D, D, 1, G * D};
    const int64_t vdim[4] = {B, G, T, D}, vstr[4] = {T * G * D, D, G * D, 1};
    const int64_t sdim[4] = {B, H, T, T}, sstr[4] = {H * T * T, T * T, T, 1};
    const int64_t rdim[4] = {B, H, T, 1}, rstr[4] = {H * T, T, 1, 1};
    const int64_t lstr[4] = {T * H, 1, H, 1};
    cudnnBackendDescriptor_t q = gb_tensor(g, UID_Q, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t kt = gb_tensor(g, UID_K, CUDNN_DATA_BFLOAT16, ktdim, ktstr, 0, 0);
    cudnnBackendDescriptor_t v = gb_tensor(g, UID_V, CUDNN_DATA_BFLOAT16, vdim, vstr, 0, 0);
    cudnnBackendDescriptor_t o = gb_tensor(g, UID_O, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t scale = gb_scalar(g, UID_SCALE);
    // S = scale Q K^T, masked
    cudnnBackendDescriptor_t s1 = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr), s2 = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr);
    gb_matmul(g, q, kt, s1);
    gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, s1, scale, NULL, s2);
    cudnnBackendDescriptor_t s = build_masks(g, k, s2, sdim, sstr);
    // softmax, with Stats = max + log(sum)
    cudnnBackendDescriptor_t mx = gb_virt(g, CUDNN_DATA_FLOAT, rdim, rstr);
    gb_reduce(g, CUDNN_REDUCE_TENSOR_MAX, s, mx);
    cudnnBackendDescriptor_t z = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr), e = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr);
    gb_pw(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, -1, s, mx, NULL, z);
    gb_pw(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, -1, z, NULL, NULL, e);
    cudnnBackendDescriptor_t sum = gb_virt(g, CUDNN_DATA_FLOAT, rdim, rstr);
    gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, e, sum);
    if (k->lse) {
        cudnnBackendDescriptor_t lg = gb_virt(g, CUDNN_DATA_FLOAT, rdim, rstr);
        cudnnBackendDescriptor_t stats = gb_tensor(g, UID_STATS, CUDNN_DATA_FLOAT, rdim, stats_bhs ? rstr : lstr, 0, 0);
        gb_pw(g, CUDNN_POINTWISE_LOG, CUDNN_DATA_FLOAT, -1, sum, NULL, NULL, lg);
        gb_pw(g, CUDNN_POINTWISE_ADD, CUDNN_DATA_FLOAT, -1, mx, lg, NULL, stats);
    }
    // P in bf16, the I/O type: the engine takes bmm2's A operand in it (CompositeSDPANode sets it so)
    cudnnBackendDescriptor_t p = gb_virt(g, CUDNN_DATA_BFLOAT16, sdim, sstr);
    gb_pw(g, CUDNN_POINTWISE_DIV, CUDNN_DATA_FLOAT, -1, e, sum, NULL, p);
    gb_matmul(g, p, v, o);
}

static void build_bwd(Gb *g, const AttnKey *k, int stats_bhs) {
    const int64_t B = k->B, T = k->T, H = k->H, G = k->Hkv, D = k->D;
    const int64_t qdim[4] = {B, H, T, D}, qstr[4] = {T * H * D, D, H * D, 1};
    const int64_t ktdim[4] = {B, G, D, T}, ktstr[4] = {T * G * D, D, 1, G * D};
    const int64_t kdim[4] = {B, G, T, D}, kstr[4] = {T * G * D, D, G * D, 1};
    const int64_t sdim[4] = {B, H, T, T}, sstr[4] = {H * T * T, T * T, T, 1};
    const int64_t tstr[4] = {H * T * T, T * T, 1, T};  // the transposes P^T, dS^T
    const int64_t rdim[4] = {B, H, T, 1}, rstr[4] = {H * T, T, 1, 1};
    const int64_t lstr[4] = {T * H, 1, H, 1};
    const int64_t xstr[4] = {H * T * D, T * D, H * D, 1};  // dO o O, as the frontend lays it out
    const int64_t fstr[4] = {H * T * D, T * D, D, 1};      // dQ_accum, the full-head dK, dV
    cudnnBackendDescriptor_t q = gb_tensor(g, UID_Q, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t kt = gb_tensor(g, UID_K, CUDNN_DATA_BFLOAT16, ktdim, ktstr, 0, 0);
    cudnnBackendDescriptor_t vt = gb_tensor(g, UID_V, CUDNN_DATA_BFLOAT16, ktdim, ktstr, 0, 0);
    cudnnBackendDescriptor_t o = gb_tensor(g, UID_O, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t dout = gb_tensor(g, UID_DO, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t stats = gb_tensor(g, UID_STATS, CUDNN_DATA_FLOAT, rdim, stats_bhs ? rstr : lstr, 0, 0);
    cudnnBackendDescriptor_t dq = gb_tensor(g, UID_DQ, CUDNN_DATA_BFLOAT16, qdim, qstr, 0, 0);
    cudnnBackendDescriptor_t dk = gb_tensor(g, UID_DK, CUDNN_DATA_BFLOAT16, kdim, kstr, 0, 0);
    cudnnBackendDescriptor_t dv = gb_tensor(g, UID_DV, CUDNN_DATA_BFLOAT16, kdim, kstr, 0, 0);
    cudnnBackendDescriptor_t scale = gb_scalar(g, UID_SCALE), one = gb_scalar(g, UID_ONE);
    // softmax_sum = rowsum(dO o O)
    cudnnBackendDescriptor_t x1 = gb_virt(g, CUDNN_DATA_FLOAT, qdim, xstr), x2 = gb_virt(g, CUDNN_DATA_FLOAT, rdim, rstr);
    cudnnBackendDescriptor_t ssum = gb_tensor(g, UID_SOFTMAX_SUM, CUDNN_DATA_FLOAT, rdim, rstr, 0, 0);
    gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, dout, o, NULL, x1);
    gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, x1, x2);
    gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, x2, one, NULL, ssum);
    // P = exp(scale Q K^T - Stats), masked
    cudnnBackendDescriptor_t s1 = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr), s2 = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr);
    cudnnBackendDescriptor_t s3 = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr);
    gb_matmul(g, q, kt, s1);
    gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, s1, scale, NULL, s2);
    gb_pw(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, -1, s2, stats, NULL, s3);
    cudnnBackendDescriptor_t s = build_masks(g, k, s3, sdim, sstr);
    cudnnBackendDescriptor_t p = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr);
    gb_pw(g, CUDNN_POINTWISE_EXP, CUDNN_DATA_FLOAT, -1, s, NULL, NULL, p);
    // dV = P^T dO (over all H heads, reduced to Hkv with grouped heads)
    cudnnBackendDescriptor_t pt = gb_virt(g, CUDNN_DATA_BFLOAT16, sdim, tstr);
    gb_reshape(g, p, pt);
    if (H == G) {
        gb_matmul(g, pt, dout, dv);
    } else {
        cudnnBackendDescriptor_t dvf = gb_virt(g, CUDNN_DATA_BFLOAT16, qdim, fstr);
        gb_matmul(g, pt, dout, dvf);
        gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dvf, dv);
    }
    // dS = (dO V^T - softmax_sum) P scale
    cudnnBackendDescriptor_t dp = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr), dp2 = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr);
    cudnnBackendDescriptor_t ds = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr), ds2 = gb_virt(g, CUDNN_DATA_FLOAT, sdim, sstr);
    gb_matmul(g, dout, vt, dp);
    gb_pw(g, CUDNN_POINTWISE_SUB, CUDNN_DATA_FLOAT, -1, dp, ssum, NULL, dp2);
    gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, dp2, p, NULL, ds);
    gb_pw(g, CUDNN_POINTWISE_MUL, CUDNN_DATA_FLOAT, -1, ds, scale, NULL, ds2);
    // dK = dS^T Q
    cudnnBackendDescriptor_t dst = gb_virt(g, CUDNN_DATA_BFLOAT16, sdim, tstr);
    gb_reshape(g, ds2, dst);
    if (H == G) {
        gb_matmul(g, dst, q, dk);
    } else {
        cudnnBackendDescriptor_t dkf = gb_virt(g, CUDNN_DATA_BFLOAT16, qdim, fstr);
        gb_matmul(g, dst, q, dkf);
        gb_reduce(g, CUDNN_REDUCE_TENSOR_ADD, dkf, dk);
    }
    // dQ = dS K, through a float32 accumulator
    cudnnBackendDescriptor_t kr = gb_virt(g, CUDNN_DATA_BFLOAT16, kdim, kstr);
    gb_reshape(g, kt, kr);
    cudnnBackendDescriptor_t acc = gb_tensor(g, UID_DQ_ACCUM, CUDNN_DATA_FLOAT, qdim, fstr, 0, 0);
    gb_matmul(g, ds2, kr, acc);
    gb_pw(g, CUDNN_POINTWISE_IDENTITY, CUDNN_DATA_FLOAT, -1, acc, NULL, NULL, dq);
}

// The operation graph, the heuristics' engine configs, the first plan that finalizes.
static void build_plan(Gb *g, cudnnHandle_t h, const AttnKey *k, int stats_bhs, AttnPlan *out) {
    g->next_uid = UID_VIRTUAL;
    if (k->bwd)
        build_bwd(g, k, stats_bhs);
    else
        build_fwd(g, k, stats_bhs);
    cudnnBackendDescriptor_t og = gb_new(g, CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
    gb_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, g->nops, g->ops);
    gb_set(g, og, CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
    gb_fin(g, og, "operation graph");
    static const cudnnBackendHeurMode_t modes[2] = {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK};
    char tried[320] = "";
    for (int m = 0; m < 2 && g->st == CUDNN_STATUS_SUCCESS; m++) {
        cudnnBackendDescriptor_t heur = gb_new(g, CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
        gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &og);
        gb_set(g, heur, CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, 1, &modes[m]);
        gb_fin(g, heur, m ? "heuristics (fallback)" : "heuristics (mode A)");
        if (g->st != CUDNN_STATUS_SUCCESS) {
            if (m == 0) {  // try the fallback mode
                snprintf(tried, sizeof tried, "%s", g->why);
                g->st = CUDNN_STATUS_SUCCESS;
            }
            continue;
        }
        int64_t n = 0;
        cudnnStatus_t s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0,
                                                   &n, NULL);
        if (s != CUDNN_STATUS_SUCCESS) {
            gb_fail(g, s, "heuristics results", m);
            break;
        }
        if (n > 8) n = 8;
        cudnnBackendDescriptor_t cfg[8];
        for (int i = 0; i < n; i++) cfg[i] = gb_new(g, CUDNN_BACKEND_ENGINECFG_DESCRIPTOR);
        if (g->st != CUDNN_STATUS_SUCCESS) break;
        int64_t got = 0;
        s = cudnnBackendGetAttribute(heur, CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, cfg);
        if (s != CUDNN_STATUS_SUCCESS) {
            gb_fail(g, s, "heuristics results", m);
            break;
        }
        for (int i = 0; i < got; i++) {
            cudnnBackendDescriptor_t plan = NULL;
            s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR, &plan);
            if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, 1, &h);
            if (s == CUDNN_STATUS_SUCCESS)
                s = cudnnBackendSetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                                             &cfg[i]);
            if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(plan);
            int64_t ws = 0, wn = 0;
            if (s == CUDNN_STATUS_SUCCESS)
                s = cudnnBackendGetAttribute(plan, CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE, CUDNN_TYPE_INT64, 1, &wn, &ws);
            if (s == CUDNN_STATUS_SUCCESS) {
                if (g->n < MAXDESC) g->d[g->n++] = plan;  // kept with the graph's descriptors
                out->plan = plan;
                out->ws = ws;
                return;
            }
            char msg[200];
            msg[0] = 0;
            cudnnGetLastErrorString(msg, sizeof msg);
            snprintf(tried, sizeof tried, "engine config %d of %lld (heuristics %s): %s%s%s", i, (long long)got,
                     m ? "fallback" : "A", cudnnGetErrorString(s), msg[0] ? ": " : "", msg);
            if (plan) cudnnBackendDestroyDescriptor(plan);
        }
    }
    if (g->st == CUDNN_STATUS_SUCCESS) {
        g->st = CUDNN_STATUS_NOT_SUPPORTED;
        snprintf(g->why, sizeof g->why, "no engine: %s", tried[0] ? tried : "the heuristics returned none");
    }
}

// ---- the plan table, the handles

#define NPLANS 64
#define NDEV 32

static pthread_mutex_t attn_lock = PTHREAD_MUTEX_INITIALIZER;
static AttnPlan plans[NPLANS];
static int nplans;
static cudnnHandle_t handles[NDEV];
static int handle_state[NDEV];  // 0 untried, 1 made, -1 failed
static char handle_why[NDEV][200];

// Called with attn_lock held. The plan of `k` (built now if new), or NULL when the table is full.
static AttnPlan *get_plan(const AttnKey *k, cudnnHandle_t h) {
    for (int i = 0; i < nplans; i++)
        if (!memcmp(&plans[i].key, k, sizeof *k)) return &plans[i];
    if (nplans == NPLANS) return NULL;
    AttnPlan *p = &plans[nplans++];
    memset(p, 0, sizeof *p);
    p->key = *k;
    char first[sizeof p->why] = "";
    for (int bhs = 0; bhs < (k->lse || k->bwd ? 2 : 1); bhs++) {
        Gb *g = (Gb *)calloc(1, sizeof(Gb));
        if (!g) {
            snprintf(p->why, sizeof p->why, "out of memory building the graph");
            p->state = -1;
            return p;
        }
        build_plan(g, h, k, bhs, p);
        if (g->st == CUDNN_STATUS_SUCCESS) {
            p->state = 1;
            p->stats_bhs = bhs;
            free(g);  // its descriptors live as long as the plan: never destroyed
            return p;
        }
        if (!bhs)
            snprintf(first, sizeof first, "%s", g->why);
        else
            snprintf(p->why, sizeof p->why, "%s; with Stats [B,H,T]: %s", first, g->why);
        if (!(k->lse || k->bwd)) snprintf(p->why, sizeof p->why, "%s", first);
        gb_free(g);
        free(g);
    }
    p->state = -1;
    cudaGetLastError();  // whatever cuDNN's probing left; a genuine error was checked before
    return p;
}

// The plan for this call, or NULL with *why set (declined) or *err set (an error to return).
static AttnPlan *find_plan(const Backend *be, AttnKey *k, cudnnHandle_t *hout, const char **why, int *err,
                           const char *fn) {
    CudaCtx *c = cuda_ctx(be);
    *why = NULL;
    *err = MN_OK;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    int capturing = cudaStreamIsCapturing(c->stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone;
    if (capturing) cudaGetLastError();
    cudaError_t e = cudaPeekAtLastError();
    if (e == cudaSuccess) e = cudaGetDevice(&k->dev);
    if (e != cudaSuccess) {
        *err = mn_error(MN_ERR_UNSUPPORTED, "%s: CUDA error %s before cuDNN: %s", fn, cudaGetErrorName(e), cudaGetErrorString(e));
        return NULL;
    }
    if (k->dev < 0 || k->dev >= NDEV) {
        *why = "device index past the table";
        return NULL;
    }
    if (cudnnGetVersion() < 90000) {
        *why = "cuDNN older than 9.0";
        return NULL;
    }
    if (capturing) {  // building is not capturable; running a plan an eager call built before is
        const AttnPlan *q = NULL;
        for (int i = 0; i < nplans && !q; i++)
            if (!memcmp(&plans[i].key, k, sizeof *k)) q = &plans[i];
        if (handle_state[k->dev] != 1 || !q || q->state <= 0) {
            *why = "the stream is being captured into a graph, and no plan for this shape was built before";
            return NULL;
        }
    }
    if (handle_state[k->dev] == 0) {
        cudnnStatus_t s = cudnnCreate(&handles[k->dev]);
        handle_state[k->dev] = s == CUDNN_STATUS_SUCCESS ? 1 : -1;
        if (s != CUDNN_STATUS_SUCCESS) {
            char msg[160];
            msg[0] = 0;
            cudnnGetLastErrorString(msg, sizeof msg);
            snprintf(handle_why[k->dev], sizeof handle_why[k->dev], "cudnnCreate: %s %s", cudnnGetErrorString(s), msg);
            cudaGetLastError();
        }
    }
    if (handle_state[k->dev] < 0) {
        *why = handle_why[k->dev];
        return NULL;
    }
    AttnPlan *p = get_plan(k, handles[k->dev]);
    if (!p) {
        *why = "the plan table is full";
        return NULL;
    }
    if (p->state < 0) {
        *why = p->why;
        return NULL;
    }
    cudnnStatus_t s = cudnnSetStream(handles[k->dev], c->stream);
    if (s != CUDNN_STATUS_SUCCESS) {
        *err = mn_error(MN_ERR_UNSUPPORTED, "%s: cudnnSetStream: %s", fn, cudnnGetErrorString(s));
        return NULL;
    }
    *hout = handles[k->dev];
    return p;
}

static int execute(cudnnHandle_t h, const AttnPlan *p, int n, const int64_t *uids, void *const *ptrs, void *ws,
                   const char *fn) {
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t s = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendFinalize(vp);
    if (s == CUDNN_STATUS_SUCCESS) s = cudnnBackendExecute(h, p->plan, vp);
    char msg[200];
    msg[0] = 0;
    if (s != CUDNN_STATUS_SUCCESS) cudnnGetLastErrorString(msg, sizeof msg);
    if (vp) cudnnBackendDestroyDescriptor(vp);
    if (s != CUDNN_STATUS_SUCCESS) return mn_error(MN_ERR_UNSUPPORTED, "%s: cuDNN execution failed: %s %s", fn, cudnnGetErrorString(s), msg);
    return MN_OK;
}

// Stats [B,H,T] <-> lse [B,T,H]
static __global__ void stats_transpose_kernel(float *dst, const float *src, int B, int H, int T, int to_lse) {
    const size_t n = (size_t)B * H * T;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        // i indexes [B,T,H]
        const size_t h = i % H, t = (i / H) % T, b = i / ((size_t)H * T), j = (b * H + h) * T + t;
        if (to_lse)
            dst[i] = src[j];
        else
            dst[j] = src[i];
    }
}

static size_t up256(size_t x) { return (x + 255) / 256 * 256; }

static int decline(const char *fn, int sel, const char *why) {
    if (sel == SEL_CUDNN) return mn_error(MN_ERR_UNSUPPORTED, "%s: MESANET_ATTN=cudnn, but cuDNN refused: %s", fn, why);
    attn_path = "own";
    return ATTN_CUDNN_DECLINED;
}

static void make_key(AttnKey *k, const AttnDims *d, int bwd, int lse) {
    memset(k, 0, sizeof *k);
    k->bwd = bwd;
    k->B = d->B, k->T = d->T, k->H = d->H, k->Hkv = d->Hkv, k->D = d->D;
    k->window = d->window > 0 && d->window < d->T ? d->window : 0;
    k->lse = lse;
}

extern "C" int cuda_attn_fwd_cudnn(const Backend *be, const AttnDims *d, const AttnFwd *io) {
    const int sel = attn_select();
    if (sel == SEL_BAD) return bad_select("attn_fwd");
    if (sel == SEL_OWN) return decline("attn_fwd", sel, "");
    AttnKey k;
    make_key(&k, d, 0, 1);  // Stats always (into the scratch when lse is NULL): the graph the tests run
    pthread_mutex_lock(&attn_lock);
    cudnnHandle_t h = NULL;
    const char *why;
    int err;
    AttnPlan *p = find_plan(be, &k, &h, &why, &err, "attn_fwd");
    int rc;
    if (!p) {
        rc = err ? err : decline("attn_fwd", sel, why);
    } else {
        CudaCtx *c = cuda_ctx(be);
        const size_t nst = p->stats_bhs || !io->lse ? up256((size_t)d->B * d->H * d->T * sizeof(float)) : 0;
        char *ws = (char *)cuda_scratch(be, nst + (size_t)p->ws + 256);
        if (!ws) {
            rc = MN_ERR_NOMEM;
        } else {
            float scale = d->scale, ninf = cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY, win = (float)k.window;
            void *stats = nst ? (void *)ws : io->lse;
            int64_t uids[8] = {UID_Q, UID_K, UID_V, UID_O, UID_SCALE, UID_NINF, UID_WINDOW, UID_STATS};
            void *ptrs[8] = {(void *)io->q, (void *)io->k, (void *)io->v, io->o, &scale, &ninf, &win, stats};
            int n = k.window ? 7 : 6;
            uids[n] = UID_STATS;
            ptrs[n++] = stats;
            rc = execute(h, p, n, uids, ptrs, p->ws ? ws + nst : NULL, "attn_fwd");
            if (!rc && nst && io->lse) {
                stats_transpose_kernel<<<grid_for((size_t)d->B * d->H * d->T, 256), 256, 0, c->stream>>>(
                    (float *)io->lse, (const float *)ws, d->B, d->H, d->T, 1);
                cudaError_t e = cudaGetLastError();
                if (e != cudaSuccess) rc = mn_error(MN_ERR_UNSUPPORTED, "attn_fwd: CUDA error %s", cudaGetErrorString(e));
            }
            if (!rc) attn_path = "cudnn";
        }
    }
    pthread_mutex_unlock(&attn_lock);
    return rc;
}

extern "C" int cuda_attn_bwd_cudnn(const Backend *be, const AttnDims *d, const AttnBwd *io) {
    const int sel = attn_select();
    if (sel == SEL_BAD) return bad_select("attn_bwd");
    if (sel == SEL_OWN) return decline("attn_bwd", sel, "");
    AttnKey k;
    make_key(&k, d, 1, 1);
    pthread_mutex_lock(&attn_lock);
    cudnnHandle_t h = NULL;
    const char *why;
    int err;
    AttnPlan *p = find_plan(be, &k, &h, &why, &err, "attn_bwd");
    int rc;
    if (!p) {
        rc = err ? err : decline("attn_bwd", sel, why);
    } else {
        CudaCtx *c = cuda_ctx(be);
        const size_t rows = (size_t)d->B * d->H * d->T;
        const size_t nacc = up256(rows * d->D * sizeof(float)), nsum = up256(rows * sizeof(float));
        const size_t nst = p->stats_bhs ? nsum : 0;
        char *ws = (char *)cuda_scratch(be, nacc + nsum + nst + (size_t)p->ws + 256);
        if (!ws) {
            rc = MN_ERR_NOMEM;
        } else {
            rc = MN_OK;
            void *stats = (void *)io->lse;
            if (nst) {
                stats = ws + nacc + nsum;
                stats_transpose_kernel<<<grid_for(rows, 256), 256, 0, c->stream>>>((float *)stats, (const float *)io->lse,
                                                                                  d->B, d->H, d->T, 0);
                cudaError_t e = cudaGetLastError();
                if (e != cudaSuccess) rc = mn_error(MN_ERR_UNSUPPORTED, "attn_bwd: CUDA error %s", cudaGetErrorString(e));
            }
            float scale = d->scale, ninf = cudnnGetVersion() < 91000 ? -FLT_MAX : -INFINITY, win = (float)k.window, one = 1;
            int64_t uids[16] = {UID_Q, UID_K, UID_V, UID_O, UID_DO, UID_STATS, UID_DQ, UID_DK, UID_DV,
                                UID_SCALE, UID_ONE, UID_NINF, UID_SOFTMAX_SUM, UID_DQ_ACCUM, UID_WINDOW};
            void *ptrs[16] = {(void *)io->q, (void *)io->k, (void *)io->v, (void *)io->o, (void *)io->dout, stats,
                              io->dq, io->dk, io->dv, &scale, &one, &ninf, ws + nacc, ws, &win};
            const int n = k.window ? 15 : 14;
            if (!rc) rc = execute(h, p, n, uids, ptrs, p->ws ? ws + nacc + nsum + nst : NULL, "attn_bwd");
            if (!rc) attn_path = "cudnn";
        }
    }
    pthread_mutex_unlock(&attn_lock);
    return rc;
}

#endif  // MN_HAVE_CUDNN
