/*
 * The Mesa layer as a mixer (spec section 5; paper appendix D; fla's MesaNet):
 *
 *   q = L2norm(SiLU(conv4(W_q u))),  k = L2norm(SiLU(conv4(W_k u))),  v = W_v u
 *   beta = sigmoid(W_b u + b_b),  log gamma = min(logsigmoid(W_a u + b_a), log(1 - beta / h_max))
 *   lambda = softplus(p) + lambda_min
 *   o = Mesa(q, k, v, gamma, beta, lambda)            (per head, spec sections 1-4)
 *   y = W_o RMSNorm_h(o)          or   y = W_o (RMSNorm_h(o) (.) SiLU(W_g u))  with the output gate
 *
 * Everything but the core and lambda is the paper's shared parameterisation (shell.h), which the
 * linear-attention family (linear.c) shares. Parameter names and shapes follow fla's MesaNet layer
 * (attn.q_proj.weight, attn.q_conv1d.weight [Q, 1, K], attn.lambda_params, ...), so checkpoints map
 * one to one.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"
#include "shell.h"

typedef struct {
    Shell sh;                // projections, convolutions, gates, output norm and projection
    void *lambda;            // [H*Dk] f32
    void *x;                 // [N,Q] CG solutions
    void *steps;             // [N*H] i32: CG steps of the last call, per system
    void *steps_acc;         // [2, N*H] i32: per slot, the sum of those steps and the number of calls since
                             // the last collect; counted by the backend, so a recorded step counts too
    void *d_lambda;          // [H*Dk] f32
    // recurrent state for decoding (the convolutions' tails are the shell's)
    void *hs, *gs;           // [B,H,Dk,Dk], [B,H,Dv,Dk] f32
} Mesa;

// lambda_params: its initial value is the softplus^-1 of lambda_init - lambda_min, set per config
// in mesa_kind.
static ShellKind mesa_kind(const ModelConfig *c, ShellParam *lambda) {
    Sizes s = shell_sizes(c, 0);
    double lambda_p = log(expm1((double)(c->lambda_init - c->lambda_min)));  // softplus^-1
    ShellParam p = {"attn.lambda_params", 1, {s.Q}, INIT_CONST, lambda_p, 0};
    *lambda = p;
    ShellKind k = {.gate = 1, .beta = 1, .beta_scale = 1, .bound = 1, .core = lambda, .n_core = 1};
    return k;
}

static int mesa_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    ShellParam lambda;
    ShellKind k = mesa_kind(c, &lambda);
    return shell_declare(c, &k, prefix, out, n, max);
}

// The Mesa core's own buffers: their element counts (per token, or fixed) and kinds.
enum { MESA_BUFS = 5 };

static void buffers(Mesa *s, const Sizes *z, MixerBuf *out) {
    MixerBuf d[MESA_BUFS] = {
        {&s->lambda, 0, z->Q, MEM_F32}, {&s->x, z->Q, 0, MEM_ACT},       {&s->steps, z->H, 0, MEM_I32},
        {&s->steps_acc, 2 * z->H, 0, MEM_I32}, {&s->d_lambda, 0, z->Q, MEM_F32},
    };
    memcpy(out, d, sizeof d);
}

static void free_buffers(Mixer *m) {
    Mesa *s = m->priv;
    MixerBuf d[MESA_BUFS];
    Sizes z = shell_sizes(m->cfg, 0);
    buffers(s, &z, d);
    mixer_bufs_free(m->be, d, MESA_BUFS);
    shell_free_buffers(m->be, &s->sh);
}

static size_t mesa_activation_bytes(const ModelConfig *c, const Backend *be) {
    Mesa s;
    Sizes z = shell_sizes(c, 1);
    MixerBuf d[MESA_BUFS];
    buffers(&s, &z, d);
    return mixer_bufs_bytes(be, d, MESA_BUFS) + shell_activation_bytes(c, be);
}

// Adds the CG steps counted on the backend since the last collect to the mixer's totals: one
// read-back when the numbers are wanted, not one per call.
static int mesa_collect(Mixer *m) {
    Mesa *s = m->priv;
    if (!s->sh.cap) return MN_OK;
    size_t n = (size_t)s->sh.cap * m->cfg->n_heads;
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
    if (N <= s->sh.cap) return MN_OK;
    MN_TRY(mesa_collect(m));  // the step counters go with the buffers
    free_buffers(m);
    Sizes z = shell_sizes(m->cfg, N);
    MixerBuf d[MESA_BUFS];
    buffers(s, &z, d);
    MN_TRY(mixer_bufs_alloc(m->be, d, MESA_BUFS, (size_t)N));
    return shell_alloc_buffers(m, &s->sh, N);
}

static int mesa_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    Mesa *s = m->priv;
    Shell *sh = &s->sh;
    int N = B * T;
    Sizes z = shell_sizes(m->cfg, N);
    if (use_state) MN_TRY(shell_check_state(m, sh, B));
    MN_TRY(ensure_capacity(m, N));
    // q, k, v and the gates
    MN_TRY(shell_in_fwd(m, sh, u, B, T, use_state));
    // the ridge
    MN_TRY(be->mesa->softplus_fwd(be, s->lambda, m->w[sh->at.core], (size_t)z.Q, m->cfg->lambda_min));
    // the core
    MnSeqDims d = shell_dims(sh, m->cfg, B, T);
    MnMesaFwd io = {.q = sh->q, .k = sh->k, .v = sh->v, .g = sh->g, .beta = sh->beta, .lambda = s->lambda,
                    .h0 = use_state ? s->hs : NULL, .g0 = use_state ? s->gs : NULL, .o = sh->o, .x = s->x,
                    .hT = use_state ? s->hs : NULL, .gT = use_state ? s->gs : NULL, .steps = s->steps};
    MIXER_TIMED(m, &m->core_seconds, be->mesa->fwd(be, &d, &m->solver, &io));
    size_t nh = (size_t)N * z.H;
    void *calls = (char *)s->steps_acc + (size_t)sh->cap * z.H * be->elem_size(be, MEM_I32);
    MN_TRY(be->tally_i32(be, s->steps_acc, calls, s->steps, nh));
    // per-head RMSNorm, optional output gate, output projection
    return shell_out_fwd(m, sh, y);
}

static int mesa_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    Mesa *s = m->priv;
    Shell *sh = &s->sh;
    Sizes z = shell_sizes(m->cfg, 0);
    // output projection, gate, norm
    MN_TRY(shell_out_bwd(m, sh, dy));
    // the core (implicit differentiation)
    MnSeqDims d = shell_dims(sh, m->cfg, sh->B, sh->T);
    MnMesaBwd io = {.q = sh->q, .k = sh->k, .v = sh->v, .g = sh->g, .beta = sh->beta, .lambda = s->lambda, .x = s->x,
                    .o = sh->o, .dout = sh->d_o, .dq = sh->d_q, .dk = sh->d_k, .dv = sh->d_v, .dg = sh->d_g,
                    .dbeta = sh->d_beta, .dlambda = s->d_lambda};
    MIXER_TIMED(m, &m->core_seconds, be->mesa->bwd(be, &d, &m->solver, &io));
    MN_TRY(be->mesa->softplus_bwd(be, m->dw[sh->at.core], s->d_lambda, m->w[sh->at.core], (size_t)z.Q));
    // the gates, q, k, v and the projections into du
    return shell_in_bwd(m, sh, du);
}

static size_t h_floats(const ModelConfig *c) { return (size_t)c->n_heads * c->head_dim * c->head_dim; }

static int mesa_reset_state(Mixer *m, int B) {
    Mesa *s = m->priv;
    void *states[2] = {s->hs, s->gs};
    size_t counts[2] = {h_floats(m->cfg), h_floats(m->cfg)};  // Dk x Dk and Dv x Dk, Dv = Dk
    int st = shell_reset_state(m, &s->sh, B, states, counts, 2);
    s->hs = states[0];
    s->gs = states[1];
    return st;
}

static size_t mesa_state_floats(const ModelConfig *c) { return 2 * h_floats(c) + shell_state_floats(c); }

static void mesa_destroy(Mixer *m) {
    Mesa *s = m->priv;
    if (!s) return;
    free_buffers(m);
    shell_destroy(m->be, &s->sh);
    void *p[] = {s->hs, s->gs};
    for (int i = 0; i < 2; i++)
        if (p[i]) m->be->free(m->be, p[i]);
    free(s);
    m->priv = NULL;
}

static int mesa_create(Mixer *m) {
    const Backend *be = m->be;
    if (!be->mesa || !be->mesa->fwd || !be->mesa->bwd || !be->mesa->softplus_fwd || !be->mesa->softplus_bwd)
        return mixer_unsupported(m, "it has no Mesa core");
    MnSeqDims d = mixer_layer_dims(m);
    if (be->mesa->supports) MN_TRY(mixer_supports(m, be->mesa->supports(be, &d)));
    Mesa *s = calloc(1, sizeof(Mesa));
    if (!s) return mn_error(MN_ERR_NOMEM, "out of memory");
    ShellParam lambda;
    ShellKind k = mesa_kind(m->cfg, &lambda);
    k.core = NULL;  // (the declaration's only)
    shell_init(&s->sh, m->cfg, &k);
    m->priv = s;
    return MN_OK;
}

const MixerOps mixer_mesa = {
    .name = "mesa",
    .about = "MesaNet: H_t = gamma H + beta k k^T, G_t = gamma G + beta v k^T, o = G (H + Lambda)^-1 q (CG)",
    .state_about = "H (Dk x Dk) and G (Dv x Dk) per head, and the convolutions' last inputs",
    .uses_cg = 1,
    .fields = CF_CONV | CF_OUTPUT_GATE | CF_ONORM | CF_RIDGE | CF_GATE_BOUND,
    .declare = mesa_declare,
    .activation_bytes = mesa_activation_bytes,
    .scratch_elems = shell_scratch_elems,
    .create = mesa_create,
    .forward = mesa_forward,
    .backward = mesa_backward,
    .reset_state = mesa_reset_state,
    .state_floats = mesa_state_floats,
    .collect = mesa_collect,
    .destroy = mesa_destroy,
};
