/*
 * The paper's shared parameterisation around a recurrent core (shell.h): projections, short
 * convolutions, SiLU, L2 norm, gates, output norm, output gate and projection, forward and backward.
 */
#include "shell.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

Sizes shell_sizes(const ModelConfig *c, int N) {
    Sizes s = {N, c->dim, c->n_heads, c->head_dim, c->head_dim, c->n_heads * c->head_dim, c->n_heads * c->head_dim,
               c->conv_size};
    return s;
}

ShellSlots shell_slots(const ModelConfig *c, const ShellKind *k) {
    ShellSlots s;
    int i = 0;
    s.q_proj = i++;
    s.k_proj = i++;
    s.v_proj = i++;
    s.a_w = k->gate ? i++ : -1;
    s.a_b = k->gate ? i++ : -1;
    s.b_w = k->beta ? i++ : -1;
    s.b_b = k->beta ? i++ : -1;
    s.core = k->n_core ? i : -1;
    i += k->n_core;
    s.q_conv = i++;
    s.k_conv = i++;
    s.o_norm = i++;
    s.o_proj = i++;
    s.g_proj = c->output_gate ? i++ : -1;
    s.count = i;
    return s;
}

static int add(ParamSpec *out, int *n, int max, const char *prefix, const ShellParam *p) {
    char name[96];
    snprintf(name, sizeof name, "%s%s", prefix, p->name);
    if (param_add(out, n, max, name, p->ndim, p->shape, p->init, p->value, p->decay) < 0)
        return mn_error(MN_ERR_ARG, "too many parameter tensors");
    return MN_OK;
}

int shell_declare(const ModelConfig *c, const ShellKind *k, const char *prefix, ParamSpec *out, int *n, int max) {
    Sizes s = shell_sizes(c, 0);
    double in_std = 1 / sqrt((double)s.D), resid = pow((double)c->n_layers, -c->resid_scale);
    const ShellParam in[] = {
        {"attn.q_proj.weight", 2, {s.Q, s.D}, INIT_NORMAL, in_std, 1},
        {"attn.k_proj.weight", 2, {s.Q, s.D}, INIT_NORMAL, in_std, 1},
        {"attn.v_proj.weight", 2, {s.Vd, s.D}, INIT_NORMAL, in_std, 1},
    };
    const ShellParam gate[] = {
        {"attn.a_proj.weight", 2, {s.H, s.D}, INIT_NORMAL, in_std, 1},
        {"attn.a_proj.bias", 1, {s.H}, INIT_FORGET_BIAS, 0, 0},
    };
    const ShellParam beta[] = {
        {"attn.b_proj.weight", 2, {s.H, s.D}, INIT_NORMAL, in_std, 1},
        {"attn.b_proj.bias", 1, {s.H}, INIT_CONST, 0, 0},
    };
    const ShellParam outp[] = {
        {"attn.q_conv1d.weight", 3, {s.Q, 1, s.K}, INIT_NORMAL, 1 / sqrt((double)s.K), 1},
        {"attn.k_conv1d.weight", 3, {s.Q, 1, s.K}, INIT_NORMAL, 1 / sqrt((double)s.K), 1},
        {"attn.o_norm.weight", 1, {c->shared_onorm ? s.Dv : s.Vd}, INIT_CONST, 1, 0},
        {"attn.o_proj.weight", 2, {s.D, s.Vd}, INIT_NORMAL, resid / sqrt((double)s.Vd), 1},
        {"attn.g_proj.weight", 2, {s.Vd, s.D}, INIT_NORMAL, in_std, 1},
    };
    for (int i = 0; i < 3; i++) MN_TRY(add(out, n, max, prefix, &in[i]));
    for (int i = 0; i < 2 && k->gate; i++) MN_TRY(add(out, n, max, prefix, &gate[i]));
    for (int i = 0; i < 2 && k->beta; i++) MN_TRY(add(out, n, max, prefix, &beta[i]));
    for (int i = 0; i < k->n_core; i++) MN_TRY(add(out, n, max, prefix, &k->core[i]));
    for (int i = 0; i < (c->output_gate ? 5 : 4); i++) MN_TRY(add(out, n, max, prefix, &outp[i]));
    return MN_OK;
}

void shell_init(Shell *s, const ModelConfig *c, const ShellKind *k) {
    memset(s, 0, sizeof *s);
    s->kind = *k;
    s->at = shell_slots(c, k);
}

// Every activation buffer of the shell: its element count per token, and kind.
enum { SHELL_BUFS = 20 };

static void buffers(Shell *s, const Sizes *z, MixerBuf *out) {
    MixerBuf d[SHELL_BUFS] = {
        {&s->qp, z->Q, 0, MEM_ACT},     {&s->kp, z->Q, 0, MEM_ACT},     {&s->v, z->Vd, 0, MEM_ACT},
        {&s->qc, z->Q, 0, MEM_ACT},     {&s->kc, z->Q, 0, MEM_ACT},     {&s->q, z->Q, 0, MEM_ACT},
        {&s->k, z->Q, 0, MEM_ACT},      {&s->qinv, z->H, 0, MEM_F32},   {&s->kinv, z->H, 0, MEM_F32},
        {&s->a, z->H, 0, MEM_ACT},      {&s->b, z->H, 0, MEM_ACT},      {&s->g, z->H, 0, MEM_F32},
        {&s->beta, z->H, 0, MEM_F32},   {&s->o, z->Vd, 0, MEM_ACT},     {&s->onrstd, z->H, 0, MEM_F32},
        {&s->z, z->Vd, 0, MEM_ACT},     {&s->d_a, z->H, 0, MEM_ACT},    {&s->d_b, z->H, 0, MEM_ACT},
        {&s->d_g, z->H, 0, MEM_F32},    {&s->d_beta, z->H, 0, MEM_F32},
    };
    memcpy(out, d, sizeof d);
}

size_t shell_activation_bytes(const ModelConfig *c, const Backend *be) {
    Shell s;
    Sizes z = shell_sizes(c, 1);
    MixerBuf d[SHELL_BUFS];
    buffers(&s, &z, d);
    return mixer_bufs_bytes(be, d, SHELL_BUFS);
}

// The call temporaries of N tokens, carved from the shared scratch: the forward's (qs, ks) and the
// backward's (the d_ of [N, .]) overlap, as no call needs the other's; the normalised and the
// gated output, which both use, have their own places. Set at every call, since another layer
// may have grown the scratch since this one's last.
size_t shell_scratch_elems(const ModelConfig *c) {
    Sizes z = shell_sizes(c, 1);
    return 7 * (size_t)z.Vd + 3 * (size_t)z.Q;
}

static void scratch_views(Mixer *m, Shell *s, const Sizes *z) {
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

void shell_free_buffers(const Backend *be, Shell *s) {
    MixerBuf d[SHELL_BUFS];
    Sizes z = {0};
    buffers(s, &z, d);
    mixer_bufs_free(be, d, SHELL_BUFS);
    s->cap = 0;
}

int shell_alloc_buffers(Mixer *m, Shell *s, int N) {
    shell_free_buffers(m->be, s);
    Sizes z = shell_sizes(m->cfg, N);
    MixerBuf d[SHELL_BUFS];
    buffers(s, &z, d);
    MN_TRY(mixer_bufs_alloc(m->be, d, SHELL_BUFS, (size_t)N));
    MN_TRY(mixer_scratch_reserve(m, (size_t)N * shell_scratch_elems(m->cfg)));
    s->cap = N;
    return MN_OK;
}

static float hmax(const Mixer *m, const Shell *s) { return s->kind.bound ? m->cfg->gate_bound : 0; }

int shell_in_fwd(Mixer *m, Shell *s, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    int N = B * T;
    Sizes z = shell_sizes(m->cfg, N);
    const ShellSlots *at = &s->at;
    void **w = m->w;
    scratch_views(m, s, &z);
    s->u = u;
    s->B = B;
    s->T = T;
    // projections
    MN_TRY(be->linear_fwd(be, s->qp, u, w[at->q_proj], NULL, N, z.D, z.Q));
    MN_TRY(be->linear_fwd(be, s->kp, u, w[at->k_proj], NULL, N, z.D, z.Q));
    MN_TRY(be->linear_fwd(be, s->v, u, w[at->v_proj], NULL, N, z.D, z.Vd));
    if (s->kind.gate) MN_TRY(be->linear_fwd(be, s->a, u, w[at->a_w], w[at->a_b], N, z.D, z.H));
    if (s->kind.beta) MN_TRY(be->linear_fwd(be, s->b, u, w[at->b_w], w[at->b_b], N, z.D, z.H));
    // q, k: short convolution (carrying its last inputs when decoding), SiLU, L2 norm per head
    MN_TRY(be->conv_fwd(be, s->qc, s->qp, w[at->q_conv], B, T, z.Q, z.K, use_state ? s->qtail : NULL,
                        use_state ? s->qtail : NULL));
    MN_TRY(be->conv_fwd(be, s->kc, s->kp, w[at->k_conv], B, T, z.Q, z.K, use_state ? s->ktail : NULL,
                        use_state ? s->ktail : NULL));
    if (s->kind.raw_qk) {
        MN_TRY(be->silu_fwd(be, s->q, s->qc, (size_t)N * z.Q));
        MN_TRY(be->silu_fwd(be, s->k, s->kc, (size_t)N * z.Q));
    } else {
        MN_TRY(be->silu_fwd(be, s->qs, s->qc, (size_t)N * z.Q));
        MN_TRY(be->silu_fwd(be, s->ks, s->kc, (size_t)N * z.Q));
        MN_TRY(be->l2norm_fwd(be, s->q, s->qinv, s->qs, N, z.Q, z.Dk, 1e-6f));
        MN_TRY(be->l2norm_fwd(be, s->k, s->kinv, s->ks, N, z.Q, z.Dk, 1e-6f));
    }
    // gates (one op makes both; a layer with one of them reads its projection for the other too
    // and leaves that result unused)
    if (s->kind.gate || s->kind.beta) {
        const void *a = s->kind.gate ? s->a : s->b, *b = s->kind.beta ? s->b : s->a;
        size_t nh = (size_t)N * z.H;
        if (s->kind.mlstm) MN_TRY(be->mlstm->gates_fwd(be, s->g, s->beta, a, b, nh, 0));
        else MN_TRY(be->gates_fwd(be, s->g, s->beta, a, b, nh, hmax(m, s)));
        if (s->kind.beta && s->kind.beta_scale != 1) MN_TRY(be->scale_f32(be, s->beta, nh, s->kind.beta_scale));
    }
    return MN_OK;
}

int shell_out_fwd(Mixer *m, Shell *s, void *y) {
    const Backend *be = m->be;
    int N = s->B * s->T;
    Sizes z = shell_sizes(m->cfg, N);
    const ShellSlots *at = &s->at;
    void **w = m->w;
    // per-head RMSNorm, optional output gate, output projection
    MN_TRY(be->rmsnorm_fwd(be, s->on, s->onrstd, s->o, w[at->o_norm], N, z.Vd, z.Dv,
                           m->cfg->shared_onorm ? z.Dv : z.Vd, m->cfg->norm_eps));
    const void *out = s->on;
    if (m->cfg->output_gate) {
        MN_TRY(be->linear_fwd(be, s->z, s->u, w[at->g_proj], NULL, N, z.D, z.Vd));
        MN_TRY(be->swiglu_fwd(be, s->gated, s->z, s->on, (size_t)N * z.Vd));
        out = s->gated;
    }
    return be->linear_fwd(be, y, out, w[at->o_proj], NULL, N, z.Vd, z.D);
}

int shell_out_bwd(Mixer *m, Shell *s, const void *dy) {
    const Backend *be = m->be;
    int N = s->B * s->T;
    Sizes z = shell_sizes(m->cfg, N);
    scratch_views(m, s, &z);
    const ShellSlots *at = &s->at;
    void **w = m->w, **dw = m->dw;
    int gate = m->cfg->output_gate, onorm_len = m->cfg->shared_onorm ? z.Dv : z.Vd;
    // output projection, gate, norm (the normalised and the gated output as the forward made them)
    MN_TRY(be->rmsnorm_fwd(be, s->on, s->onrstd, s->o, w[at->o_norm], N, z.Vd, z.Dv, onorm_len, m->cfg->norm_eps));
    if (gate) MN_TRY(be->swiglu_fwd(be, s->gated, s->z, s->on, (size_t)N * z.Vd));
    const void *out = gate ? s->gated : s->on;
    MN_TRY(be->linear_bwd(be, s->d_gated, dw[at->o_proj], NULL, dy, out, w[at->o_proj], N, z.Vd, z.D, 0));
    void *d_on = s->d_gated;
    if (gate) {
        MN_TRY(be->swiglu_bwd(be, s->d_z, s->d_on, s->d_gated, s->z, s->on, (size_t)N * z.Vd));
        d_on = s->d_on;
    }
    return be->rmsnorm_bwd(be, s->d_o, dw[at->o_norm], d_on, s->o, w[at->o_norm], s->onrstd, N, z.Vd, z.Dv, onorm_len,
                           0);
}

int shell_in_bwd(Mixer *m, Shell *s, void *du) {
    const Backend *be = m->be;
    int B = s->B, T = s->T, N = B * T;
    Sizes z = shell_sizes(m->cfg, N);
    const ShellSlots *at = &s->at;
    void **w = m->w, **dw = m->dw;
    // the gates (a layer with one of them: the other's gradient is zero, its result unused)
    if (s->kind.gate || s->kind.beta) {
        size_t nh = (size_t)N * z.H;
        if (!s->kind.gate) be->zero(be, s->d_g, nh, MEM_F32);
        if (!s->kind.beta) be->zero(be, s->d_beta, nh, MEM_F32);
        if (s->kind.beta && s->kind.beta_scale != 1) MN_TRY(be->scale_f32(be, s->d_beta, nh, s->kind.beta_scale));
        const void *a = s->kind.gate ? s->a : s->b, *b = s->kind.beta ? s->b : s->a;
        if (s->kind.mlstm) MN_TRY(be->mlstm->gates_bwd(be, s->d_a, s->d_b, s->d_g, s->d_beta, a, b, nh, 0));
        else MN_TRY(be->gates_bwd(be, s->d_a, s->d_b, s->d_g, s->d_beta, a, b, nh, hmax(m, s)));
    }
    // q and k back through L2 norm, SiLU and the convolution (in place where a buffer is spent)
    struct {
        void *d, *y, *inv, *c, *p, *convw, *dconvw;
    } qk[2] = {{s->d_q, s->q, s->qinv, s->qc, s->qp, w[at->q_conv], dw[at->q_conv]},
               {s->d_k, s->k, s->kinv, s->kc, s->kp, w[at->k_conv], dw[at->k_conv]}};
    for (int i = 0; i < 2; i++) {
        if (s->kind.raw_qk) {
            MN_TRY(be->silu_bwd(be, s->d_tmp, qk[i].d, qk[i].c, (size_t)N * z.Q));
            MN_TRY(be->conv_bwd(be, qk[i].d, qk[i].dconvw, s->d_tmp, qk[i].p, qk[i].convw, B, T, z.Q, z.K, NULL));
            continue;
        }
        MN_TRY(be->l2norm_bwd(be, s->d_tmp, qk[i].d, qk[i].y, qk[i].inv, N, z.Q, z.Dk));
        MN_TRY(be->silu_bwd(be, qk[i].d, s->d_tmp, qk[i].c, (size_t)N * z.Q));
        MN_TRY(be->conv_bwd(be, s->d_tmp, qk[i].dconvw, qk[i].d, qk[i].p, qk[i].convw, B, T, z.Q, z.K, NULL));
        be->copy(be, qk[i].d, s->d_tmp, (size_t)N * z.Q, MEM_ACT);  // d of the projection
    }
    // into the input, through every projection that read it
    MN_TRY(be->linear_bwd(be, du, dw[at->q_proj], NULL, s->d_q, s->u, w[at->q_proj], N, z.D, z.Q, 0));
    MN_TRY(be->linear_bwd(be, du, dw[at->k_proj], NULL, s->d_k, s->u, w[at->k_proj], N, z.D, z.Q, 1));
    MN_TRY(be->linear_bwd(be, du, dw[at->v_proj], NULL, s->d_v, s->u, w[at->v_proj], N, z.D, z.Vd, 1));
    if (s->kind.gate) MN_TRY(be->linear_bwd(be, du, dw[at->a_w], dw[at->a_b], s->d_a, s->u, w[at->a_w], N, z.D, z.H, 1));
    if (s->kind.beta) MN_TRY(be->linear_bwd(be, du, dw[at->b_w], dw[at->b_b], s->d_b, s->u, w[at->b_w], N, z.D, z.H, 1));
    if (m->cfg->output_gate)
        MN_TRY(be->linear_bwd(be, du, dw[at->g_proj], NULL, s->d_z, s->u, w[at->g_proj], N, z.D, z.Vd, 1));
    return MN_OK;
}

MnSeqDims shell_dims(const Shell *s, const ModelConfig *c, int B, int T) {
    (void)s;
    MnSeqDims d = {B, T, c->n_heads, c->head_dim, c->head_dim};
    return d;
}

int shell_reset_state(Mixer *m, Shell *s, int B, void **states, const size_t *counts, int n) {
    const Backend *be = m->be;
    Sizes z = shell_sizes(m->cfg, 0);
    size_t nt = (size_t)B * (z.K - 1) * z.Q;
    if (s->state_B != B) {
        for (int i = 0; i < n; i++) {
            if (states[i]) be->free(be, states[i]);
            states[i] = NULL;
        }
        if (s->qtail) be->free(be, s->qtail);
        if (s->ktail) be->free(be, s->ktail);
        s->state_B = 0;
        int ok = 1;
        for (int i = 0; i < n; i++) ok &= (states[i] = be->alloc(be, (size_t)B * counts[i], MEM_F32)) != NULL;
        s->qtail = be->alloc(be, nt, MEM_ACT);
        s->ktail = be->alloc(be, nt, MEM_ACT);
        if (!ok || !s->qtail || !s->ktail) return MN_ERR_NOMEM;
        s->state_B = B;
    }
    for (int i = 0; i < n; i++) be->zero(be, states[i], (size_t)B * counts[i], MEM_F32);
    be->zero(be, s->qtail, nt, MEM_ACT);
    be->zero(be, s->ktail, nt, MEM_ACT);
    return MN_OK;
}

int shell_check_state(const Mixer *m, const Shell *s, int B) {
    if (s->state_B == B) return MN_OK;
    if (!s->state_B)
        return mn_error(MN_ERR_ARG, "%s: decoding %d sequences, but the state was not reset (reset_state first)",
                        m->ops->name, B);
    return mn_error(MN_ERR_ARG, "%s: decoding %d sequences, but the state was reset for %d", m->ops->name, B, s->state_B);
}

size_t shell_state_floats(const ModelConfig *c) {
    Sizes z = shell_sizes(c, 0);
    return 2 * (size_t)(z.K - 1) * z.Q;
}

void shell_destroy(const Backend *be, Shell *s) {
    shell_free_buffers(be, s);
    if (s->qtail) be->free(be, s->qtail);
    if (s->ktail) be->free(be, s->ktail);
    s->qtail = s->ktail = NULL;
}
