/*
 * The Gated DeltaNet paper's own layer (`gdn-paper`) and DeltaNet's (`deltanet-paper`), as fla has
 * them (fla/layers/gated_deltanet.py GatedDeltaNet, fla/layers/delta_net.py DeltaNet with its
 * defaults), so that fla's GatedDeltaNetForCausalLM and DeltaNetForCausalLM checkpoints map one to
 * one (docs/spec/mixers.md section 2, last bullet):
 *
 *   q = L2norm(SiLU(conv(W_q u))),  k = L2norm(SiLU(conv(W_k u))),  v = SiLU(conv(W_v u))
 *   log alpha = -exp(A_log) softplus(W_a u + dt_bias)       (gdn-paper; deltanet-paper: alpha = 1)
 *   beta = sigmoid(W_b u)   (2 sigmoid(.) with the config's neg_eigen: fla's allow_neg_eigval)
 *   S_t = alpha_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T,   o_t = Dk^-1/2 S_t q_t
 *   y = W_o (RMSNorm(o) (.) SiLU(W_g u))   (fla's use_gate: FusedRMSNormGated), else W_o RMSNorm(o)
 *
 * per head, RMSNorm over the value head (one weight of Dv shared by the heads: fla's, with the
 * config's shared_onorm; one per head otherwise). Heads: H query/key heads of Dk = head_dim,
 * values of Dv = head_v_dim (fla's head_dim * expand_v for GDN; hidden * expand_v / H for
 * DeltaNet). No biases but dt_bias; the convolutions have none either (fla's conv_bias = False).
 *
 * Tensors, in fla's order and names (prefix "model.layers.N."): attn.q_proj.weight [Q,D],
 * attn.k_proj.weight [Q,D], attn.v_proj.weight [V,D], attn.a_proj.weight [H,D] (gdn),
 * attn.b_proj.weight [H,D], attn.A_log [H] (gdn), attn.dt_bias [H] (gdn), attn.q_conv1d.weight
 * [Q,1,K], attn.k_conv1d.weight [Q,1,K], attn.v_conv1d.weight [V,1,K], attn.g_proj.weight [V,D]
 * (with the gate), attn.o_norm.weight [Dv], attn.o_proj.weight [D,V].
 *
 * Initialisation: A = U(0, 16), A_log = log A; dt log-uniform in [1e-3, 1e-1] (floor 1e-4),
 * dt_bias = softplus^-1(dt), as fla; the matrices as the shell's (N(0, 1/fan-in)).
 *
 * The core is the backend's lin_fwd / lin_bwd with the delta rule and scale Dk^-1/2, the gate the
 * backend's gdn_gate_fwd / gdn_gate_bwd; a backend without them refuses these mixers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"

typedef struct {
    const char *name;
    int gate;  // gdn-paper: the Mamba2 gate (a_proj, A_log, dt_bias); deltanet-paper: none
} PaperKind;

static const PaperKind kind_gdn = {"gdn-paper", 1}, kind_delta = {"deltanet-paper", 0};

// Parameter slots (indices into w, dw), -1 where the layer has none.
typedef struct {
    int q_proj, k_proj, v_proj, a_proj, b_proj, A_log, dt_bias, q_conv, k_conv, v_conv, g_proj, o_norm, o_proj, count;
} Slots;

typedef struct {
    int N, D, H, Dk, Dv, Q, V, K;
} Dims;

static Dims dims_of(const ModelConfig *c, int N) {
    Dims d = {N, c->dim, c->n_heads, c->head_dim, c->head_v_dim ? c->head_v_dim : c->head_dim, 0, 0, c->conv_size};
    d.Q = d.H * d.Dk;
    d.V = d.H * d.Dv;
    return d;
}

static Slots slots_of(const ModelConfig *c, const PaperKind *k) {
    Slots s;
    int i = 0;
    s.q_proj = i++;
    s.k_proj = i++;
    s.v_proj = i++;
    s.a_proj = k->gate ? i++ : -1;
    s.b_proj = i++;
    s.A_log = k->gate ? i++ : -1;
    s.dt_bias = k->gate ? i++ : -1;
    s.q_conv = i++;
    s.k_conv = i++;
    s.v_conv = i++;
    s.g_proj = c->output_gate ? i++ : -1;
    s.o_norm = i++;
    s.o_proj = i++;
    s.count = i;
    return s;
}

static int add(ParamSpec *out, int *n, int max, const char *prefix, const char *name, int ndim, int64_t a, int64_t b,
               int64_t c3, InitKind init, double value, int decay) {
    char full[96];
    int64_t shape[3] = {a, b, c3};
    snprintf(full, sizeof full, "%s%s", prefix, name);
    if (param_add(out, n, max, full, ndim, shape, init, value, decay) < 0)
        return mn_error(MN_ERR_ARG, "too many parameter tensors");
    return MN_OK;
}

static int declare(const ModelConfig *c, const PaperKind *k, const char *prefix, ParamSpec *out, int *n, int max) {
    Dims z = dims_of(c, 0);
    double in_std = 1 / sqrt((double)z.D), resid = pow((double)c->n_layers, -c->resid_scale);
    double conv_std = 1 / sqrt((double)z.K);
    MN_TRY(add(out, n, max, prefix, "attn.q_proj.weight", 2, z.Q, z.D, 0, INIT_NORMAL, in_std, 1));
    MN_TRY(add(out, n, max, prefix, "attn.k_proj.weight", 2, z.Q, z.D, 0, INIT_NORMAL, in_std, 1));
    MN_TRY(add(out, n, max, prefix, "attn.v_proj.weight", 2, z.V, z.D, 0, INIT_NORMAL, in_std, 1));
    if (k->gate) MN_TRY(add(out, n, max, prefix, "attn.a_proj.weight", 2, z.H, z.D, 0, INIT_NORMAL, in_std, 1));
    MN_TRY(add(out, n, max, prefix, "attn.b_proj.weight", 2, z.H, z.D, 0, INIT_NORMAL, in_std, 1));
    if (k->gate) {
        MN_TRY(add(out, n, max, prefix, "attn.A_log", 1, z.H, 0, 0, INIT_A_LOG, 0, 0));
        MN_TRY(add(out, n, max, prefix, "attn.dt_bias", 1, z.H, 0, 0, INIT_DT_BIAS, 0, 0));
    }
    MN_TRY(add(out, n, max, prefix, "attn.q_conv1d.weight", 3, z.Q, 1, z.K, INIT_NORMAL, conv_std, 1));
    MN_TRY(add(out, n, max, prefix, "attn.k_conv1d.weight", 3, z.Q, 1, z.K, INIT_NORMAL, conv_std, 1));
    MN_TRY(add(out, n, max, prefix, "attn.v_conv1d.weight", 3, z.V, 1, z.K, INIT_NORMAL, conv_std, 1));
    if (c->output_gate) MN_TRY(add(out, n, max, prefix, "attn.g_proj.weight", 2, z.V, z.D, 0, INIT_NORMAL, in_std, 1));
    MN_TRY(add(out, n, max, prefix, "attn.o_norm.weight", 1, c->shared_onorm ? z.Dv : z.V, 0, 0, INIT_CONST, 1, 0));
    MN_TRY(add(out, n, max, prefix, "attn.o_proj.weight", 2, z.D, z.V, 0, INIT_NORMAL, resid / sqrt((double)z.V), 1));
    return MN_OK;
}

typedef struct {
    const PaperKind *kind;
    Slots at;
    int cap;              // tokens the buffers hold
    const void *u;        // [N,D] the last forward's input (the model's buffer)
    int B, T;
    // forward, kept for the backward
    void *qp, *kp, *vp;   // [N,Q], [N,Q], [N,V] projections
    void *qc, *kc, *vc;   // convolution outputs
    void *q, *k, *v;      // L2-normalised q, k; v = SiLU(conv)
    void *qinv, *kinv;    // [N*H] f32
    void *a, *b;          // [N,H] gate projections
    void *g, *beta;       // [N*H] f32 log alpha, beta
    void *o;              // [N,V] the core's output
    void *on, *onrstd;    // [N,V] normalised output, [N*H] f32 its 1/rms
    void *z, *gated;      // [N,V] output-gate projection, gated output
    // temporaries; the [N,Q] and [N,V] ones are views into the model's shared scratch (the
    // forward's and the backward's overlap: no call needs the other's)
    void *qs, *ks;        // [N,Q] after SiLU
    void *junk, *zero;    // [N*H] f32: the unused log gate of gates_fwd, zeros for its backward
    void *d_gated, *d_z, *d_on, *d_o, *d_v, *d_vt;  // [N,V]
    void *d_q, *d_k, *d_t;                           // [N,Q]
    void *d_a, *d_b, *d_junk;                        // [N,H]
    void *d_g, *d_beta;                              // [N*H] f32
    // decoding
    int state_B;
    void *S;                     // [B,H,Dv,Dk] f32
    void *qtail, *ktail, *vtail;  // [B,K-1,Q], [B,K-1,Q], [B,K-1,V]
} Paper;

enum { NBUFS = 27 };

static int buffers(Paper *s, const Dims *z, MixerBuf *out) {
    size_t Q = z->Q, V = z->V, H = z->H;
    MixerBuf d[] = {
        {&s->qp, Q, 0, MEM_ACT},     {&s->kp, Q, 0, MEM_ACT},     {&s->vp, V, 0, MEM_ACT},      {&s->qc, Q, 0, MEM_ACT},
        {&s->kc, Q, 0, MEM_ACT},     {&s->vc, V, 0, MEM_ACT},     {&s->q, Q, 0, MEM_ACT},       {&s->k, Q, 0, MEM_ACT},
        {&s->v, V, 0, MEM_ACT},      {&s->qinv, H, 0, MEM_F32},   {&s->kinv, H, 0, MEM_F32},    {&s->a, H, 0, MEM_ACT},
        {&s->b, H, 0, MEM_ACT},      {&s->g, H, 0, MEM_F32},      {&s->beta, H, 0, MEM_F32},    {&s->o, V, 0, MEM_ACT},
        {&s->on, V, 0, MEM_ACT},     {&s->onrstd, H, 0, MEM_F32}, {&s->z, V, 0, MEM_ACT},       {&s->gated, V, 0, MEM_ACT},
        {&s->junk, H, 0, MEM_F32},   {&s->zero, H, 0, MEM_F32},   {&s->d_a, H, 0, MEM_ACT},     {&s->d_b, H, 0, MEM_ACT},
        {&s->d_junk, H, 0, MEM_ACT}, {&s->d_g, H, 0, MEM_F32},    {&s->d_beta, H, 0, MEM_F32},
    };
    _Static_assert(sizeof d / sizeof d[0] == NBUFS, "buffer count");
    memcpy(out, d, sizeof d);
    return NBUFS;
}

static size_t paper_activation_bytes(const ModelConfig *c, const Backend *be) {
    Paper s;
    Dims z = dims_of(c, 1);
    MixerBuf d[NBUFS];
    buffers(&s, &z, d);
    return mixer_bufs_bytes(be, d, NBUFS);
}

// The shared scratch: 6 [N,V] and 3 [N,Q] backward temporaries (the forward's 2 [N,Q] inside them).
static size_t paper_scratch_elems(const ModelConfig *c) {
    Dims z = dims_of(c, 1);
    return 6 * (size_t)z.V + 3 * (size_t)z.Q;
}

// Set at every call: another layer may have grown (moved) the scratch since this one's last.
static void scratch_views(Mixer *m, Paper *s, const Dims *z) {
    size_t es = m->be->elem_size(m->be, MEM_ACT), v = (size_t)z->N * z->V * es, q = (size_t)z->N * z->Q * es;
    char *p = m->scratch->p;
    void **dv[6] = {&s->d_gated, &s->d_z, &s->d_on, &s->d_o, &s->d_v, &s->d_vt}, **dq[3] = {&s->d_q, &s->d_k, &s->d_t};
    for (int i = 0; i < 6; i++) *dv[i] = p + i * v;
    for (int i = 0; i < 3; i++) *dq[i] = p + 6 * v + i * q;
    s->qs = p;
    s->ks = p + q;
}

static void free_buffers(const Backend *be, Paper *s) {
    MixerBuf d[NBUFS];
    Dims z = {0};
    buffers(s, &z, d);
    mixer_bufs_free(be, d, NBUFS);
    s->cap = 0;
}

static int alloc_buffers(Mixer *m, Paper *s, int N) {
    free_buffers(m->be, s);
    Dims z = dims_of(m->cfg, N);
    MixerBuf d[NBUFS];
    buffers(s, &z, d);
    MN_TRY(mixer_bufs_alloc(m->be, d, NBUFS, (size_t)N));
    MN_TRY(mixer_scratch_reserve(m, (size_t)N * paper_scratch_elems(m->cfg)));
    s->cap = N;
    return MN_OK;
}

static MnLinOpts lin_opts(const Mixer *m) {
    MnLinOpts o = {.rule = MN_LIN_DELTA, .scale = (float)(1 / sqrt((double)m->cfg->head_dim)), .form = m->solver.form,
                   .chunk = m->solver.chunk, .precision = m->solver.precision};
    return o;
}

static int check_state(const Mixer *m, const Paper *s, int B) {
    if (s->state_B == B) return MN_OK;
    if (!s->state_B)
        return mn_error(MN_ERR_ARG, "%s: decoding %d sequences, but the state was not reset (reset_state first)",
                        m->ops->name, B);
    return mn_error(MN_ERR_ARG, "%s: decoding %d sequences, but the state was reset for %d", m->ops->name, B, s->state_B);
}

static int paper_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    const ModelConfig *c = m->cfg;
    Paper *s = m->priv;
    int N = B * T;
    if (use_state) MN_TRY(check_state(m, s, B));
    if (N > s->cap) MN_TRY(alloc_buffers(m, s, N));
    Dims z = dims_of(c, N);
    const Slots *at = &s->at;
    void **w = m->w;
    size_t nh = (size_t)N * z.H;
    scratch_views(m, s, &z);
    s->u = u;
    s->B = B;
    s->T = T;
    // projections
    MN_TRY(be->linear_fwd(be, s->qp, u, w[at->q_proj], NULL, N, z.D, z.Q));
    MN_TRY(be->linear_fwd(be, s->kp, u, w[at->k_proj], NULL, N, z.D, z.Q));
    MN_TRY(be->linear_fwd(be, s->vp, u, w[at->v_proj], NULL, N, z.D, z.V));
    MN_TRY(be->linear_fwd(be, s->b, u, w[at->b_proj], NULL, N, z.D, z.H));
    // gates: beta = s sigmoid(b) (gates_fwd's log gate of b is left unused), log alpha
    MN_TRY(be->gates_fwd(be, s->junk, s->beta, s->b, s->b, nh, 0));
    if (c->neg_eigen) MN_TRY(be->scale_f32(be, s->beta, nh, 2));
    if (s->kind->gate) {
        MN_TRY(be->linear_fwd(be, s->a, u, w[at->a_proj], NULL, N, z.D, z.H));
        MN_TRY(be->lin->gdn_gate_fwd(be, s->g, s->a, w[at->A_log], w[at->dt_bias], N, z.H));
    }
    // short convolutions (carrying their last inputs when decoding) and SiLU; q, k L2-normalised
    struct {
        void *out, *in, *w, *tail;
        int C;
    } cv[3] = {{s->qc, s->qp, w[at->q_conv], s->qtail, z.Q},
               {s->kc, s->kp, w[at->k_conv], s->ktail, z.Q},
               {s->vc, s->vp, w[at->v_conv], s->vtail, z.V}};
    for (int i = 0; i < 3; i++)
        MN_TRY(be->conv_fwd(be, cv[i].out, cv[i].in, cv[i].w, B, T, cv[i].C, z.K, use_state ? cv[i].tail : NULL,
                            use_state ? cv[i].tail : NULL));
    MN_TRY(be->silu_fwd(be, s->qs, s->qc, (size_t)N * z.Q));
    MN_TRY(be->silu_fwd(be, s->ks, s->kc, (size_t)N * z.Q));
    MN_TRY(be->silu_fwd(be, s->v, s->vc, (size_t)N * z.V));
    MN_TRY(be->l2norm_fwd(be, s->q, s->qinv, s->qs, N, z.Q, z.Dk, 1e-6f));
    MN_TRY(be->l2norm_fwd(be, s->k, s->kinv, s->ks, N, z.Q, z.Dk, 1e-6f));
    // the delta rule
    MnSeqDims d = {B, T, z.H, z.Dk, z.Dv};
    MnLinOpts o = lin_opts(m);
    MnLinFwd io = {.q = s->q, .k = s->k, .v = s->v, .g = s->kind->gate ? s->g : NULL, .beta = s->beta,
                   .s0 = use_state ? s->S : NULL, .o = s->o, .sT = use_state ? s->S : NULL};
    MIXER_TIMED(m, &m->core_seconds, be->lin->fwd(be, &d, &o, &io));
    // output norm, gate, projection
    int wlen = c->shared_onorm ? z.Dv : z.V;
    MN_TRY(be->rmsnorm_fwd(be, s->on, s->onrstd, s->o, w[at->o_norm], N, z.V, z.Dv, wlen, c->norm_eps));
    const void *out = s->on;
    if (c->output_gate) {
        MN_TRY(be->linear_fwd(be, s->z, u, w[at->g_proj], NULL, N, z.D, z.V));
        MN_TRY(be->swiglu_fwd(be, s->gated, s->z, s->on, (size_t)N * z.V));
        out = s->gated;
    }
    return be->linear_fwd(be, y, out, w[at->o_proj], NULL, N, z.V, z.D);
}

static int paper_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    const ModelConfig *c = m->cfg;
    Paper *s = m->priv;
    if (!s->cap) return mn_error(MN_ERR_ARG, "%s: backward before any forward", m->ops->name);
    int B = s->B, T = s->T, N = B * T;
    Dims z = dims_of(c, N);
    const Slots *at = &s->at;
    void **w = m->w, **dw = m->dw;
    size_t nh = (size_t)N * z.H;
    int gate = c->output_gate, wlen = c->shared_onorm ? z.Dv : z.V;
    scratch_views(m, s, &z);
    // output projection, gate, norm
    const void *out = gate ? s->gated : s->on;
    MN_TRY(be->linear_bwd(be, s->d_gated, dw[at->o_proj], NULL, dy, out, w[at->o_proj], N, z.V, z.D, 0));
    void *d_on = s->d_gated;
    if (gate) {
        MN_TRY(be->swiglu_bwd(be, s->d_z, s->d_on, s->d_gated, s->z, s->on, (size_t)N * z.V));
        d_on = s->d_on;
    }
    MN_TRY(be->rmsnorm_bwd(be, s->d_o, dw[at->o_norm], d_on, s->o, w[at->o_norm], s->onrstd, N, z.V, z.Dv, wlen, 0));
    // the delta rule
    MnSeqDims d = {B, T, z.H, z.Dk, z.Dv};
    MnLinOpts o = lin_opts(m);
    MnLinBwd io = {.q = s->q, .k = s->k, .v = s->v, .g = s->kind->gate ? s->g : NULL, .beta = s->beta,
                   .dout = s->d_o, .dq = s->d_q, .dk = s->d_k, .dv = s->d_v,
                   .dg = s->kind->gate ? s->d_g : NULL, .dbeta = s->d_beta};
    MIXER_TIMED(m, &m->core_seconds, be->lin->bwd(be, &d, &o, &io));
    // gates
    if (c->neg_eigen) MN_TRY(be->scale_f32(be, s->d_beta, nh, 2));
    be->zero(be, s->zero, nh, MEM_F32);
    MN_TRY(be->gates_bwd(be, s->d_junk, s->d_b, s->zero, s->d_beta, s->b, s->b, nh, 0));
    if (s->kind->gate)
        MN_TRY(be->lin->gdn_gate_bwd(be, s->d_a, dw[at->A_log], dw[at->dt_bias], s->d_g, s->a, w[at->A_log], w[at->dt_bias],
                                N, z.H));
    // v back through SiLU and its convolution (d_vt: d of v's projection)
    MN_TRY(be->silu_bwd(be, s->d_vt, s->d_v, s->vc, (size_t)N * z.V));
    MN_TRY(be->conv_bwd(be, s->d_v, dw[at->v_conv], s->d_vt, s->vp, w[at->v_conv], B, T, z.V, z.K, NULL));
    // q and k back through L2 norm, SiLU and the convolution (ending in d_q, d_k)
    struct {
        void *d, *y, *inv, *c, *p, *convw, *dconvw;
    } qk[2] = {{s->d_q, s->q, s->qinv, s->qc, s->qp, w[at->q_conv], dw[at->q_conv]},
               {s->d_k, s->k, s->kinv, s->kc, s->kp, w[at->k_conv], dw[at->k_conv]}};
    for (int i = 0; i < 2; i++) {
        MN_TRY(be->l2norm_bwd(be, s->d_t, qk[i].d, qk[i].y, qk[i].inv, N, z.Q, z.Dk));
        MN_TRY(be->silu_bwd(be, qk[i].d, s->d_t, qk[i].c, (size_t)N * z.Q));
        MN_TRY(be->conv_bwd(be, s->d_t, qk[i].dconvw, qk[i].d, qk[i].p, qk[i].convw, B, T, z.Q, z.K, NULL));
        be->copy(be, qk[i].d, s->d_t, (size_t)N * z.Q, MEM_ACT);
    }
    // into the input, through every projection that read it
    const void *u = s->u;
    MN_TRY(be->linear_bwd(be, du, dw[at->q_proj], NULL, s->d_q, u, w[at->q_proj], N, z.D, z.Q, 0));
    MN_TRY(be->linear_bwd(be, du, dw[at->k_proj], NULL, s->d_k, u, w[at->k_proj], N, z.D, z.Q, 1));
    MN_TRY(be->linear_bwd(be, du, dw[at->v_proj], NULL, s->d_v, u, w[at->v_proj], N, z.D, z.V, 1));
    MN_TRY(be->linear_bwd(be, du, dw[at->b_proj], NULL, s->d_b, u, w[at->b_proj], N, z.D, z.H, 1));
    if (s->kind->gate) MN_TRY(be->linear_bwd(be, du, dw[at->a_proj], NULL, s->d_a, u, w[at->a_proj], N, z.D, z.H, 1));
    if (gate) MN_TRY(be->linear_bwd(be, du, dw[at->g_proj], NULL, s->d_z, u, w[at->g_proj], N, z.D, z.V, 1));
    return MN_OK;
}

static size_t s_floats(const ModelConfig *c) {
    Dims z = dims_of(c, 0);
    return (size_t)z.H * z.Dv * z.Dk;
}

static size_t tail_floats(const ModelConfig *c) {
    Dims z = dims_of(c, 0);
    return (size_t)(z.K - 1) * (2 * (size_t)z.Q + z.V);
}

static void free_state(const Backend *be, Paper *s) {
    void **p[] = {&s->S, &s->qtail, &s->ktail, &s->vtail};
    for (int i = 0; i < 4; i++) {
        if (*p[i]) be->free(be, *p[i]);
        *p[i] = NULL;
    }
    s->state_B = 0;
}

static int paper_reset_state(Mixer *m, int B) {
    const Backend *be = m->be;
    Paper *s = m->priv;
    Dims z = dims_of(m->cfg, 0);
    size_t ns = (size_t)B * s_floats(m->cfg), nq = (size_t)B * (z.K - 1) * z.Q, nv = (size_t)B * (z.K - 1) * z.V;
    if (s->state_B != B) {
        free_state(be, s);
        s->S = be->alloc(be, ns, MEM_F32);
        s->qtail = be->alloc(be, nq, MEM_ACT);
        s->ktail = be->alloc(be, nq, MEM_ACT);
        s->vtail = be->alloc(be, nv, MEM_ACT);
        if (!s->S || !s->qtail || !s->ktail || !s->vtail) return MN_ERR_NOMEM;
        s->state_B = B;
    }
    be->zero(be, s->S, ns, MEM_F32);
    be->zero(be, s->qtail, nq, MEM_ACT);
    be->zero(be, s->ktail, nq, MEM_ACT);
    be->zero(be, s->vtail, nv, MEM_ACT);
    return MN_OK;
}

static size_t paper_state_floats(const ModelConfig *c) { return s_floats(c) + tail_floats(c); }

static void paper_destroy(Mixer *m) {
    Paper *s = m->priv;
    if (!s) return;
    free_buffers(m->be, s);
    free_state(m->be, s);
    free(s);
    m->priv = NULL;
}

static int paper_create(Mixer *m) {
    const PaperKind *k = m->ops == &mixer_gdn_paper ? &kind_gdn : &kind_delta;
    const Backend *be = m->be;
    if (!be->lin || !be->lin->fwd || !be->lin->bwd || !be->scale_f32)
        return mixer_unsupported(m, "it has no linear-attention core");
    if (k->gate && (!be->lin->gdn_gate_fwd || !be->lin->gdn_gate_bwd))
        return mixer_unsupported(m, "it has no gdn_gate op");
    MnSeqDims d = mixer_layer_dims(m);
    if (be->lin->supports) MN_TRY(mixer_supports(m, be->lin->supports(be, &d)));
    Paper *s = calloc(1, sizeof(Paper));
    if (!s) return mn_error(MN_ERR_NOMEM, "out of memory");
    s->kind = k;
    s->at = slots_of(m->cfg, k);
    m->priv = s;
    return MN_OK;
}

static int gdn_paper_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    return declare(c, &kind_gdn, prefix, out, n, max);
}

static int deltanet_paper_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    return declare(c, &kind_delta, prefix, out, n, max);
}

// fla's GatedDeltaNet layer has its output gate (use_gate): the preset made for it has one too.
static void gdn_paper_preset(ModelConfig *c) { c->output_gate = 1; }

enum { PAPER_FIELDS = CF_CONV | CF_OUTPUT_GATE | CF_ONORM | CF_HEAD_V_DIM | CF_NEG_EIGEN };

const MixerOps mixer_gdn_paper = {
    .name = "gdn-paper",
    .about = "Gated DeltaNet as fla's GatedDeltaNet: alpha = exp(-exp(A_log) softplus(W_a u + dt_bias)), "
             "S_t = alpha S (I - beta k k^T) + beta v k^T, o = Dk^-1/2 S q",
    .state_about = "S (Dv x Dk) per head, and the q, k, v convolutions' last inputs",
    .fields = PAPER_FIELDS,
    .preset = gdn_paper_preset,
    .declare = gdn_paper_declare,
    .activation_bytes = paper_activation_bytes,
    .scratch_elems = paper_scratch_elems,
    .create = paper_create,
    .forward = paper_forward,
    .backward = paper_backward,
    .reset_state = paper_reset_state,
    .state_floats = paper_state_floats,
    .collect = NULL,
    .destroy = paper_destroy,
};

const MixerOps mixer_deltanet_paper = {
    .name = "deltanet-paper",
    .about = "DeltaNet as fla's DeltaNet: S_t = S (I - beta k k^T) + beta v k^T, o = Dk^-1/2 S q",
    .state_about = "S (Dv x Dk) per head, and the q, k, v convolutions' last inputs",
    .fields = PAPER_FIELDS,
    .declare = deltanet_paper_declare,
    .activation_bytes = paper_activation_bytes,
    .scratch_elems = paper_scratch_elems,
    .create = paper_create,
    .forward = paper_forward,
    .backward = paper_backward,
    .reset_state = paper_reset_state,
    .state_floats = paper_state_floats,
    .collect = NULL,
    .destroy = paper_destroy,
};
