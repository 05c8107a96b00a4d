/*
 * Griffin's recurrent block with the RG-LRU (De et al. 2024), as transformers' RecurrentGemma has it
 * (RecurrentGemmaRecurrentBlock, RecurrentGemmaRglru). On the normalised input u [N, D], with the
 * recurrence width L = lru_width (0: D) in H = n_heads blocks of bw = L / H:
 *
 *   y~ = W_y u + b_y                                     (linear_y)
 *   x  = conv_K(W_x u + b_x) + b_conv                    (linear_x, causal depthwise conv1d of K = conv_size)
 *   r~ = blockdiag(W_r) x + b_r,  i~ = blockdiag(W_i) x + b_i   (the RG-LRU's gates, per block of bw)
 *   h  = RG-LRU(x, r~, i~, Lambda)                       (ScanOps SCAN_RGLRU: the sigmoids, a_t, the
 *                                                         sqrt(1 - a_t^2) input scaling, the reset at t = 0)
 *   y  = W_out (gelu_tanh(y~) (.) h) + b_out             (linear_out)
 *
 * The block's MLP follows (MixerOps.block: our default SwiGLU, the MesaNet paper's Hawk baseline).
 *
 * Tensors, under the block's prefix: transformers' names and shapes, but for the gates' weights.
 * transformers' input_gate_weight and recurrent_gate_weight [H, bw_in, bw_out] multiply from the
 * right (x W); ours [H, bw_out, bw_in] are the backend's block-diagonal projection (headwise_fwd,
 * y = w x): a checkpoint's gate weights are transposed in their last two dimensions between the model
 * and its files (ParamSpec.file_transpose, model/weights.c), so that the files are transformers'; everything
 * else is as it is (conv_1d.weight [L, 1, K] is conv_fwd's [L, K]; the gate biases [H, bw] are [L]).
 *
 * Initialisation: the projections in and out as the other mixers' (std D^-1/2 in, n_layers^-resid_scale
 * L^-1/2 out), the recurrent part as transformers' (w_init_variance_scale 0.01: conv std (0.01 / K)^1/2,
 * gates (0.01 / bw)^1/2, biases 0, Lambda INIT_RGLRU_LAMBDA).
 *
 * Decoding keeps the convolution's last K - 1 inputs and h (float32). A state just reset starts a
 * sequence: its first call runs the scan with `reset` (a_0 = 0, no input scaling at t = 0, as
 * transformers at position 0); later calls continue the state.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"

// Parameter slots, in declaration (checkpoint) order.
enum { Y_W, Y_B, X_W, X_B, OUT_W, OUT_B, CONV_W, CONV_B, I_W, I_B, R_W, R_B, LAMBDA, NPARAM };

typedef struct {
    int cap, B, T;
    const void *u;           // [N,D] the last forward's input (the model's buffer)
    void *ypre;              // [N,L] y~, before its GELU
    void *xb;                // [N,L] linear_x's output, the convolution's input
    void *x;                 // [N,L] after the convolution and its bias: the RG-LRU's input
    void *rpre, *ipre;       // [N,L] the gates' pre-activations
    void *h;                 // [N,L] the RG-LRU's output
    // in the shared scratch
    void *g, *d_g, *d_ypre, *d_h, *d_x, *d_r, *d_i;  // [N,L]; d_xb reuses g
    // decoding
    int state_B;
    int fresh;               // the state was just reset: the next call starts its sequences (scan `reset`)
    void *tail;              // [B,K-1,L] the convolution's last inputs
    void *hs;                // [B,L] f32 the recurrence's state
} Hawk;

static int width(const ModelConfig *c) { return c->lru_width ? c->lru_width : c->dim; }

static int hk_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    int64_t D = c->dim, L = width(c), H = c->n_heads, bw = L / H, K = c->conv_size;
    double in_std = 1 / sqrt((double)D), out_std = pow((double)c->n_layers, -c->resid_scale) / sqrt((double)L);
    double conv_std = sqrt(0.01 / (double)K), gate_std = sqrt(0.01 / (double)bw);
    const MixerParam p[NPARAM] = {
        [Y_W] = {"temporal_block.linear_y.weight", 2, {L, D}, INIT_NORMAL, in_std, 1},
        [Y_B] = {"temporal_block.linear_y.bias", 1, {L}, INIT_CONST, 0, 0},
        [X_W] = {"temporal_block.linear_x.weight", 2, {L, D}, INIT_NORMAL, in_std, 1},
        [X_B] = {"temporal_block.linear_x.bias", 1, {L}, INIT_CONST, 0, 0},
        [OUT_W] = {"temporal_block.linear_out.weight", 2, {D, L}, INIT_NORMAL, out_std, 1},
        [OUT_B] = {"temporal_block.linear_out.bias", 1, {D}, INIT_CONST, 0, 0},
        [CONV_W] = {"temporal_block.conv_1d.weight", 3, {L, 1, K}, INIT_NORMAL, conv_std, 1},
        [CONV_B] = {"temporal_block.conv_1d.bias", 1, {L}, INIT_CONST, 0, 0},
        [I_W] = {"temporal_block.rg_lru.input_gate_weight", 3, {H, bw, bw}, INIT_NORMAL, gate_std, 1},
        [I_B] = {"temporal_block.rg_lru.input_gate_bias", 2, {H, bw}, INIT_CONST, 0, 0},
        [R_W] = {"temporal_block.rg_lru.recurrent_gate_weight", 3, {H, bw, bw}, INIT_NORMAL, gate_std, 1},
        [R_B] = {"temporal_block.rg_lru.recurrent_gate_bias", 2, {H, bw}, INIT_CONST, 0, 0},
        [LAMBDA] = {"temporal_block.rg_lru.recurrent_param", 1, {L}, INIT_RGLRU_LAMBDA, 0, 0},
    };
    MN_TRY(mixer_declare_table(prefix, p, NPARAM, out, n, max));
    // transformers multiplies x [bw] by its gate blocks from the right: its files hold ours transposed
    out[*n - NPARAM + I_W].file_transpose = out[*n - NPARAM + R_W].file_transpose = 1;
    return MN_OK;
}

static int hk_validate(const ModelConfig *c, const char *where) {
    if (width(c) % c->n_heads)
        return mn_error(MN_ERR_ARG, "%s: hawk's recurrence width lru_width = %d%s must be a multiple of n_heads = %d (its "
                                    "gates are block-diagonal, one block per head)",
                        where, width(c), c->lru_width ? "" : " (0: dim)", c->n_heads);
    return MN_OK;
}

// The activation buffers: six [N,L] MEM_ACT.
enum { HK_BUFS = 6 };

static void buffers(Hawk *s, size_t L, MixerBuf *out) {
    MixerBuf d[HK_BUFS] = {
        {&s->ypre, L, 0, MEM_ACT}, {&s->xb, L, 0, MEM_ACT},   {&s->x, L, 0, MEM_ACT},
        {&s->rpre, L, 0, MEM_ACT}, {&s->ipre, L, 0, MEM_ACT}, {&s->h, L, 0, MEM_ACT},
    };
    memcpy(out, d, sizeof d);
}

static size_t hk_activation_bytes(const ModelConfig *c, const Backend *be) {
    Hawk s;
    MixerBuf d[HK_BUFS];
    buffers(&s, (size_t)width(c), d);
    return mixer_bufs_bytes(be, d, HK_BUFS);
}

enum { HK_SCRATCH = 7 };  // [N,L] views of the shared scratch
static size_t hk_scratch_elems(const ModelConfig *c) { return HK_SCRATCH * (size_t)width(c); }

static void scratch_views(Mixer *m, Hawk *s, size_t N) {
    size_t nl = N * (size_t)width(m->cfg) * m->be->elem_size(m->be, MEM_ACT);
    char *p = m->scratch->p;
    void **v[HK_SCRATCH] = {&s->g, &s->d_g, &s->d_ypre, &s->d_h, &s->d_x, &s->d_r, &s->d_i};
    for (int i = 0; i < HK_SCRATCH; i++) *v[i] = p + i * nl;
}

static int ensure_capacity(Mixer *m, int N) {
    Hawk *s = m->priv;
    MN_TRY(mixer_scratch_reserve(m, (size_t)N * hk_scratch_elems(m->cfg)));
    if (N <= s->cap) return MN_OK;
    MixerBuf d[HK_BUFS];
    buffers(s, (size_t)width(m->cfg), d);
    mixer_bufs_free(m->be, d, HK_BUFS);
    s->cap = 0;
    MN_TRY(mixer_bufs_alloc(m->be, d, HK_BUFS, (size_t)N));
    s->cap = N;
    return MN_OK;
}

static ScanDims scan_dims(const ModelConfig *c, int B, int T, int reset) {
    ScanDims d = {.kind = SCAN_RGLRU, .B = B, .T = T, .C = width(c), .N = 1, .reset = reset};
    return d;
}

static int hk_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    const ModelConfig *c = m->cfg;
    Hawk *s = m->priv;
    int N = B * T, D = c->dim, L = width(c), H = c->n_heads, bw = L / H, K = c->conv_size;
    if (use_state) MN_TRY(mixer_check_decode(m, s->state_B, B));
    MN_TRY(ensure_capacity(m, N));
    scratch_views(m, s, (size_t)N);
    s->u = u;
    s->B = B;
    s->T = T;
    void **w = m->w;
    MN_TRY(be->linear_fwd(be, s->ypre, u, w[Y_W], w[Y_B], N, D, L));
    MN_TRY(be->linear_fwd(be, s->xb, u, w[X_W], w[X_B], N, D, L));
    MN_TRY(be->conv_fwd(be, s->x, s->xb, w[CONV_W], B, T, L, K, use_state ? s->tail : NULL, use_state ? s->tail : NULL));
    MN_TRY(be->bias_fwd(be, s->x, w[CONV_B], N, L));
    MN_TRY(be->headwise_fwd(be, s->rpre, s->x, w[R_W], N, H, bw, bw));
    MN_TRY(be->bias_fwd(be, s->rpre, w[R_B], N, L));
    MN_TRY(be->headwise_fwd(be, s->ipre, s->x, w[I_W], N, H, bw, bw));
    MN_TRY(be->bias_fwd(be, s->ipre, w[I_B], N, L));
    ScanDims d = scan_dims(c, B, T, use_state ? s->fresh : 1);
    ScanFwd io = {.x = s->x, .r = s->rpre, .i = s->ipre, .w = w[LAMBDA], .y = s->h};
    if (use_state) io.s0 = io.sT = s->hs;
    MIXER_TIMED(m, &m->core_seconds, be->scan->fwd(be, &d, &io));
    if (use_state) s->fresh = 0;
    MN_TRY(be->geglu_tanh_fwd(be, s->g, s->ypre, s->h, (size_t)N * L));
    return be->linear_fwd(be, y, s->g, w[OUT_W], w[OUT_B], N, L, D);
}

static int hk_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    const ModelConfig *c = m->cfg;
    Hawk *s = m->priv;
    if (!s->cap) return mn_error(MN_ERR_ARG, "%s: backward before any forward", m->ops->name);
    int B = s->B, T = s->T, N = B * T, D = c->dim, L = width(c), H = c->n_heads, bw = L / H, K = c->conv_size;
    size_t nl = (size_t)N * L;
    scratch_views(m, s, (size_t)N);
    void **w = m->w, **dw = m->dw;
    // the gated output again (the scratch held another layer's since)
    MN_TRY(be->geglu_tanh_fwd(be, s->g, s->ypre, s->h, nl));
    MN_TRY(be->linear_bwd(be, s->d_g, dw[OUT_W], dw[OUT_B], dy, s->g, w[OUT_W], N, L, D, 0));
    MN_TRY(be->geglu_tanh_bwd(be, s->d_ypre, s->d_h, s->d_g, s->ypre, s->h, nl));
    ScanDims d = scan_dims(c, B, T, 1);
    ScanBwd io = {.x = s->x, .r = s->rpre, .i = s->ipre, .w = w[LAMBDA], .dy = s->d_h, .dx = s->d_x, .dr = s->d_r,
                  .di = s->d_i, .dw = dw[LAMBDA]};
    MIXER_TIMED(m, &m->core_seconds, be->scan->bwd(be, &d, &io));
    // the gates: biases, then their block-diagonal projections into x's gradient
    MN_TRY(be->bias_bwd(be, dw[R_B], s->d_r, N, L));
    MN_TRY(be->bias_bwd(be, dw[I_B], s->d_i, N, L));
    MN_TRY(be->headwise_bwd(be, s->d_x, dw[R_W], s->d_r, s->x, w[R_W], N, H, bw, bw, 1));
    MN_TRY(be->headwise_bwd(be, s->d_x, dw[I_W], s->d_i, s->x, w[I_W], N, H, bw, bw, 1));
    // x = conv(xb) + b: d_xb into g's place (g is spent)
    void *d_xb = s->g;
    MN_TRY(be->bias_bwd(be, dw[CONV_B], s->d_x, N, L));
    MN_TRY(be->conv_bwd(be, d_xb, dw[CONV_W], s->d_x, s->xb, w[CONV_W], B, T, L, K, NULL));
    MN_TRY(be->linear_bwd(be, du, dw[X_W], dw[X_B], d_xb, s->u, w[X_W], N, D, L, 0));
    return be->linear_bwd(be, du, dw[Y_W], dw[Y_B], s->d_ypre, s->u, w[Y_W], N, D, L, 1);
}

// The decoding state: the conv's last inputs [B,K-1,L] and the RG-LRU's h [B,L].
static int state_bufs(Mixer *m, int B, MixerStateBuf *b) {
    Hawk *s = m->priv;
    size_t L = (size_t)width(m->cfg);
    b[0] = (MixerStateBuf){&s->tail, (size_t)B * (m->cfg->conv_size - 1) * L, MEM_ACT};
    b[1] = (MixerStateBuf){&s->hs, (size_t)B * L, MEM_F32};
    return 2;
}

static void free_state(Mixer *m) {
    MixerStateBuf b[2];
    mixer_state_free(m->be, b, state_bufs(m, 0, b), &((Hawk *)m->priv)->state_B);
}

static int hk_reset_state(Mixer *m, int B) {
    Hawk *s = m->priv;
    MixerStateBuf b[2];
    MN_TRY(mixer_state_reset(m->be, b, state_bufs(m, B, b), &s->state_B, B));
    s->fresh = 1;
    return MN_OK;
}

static size_t hk_state_floats(const ModelConfig *c) { return (size_t)c->conv_size * width(c); }

static void hk_destroy(Mixer *m) {
    Hawk *s = m->priv;
    if (!s) return;
    MixerBuf d[HK_BUFS];
    buffers(s, 0, d);
    mixer_bufs_free(m->be, d, HK_BUFS);
    free_state(m);
    free(s);
    m->priv = NULL;
}

static int hk_create(Mixer *m) {
    const Backend *be = m->be;
    if (!be->scan || !be->scan->fwd || !be->scan->bwd) return mixer_unsupported(m, "it has no diagonal-scan core");
    if (!be->headwise_fwd || !be->bias_fwd || !be->geglu_tanh_fwd)
        return mixer_unsupported(m, "it lacks the block-diagonal projection, bias or tanh-GELU ops");
    if (be->scan->supports) {
        ScanDims d = scan_dims(m->cfg, 1, 1, 1);
        MN_TRY(mixer_supports(m, be->scan->supports(be, &d)));
    }
    Hawk *s = calloc(1, sizeof(Hawk));
    if (!s) return mn_error(MN_ERR_NOMEM, "out of memory");
    m->priv = s;
    return MN_OK;
}

const MixerOps mixer_hawk = {
    .name = "hawk",
    .about = "Griffin's recurrent block: GELU(tanh) branch x (linear, conv4, RG-LRU with block-diagonal gates)",
    .state_about = "the RG-LRU's h (lru_width) and the convolution's last inputs",
    .fields = CF_CONV | CF_LRU,
    .block = {.ffn = FFN_SWIGLU},
    .declare = hk_declare,
    .validate = hk_validate,
    .activation_bytes = hk_activation_bytes,
    .scratch_elems = hk_scratch_elems,
    .create = hk_create,
    .forward = hk_forward,
    .backward = hk_backward,
    .reset_state = hk_reset_state,
    .state_floats = hk_state_floats,
    .destroy = hk_destroy,
};
