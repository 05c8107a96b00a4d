/*
 * xLSTM-7B's mLSTM layer (Hugging Face transformers' xLSTMForCausalLM, NX-AI's xlstm_large), the
 * mixer of the `xlstm` architecture. After the block's RMSNorm:
 *
 *   q = W_q u,  k = W_k u,  v = W_v u,  o = W_o u      (H heads of Dk = head_dim, Dv = head_v_dim)
 *   i~ = c tanh((W_i u + b_i) / c),  f~ = c tanh((W_f u + b_f) / c)   (the gates' soft cap c = gate_cap)
 *   h = mLSTM(q, k, v, logsigmoid(f~), i~)            (q.k scaled by Dk^-1/2; eps 1e-6)
 *   y = W_out (sigmoid(o) (.) LayerNorm_h(h))         (a LayerNorm without bias per head, weight [H Dv])
 *
 * then the block's SwiGLU feed-forward part. Tensor names are transformers' ("mlstm_layer.q.weight",
 * ...; its weight_mode "single"), so its checkpoints load as they are.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"

enum { WQ, WK, WV, WO, WI, BI, WF, BF, HNORM, WOUT, NPARAM };

typedef struct {
    int cap, B, T;
    const void *u;                 // [N,D] the last forward's input
    void *q, *k, *v, *o;           // [N,QK], [N,QK], [N,V], [N,V]
    void *ipre, *fpre;             // [N,H]
    void *fg, *ig;                 // [N*H] f32 the core's gates
    void *h, *nq, *m;              // [N,V] the core's output; [N*H] f32 its saved terms
    void *hn, *stats;              // [N,V] normalised; [2 N H] f32 the norm's rstd and mean
    void *d_fg;                    // [2 N H] f32: the gates' gradients (d_ig the second half)
    // in the shared scratch
    void *hg, *d_hg, *d_o, *d_hn, *d_h, *d_v;  // [N,V]
    void *d_q, *d_k;                           // [N,QK]
    void *d_ipre, *d_fpre;                     // [N,H]
    // decoding
    int state_B;
    void *C, *n, *ms;              // [B,H,Dv,Dk], [B,H,Dk], [B,H] f32
} MlstmLarge;

static int dk(const ModelConfig *c) { return c->head_dim; }
static int dv(const ModelConfig *c) { return c->head_v_dim ? c->head_v_dim : c->head_dim; }

static int ml_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    int64_t D = c->dim, H = c->n_heads, QK = H * dk(c), V = H * dv(c);
    double small = sqrt(2.0 / (5.0 * (double)D)), out_std = 2.0 / ((double)c->n_layers * sqrt((double)D));
    const MixerParam p[NPARAM] = {
        // transformers' initialisation: the gates' weights zero, input gates shut (-10), forget
        // gates open from 3 to 6
        [WQ] = {"mlstm_layer.q.weight", 2, {QK, D}, INIT_NORMAL, small, 1},
        [WK] = {"mlstm_layer.k.weight", 2, {QK, D}, INIT_NORMAL, small, 1},
        [WV] = {"mlstm_layer.v.weight", 2, {V, D}, INIT_NORMAL, small, 1},
        [WO] = {"mlstm_layer.ogate_preact.weight", 2, {V, D}, INIT_CONST, 0, 1},
        [WI] = {"mlstm_layer.igate_preact.weight", 2, {H, D}, INIT_CONST, 0, 1},
        [BI] = {"mlstm_layer.igate_preact.bias", 1, {H}, INIT_CONST, -10, 0},
        [WF] = {"mlstm_layer.fgate_preact.weight", 2, {H, D}, INIT_CONST, 0, 1},
        [BF] = {"mlstm_layer.fgate_preact.bias", 1, {H}, INIT_LINSPACE_3_6, 0, 0},
        [HNORM] = {"mlstm_layer.multihead_norm.weight", 1, {V}, INIT_CONST, 1, 0},
        [WOUT] = {"mlstm_layer.out_proj.weight", 2, {D, V}, INIT_NORMAL, out_std, 1},
    };
    return mixer_declare_table(prefix, p, NPARAM, out, n, max);
}

enum { ML_BUFS = 14 };

static void buffers(MlstmLarge *s, size_t QK, size_t V, size_t H, MixerBuf *out) {
    MixerBuf d[ML_BUFS] = {
        {&s->q, QK, 0, MEM_ACT},     {&s->k, QK, 0, MEM_ACT},       {&s->v, V, 0, MEM_ACT},
        {&s->o, V, 0, MEM_ACT},      {&s->ipre, H, 0, MEM_ACT},     {&s->fpre, H, 0, MEM_ACT},
        {&s->fg, H, 0, MEM_F32},     {&s->ig, H, 0, MEM_F32},       {&s->h, V, 0, MEM_ACT},
        {&s->nq, H, 0, MEM_F32},     {&s->m, H, 0, MEM_F32},        {&s->hn, V, 0, MEM_ACT},
        {&s->stats, 2 * H, 0, MEM_F32}, {&s->d_fg, 2 * H, 0, MEM_F32},
    };
    memcpy(out, d, sizeof d);
}

static void sizes(const ModelConfig *c, size_t *QK, size_t *V, size_t *H) {
    *H = (size_t)c->n_heads;
    *QK = *H * dk(c);
    *V = *H * dv(c);
}

static size_t ml_activation_bytes(const ModelConfig *c, const Backend *be) {
    MlstmLarge s;
    MixerBuf d[ML_BUFS];
    size_t QK, V, H;
    sizes(c, &QK, &V, &H);
    buffers(&s, QK, V, H, d);
    return mixer_bufs_bytes(be, d, ML_BUFS);
}

static size_t ml_scratch_elems(const ModelConfig *c) {
    size_t QK, V, H;
    sizes(c, &QK, &V, &H);
    return 6 * V + 2 * QK + 2 * H;
}

static void scratch_views(Mixer *m, MlstmLarge *s, size_t N) {
    size_t QK, V, H, es = m->be->elem_size(m->be, MEM_ACT);
    sizes(m->cfg, &QK, &V, &H);
    char *p = m->scratch->p;
    void **v[] = {&s->hg, &s->d_hg, &s->d_o, &s->d_hn, &s->d_h, &s->d_v};
    for (int i = 0; i < 6; i++) *v[i] = p + i * N * V * es;
    p += 6 * N * V * es;
    s->d_q = p;
    s->d_k = p + N * QK * es;
    p += 2 * N * QK * es;
    s->d_ipre = p;
    s->d_fpre = p + N * H * es;
}

static int ensure_capacity(Mixer *m, int N) {
    MlstmLarge *s = m->priv;
    MN_TRY(mixer_scratch_reserve(m, (size_t)N * ml_scratch_elems(m->cfg)));
    if (N <= s->cap) return MN_OK;
    MixerBuf d[ML_BUFS];
    size_t QK, V, H;
    sizes(m->cfg, &QK, &V, &H);
    buffers(s, QK, V, H, d);
    mixer_bufs_free(m->be, d, ML_BUFS);
    s->cap = 0;
    MN_TRY(mixer_bufs_alloc(m->be, d, ML_BUFS, (size_t)N));
    s->cap = N;
    return MN_OK;
}

static MnSeqDims core_dims(const ModelConfig *c, int B, int T) {
    MnSeqDims d = {B, T, c->n_heads, dk(c), dv(c)};
    return d;
}

static void *f32_at(const Backend *be, void *p, size_t elems) { return (char *)p + elems * be->elem_size(be, MEM_F32); }

static int ml_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    const ModelConfig *c = m->cfg;
    MlstmLarge *s = m->priv;
    int N = B * T, D = c->dim, H = c->n_heads, QK = H * dk(c), V = H * dv(c);
    if (use_state) MN_TRY(mixer_check_decode(m, s->state_B, B));
    MN_TRY(ensure_capacity(m, N));
    scratch_views(m, s, (size_t)N);
    s->u = u;
    s->B = B;
    s->T = T;
    void **w = m->w;
    MN_TRY(be->linear_fwd(be, s->q, u, w[WQ], NULL, N, D, QK));
    MN_TRY(be->linear_fwd(be, s->k, u, w[WK], NULL, N, D, QK));
    MN_TRY(be->linear_fwd(be, s->v, u, w[WV], NULL, N, D, V));
    MN_TRY(be->linear_fwd(be, s->o, u, w[WO], NULL, N, D, V));
    MN_TRY(be->linear_fwd(be, s->ipre, u, w[WI], w[BI], N, D, H));
    MN_TRY(be->linear_fwd(be, s->fpre, u, w[WF], w[BF], N, D, H));
    MN_TRY(be->mlstm->gates_fwd(be, s->fg, s->ig, s->fpre, s->ipre, (size_t)N * H, c->gate_cap));
    MnSeqDims d = core_dims(c, B, T);
    MlstmOpts o = mixer_mlstm_opts(m, dk(m->cfg));
    MlstmFwd io = {.q = s->q, .k = s->k, .v = s->v, .fg = s->fg, .ig = s->ig, .h = s->h, .nq = s->nq, .m = s->m};
    if (use_state) {
        io.c0 = io.cT = s->C;
        io.n0 = io.nT = s->n;
        io.m0 = io.mT = s->ms;
    }
    MIXER_TIMED(m, &m->core_seconds, be->mlstm->fwd(be, &d, &o, &io));
    MN_TRY(be->layernorm_fwd(be, s->hn, f32_at(be, s->stats, (size_t)N * H), s->stats, s->h, w[HNORM], N, V, dv(c), V,
                             c->norm_eps));
    MN_TRY(be->sigmoid_gate_fwd(be, s->hg, s->o, s->hn, (size_t)N * V));
    return be->linear_fwd(be, y, s->hg, w[WOUT], NULL, N, V, D);
}

static int ml_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    const ModelConfig *c = m->cfg;
    MlstmLarge *s = m->priv;
    if (!s->cap) return mn_error(MN_ERR_ARG, "%s: backward before any forward", m->ops->name);
    int B = s->B, T = s->T, N = B * T, D = c->dim, H = c->n_heads, QK = H * dk(c), V = H * dv(c);
    scratch_views(m, s, (size_t)N);
    void **w = m->w, **dw = m->dw;
    void *d_ig = f32_at(be, s->d_fg, (size_t)N * H);
    MN_TRY(be->sigmoid_gate_fwd(be, s->hg, s->o, s->hn, (size_t)N * V));  // (the scratch held another layer's)
    MN_TRY(be->linear_bwd(be, s->d_hg, dw[WOUT], NULL, dy, s->hg, w[WOUT], N, V, D, 0));
    MN_TRY(be->sigmoid_gate_bwd(be, s->d_o, s->d_hn, s->d_hg, s->o, s->hn, (size_t)N * V));
    MN_TRY(be->layernorm_bwd(be, s->d_h, dw[HNORM], s->d_hn, s->h, w[HNORM], f32_at(be, s->stats, (size_t)N * H),
                             s->stats, N, V, dv(c), V, 0));
    MnSeqDims d = core_dims(c, B, T);
    MlstmOpts o = mixer_mlstm_opts(m, dk(m->cfg));
    MlstmBwd io = {.q = s->q, .k = s->k, .v = s->v, .fg = s->fg, .ig = s->ig, .h = s->h, .nq = s->nq, .m = s->m,
                   .dh = s->d_h, .dq = s->d_q, .dk = s->d_k, .dv = s->d_v, .dfg = s->d_fg, .dig = d_ig};
    MIXER_TIMED(m, &m->core_seconds, be->mlstm->bwd(be, &d, &o, &io));
    MN_TRY(be->mlstm->gates_bwd(be, s->d_fpre, s->d_ipre, s->d_fg, d_ig, s->fpre, s->ipre, (size_t)N * H, c->gate_cap));
    MN_TRY(be->linear_bwd(be, du, dw[WQ], NULL, s->d_q, s->u, w[WQ], N, D, QK, 0));
    MN_TRY(be->linear_bwd(be, du, dw[WK], NULL, s->d_k, s->u, w[WK], N, D, QK, 1));
    MN_TRY(be->linear_bwd(be, du, dw[WV], NULL, s->d_v, s->u, w[WV], N, D, V, 1));
    MN_TRY(be->linear_bwd(be, du, dw[WO], NULL, s->d_o, s->u, w[WO], N, D, V, 1));
    MN_TRY(be->linear_bwd(be, du, dw[WI], dw[BI], s->d_ipre, s->u, w[WI], N, D, H, 1));
    return be->linear_bwd(be, du, dw[WF], dw[BF], s->d_fpre, s->u, w[WF], N, D, H, 1);
}

static void state_counts(const ModelConfig *c, size_t n[3]) {
    n[0] = (size_t)c->n_heads * dv(c) * dk(c);
    n[1] = (size_t)c->n_heads * dk(c);
    n[2] = (size_t)c->n_heads;
}

// The decoding state: the cells' C, n, m (state_counts).
static int state_bufs(Mixer *m, int B, MixerStateBuf *b) {
    MlstmLarge *s = m->priv;
    size_t n[3];
    state_counts(m->cfg, n);
    b[0] = (MixerStateBuf){&s->C, (size_t)B * n[0], MEM_F32};
    b[1] = (MixerStateBuf){&s->n, (size_t)B * n[1], MEM_F32};
    b[2] = (MixerStateBuf){&s->ms, (size_t)B * n[2], MEM_F32};
    return 3;
}

static void free_state(Mixer *m) {
    MixerStateBuf b[3];
    mixer_state_free(m->be, b, state_bufs(m, 0, b), &((MlstmLarge *)m->priv)->state_B);
}

static int ml_reset_state(Mixer *m, int B) {
    MixerStateBuf b[3];
    return mixer_state_reset(m->be, b, state_bufs(m, B, b), &((MlstmLarge *)m->priv)->state_B, B);
}

static size_t ml_state_floats(const ModelConfig *c) {
    size_t n[3];
    state_counts(c, n);
    return n[0] + n[1] + n[2];
}

static void ml_destroy(Mixer *m) {
    MlstmLarge *s = m->priv;
    if (!s) return;
    MixerBuf d[ML_BUFS];
    buffers(s, 0, 0, 0, d);
    mixer_bufs_free(m->be, d, ML_BUFS);
    free_state(m);
    free(s);
    m->priv = NULL;
}

static int ml_create(Mixer *m) {
    const Backend *be = m->be;
    MN_TRY(mixer_need_mlstm(m));
    if (!be->layernorm_fwd || !be->sigmoid_gate_fwd) return mixer_unsupported(m, "it lacks LayerNorm or the sigmoid gate");
    MnSeqDims d = mixer_layer_dims(m);
    if (be->mlstm->supports) MN_TRY(mixer_supports(m, be->mlstm->supports(be, &d)));
    MlstmLarge *s = calloc(1, sizeof(MlstmLarge));
    if (!s) return mn_error(MN_ERR_NOMEM, "out of memory");
    m->priv = s;
    return MN_OK;
}

// xLSTM-7B's settings: the gates' soft cap 15 (the backbone's are the xlstm architecture's).
static void ml_preset(ModelConfig *c) { c->gate_cap = 15; }

const MixerOps mixer_mlstm_large = {
    .name = "mlstm-large",
    .about = "xLSTM-7B's mLSTM layer: q, k, v, soft-capped gates, mLSTM, per-head LayerNorm, sigmoid output gate",
    .state_about = "C (Dv x Dk), n (Dk) and m per head",
    .fields = CF_HEAD_V_DIM | CF_GATE_CAP,
    .declare = ml_declare,
    .preset = ml_preset,
    .activation_bytes = ml_activation_bytes,
    .scratch_elems = ml_scratch_elems,
    .create = ml_create,
    .forward = ml_forward,
    .backward = ml_backward,
    .reset_state = ml_reset_state,
    .state_floats = ml_state_floats,
    .destroy = ml_destroy,
};
