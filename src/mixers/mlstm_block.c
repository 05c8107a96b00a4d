/*
 * The xLSTM paper's mLSTM block (pre up-projection; its Figure 8, NX-AI's mLSTMLayer;
 * docs/spec/reference/xlstm-notes.md 3.3). The block's norm (LayerNorm in the paper's models:
 * the config's `norm`) comes before it; it has no feed-forward part (the up-projection is its MLP):
 *
 *   x = W_up,x u,  z = W_up,z u                                   (inner width Di = H Dh)
 *   c = SiLU(conv4(x) + b_conv)
 *   q = Q c,  k = K c,  v = V x          (block-diagonal, blocks of 4: headwise_fwd)
 *   i~ = W_i [q; k; v] + b_i,  f~ = W_f [q; k; v] + b_f            (one per head)
 *   h = mLSTM(q, k, v, logsigmoid(f~), i~)                         (k scaled by Dh^-1/2)
 *   y = W_down ((GroupNorm_h(h) + s (.) c) (.) SiLU(z))            (s: the learnable skip)
 *
 * NX-AI stores W_up as one [2 Di, D] tensor; here it is two (x's rows, then z's), since a
 * parameter is a whole tensor on every backend; the checkpoint converters split and join it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"

enum { QKV_BLOCK = 4 };  // the block size of the q, k, v projections (NX-AI's qkv_proj_blocksize)

// Parameter slots, in declaration (checkpoint) order.
enum { UP_X, UP_Z, CONV_W, CONV_B, Q_W, K_W, V_W, I_W, I_B, F_W, F_B, ONORM, SKIP, DOWN, NPARAM };

typedef struct {
    int cap;                                  // tokens the buffers hold
    int B, T;                                 // the last forward's
    const void *u;                            // [N,D] its input (the model's buffer)
    void *x, *z, *xconv, *c;                  // [N,Di] up-projections, conv (+ bias) output, after SiLU
    void *q, *k, *v, *qkv;                    // [N,Di], and [N,3Di] the three side by side
    void *ipre, *fpre;                        // [N,H] gate pre-activations
    void *fg, *ig;                            // [N*H] f32 the core's gates
    void *h, *nq, *m;                         // [N,Di] the core's output; [N*H] f32 its saved terms
    void *hn, *stats;                         // [N,Di] normalised output; [2 N H] f32 its rstd and mean
    void *d_fg, *d_ig;                        // [N*H] f32
    // in the shared scratch
    void *t, *hg;                             // [N,Di] hn + s c, and gated by SiLU(z)
    void *d_hg, *d_t, *d_z, *d_c, *d_h, *d_q, *d_k, *d_v, *d_x, *tmp;  // [N,Di]
    void *d_qkv;                              // [N,3Di]
    void *d_ipre, *d_fpre;                    // [N,H]
    // decoding
    int state_B;
    void *tail;                               // [B,K-1,Di] the conv's last inputs
    void *C, *n, *ms;                         // [B,H,Dh,Dh], [B,H,Dh], [B,H] f32
} MlstmBlock;

static int inner(const ModelConfig *c) { return c->n_heads * c->head_dim; }

static int mb_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    int64_t D = c->dim, Di = inner(c), H = c->n_heads, K = c->conv_size;
    double small = sqrt(2.0 / (5.0 * (double)D)), wang = 2.0 / ((double)c->n_layers * sqrt((double)D));
    const MixerParam p[NPARAM] = {
        [UP_X] = {"xlstm.proj_up_x.weight", 2, {Di, D}, INIT_NORMAL, small, 1},
        [UP_Z] = {"xlstm.proj_up_z.weight", 2, {Di, D}, INIT_NORMAL, small, 1},
        [CONV_W] = {"xlstm.conv1d.weight", 3, {Di, 1, K}, INIT_NORMAL, 1 / sqrt((double)K), 1},
        [CONV_B] = {"xlstm.conv1d.bias", 1, {Di}, INIT_CONST, 0, 0},
        [Q_W] = {"xlstm.q_proj.weight", 3, {Di / QKV_BLOCK, QKV_BLOCK, QKV_BLOCK}, INIT_NORMAL, small, 1},
        [K_W] = {"xlstm.k_proj.weight", 3, {Di / QKV_BLOCK, QKV_BLOCK, QKV_BLOCK}, INIT_NORMAL, small, 1},
        [V_W] = {"xlstm.v_proj.weight", 3, {Di / QKV_BLOCK, QKV_BLOCK, QKV_BLOCK}, INIT_NORMAL, small, 1},
        [I_W] = {"xlstm.igate.weight", 2, {H, 3 * Di}, INIT_CONST, 0, 1},
        [I_B] = {"xlstm.igate.bias", 1, {H}, INIT_NORMAL, 0.1, 0},
        [F_W] = {"xlstm.fgate.weight", 2, {H, 3 * Di}, INIT_CONST, 0, 1},
        [F_B] = {"xlstm.fgate.bias", 1, {H}, INIT_LINSPACE_3_6, 0, 0},
        [ONORM] = {"xlstm.outnorm.weight", 1, {Di}, INIT_CONST, 1, 0},
        [SKIP] = {"xlstm.learnable_skip", 1, {Di}, INIT_CONST, 1, 0},
        [DOWN] = {"xlstm.proj_down.weight", 2, {D, Di}, INIT_NORMAL, wang, 1},
    };
    return mixer_declare_table(prefix, p, NPARAM, out, n, max);
}

static int mb_validate(const ModelConfig *c, const char *where) {
    if (inner(c) % QKV_BLOCK)
        return mn_error(MN_ERR_ARG, "%s: mlstm-block's inner width n_heads x head_dim = %d x %d must be a multiple of %d "
                                    "(its q, k, v projections are block-diagonal with blocks of %d)",
                        where, c->n_heads, c->head_dim, QKV_BLOCK, QKV_BLOCK);
    return MN_OK;
}

// The activation buffers: per token elements (Di, H multiples) and kinds.
enum { MB_BUFS = 18 };

static void buffers(MlstmBlock *s, size_t Di, size_t H, MixerBuf *out) {
    MixerBuf d[MB_BUFS] = {
        {&s->x, Di, 0, MEM_ACT},     {&s->z, Di, 0, MEM_ACT},      {&s->xconv, Di, 0, MEM_ACT},
        {&s->c, Di, 0, MEM_ACT},     {&s->q, Di, 0, MEM_ACT},      {&s->k, Di, 0, MEM_ACT},
        {&s->v, Di, 0, MEM_ACT},     {&s->qkv, 3 * Di, 0, MEM_ACT}, {&s->ipre, H, 0, MEM_ACT},
        {&s->fpre, H, 0, MEM_ACT},   {&s->fg, H, 0, MEM_F32},      {&s->ig, H, 0, MEM_F32},
        {&s->h, Di, 0, MEM_ACT},     {&s->nq, H, 0, MEM_F32},      {&s->m, H, 0, MEM_F32},
        {&s->hn, Di, 0, MEM_ACT},    {&s->stats, 2 * H, 0, MEM_F32}, {&s->d_fg, 2 * H, 0, MEM_F32},
    };
    memcpy(out, d, sizeof d);
}

static size_t mb_activation_bytes(const ModelConfig *c, const Backend *be) {
    MlstmBlock s;
    MixerBuf d[MB_BUFS];
    buffers(&s, (size_t)inner(c), (size_t)c->n_heads, d);
    return mixer_bufs_bytes(be, d, MB_BUFS);
}

// Scratch: 12 [N,Di] views, d_qkv [N,3Di] and the two [N,H] gate gradients.
static size_t mb_scratch_elems(const ModelConfig *c) { return 15 * (size_t)inner(c) + 2 * (size_t)c->n_heads; }

static void scratch_views(Mixer *m, MlstmBlock *s, size_t N) {
    size_t es = m->be->elem_size(m->be, MEM_ACT), di = N * (size_t)inner(m->cfg) * es;
    char *p = m->scratch->p;
    void **v[] = {&s->t, &s->hg, &s->d_hg, &s->d_t, &s->d_z, &s->d_c, &s->d_h, &s->d_q, &s->d_k, &s->d_v, &s->d_x, &s->tmp};
    for (int i = 0; i < 12; i++) *v[i] = p + i * di;
    s->d_qkv = p + 12 * di;
    s->d_ipre = p + 15 * di;
    s->d_fpre = p + 15 * di + N * (size_t)m->cfg->n_heads * es;
}

static int ensure_capacity(Mixer *m, int N) {
    MlstmBlock *s = m->priv;
    MN_TRY(mixer_scratch_reserve(m, (size_t)N * mb_scratch_elems(m->cfg)));
    if (N <= s->cap) return MN_OK;
    MixerBuf d[MB_BUFS];
    size_t Di = (size_t)inner(m->cfg);
    buffers(s, Di, (size_t)m->cfg->n_heads, d);
    mixer_bufs_free(m->be, d, MB_BUFS);
    s->cap = 0;
    MN_TRY(mixer_bufs_alloc(m->be, d, MB_BUFS, (size_t)N));
    s->d_ig = (char *)s->d_fg + (size_t)N * m->cfg->n_heads * m->be->elem_size(m->be, MEM_F32);
    s->cap = N;
    return MN_OK;
}

static MnSeqDims core_dims(const ModelConfig *c, int B, int T) {
    MnSeqDims d = {B, T, c->n_heads, c->head_dim, c->head_dim};
    return d;
}

static void *at_act(const Backend *be, void *p, size_t elems) { return (char *)p + elems * be->elem_size(be, MEM_ACT); }

static int mb_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    const ModelConfig *c = m->cfg;
    MlstmBlock *s = m->priv;
    int N = B * T, D = c->dim, Di = inner(c), H = c->n_heads, K = c->conv_size, nb = Di / QKV_BLOCK;
    if (use_state) MN_TRY(mixer_check_decode(m, s->state_B, B));
    MN_TRY(ensure_capacity(m, N));
    scratch_views(m, s, (size_t)N);
    s->u = u;
    s->B = B;
    s->T = T;
    void **w = m->w;
    size_t nd = (size_t)N * Di;
    MN_TRY(be->linear_fwd(be, s->x, u, w[UP_X], NULL, N, D, Di));
    MN_TRY(be->linear_fwd(be, s->z, u, w[UP_Z], NULL, N, D, Di));
    MN_TRY(be->conv_fwd(be, s->xconv, s->x, w[CONV_W], B, T, Di, K, use_state ? s->tail : NULL,
                        use_state ? s->tail : NULL));
    MN_TRY(be->bias_fwd(be, s->xconv, w[CONV_B], N, Di));
    MN_TRY(be->silu_fwd(be, s->c, s->xconv, nd));
    MN_TRY(be->headwise_fwd(be, s->q, s->c, w[Q_W], N, nb, QKV_BLOCK, QKV_BLOCK));
    MN_TRY(be->headwise_fwd(be, s->k, s->c, w[K_W], N, nb, QKV_BLOCK, QKV_BLOCK));
    MN_TRY(be->headwise_fwd(be, s->v, s->x, w[V_W], N, nb, QKV_BLOCK, QKV_BLOCK));
    const void *parts[3] = {s->q, s->k, s->v};
    for (int i = 0; i < 3; i++)
        be->copy_rows(be, at_act(be, s->qkv, (size_t)i * Di), 3 * (size_t)Di, parts[i], (size_t)Di, (size_t)N,
                      (size_t)Di, MEM_ACT);
    MN_TRY(be->linear_fwd(be, s->ipre, s->qkv, w[I_W], w[I_B], N, 3 * Di, H));
    MN_TRY(be->linear_fwd(be, s->fpre, s->qkv, w[F_W], w[F_B], N, 3 * Di, H));
    MN_TRY(be->mlstm->gates_fwd(be, s->fg, s->ig, s->fpre, s->ipre, (size_t)N * H, 0));
    MnSeqDims d = core_dims(c, B, T);
    MlstmOpts o = mixer_mlstm_opts(m, m->cfg->head_dim);
    MlstmFwd io = {.q = s->q, .k = s->k, .v = s->v, .fg = s->fg, .ig = s->ig, .h = s->h, .nq = s->nq, .m = s->m};
    if (use_state) {
        io.c0 = io.cT = s->C;
        io.n0 = io.nT = s->n;
        io.m0 = io.mT = s->ms;
    }
    MIXER_TIMED(m, &m->core_seconds, be->mlstm->fwd(be, &d, &o, &io));
    void *rstd = s->stats, *mean = (char *)s->stats + (size_t)N * H * be->elem_size(be, MEM_F32);
    MN_TRY(be->layernorm_fwd(be, s->hn, mean, rstd, s->h, w[ONORM], N, Di, c->head_dim, Di, c->norm_eps));
    MN_TRY(be->scale_add_fwd(be, s->t, s->hn, w[SKIP], s->c, N, Di));
    MN_TRY(be->swiglu_fwd(be, s->hg, s->z, s->t, nd));
    return be->linear_fwd(be, y, s->hg, w[DOWN], NULL, N, Di, D);
}

static int mb_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    const ModelConfig *c = m->cfg;
    MlstmBlock *s = m->priv;
    if (!s->cap) return mn_error(MN_ERR_ARG, "%s: backward before any forward", m->ops->name);
    int B = s->B, T = s->T, N = B * T, D = c->dim, Di = inner(c), H = c->n_heads, K = c->conv_size;
    int nb = Di / QKV_BLOCK;
    size_t nd = (size_t)N * Di;
    scratch_views(m, s, (size_t)N);
    void **w = m->w, **dw = m->dw;
    // the gated output again (the scratch held another layer's since)
    MN_TRY(be->scale_add_fwd(be, s->t, s->hn, w[SKIP], s->c, N, Di));
    MN_TRY(be->swiglu_fwd(be, s->hg, s->z, s->t, nd));
    MN_TRY(be->linear_bwd(be, s->d_hg, dw[DOWN], NULL, dy, s->hg, w[DOWN], N, Di, D, 0));
    MN_TRY(be->swiglu_bwd(be, s->d_z, s->d_t, s->d_hg, s->z, s->t, nd));
    // t = hn + s (.) c: the skip's gradient into c (=), the rest through the norm
    MN_TRY(be->scale_add_bwd(be, s->d_c, dw[SKIP], s->d_t, s->c, w[SKIP], N, Di, 0));
    void *rstd = s->stats, *mean = (char *)s->stats + (size_t)N * H * be->elem_size(be, MEM_F32);
    MN_TRY(be->layernorm_bwd(be, s->d_h, dw[ONORM], s->d_t, s->h, w[ONORM], mean, rstd, N, Di, c->head_dim, Di, 0));
    MnSeqDims d = core_dims(c, B, T);
    MlstmOpts o = mixer_mlstm_opts(m, m->cfg->head_dim);
    MlstmBwd io = {.q = s->q, .k = s->k, .v = s->v, .fg = s->fg, .ig = s->ig, .h = s->h, .nq = s->nq, .m = s->m,
                   .dh = s->d_h, .dq = s->d_q, .dk = s->d_k, .dv = s->d_v, .dfg = s->d_fg, .dig = s->d_ig};
    MIXER_TIMED(m, &m->core_seconds, be->mlstm->bwd(be, &d, &o, &io));
    MN_TRY(be->mlstm->gates_bwd(be, s->d_fpre, s->d_ipre, s->d_fg, s->d_ig, s->fpre, s->ipre, (size_t)N * H, 0));
    MN_TRY(be->linear_bwd(be, s->d_qkv, dw[I_W], dw[I_B], s->d_ipre, s->qkv, w[I_W], N, 3 * Di, H, 0));
    MN_TRY(be->linear_bwd(be, s->d_qkv, dw[F_W], dw[F_B], s->d_fpre, s->qkv, w[F_W], N, 3 * Di, H, 1));
    void *dparts[3] = {s->d_q, s->d_k, s->d_v};
    for (int i = 0; i < 3; i++) {
        be->copy_rows(be, s->tmp, (size_t)Di, at_act(be, s->d_qkv, (size_t)i * Di), 3 * (size_t)Di, (size_t)N,
                      (size_t)Di, MEM_ACT);
        MN_TRY(be->add(be, dparts[i], s->tmp, nd));
    }
    MN_TRY(be->headwise_bwd(be, s->d_c, dw[Q_W], s->d_q, s->c, w[Q_W], N, nb, QKV_BLOCK, QKV_BLOCK, 1));
    MN_TRY(be->headwise_bwd(be, s->d_c, dw[K_W], s->d_k, s->c, w[K_W], N, nb, QKV_BLOCK, QKV_BLOCK, 1));
    MN_TRY(be->headwise_bwd(be, s->d_x, dw[V_W], s->d_v, s->x, w[V_W], N, nb, QKV_BLOCK, QKV_BLOCK, 0));
    // c = SiLU(conv(x) + b)
    MN_TRY(be->silu_bwd(be, s->tmp, s->d_c, s->xconv, nd));
    MN_TRY(be->bias_bwd(be, dw[CONV_B], s->tmp, N, Di));
    MN_TRY(be->conv_bwd(be, s->d_t, dw[CONV_W], s->tmp, s->x, w[CONV_W], B, T, Di, K, NULL));
    MN_TRY(be->add(be, s->d_x, s->d_t, nd));
    MN_TRY(be->linear_bwd(be, du, dw[UP_X], NULL, s->d_x, s->u, w[UP_X], N, D, Di, 0));
    return be->linear_bwd(be, du, dw[UP_Z], NULL, s->d_z, s->u, w[UP_Z], N, D, Di, 1);
}

// The decoding state's parts per sequence (floats): C, n, m.
static void state_counts(const ModelConfig *c, size_t n[3]) {
    n[0] = (size_t)c->n_heads * c->head_dim * c->head_dim;
    n[1] = (size_t)c->n_heads * c->head_dim;
    n[2] = (size_t)c->n_heads;
}

// The decoding state: the conv's last inputs [B,K-1,inner] and the cells' C, n, m (state_counts).
static int state_bufs(Mixer *m, int B, MixerStateBuf *b) {
    MlstmBlock *s = m->priv;
    size_t n[3];
    state_counts(m->cfg, n);
    b[0] = (MixerStateBuf){&s->tail, (size_t)B * (m->cfg->conv_size - 1) * inner(m->cfg), MEM_ACT};
    b[1] = (MixerStateBuf){&s->C, (size_t)B * n[0], MEM_F32};
    b[2] = (MixerStateBuf){&s->n, (size_t)B * n[1], MEM_F32};
    b[3] = (MixerStateBuf){&s->ms, (size_t)B * n[2], MEM_F32};
    return 4;
}

static void free_state(Mixer *m) {
    MixerStateBuf b[4];
    mixer_state_free(m->be, b, state_bufs(m, 0, b), &((MlstmBlock *)m->priv)->state_B);
}

static int mb_reset_state(Mixer *m, int B) {
    MixerStateBuf b[4];
    return mixer_state_reset(m->be, b, state_bufs(m, B, b), &((MlstmBlock *)m->priv)->state_B, B);
}

static size_t mb_state_floats(const ModelConfig *c) {
    size_t n[3];
    state_counts(c, n);
    return n[0] + n[1] + n[2] + (size_t)(c->conv_size - 1) * inner(c);
}

static void mb_destroy(Mixer *m) {
    MlstmBlock *s = m->priv;
    if (!s) return;
    MixerBuf d[MB_BUFS];
    buffers(s, 0, 0, d);
    mixer_bufs_free(m->be, d, MB_BUFS);
    free_state(m);
    free(s);
    m->priv = NULL;
}

static int mb_create(Mixer *m) {
    const Backend *be = m->be;
    MN_TRY(mixer_need_mlstm(m));
    if (!be->layernorm_fwd || !be->headwise_fwd || !be->scale_add_fwd || !be->bias_fwd)
        return mixer_unsupported(m, "it lacks the block's LayerNorm, block-diagonal projection, skip or bias ops");
    MnSeqDims d = mixer_layer_dims(m);
    if (be->mlstm->supports) MN_TRY(mixer_supports(m, be->mlstm->supports(be, &d)));
    MlstmBlock *s = calloc(1, sizeof(MlstmBlock));
    if (!s) return mn_error(MN_ERR_NOMEM, "out of memory");
    m->priv = s;
    return MN_OK;
}

// The paper's block: 4 heads over an inner width of 2 D rounded up to 64 (NX-AI's proj_factor 2,
// round_proj_up_to_multiple_of 64), LayerNorm (its eps 1e-5).
static void mb_preset(ModelConfig *c) {
    c->n_heads = 4;
    c->head_dim = (2 * c->dim + 63) / 64 * 64 / 4;
    snprintf(c->norm, sizeof c->norm, "layernorm");
    c->norm_eps = 1e-5f;
}

const MixerOps mixer_mlstm_block = {
    .name = "mlstm-block",
    .about = "xLSTM's mLSTM block: up-projection x2, conv4, block-diagonal q/k/v, mLSTM, GroupNorm, skip, SiLU gate",
    .state_about = "C (Dh x Dh), n (Dh) and m per head, and the convolution's last inputs",
    .fields = CF_CONV,
    .block = {.ffn = FFN_NONE},
    .declare = mb_declare,
    .validate = mb_validate,
    .preset = mb_preset,
    .activation_bytes = mb_activation_bytes,
    .scratch_elems = mb_scratch_elems,
    .create = mb_create,
    .forward = mb_forward,
    .backward = mb_backward,
    .reset_state = mb_reset_state,
    .state_floats = mb_state_floats,
    .destroy = mb_destroy,
};
