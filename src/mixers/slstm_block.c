/*
 * The xLSTM paper's sLSTM block (post up-projection; its Figure 7, NX-AI's sLSTMLayer;
 * docs/spec/reference/xlstm-notes.md 3.4). After the block's norm (LayerNorm in the paper's
 * models: the config's `norm`), D = H Dh scalar cells in H = slstm_heads heads:
 *
 *   c = SiLU(conv4(u) + b_conv)
 *   x_i = W_i c,  x_f = W_f c,  x_z = W_z u,  x_o = W_o u     (block-diagonal per head: headwise_fwd)
 *   h = sLSTM(x + b, R)                                        (memory mixing within a head through R)
 *   y = GroupNorm_h(h)                                         (no output projection)
 *
 * then the block's GELU-gated MLP (MixerOps.block: FFN_GEGLU without biases, mlp_hidden wide:
 * NX-AI's 1.3 D rounded up to 64). The recurrent kernel R [H, Dh, 4, Dh] and the biases
 * [4, H, Dh] are the core's layout (core/backend.h); the checkpoint converters map NX-AI's.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"

// Parameter slots, in declaration (checkpoint) order; the four gate projections in gate order.
enum { CONV_W, CONV_B, GATE_I, GATE_F, GATE_Z, GATE_O, REC, BIAS, GNORM, NPARAM };

typedef struct {
    int cap, B, T;
    const void *u;        // [N,D] the last forward's input
    void *xconv, *c;      // [N,D] conv (+ bias) output, after SiLU
    void *x;              // [N,4,D] gate pre-activations (+ biases)
    void *h;              // [N,D] the cells' output
    void *cache;          // [N,4,D] f32 the core's states, for the backward
    void *stats;          // [2 N H] f32 the group norm's rstd and mean
    // in the shared scratch
    void *tmp, *tmp2, *d_h, *d_c;  // [N,D]
    void *d_x;                     // [N,4,D]
    // decoding
    int state_B;
    void *tail;           // [B,K-1,D] the conv's last inputs
    void *st;             // [B,4,D] f32 (h, c, n, m)
} SlstmBlock;

static int cells(const ModelConfig *c) { return c->dim / c->slstm_heads; }

static int sb_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    int64_t D = c->dim, H = c->slstm_heads, Dh = cells(c), K = c->conv_size;
    double small = sqrt(2.0 / (5.0 * (double)D));
    const MixerParam p[NPARAM] = {
        [CONV_W] = {"xlstm.conv1d.weight", 3, {D, 1, K}, INIT_NORMAL, 1 / sqrt((double)K), 1},
        [CONV_B] = {"xlstm.conv1d.bias", 1, {D}, INIT_CONST, 0, 0},
        [GATE_I] = {"xlstm.igate.weight", 3, {H, Dh, Dh}, INIT_NORMAL, small, 1},
        [GATE_F] = {"xlstm.fgate.weight", 3, {H, Dh, Dh}, INIT_NORMAL, small, 1},
        [GATE_Z] = {"xlstm.zgate.weight", 3, {H, Dh, Dh}, INIT_NORMAL, small, 1},
        [GATE_O] = {"xlstm.ogate.weight", 3, {H, Dh, Dh}, INIT_NORMAL, small, 1},
        [REC] = {"xlstm.slstm_cell.recurrent_kernel", 4, {H, Dh, 4, Dh}, INIT_CONST, 0, 1},
        [BIAS] = {"xlstm.slstm_cell.bias", 3, {4, H, Dh}, INIT_SLSTM_BIAS, 0, 0},
        [GNORM] = {"xlstm.group_norm.weight", 1, {D}, INIT_CONST, 1, 0},
    };
    return mixer_declare_table(prefix, p, NPARAM, out, n, max);
}

static int sb_validate(const ModelConfig *c, const char *where) {
    if (c->dim % c->slstm_heads)
        return mn_error(MN_ERR_ARG, "%s: slstm-block's heads (slstm_heads = %d) must divide dim = %d", where,
                        c->slstm_heads, c->dim);
    return MN_OK;
}

enum { SB_BUFS = 6 };

static void buffers(SlstmBlock *s, size_t D, size_t H, MixerBuf *out) {
    MixerBuf d[SB_BUFS] = {
        {&s->xconv, D, 0, MEM_ACT}, {&s->c, D, 0, MEM_ACT},        {&s->x, 4 * D, 0, MEM_ACT},
        {&s->h, D, 0, MEM_ACT},     {&s->cache, 4 * D, 0, MEM_F32}, {&s->stats, 2 * H, 0, MEM_F32},
    };
    memcpy(out, d, sizeof d);
}

static size_t sb_activation_bytes(const ModelConfig *c, const Backend *be) {
    SlstmBlock s;
    MixerBuf d[SB_BUFS];
    buffers(&s, (size_t)c->dim, (size_t)c->slstm_heads, d);
    return mixer_bufs_bytes(be, d, SB_BUFS);
}

static size_t sb_scratch_elems(const ModelConfig *c) { return 8 * (size_t)c->dim; }

static void scratch_views(Mixer *m, SlstmBlock *s, size_t N) {
    size_t nd = N * (size_t)m->cfg->dim * m->be->elem_size(m->be, MEM_ACT);
    char *p = m->scratch->p;
    s->tmp = p;
    s->tmp2 = p + nd;
    s->d_h = p + 2 * nd;
    s->d_c = p + 3 * nd;
    s->d_x = p + 4 * nd;
}

static int ensure_capacity(Mixer *m, int N) {
    SlstmBlock *s = m->priv;
    MN_TRY(mixer_scratch_reserve(m, (size_t)N * sb_scratch_elems(m->cfg)));
    if (N <= s->cap) return MN_OK;
    MixerBuf d[SB_BUFS];
    buffers(s, (size_t)m->cfg->dim, (size_t)m->cfg->slstm_heads, d);
    mixer_bufs_free(m->be, d, SB_BUFS);
    s->cap = 0;
    MN_TRY(mixer_bufs_alloc(m->be, d, SB_BUFS, (size_t)N));
    s->cap = N;
    return MN_OK;
}

static void *at_act(const Backend *be, void *p, size_t elems) { return (char *)p + elems * be->elem_size(be, MEM_ACT); }

static SlstmDims core_dims(const ModelConfig *c, int B, int T) {
    SlstmDims d = {B, T, c->slstm_heads, cells(c), 0};
    return d;
}

static int sb_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    const ModelConfig *c = m->cfg;
    SlstmBlock *s = m->priv;
    int N = B * T, D = c->dim, H = c->slstm_heads, Dh = cells(c), K = c->conv_size;
    if (use_state && s->state_B != B)
        return mn_error(MN_ERR_ARG, "%s: decoding %d sequences, but the state was reset for %d", m->ops->name, B,
                        s->state_B);
    MN_TRY(ensure_capacity(m, N));
    scratch_views(m, s, (size_t)N);
    s->u = u;
    s->B = B;
    s->T = T;
    void **w = m->w;
    MN_TRY(be->conv_fwd(be, s->xconv, u, w[CONV_W], B, T, D, K, use_state ? s->tail : NULL, use_state ? s->tail : NULL));
    MN_TRY(be->bias_fwd(be, s->xconv, w[CONV_B], N, D));
    MN_TRY(be->silu_fwd(be, s->c, s->xconv, (size_t)N * D));
    // the gates' input pre-activations, side by side in x [N, 4, D]: i and f from the convolution's
    // output, z and o from the block's input
    const void *in[4] = {s->c, s->c, u, u};
    for (int g = 0; g < 4; g++) {
        MN_TRY(be->headwise_fwd(be, s->tmp, in[g], w[GATE_I + g], N, H, Dh, Dh));
        be->copy_rows(be, at_act(be, s->x, (size_t)g * D), 4 * (size_t)D, s->tmp, (size_t)D, (size_t)N, (size_t)D,
                      MEM_ACT);
    }
    MN_TRY(be->bias_fwd(be, s->x, w[BIAS], N, 4 * D));
    SlstmDims d = core_dims(c, B, T);
    SlstmFwd io = {.x = s->x, .r = w[REC], .h = s->h, .cache = s->cache};
    if (use_state) io.s0 = io.sT = s->st;
    MIXER_TIMED(m, &m->core_seconds, be->slstm->fwd(be, &d, &io));
    void *rstd = s->stats, *mean = (char *)s->stats + (size_t)N * H * be->elem_size(be, MEM_F32);
    return be->layernorm_fwd(be, y, mean, rstd, s->h, w[GNORM], N, D, Dh, D, c->norm_eps);
}

static int sb_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    const ModelConfig *c = m->cfg;
    SlstmBlock *s = m->priv;
    if (!s->cap) return mn_error(MN_ERR_ARG, "%s: backward before any forward", m->ops->name);
    int B = s->B, T = s->T, N = B * T, D = c->dim, H = c->slstm_heads, Dh = cells(c), K = c->conv_size;
    size_t nd = (size_t)N * D;
    scratch_views(m, s, (size_t)N);
    void **w = m->w, **dw = m->dw;
    void *rstd = s->stats, *mean = (char *)s->stats + (size_t)N * H * be->elem_size(be, MEM_F32);
    MN_TRY(be->layernorm_bwd(be, s->d_h, dw[GNORM], dy, s->h, w[GNORM], mean, rstd, N, D, Dh, D, 0));
    SlstmDims d = core_dims(c, B, T);
    SlstmBwd io = {.x = s->x, .r = w[REC], .cache = s->cache, .dh = s->d_h, .dx = s->d_x, .dr = dw[REC]};
    MIXER_TIMED(m, &m->core_seconds, be->slstm->bwd(be, &d, &io));
    MN_TRY(be->bias_bwd(be, dw[BIAS], s->d_x, N, 4 * D));
    // each gate's projection: i, f into the convolution's output, z, o into the input (z first: =)
    const int order[4] = {2, 3, 0, 1};
    for (int k = 0; k < 4; k++) {
        int g = order[k];
        be->copy_rows(be, s->tmp, (size_t)D, at_act(be, s->d_x, (size_t)g * D), 4 * (size_t)D, (size_t)N, (size_t)D,
                      MEM_ACT);
        void *dst = g >= 2 ? du : s->d_c;
        const void *src = g >= 2 ? s->u : s->c;
        MN_TRY(be->headwise_bwd(be, dst, dw[GATE_I + g], s->tmp, src, w[GATE_I + g], N, H, Dh, Dh, g == 3 || g == 1));
    }
    MN_TRY(be->silu_bwd(be, s->tmp, s->d_c, s->xconv, nd));
    MN_TRY(be->bias_bwd(be, dw[CONV_B], s->tmp, N, D));
    MN_TRY(be->conv_bwd(be, s->tmp2, dw[CONV_W], s->tmp, s->u, w[CONV_W], B, T, D, K, NULL));
    return be->add(be, du, s->tmp2, nd);
}

// The decoding state: the conv's last inputs [B,K-1,D] and the cells' (h, c, n, m) [B,4,D].
static int state_bufs(Mixer *m, int B, MixerStateBuf *b) {
    SlstmBlock *s = m->priv;
    b[0] = (MixerStateBuf){&s->tail, (size_t)B * (m->cfg->conv_size - 1) * m->cfg->dim, MEM_ACT};
    b[1] = (MixerStateBuf){&s->st, (size_t)B * 4 * m->cfg->dim, MEM_F32};
    return 2;
}

static void free_state(Mixer *m) {
    MixerStateBuf b[2];
    mixer_state_free(m->be, b, state_bufs(m, 0, b), &((SlstmBlock *)m->priv)->state_B);
}

static int sb_reset_state(Mixer *m, int B) {
    MixerStateBuf b[2];
    return mixer_state_reset(m->be, b, state_bufs(m, B, b), &((SlstmBlock *)m->priv)->state_B, B);
}

static size_t sb_state_floats(const ModelConfig *c) { return (size_t)(4 + c->conv_size - 1) * c->dim; }

static void sb_destroy(Mixer *m) {
    SlstmBlock *s = m->priv;
    if (!s) return;
    MixerBuf d[SB_BUFS];
    buffers(s, 0, 0, d);
    mixer_bufs_free(m->be, d, SB_BUFS);
    free_state(m);
    free(s);
    m->priv = NULL;
}

static int sb_create(Mixer *m) {
    const Backend *be = m->be;
    if (!be->slstm || !be->slstm->fwd || !be->slstm->bwd) return mixer_unsupported(m, "it has no sLSTM core");
    if (!be->layernorm_fwd || !be->headwise_fwd || !be->bias_fwd || !be->geglu_fwd)
        return mixer_unsupported(m, "it lacks the block's LayerNorm, block-diagonal projection, bias or GELU ops");
    if (be->slstm->supports) {
        SlstmDims d = core_dims(m->cfg, 1, 1);
        MN_TRY(mixer_supports(m, be->slstm->supports(be, &d)));
    }
    SlstmBlock *s = calloc(1, sizeof(SlstmBlock));
    if (!s) return mn_error(MN_ERR_NOMEM, "out of memory");
    m->priv = s;
    return MN_OK;
}

// The paper's block: 4 heads, LayerNorm (eps 1e-5), an MLP of 1.3 D rounded up to 64 (NX-AI's
// proj_factor 1.3; matched presets then move it to match the parameters).
static void sb_preset(ModelConfig *c) {
    c->slstm_heads = 4;
    snprintf(c->norm, sizeof c->norm, "layernorm");
    c->norm_eps = 1e-5f;
    c->mlp_hidden = (13 * c->dim / 10 + 63) / 64 * 64;
}

const MixerOps mixer_slstm_block = {
    .name = "slstm-block",
    .about = "xLSTM's sLSTM block: conv4, block-diagonal gates, sLSTM cells mixed per head, GroupNorm; GELU MLP",
    .state_about = "h, c, n and m per cell, and the convolution's last inputs",
    .no_graph = 0,
    .fields = CF_CONV | CF_SLSTM,
    .block = {.ffn = FFN_GEGLU},
    .declare = sb_declare,
    .validate = sb_validate,
    .preset = sb_preset,
    .activation_bytes = sb_activation_bytes,
    .scratch_elems = sb_scratch_elems,
    .create = sb_create,
    .forward = sb_forward,
    .backward = sb_backward,
    .reset_state = sb_reset_state,
    .state_floats = sb_state_floats,
    .destroy = sb_destroy,
};
