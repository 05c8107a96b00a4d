/*
 * The Mesa layer as a mixer (spec section 5; paper appendix D; fla's MesaNet):
 *
 *   q = L2norm(SiLU(conv4(W_q u))),  k = L2norm(SiLU(conv4(W_k u))),  v = W_v u
 *   beta = sigmoid(W_b u + b_b),  log gamma = min(logsigmoid(W_a u + b_a), log(1 - beta / h_max))
 *   lambda = softplus(p) + lambda_min
 *   o = Mesa(q, k, v, gamma, beta, lambda)            (per head, spec sections 1-4)
 *   y = W_o RMSNorm_h(o)          or   y = W_o (RMSNorm_h(o) (.) SiLU(W_g u))  with the output gate
 *
 * Parameter names and shapes follow fla's MesaNet layer (attn.q_proj.weight,
 * attn.q_conv1d.weight [Q, 1, K], attn.lambda_params, ...), so checkpoints map
 * one to one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"

// Parameter slots, in declaration order (g_proj last: it exists only with the gate).
enum { Q_PROJ, K_PROJ, V_PROJ, A_W, A_B, B_W, B_B, LAMBDA, Q_CONV, K_CONV, O_NORM, O_PROJ, G_PROJ };

typedef struct {
    int cap;                 // tokens the activation buffers hold
    const void *u;           // [N,D] block input of the last forward (the model's buffer)
    int B, T;                // sizes of the last forward
    void *qp, *kp, *v;       // [N,Q], [N,Q], [N,Vd] projections
    void *qc, *kc;           // [N,Q] convolution outputs
    void *qs, *ks;           // [N,Q] after SiLU (forward temporaries: in the shared scratch)
    void *q, *k;             // [N,Q] L2-normalised queries and keys
    void *qinv, *kinv;       // [N*H] f32: 1/||SiLU(conv(.))||
    void *a, *b;             // [N,H] gate projections
    void *g, *beta;          // [N,H] f32: log forget gate, input gate
    void *lambda;            // [H*Dk] f32
    void *o, *x;             // [N,Vd] core output, [N,Q] CG solutions
    void *on, *onrstd;       // [N,Vd] normalised output (in the shared scratch: the backward recomputes
                             // it), [N*H] f32 its 1/rms
    void *z, *gated;         // [N,Vd] output-gate projection, gated output (in the shared scratch:
                             // the backward recomputes it)
    void *steps;             // [N*H] i32: CG steps of the last call, per system
    void *steps_acc;         // [2, N*H] i32: per slot, the sum of those steps and the number of calls since
                             // the last collect; counted by the backend, so a recorded step counts too
    // backward temporaries; the [N, .] ones in the shared scratch (scratch_views)
    void *d_gated, *d_z, *d_on, *d_o, *d_v;  // [N,Vd]
    void *d_q, *d_k, *d_tmp;                 // [N,Q]
    void *d_a, *d_b;                         // [N,H]
    void *d_g, *d_beta, *d_lambda;           // f32: [N*H], [N*H], [H*Dk]
    // recurrent state for decoding
    int state_B;
    void *hs, *gs;           // [B,H,Dk,Dk], [B,H,Dv,Dk] f32
    void *qtail, *ktail;     // [B,K-1,Q] the convolutions' last inputs
} Mesa;

typedef struct {
    int N, D, H, Dk, Dv, Q, Vd, K;
} Sizes;

static Sizes sizes(const ModelConfig *c, int N) {
    Sizes s = {N, c->dim, c->n_heads, c->head_dim, c->head_dim, c->n_heads * c->head_dim, c->n_heads * c->head_dim,
               c->conv_size};
    return s;
}

static int mesa_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    Sizes s = sizes(c, 0);
    double in_std = 1 / sqrt((double)s.D), resid = pow((double)c->n_layers, -c->resid_scale);
    double lambda_p = log(expm1((double)(c->lambda_init - c->lambda_min)));  // softplus^-1
    struct {
        const char *name;
        int ndim;
        int64_t shape[3];
        InitKind init;
        double value;
        int decay;
    } p[] = {
        {"attn.q_proj.weight", 2, {s.Q, s.D}, INIT_NORMAL, in_std, 1},
        {"attn.k_proj.weight", 2, {s.Q, s.D}, INIT_NORMAL, in_std, 1},
        {"attn.v_proj.weight", 2, {s.Vd, s.D}, INIT_NORMAL, in_std, 1},
        {"attn.a_proj.weight", 2, {s.H, s.D}, INIT_NORMAL, in_std, 1},
        {"attn.a_proj.bias", 1, {s.H}, INIT_FORGET_BIAS, 0, 0},
        {"attn.b_proj.weight", 2, {s.H, s.D}, INIT_NORMAL, in_std, 1},
        {"attn.b_proj.bias", 1, {s.H}, INIT_CONST, 0, 0},
        {"attn.lambda_params", 1, {s.Q}, INIT_CONST, lambda_p, 0},
        {"attn.q_conv1d.weight", 3, {s.Q, 1, s.K}, INIT_NORMAL, 1 / sqrt((double)s.K), 1},
        {"attn.k_conv1d.weight", 3, {s.Q, 1, s.K}, INIT_NORMAL, 1 / sqrt((double)s.K), 1},
        {"attn.o_norm.weight", 1, {c->shared_onorm ? s.Dv : s.Vd}, INIT_CONST, 1, 0},
        {"attn.o_proj.weight", 2, {s.D, s.Vd}, INIT_NORMAL, resid / sqrt((double)s.Vd), 1},
        {"attn.g_proj.weight", 2, {s.Vd, s.D}, INIT_NORMAL, in_std, 1},
    };
    int count = c->output_gate ? G_PROJ + 1 : G_PROJ;
    for (int i = 0; i < count; i++) {
        char name[96];
        snprintf(name, sizeof name, "%s%s", prefix, p[i].name);
        if (param_add(out, n, max, name, p[i].ndim, p[i].shape, p[i].init, p[i].value, p[i].decay) < 0)
            return mn_error(MN_ERR_ARG, "too many parameter tensors");
    }
    return MN_OK;
}

// Every activation buffer and its element count (per token, or fixed) and kind.
typedef struct {
    void **p;
    size_t per_token, fixed;
    MemKind kind;
} BufDecl;

static int buffers(Mesa *s, const Sizes *z, BufDecl *out) {
    BufDecl d[] = {
        {&s->qp, z->Q, 0, MEM_ACT},        {&s->kp, z->Q, 0, MEM_ACT},      {&s->v, z->Vd, 0, MEM_ACT},
        {&s->qc, z->Q, 0, MEM_ACT},        {&s->kc, z->Q, 0, MEM_ACT},
        {&s->q, z->Q, 0, MEM_ACT},         {&s->k, z->Q, 0, MEM_ACT},
        {&s->qinv, z->H, 0, MEM_F32},      {&s->kinv, z->H, 0, MEM_F32},    {&s->a, z->H, 0, MEM_ACT},
        {&s->b, z->H, 0, MEM_ACT},         {&s->g, z->H, 0, MEM_F32},       {&s->beta, z->H, 0, MEM_F32},
        {&s->lambda, 0, z->Q, MEM_F32},    {&s->o, z->Vd, 0, MEM_ACT},      {&s->x, z->Q, 0, MEM_ACT},
        {&s->onrstd, z->H, 0, MEM_F32},   {&s->z, z->Vd, 0, MEM_ACT},
        {&s->d_a, z->H, 0, MEM_ACT},       {&s->d_b, z->H, 0, MEM_ACT},     {&s->d_g, z->H, 0, MEM_F32},
        {&s->d_beta, z->H, 0, MEM_F32},    {&s->d_lambda, 0, z->Q, MEM_F32}, {&s->steps, z->H, 0, MEM_I32},
        {&s->steps_acc, 2 * z->H, 0, MEM_I32},
    };
    int n = (int)(sizeof d / sizeof d[0]);
    memcpy(out, d, sizeof d);
    return n;
}

// The call temporaries of N tokens, carved from the shared scratch: the forward's (qs, ks) and the
// backward's (the d_ of [N, .]) overlap, as no call needs the other's; the normalised and the
// gated output, which both use, have their own places. Set at every call, since
// another layer may have grown the scratch since this one's last.
static size_t scratch_elems(const Sizes *z) { return (size_t)z->N * (7 * (size_t)z->Vd + 3 * (size_t)z->Q); }

static void scratch_views(Mixer *m, const Sizes *z) {
    Mesa *s = m->priv;
    size_t es = m->be->elem_size(m->be, MEM_ACT), vd = (size_t)z->N * z->Vd * es, q = (size_t)z->N * z->Q * es;
    char *p = m->scratch->p;
    s->qs = p;
    s->ks = p + q;
    void **dv[] = {&s->d_gated, &s->d_z, &s->d_on, &s->d_o, &s->d_v}, **dq[] = {&s->d_q, &s->d_k, &s->d_tmp};
    for (int i = 0; i < 5; i++) *dv[i] = p + i * vd;
    for (int i = 0; i < 3; i++) *dq[i] = p + 5 * vd + i * q;
    s->gated = p + 5 * vd + 3 * q;
    s->on = p + 6 * vd + 3 * q;
}

static void free_buffers(Mixer *m) {
    Mesa *s = m->priv;
    BufDecl d[64];
    Sizes z = sizes(m->cfg, 0);
    int n = buffers(s, &z, d);
    for (int i = 0; i < n; i++) {
        if (*d[i].p) m->be->free(m->be, *d[i].p);
        *d[i].p = NULL;
    }
    s->cap = 0;
}

// Adds the CG steps counted on the backend since the last collect to the mixer's totals: one
// read-back when the numbers are wanted, not one per call.
static int mesa_collect(Mixer *m) {
    Mesa *s = m->priv;
    if (!s->cap) return MN_OK;
    size_t n = (size_t)s->cap * m->cfg->n_heads;
    int32_t *h = malloc(2 * n * sizeof(int32_t));
    if (!h) return mn_error(MN_ERR_NOMEM, "out of memory");
    int st = m->be->download_i32(m->be, h, s->steps_acc, 2 * n);
    double steps = 0, systems = 0;
    for (size_t i = 0; i < n && !st; i++) {
        steps += h[i];
        systems += h[n + i];
    }
    free(h);
    MN_TRY(st);
    m->be->zero(m->be, s->steps_acc, 2 * n, MEM_I32);
    m->cg_steps += steps;
    m->cg_systems += systems;
    return MN_OK;
}

// (Re)allocates the activation buffers for N tokens.
static int ensure_capacity(Mixer *m, int N) {
    Mesa *s = m->priv;
    if (N <= s->cap) return MN_OK;
    MN_TRY(mesa_collect(m));  // the step counters go with the buffers
    free_buffers(m);
    Sizes z = sizes(m->cfg, N);
    BufDecl d[64];
    int n = buffers(s, &z, d);
    for (int i = 0; i < n; i++) {
        *d[i].p = m->be->alloc(m->be, d[i].per_token * (size_t)N + d[i].fixed, d[i].kind);
        if (!*d[i].p) return MN_ERR_NOMEM;
    }
    MN_TRY(mixer_scratch_reserve(m, scratch_elems(&z)));
    s->cap = N;
    return MN_OK;
}

static MnMesaDims core_dims(const Sizes *z, int B, int T) {
    MnMesaDims d = {B, T, z->H, z->Dk, z->Dv};
    return d;
}

static int mesa_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    Mesa *s = m->priv;
    int N = B * T;
    Sizes z = sizes(m->cfg, N);
    if (use_state && s->state_B != B)
        return mn_error(MN_ERR_ARG, "mesa: decoding %d sequences, but the state was reset for %d", B, s->state_B);
    MN_TRY(ensure_capacity(m, N));
    scratch_views(m, &z);
    s->u = u;
    s->B = B;
    s->T = T;
    void **w = m->w;
    // projections
    MN_TRY(be->linear_fwd(be, s->qp, u, w[Q_PROJ], NULL, N, z.D, z.Q));
    MN_TRY(be->linear_fwd(be, s->kp, u, w[K_PROJ], NULL, N, z.D, z.Q));
    MN_TRY(be->linear_fwd(be, s->v, u, w[V_PROJ], NULL, N, z.D, z.Vd));
    MN_TRY(be->linear_fwd(be, s->a, u, w[A_W], w[A_B], N, z.D, z.H));
    MN_TRY(be->linear_fwd(be, s->b, u, w[B_W], w[B_B], N, z.D, z.H));
    // q, k: short convolution (carrying its last inputs when decoding), SiLU, L2 norm per head
    MN_TRY(be->conv_fwd(be, s->qc, s->qp, w[Q_CONV], B, T, z.Q, z.K, use_state ? s->qtail : NULL,
                        use_state ? s->qtail : NULL));
    MN_TRY(be->conv_fwd(be, s->kc, s->kp, w[K_CONV], B, T, z.Q, z.K, use_state ? s->ktail : NULL,
                        use_state ? s->ktail : NULL));
    MN_TRY(be->silu_fwd(be, s->qs, s->qc, (size_t)N * z.Q));
    MN_TRY(be->silu_fwd(be, s->ks, s->kc, (size_t)N * z.Q));
    MN_TRY(be->l2norm_fwd(be, s->q, s->qinv, s->qs, N, z.Q, z.Dk, 1e-6f));
    MN_TRY(be->l2norm_fwd(be, s->k, s->kinv, s->ks, N, z.Q, z.Dk, 1e-6f));
    // gates and ridge
    MN_TRY(be->mesa_gates_fwd(be, s->g, s->beta, s->a, s->b, (size_t)N * z.H, m->cfg->gate_bound));
    MN_TRY(be->softplus_fwd(be, s->lambda, w[LAMBDA], (size_t)z.Q, m->cfg->lambda_min));
    // the core
    MnMesaDims d = core_dims(&z, B, T);
    MnMesaFwd io = {.q = s->q, .k = s->k, .v = s->v, .g = s->g, .beta = s->beta, .lambda = s->lambda,
                    .h0 = use_state ? s->hs : NULL, .g0 = use_state ? s->gs : NULL, .o = s->o, .x = s->x,
                    .hT = use_state ? s->hs : NULL, .gT = use_state ? s->gs : NULL, .steps = s->steps};
    double t0, t1;
    MN_TRY(mixer_clock(m, &t0));
    MN_TRY(be->mesa_fwd(be, &d, &m->solver, &io));
    MN_TRY(mixer_clock(m, &t1));
    m->core_seconds += t1 - t0;
    size_t nh = (size_t)N * z.H;
    void *calls = (char *)s->steps_acc + (size_t)s->cap * z.H * be->elem_size(be, MEM_I32);
    MN_TRY(be->tally_i32(be, s->steps_acc, calls, s->steps, nh));
    // per-head RMSNorm, optional output gate, output projection
    MN_TRY(be->rmsnorm_fwd(be, s->on, s->onrstd, s->o, w[O_NORM], N, z.Vd, z.Dv, m->cfg->shared_onorm ? z.Dv : z.Vd,
                           m->cfg->norm_eps));
    const void *out = s->on;
    if (m->cfg->output_gate) {
        MN_TRY(be->linear_fwd(be, s->z, u, w[G_PROJ], NULL, N, z.D, z.Vd));
        MN_TRY(be->swiglu_fwd(be, s->gated, s->z, s->on, (size_t)N * z.Vd));
        out = s->gated;
    }
    return be->linear_fwd(be, y, out, w[O_PROJ], NULL, N, z.Vd, z.D);
}

static int mesa_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    Mesa *s = m->priv;
    int B = s->B, T = s->T, N = B * T;
    Sizes z = sizes(m->cfg, N);
    scratch_views(m, &z);
    void **w = m->w, **dw = m->dw;
    int gate = m->cfg->output_gate, onorm_len = m->cfg->shared_onorm ? z.Dv : z.Vd;
    // output projection, gate, norm (the normalised and the gated output as the forward made them)
    MN_TRY(be->rmsnorm_fwd(be, s->on, s->onrstd, s->o, w[O_NORM], N, z.Vd, z.Dv, onorm_len, m->cfg->norm_eps));
    if (gate) MN_TRY(be->swiglu_fwd(be, s->gated, s->z, s->on, (size_t)N * z.Vd));
    const void *out = gate ? s->gated : s->on;
    MN_TRY(be->linear_bwd(be, s->d_gated, dw[O_PROJ], NULL, dy, out, w[O_PROJ], N, z.Vd, z.D, 0));
    void *d_on = s->d_gated;
    if (gate) {
        MN_TRY(be->swiglu_bwd(be, s->d_z, s->d_on, s->d_gated, s->z, s->on, (size_t)N * z.Vd));
        d_on = s->d_on;
    }
    MN_TRY(be->rmsnorm_bwd(be, s->d_o, dw[O_NORM], d_on, s->o, w[O_NORM], s->onrstd, N, z.Vd, z.Dv, onorm_len, 0));
    // the core (implicit differentiation)
    MnMesaDims d = core_dims(&z, B, T);
    MnMesaBwd io = {.q = s->q, .k = s->k, .v = s->v, .g = s->g, .beta = s->beta, .lambda = s->lambda, .x = s->x,
                    .o = s->o, .dout = s->d_o, .dq = s->d_q, .dk = s->d_k, .dv = s->d_v, .dg = s->d_g,
                    .dbeta = s->d_beta, .dlambda = s->d_lambda};
    double t0, t1;
    MN_TRY(mixer_clock(m, &t0));
    MN_TRY(be->mesa_bwd(be, &d, &m->solver, &io));
    MN_TRY(mixer_clock(m, &t1));
    m->core_seconds += t1 - t0;
    MN_TRY(be->softplus_bwd(be, dw[LAMBDA], s->d_lambda, w[LAMBDA], (size_t)z.Q));
    MN_TRY(be->mesa_gates_bwd(be, s->d_a, s->d_b, s->d_g, s->d_beta, s->a, s->b, (size_t)N * z.H,
                              m->cfg->gate_bound));
    // q and k back through L2 norm, SiLU and the convolution (in place where a buffer is spent)
    struct {
        void *d, *y, *inv, *c, *p, *convw, *dconvw;
    } qk[2] = {{s->d_q, s->q, s->qinv, s->qc, s->qp, w[Q_CONV], dw[Q_CONV]},
               {s->d_k, s->k, s->kinv, s->kc, s->kp, w[K_CONV], dw[K_CONV]}};
    for (int i = 0; i < 2; i++) {
        MN_TRY(be->l2norm_bwd(be, s->d_tmp, qk[i].d, qk[i].y, qk[i].inv, N, z.Q, z.Dk));
        MN_TRY(be->silu_bwd(be, qk[i].d, s->d_tmp, qk[i].c, (size_t)N * z.Q));
        MN_TRY(be->conv_bwd(be, s->d_tmp, qk[i].dconvw, qk[i].d, qk[i].p, qk[i].convw, B, T, z.Q, z.K, NULL));
        be->copy(be, qk[i].d, s->d_tmp, (size_t)N * z.Q, MEM_ACT);  // d of the projection
    }
    // into the input, through every projection that read it
    MN_TRY(be->linear_bwd(be, du, dw[Q_PROJ], NULL, s->d_q, s->u, w[Q_PROJ], N, z.D, z.Q, 0));
    MN_TRY(be->linear_bwd(be, du, dw[K_PROJ], NULL, s->d_k, s->u, w[K_PROJ], N, z.D, z.Q, 1));
    MN_TRY(be->linear_bwd(be, du, dw[V_PROJ], NULL, s->d_v, s->u, w[V_PROJ], N, z.D, z.Vd, 1));
    MN_TRY(be->linear_bwd(be, du, dw[A_W], dw[A_B], s->d_a, s->u, w[A_W], N, z.D, z.H, 1));
    MN_TRY(be->linear_bwd(be, du, dw[B_W], dw[B_B], s->d_b, s->u, w[B_W], N, z.D, z.H, 1));
    if (gate) MN_TRY(be->linear_bwd(be, du, dw[G_PROJ], NULL, s->d_z, s->u, w[G_PROJ], N, z.D, z.Vd, 1));
    return MN_OK;
}

static int mesa_reset_state(Mixer *m, int B) {
    const Backend *be = m->be;
    Mesa *s = m->priv;
    Sizes z = sizes(m->cfg, 0);
    size_t nh = (size_t)B * z.H * z.Dk * z.Dk, ng = (size_t)B * z.H * z.Dv * z.Dk, nt = (size_t)B * (z.K - 1) * z.Q;
    if (s->state_B != B) {
        void **p[] = {&s->hs, &s->gs, &s->qtail, &s->ktail};
        for (int i = 0; i < 4; i++)
            if (*p[i]) be->free(be, *p[i]);
        s->hs = be->alloc(be, nh, MEM_F32);
        s->gs = be->alloc(be, ng, MEM_F32);
        s->qtail = be->alloc(be, nt, MEM_ACT);
        s->ktail = be->alloc(be, nt, MEM_ACT);
        s->state_B = 0;
        if (!s->hs || !s->gs || !s->qtail || !s->ktail) return MN_ERR_NOMEM;
        s->state_B = B;
    }
    be->zero(be, s->hs, nh, MEM_F32);
    be->zero(be, s->gs, ng, MEM_F32);
    be->zero(be, s->qtail, nt, MEM_ACT);
    be->zero(be, s->ktail, nt, MEM_ACT);
    return MN_OK;
}

static size_t mesa_state_floats(const ModelConfig *c) {
    Sizes z = sizes(c, 0);
    return (size_t)z.H * z.Dk * (z.Dk + z.Dv) + 2 * (size_t)(z.K - 1) * z.Q;
}

static void mesa_destroy(Mixer *m) {
    Mesa *s = m->priv;
    if (!s) return;
    free_buffers(m);
    void *p[] = {s->hs, s->gs, s->qtail, s->ktail};
    for (int i = 0; i < 4; i++)
        if (p[i]) m->be->free(m->be, p[i]);
    free(s);
    m->priv = NULL;
}

static int mesa_create(Mixer *m) {
    m->priv = calloc(1, sizeof(Mesa));
    return m->priv ? MN_OK : mn_error(MN_ERR_NOMEM, "out of memory");
}

const MixerOps mixer_mesa = {
    .name = "mesa",
    .declare = mesa_declare,
    .create = mesa_create,
    .forward = mesa_forward,
    .backward = mesa_backward,
    .reset_state = mesa_reset_state,
    .state_floats = mesa_state_floats,
    .collect = mesa_collect,
    .destroy = mesa_destroy,
};
