/*
 * mLSTM in the MesaNet paper's shared parameterisation (docs/spec/mixers.md sections 1 and 4):
 * the projections, convolutions, output norm and gate of the other recurrent layers (shell.h),
 * with xLSTM's matrix memory in place of their state update:
 *
 *   q = L2norm(SiLU(conv4(W_q u))),  k = L2norm(SiLU(conv4(W_k u))),  v = W_v u
 *   f_t = logsigmoid(W_a u + b_a)      (the forget gate, in the log)
 *   i_t = W_b u + b_b                  (the exponential input gate's pre-activation)
 *   C_t = exp(f_t) C_{t-1} + exp(i_t) v_t k_t^T,  n_t = exp(f_t) n_{t-1} + exp(i_t) k_t
 *   o_t = C_t q_t / (max(|n_t^T q_t|, 1) + eps)   (k scaled by Dk^-1/2; stabilised, core/backend.h)
 *   y = W_o RMSNorm_h(o)     or   y = W_o (RMSNorm_h(o) (.) SiLU(W_g u))  with the output gate
 *
 * The core is the backend's MlstmOps; a backend without it refuses the mixer when the model is made.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"
#include "shell.h"

typedef struct {
    Shell sh;          // projections, convolutions, gates, output norm and projection
    int cap;           // tokens nq and m hold
    void *nq, *m;      // [N*H] f32: the core's normaliser term and stabiliser, for the backward
    void *C, *n, *ms;  // decoding state [B,H,Dv,Dk], [B,H,Dk], [B,H] f32
} Mlstm;

static ShellKind mlstm_kind(void) {
    ShellKind k = {.gate = 1, .beta = 1, .beta_scale = 1, .bound = 0, .mlstm = 1};
    return k;
}

static int mlstm_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    ShellKind k = mlstm_kind();
    return shell_declare(c, &k, prefix, out, n, max);
}

enum { MLSTM_BUFS = 2 };

static void buffers(Mlstm *s, int H, MixerBuf *out) {
    MixerBuf d[MLSTM_BUFS] = {{&s->nq, (size_t)H, 0, MEM_F32}, {&s->m, (size_t)H, 0, MEM_F32}};
    memcpy(out, d, sizeof d);
}

static size_t mlstm_activation_bytes(const ModelConfig *c, const Backend *be) {
    Mlstm s;
    MixerBuf d[MLSTM_BUFS];
    buffers(&s, c->n_heads, d);
    return mixer_bufs_bytes(be, d, MLSTM_BUFS) + shell_activation_bytes(c, be);
}

static int ensure_capacity(Mixer *m, int N) {
    Mlstm *s = m->priv;
    MixerBuf d[MLSTM_BUFS];
    buffers(s, m->cfg->n_heads, d);
    if (N > s->cap) {
        mixer_bufs_free(m->be, d, MLSTM_BUFS);
        s->cap = 0;
        MN_TRY(mixer_bufs_alloc(m->be, d, MLSTM_BUFS, (size_t)N));
        s->cap = N;
    }
    return N > s->sh.cap ? shell_alloc_buffers(m, &s->sh, N) : MN_OK;
}

static int mlstm_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    Mlstm *s = m->priv;
    Shell *sh = &s->sh;
    if (use_state) MN_TRY(shell_check_state(m, sh, B));
    MN_TRY(ensure_capacity(m, B * T));
    MN_TRY(shell_in_fwd(m, sh, u, B, T, use_state));
    MnSeqDims d = shell_dims(sh, m->cfg, B, T);
    MlstmOpts o = mixer_mlstm_opts(m, m->cfg->head_dim);
    MlstmFwd io = {.q = sh->q, .k = sh->k, .v = sh->v, .fg = sh->g, .ig = sh->beta, .h = sh->o, .nq = s->nq, .m = s->m};
    if (use_state) {
        io.c0 = io.cT = s->C;
        io.n0 = io.nT = s->n;
        io.m0 = io.mT = s->ms;
    }
    MIXER_TIMED(m, &m->core_seconds, be->mlstm->fwd(be, &d, &o, &io));
    return shell_out_fwd(m, sh, y);
}

static int mlstm_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    Mlstm *s = m->priv;
    Shell *sh = &s->sh;
    if (!sh->cap) return mn_error(MN_ERR_ARG, "%s: backward before any forward", m->ops->name);
    MN_TRY(shell_out_bwd(m, sh, dy));
    MnSeqDims d = shell_dims(sh, m->cfg, sh->B, sh->T);
    MlstmOpts o = mixer_mlstm_opts(m, m->cfg->head_dim);
    MlstmBwd io = {.q = sh->q, .k = sh->k, .v = sh->v, .fg = sh->g, .ig = sh->beta, .h = sh->o, .nq = s->nq,
                   .m = s->m, .dh = sh->d_o, .dq = sh->d_q, .dk = sh->d_k, .dv = sh->d_v, .dfg = sh->d_g,
                   .dig = sh->d_beta};
    MIXER_TIMED(m, &m->core_seconds, be->mlstm->bwd(be, &d, &o, &io));
    return shell_in_bwd(m, sh, du);
}

// The state's parts per sequence: C, n, m.
static void state_counts(const ModelConfig *c, size_t counts[3]) {
    counts[0] = (size_t)c->n_heads * c->head_dim * c->head_dim;
    counts[1] = (size_t)c->n_heads * c->head_dim;
    counts[2] = (size_t)c->n_heads;
}

static int mlstm_reset_state(Mixer *m, int B) {
    Mlstm *s = m->priv;
    void *states[3] = {s->C, s->n, s->ms};
    size_t counts[3];
    state_counts(m->cfg, counts);
    int st = shell_reset_state(m, &s->sh, B, states, counts, 3);
    s->C = states[0];
    s->n = states[1];
    s->ms = states[2];
    return st;
}

static size_t mlstm_state_floats(const ModelConfig *c) {
    size_t counts[3];
    state_counts(c, counts);
    return counts[0] + counts[1] + counts[2] + shell_state_floats(c);
}

static void mlstm_destroy(Mixer *m) {
    Mlstm *s = m->priv;
    if (!s) return;
    MixerBuf d[MLSTM_BUFS];
    buffers(s, m->cfg->n_heads, d);
    mixer_bufs_free(m->be, d, MLSTM_BUFS);
    shell_destroy(m->be, &s->sh);
    void *p[] = {s->C, s->n, s->ms};
    for (int i = 0; i < 3; i++)
        if (p[i]) m->be->free(m->be, p[i]);
    free(s);
    m->priv = NULL;
}

static int mlstm_create(Mixer *m) {
    const Backend *be = m->be;
    MN_TRY(mixer_need_mlstm(m));
    MnSeqDims d = mixer_layer_dims(m);
    if (be->mlstm->supports) MN_TRY(mixer_supports(m, be->mlstm->supports(be, &d)));
    Mlstm *s = calloc(1, sizeof(Mlstm));
    if (!s) return mn_error(MN_ERR_NOMEM, "out of memory");
    ShellKind k = mlstm_kind();
    shell_init(&s->sh, m->cfg, &k);
    m->priv = s;
    return MN_OK;
}

const MixerOps mixer_mlstm = {
    .name = "mlstm",
    .about = "mLSTM (the paper's): C_t = f C + exp(i) v k^T, n_t = f n + exp(i) k, o = C q / max(|n^T q|, 1)",
    .state_about = "C (Dv x Dk), n (Dk) and the stabiliser m per head, and the convolutions' last inputs",
    .fields = CF_CONV | CF_OUTPUT_GATE | CF_ONORM,
    .declare = mlstm_declare,
    .activation_bytes = mlstm_activation_bytes,
    .scratch_elems = shell_scratch_elems,
    .create = mlstm_create,
    .forward = mlstm_forward,
    .backward = mlstm_backward,
    .reset_state = mlstm_reset_state,
    .state_floats = mlstm_state_floats,
    .destroy = mlstm_destroy,
};
