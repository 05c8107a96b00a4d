/*
 * The gated linear-attention family as mixers, in the MesaNet paper's shared parameterisation
 * ("paper" mode; docs/spec/mixers.md sections 1, 2): the projections, convolutions, gates and
 * output norm of the Mesa layer (shell.h), and per head one state S (Dv x Dk) read out as
 * o_t = S_t q_t:
 *
 *   mamba2    S_t = gamma_t S_{t-1} + v_t k_t^T                                (no W_b, b_b)
 *   gla       S_t = gamma_t S_{t-1} + beta_t v_t k_t^T
 *   deltanet  S_t = S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T            (no W_a, b_a)
 *   gdn       S_t = gamma_t S_{t-1} (I - beta_t k_t k_t^T) + beta_t v_t k_t^T
 *   longhorn-exact  S_t = S_{t-1} (I - eps_t k_t k_t^T) + eps_t v_t k_t^T,  eps_t = beta_t / (1 + beta_t |k_t|^2)
 *
 * gamma = sigmoid(W_a u + b_a) (no bound), beta = sigmoid(W_b u + b_b), or 2 sigmoid(.) in (0, 2)
 * for the delta rules with the config's neg_eigen (negative eigenvalues of the transition, for
 * state tracking). The core is the backend's lin_fwd / lin_bwd (include/mesanet.h, MnLinRule);
 * a backend without it refuses these mixers when the model is made.
 *
 * longhorn-exact is Longhorn's online regression (docs/spec/mixers.md section 3) in its exact,
 * matrix form with one beta per head: S_t minimises |S - S_{t-1}|^2 + beta_t |S k_t - v_t|^2 in closed
 * form, the delta rule with beta replaced by eps (the backend's longhorn_eps op). Its keys and
 * queries are SiLU(conv(.)) without the L2 norm (the shell's raw_qk): eps shrinks the step where
 * |k| is large, so every eigenvalue of I - eps k k^T stays in (0, 1] (1 / (1 + beta |k|^2) along
 * k). It has no forget gate; eps lives in the shell's forget-gate buffer, which it leaves unused.
 */
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"
#include "shell.h"

typedef struct {
    const char *name;
    MnLinRule rule;
    int gate, beta;  // W_a (forget gate), W_b (input gate)
    int implicit;    // 1: Longhorn's step size eps = beta / (1 + beta |k|^2) in place of beta; raw keys
} LinKind;

enum { MAMBA2, GLA, DELTANET, GDN, LONGHORN_EXACT };
static const LinKind kinds[] = {
    [MAMBA2] = {"mamba2", MN_LIN_GLA, 1, 0},
    [GLA] = {"gla", MN_LIN_GLA, 1, 1},
    [DELTANET] = {"deltanet", MN_LIN_DELTA, 0, 1},
    [GDN] = {"gdn", MN_LIN_DELTA, 1, 1},
    [LONGHORN_EXACT] = {"longhorn-exact", MN_LIN_DELTA, 0, 1, 1},
};

typedef struct {
    Shell sh;          // projections, convolutions, gates, output norm and projection
    const LinKind *kind;
    void *S;           // [B,H,Dv,Dk] f32: the recurrent state for decoding
} Lin;

static ShellKind shell_kind(const ModelConfig *c, const LinKind *k) {
    ShellKind s = {.gate = k->gate, .beta = k->beta, .beta_scale = 1, .bound = 0, .raw_qk = k->implicit};
    if (k->rule == MN_LIN_DELTA && c->neg_eigen && !k->implicit) s.beta_scale = 2;
    return s;
}

static const LinKind *kind_of(const Mixer *m) {
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (!strcmp(kinds[i].name, m->ops->name)) return &kinds[i];
    return NULL;
}

static int lin_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    Lin *s = m->priv;
    Shell *sh = &s->sh;
    int N = B * T;
    if (use_state) MN_TRY(shell_check_state(m, sh, B));
    if (N > sh->cap) MN_TRY(shell_alloc_buffers(m, sh, N));
    MN_TRY(shell_in_fwd(m, sh, u, B, T, use_state));
    MnSeqDims d = shell_dims(sh, m->cfg, B, T);
    if (s->kind->implicit) MN_TRY(be->lin->longhorn_eps_fwd(be, sh->g, sh->beta, sh->k, N, d.H, d.Dk));
    MnLinOpts o = {.rule = s->kind->rule, .scale = 1, .form = m->solver.form, .chunk = m->solver.chunk,
                   .precision = m->solver.precision};
    MnLinFwd io = {.q = sh->q, .k = sh->k, .v = sh->v, .g = s->kind->gate ? sh->g : NULL,
                   .beta = s->kind->implicit ? sh->g : s->kind->beta ? sh->beta : NULL, .s0 = use_state ? s->S : NULL,
                   .o = sh->o, .sT = use_state ? s->S : NULL};
    MIXER_TIMED(m, &m->core_seconds, be->lin->fwd(be, &d, &o, &io));
    return shell_out_fwd(m, sh, y);
}

static int lin_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    Lin *s = m->priv;
    Shell *sh = &s->sh;
    if (!sh->cap) return mn_error(MN_ERR_ARG, "%s: backward before any forward", m->ops->name);
    MN_TRY(shell_out_bwd(m, sh, dy));
    MnSeqDims d = shell_dims(sh, m->cfg, sh->B, sh->T);
    MnLinOpts o = {.rule = s->kind->rule, .scale = 1, .form = m->solver.form, .chunk = m->solver.chunk,
                   .precision = m->solver.precision};
    MnLinBwd io = {.q = sh->q, .k = sh->k, .v = sh->v, .g = s->kind->gate ? sh->g : NULL,
                   .beta = s->kind->implicit ? sh->g : s->kind->beta ? sh->beta : NULL, .dout = sh->d_o, .dq = sh->d_q,
                   .dk = sh->d_k, .dv = sh->d_v, .dg = s->kind->gate ? sh->d_g : NULL,
                   .dbeta = s->kind->beta ? sh->d_beta : NULL};
    MIXER_TIMED(m, &m->core_seconds, be->lin->bwd(be, &d, &o, &io));
    // eps's gradient into beta's (in place) and the keys' (added)
    if (s->kind->implicit)
        MN_TRY(be->lin->longhorn_eps_bwd(be, sh->d_beta, sh->d_k, sh->d_beta, sh->beta, sh->k, d.B * d.T, d.H, d.Dk));
    return shell_in_bwd(m, sh, du);
}

static size_t s_floats(const ModelConfig *c) { return (size_t)c->n_heads * c->head_dim * c->head_dim; }

static int lin_reset_state(Mixer *m, int B) {
    Lin *s = m->priv;
    size_t count = s_floats(m->cfg);
    return shell_reset_state(m, &s->sh, B, &s->S, &count, 1);
}

static size_t lin_state_floats(const ModelConfig *c) { return s_floats(c) + shell_state_floats(c); }

static void lin_destroy(Mixer *m) {
    Lin *s = m->priv;
    if (!s) return;
    shell_destroy(m->be, &s->sh);
    if (s->S) m->be->free(m->be, s->S);
    free(s);
    m->priv = NULL;
}

static int lin_create(Mixer *m) {
    const LinKind *k = kind_of(m);
    if (!k) return mn_error(MN_ERR_ARG, "mixer %s: not of the linear-attention family", m->ops->name);
    const Backend *be = m->be;
    ShellKind sk = shell_kind(m->cfg, k);
    if (!be->lin || !be->lin->fwd || !be->lin->bwd || (sk.beta_scale != 1 && !be->scale_f32))
        return mixer_unsupported(m, "it has no linear-attention core");
    if (k->implicit && (!be->lin->longhorn_eps_fwd || !be->lin->longhorn_eps_bwd))
        return mixer_unsupported(m, "it has no longhorn_eps op");
    MnSeqDims d = mixer_layer_dims(m);
    if (be->lin->supports) MN_TRY(mixer_supports(m, be->lin->supports(be, &d)));
    Lin *s = calloc(1, sizeof(Lin));
    if (!s) return mn_error(MN_ERR_NOMEM, "out of memory");
    s->kind = k;
    shell_init(&s->sh, m->cfg, &sk);
    m->priv = s;
    return MN_OK;
}

#define LIN_MIXER(ID, var, name_, fields_, about_)                                                        \
    static int var##_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) { \
        ShellKind k = shell_kind(c, &kinds[ID]);                                                        \
        return shell_declare(c, &k, prefix, out, n, max);                                               \
    }                                                                                                   \
    const MixerOps mixer_##var = {                                                                      \
        .name = name_,                                                                                  \
        .about = about_,                                                                                \
        .state_about = "S (Dv x Dk) per head, and the convolutions' last inputs",                       \
        .fields = CF_CONV | CF_OUTPUT_GATE | CF_ONORM | (fields_),                                      \
        .declare = var##_declare,                                                                       \
        .activation_bytes = shell_activation_bytes,                                                     \
        .scratch_elems = shell_scratch_elems,                                                           \
        .create = lin_create,                                                                           \
        .forward = lin_forward,                                                                         \
        .backward = lin_backward,                                                                       \
        .reset_state = lin_reset_state,                                                                 \
        .state_floats = lin_state_floats,                                                               \
        .collect = NULL,                                                                                \
        .destroy = lin_destroy,                                                                         \
    };

LIN_MIXER(MAMBA2, mamba2, "mamba2", 0, "Mamba2 (the paper's): S_t = gamma S + v k^T, o = S q")
LIN_MIXER(GLA, gla, "gla", 0, "GLA (scalar gate): S_t = gamma S + beta v k^T, o = S q")
LIN_MIXER(DELTANET, deltanet, "deltanet", CF_NEG_EIGEN, "DeltaNet: S_t = S (I - beta k k^T) + beta v k^T, o = S q")
LIN_MIXER(GDN, gdn, "gdn", CF_NEG_EIGEN, "Gated DeltaNet: S_t = gamma S (I - beta k k^T) + beta v k^T, o = S q")
LIN_MIXER(LONGHORN_EXACT, longhorn_exact, "longhorn-exact", 0,
          "Longhorn, exact form: S_t = S (I - eps k k^T) + eps v k^T, eps = beta / (1 + beta |k|^2), raw q, k")
