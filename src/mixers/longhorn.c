/*
 * The Longhorn paper's layer (docs/spec/mixers.md section 3; docs/spec/reference/gdn-longhorn-notes.md
 * B.2: the official models/longhorn.py): a Mamba-1 style block with Longhorn's online-regression
 * state in place of Mamba's SSM, and no feed-forward part. After the block's RMSNorm, with the
 * inner width E = expand D, N = d_state state slots per channel and R = ceil(D / 16):
 *
 *   x = W_in,x u,  z = W_in,z u                                   (no biases)
 *   c = SiLU(conv4(x) + b_conv)                                   (causal, depthwise)
 *   delta = W_dt (W_x,dt c),  k = W_x,k c,  q = W_x,q c           (low-rank delta; keys and queries of N)
 *   beta = sigmoid(delta + b_dt),  Delta = beta / (1 + beta |k|^2)
 *   S_t = (1 - Delta_t (x) k_t^2) (.) S_{t-1} + (Delta_t (.) c_t) (x) k_t    (S: E x N, float32)
 *   h_t = S_t q_t + D (.) c_t
 *   y = W_out (h (.) SiLU(z))
 *
 * The diagonal recurrence, beta, Delta and the read-out are the backend's scan (ScanOps, SCAN_LONGHORN:
 * delta and b_dt go in apart, so that the gates are formed inside the scan). The official in_proj
 * [2E, D] is our in_proj_x (its first E rows) and in_proj_z, and its x_proj [R + 2N, E] our x_proj_dt,
 * x_proj_k, x_proj_q (in that order), since a parameter is a whole tensor on every backend; the
 * checkpoint converter (model/format_longhorn.h) splits and joins them.
 *
 * Initialisation as the official code's (B.2): PyTorch's defaults (kaiming_uniform(a = sqrt 5), a
 * uniform of variance 1 / (3 fan_in), drawn here from a normal of that variance) for the
 * projections and the convolution with its bias, the linear biases zero (b_dt: beta starts at
 * sigmoid(delta)), D = 1, out_proj's divided by sqrt(n_layers) (n_layers^resid_scale in variance).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"

// Parameter slots, in declaration (checkpoint) order.
enum { IN_X, IN_Z, CONV_W, CONV_B, XP_DT, XP_K, XP_Q, DT_W, DT_B, SKIP, OUT, NPARAM };

// The layer's sizes: model width D, inner width E, state slots N, delta's rank R, convolution K.
typedef struct {
    int D, E, N, R, K;
} LhSizes;

static LhSizes sizes(const ModelConfig *c) {
    LhSizes s = {c->dim, c->expand * c->dim, c->d_state, (c->dim + 15) / 16, c->conv_size};
    return s;
}

typedef struct {
    int cap;                       // tokens the buffers hold
    int B, T;                      // the last forward's
    const void *u;                 // [N,D] its input (the model's buffer)
    void *x, *z, *xconv, *c;       // [N,E] the in-projections, conv (+ bias) output, after SiLU
    void *dlr, *k, *q;             // [N,R] delta's low-rank part; [N,N] keys and queries
    void *delta, *h;               // [N,E] delta (beta's pre-activation, before its bias); the scan's output
    // in the shared scratch
    void *g, *d_g, *d_z, *d_h, *d_c, *d_delta, *tmp;  // [N,E]
    void *d_dlr, *d_k, *d_q;                          // [N,R], [N,N], [N,N]
    // decoding
    int state_B;
    void *tail;                    // [B,K-1,E] the conv's last inputs
    void *S;                       // [B,E,N] f32 the scan's state
} Longhorn;

static int lh_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    LhSizes z = sizes(c);
    int64_t D = z.D, E = z.E, N = z.N, R = z.R, K = z.K;
    // PyTorch's default Linear and Conv1d: uniform of variance 1 / (3 fan_in)
    double in = 1 / sqrt(3.0 * (double)D), inner = 1 / sqrt(3.0 * (double)E), conv = 1 / sqrt(3.0 * (double)K);
    double resid = pow((double)c->n_layers, -0.5 * c->resid_scale);
    const MixerParam p[NPARAM] = {
        [IN_X] = {"mixer.in_proj_x.weight", 2, {E, D}, INIT_NORMAL, in, 1},
        [IN_Z] = {"mixer.in_proj_z.weight", 2, {E, D}, INIT_NORMAL, in, 1},
        [CONV_W] = {"mixer.conv1d.weight", 3, {E, 1, K}, INIT_NORMAL, conv, 1},
        [CONV_B] = {"mixer.conv1d.bias", 1, {E}, INIT_NORMAL, conv, 0},
        [XP_DT] = {"mixer.x_proj_dt.weight", 2, {R, E}, INIT_NORMAL, inner, 1},
        [XP_K] = {"mixer.x_proj_k.weight", 2, {N, E}, INIT_NORMAL, inner, 1},
        [XP_Q] = {"mixer.x_proj_q.weight", 2, {N, E}, INIT_NORMAL, inner, 1},
        [DT_W] = {"mixer.dt_head.weight", 2, {E, R}, INIT_NORMAL, 1 / sqrt(3.0 * (double)R), 1},
        [DT_B] = {"mixer.dt_head.bias", 1, {E}, INIT_CONST, 0, 0},
        [SKIP] = {"mixer.D", 1, {E}, INIT_CONST, 1, 0},
        [OUT] = {"mixer.out_proj.weight", 2, {D, E}, INIT_NORMAL, inner * resid, 1},
    };
    return mixer_declare_table(prefix, p, NPARAM, out, n, max);
}

// The activation buffers: per token elements and kinds.
enum { LH_BUFS = 9 };

static void buffers(Longhorn *s, const LhSizes *z, MixerBuf *out) {
    size_t E = (size_t)z->E, N = (size_t)z->N, R = (size_t)z->R;
    MixerBuf d[LH_BUFS] = {
        {&s->x, E, 0, MEM_ACT},   {&s->z, E, 0, MEM_ACT}, {&s->xconv, E, 0, MEM_ACT}, {&s->c, E, 0, MEM_ACT},
        {&s->dlr, R, 0, MEM_ACT}, {&s->k, N, 0, MEM_ACT}, {&s->q, N, 0, MEM_ACT},     {&s->delta, E, 0, MEM_ACT},
        {&s->h, E, 0, MEM_ACT},
    };
    memcpy(out, d, sizeof d);
}

static size_t lh_activation_bytes(const ModelConfig *c, const Backend *be) {
    Longhorn s;
    LhSizes z = sizes(c);
    MixerBuf d[LH_BUFS];
    buffers(&s, &z, d);
    return mixer_bufs_bytes(be, d, LH_BUFS);
}

// Scratch: seven [N,E] views, then d_dlr [N,R], d_k and d_q [N,N].
static size_t lh_scratch_elems(const ModelConfig *c) {
    LhSizes z = sizes(c);
    return 7 * (size_t)z.E + (size_t)z.R + 2 * (size_t)z.N;
}

static void scratch_views(Mixer *m, Longhorn *s, size_t N) {
    LhSizes z = sizes(m->cfg);
    size_t es = m->be->elem_size(m->be, MEM_ACT), e = N * (size_t)z.E * es;
    char *p = m->scratch->p;
    void **v[] = {&s->g, &s->d_g, &s->d_z, &s->d_h, &s->d_c, &s->d_delta, &s->tmp};
    for (int i = 0; i < 7; i++) *v[i] = p + i * e;
    s->d_dlr = p + 7 * e;
    s->d_k = p + 7 * e + N * (size_t)z.R * es;
    s->d_q = p + 7 * e + N * (size_t)(z.R + z.N) * es;
}

static int ensure_capacity(Mixer *m, int N) {
    Longhorn *s = m->priv;
    MN_TRY(mixer_scratch_reserve(m, (size_t)N * lh_scratch_elems(m->cfg)));
    if (N <= s->cap) return MN_OK;
    LhSizes z = sizes(m->cfg);
    MixerBuf d[LH_BUFS];
    buffers(s, &z, d);
    mixer_bufs_free(m->be, d, LH_BUFS);
    s->cap = 0;
    MN_TRY(mixer_bufs_alloc(m->be, d, LH_BUFS, (size_t)N));
    s->cap = N;
    return MN_OK;
}

static ScanDims scan_dims(const LhSizes *z, int B, int T) {
    ScanDims d = {.kind = SCAN_LONGHORN, .B = B, .T = T, .C = z->E, .N = z->N, .reset = 0};
    return d;
}

static int lh_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    Longhorn *s = m->priv;
    LhSizes z = sizes(m->cfg);
    int N = B * T;
    if (use_state) {
        if (!s->state_B)
            return mn_error(MN_ERR_ARG, "%s: decoding %d sequences, but the state was not reset (reset_state first)",
                            m->ops->name, B);
        MN_TRY(mixer_check_decode(m, s->state_B, B));
    }
    MN_TRY(ensure_capacity(m, N));
    scratch_views(m, s, (size_t)N);
    s->u = u;
    s->B = B;
    s->T = T;
    void **w = m->w;
    MN_TRY(be->linear_fwd(be, s->x, u, w[IN_X], NULL, N, z.D, z.E));
    MN_TRY(be->linear_fwd(be, s->z, u, w[IN_Z], NULL, N, z.D, z.E));
    MN_TRY(be->conv_fwd(be, s->xconv, s->x, w[CONV_W], B, T, z.E, z.K, use_state ? s->tail : NULL,
                        use_state ? s->tail : NULL));
    MN_TRY(be->bias_fwd(be, s->xconv, w[CONV_B], N, z.E));
    MN_TRY(be->silu_fwd(be, s->c, s->xconv, (size_t)N * z.E));
    MN_TRY(be->linear_fwd(be, s->dlr, s->c, w[XP_DT], NULL, N, z.E, z.R));
    MN_TRY(be->linear_fwd(be, s->k, s->c, w[XP_K], NULL, N, z.E, z.N));
    MN_TRY(be->linear_fwd(be, s->q, s->c, w[XP_Q], NULL, N, z.E, z.N));
    MN_TRY(be->linear_fwd(be, s->delta, s->dlr, w[DT_W], NULL, N, z.R, z.E));
    ScanDims d = scan_dims(&z, B, T);
    ScanFwd io = {.x = s->c, .r = s->delta, .k = s->k, .q = s->q, .w = w[DT_B], .skip = w[SKIP],
                  .s0 = use_state ? s->S : NULL, .y = s->h, .sT = use_state ? s->S : NULL};
    MIXER_TIMED(m, &m->core_seconds, be->scan->fwd(be, &d, &io));
    MN_TRY(be->swiglu_fwd(be, s->g, s->z, s->h, (size_t)N * z.E));
    return be->linear_fwd(be, y, s->g, w[OUT], NULL, N, z.E, z.D);
}

static int lh_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    Longhorn *s = m->priv;
    if (!s->cap) return mn_error(MN_ERR_ARG, "%s: backward before any forward", m->ops->name);
    LhSizes z = sizes(m->cfg);
    int B = s->B, T = s->T, N = B * T;
    size_t ne = (size_t)N * z.E;
    scratch_views(m, s, (size_t)N);
    void **w = m->w, **dw = m->dw;
    // the gated output again (the scratch held another layer's since)
    MN_TRY(be->swiglu_fwd(be, s->g, s->z, s->h, ne));
    MN_TRY(be->linear_bwd(be, s->d_g, dw[OUT], NULL, dy, s->g, w[OUT], N, z.E, z.D, 0));
    MN_TRY(be->swiglu_bwd(be, s->d_z, s->d_h, s->d_g, s->z, s->h, ne));
    ScanDims d = scan_dims(&z, B, T);
    ScanBwd io = {.x = s->c, .r = s->delta, .k = s->k, .q = s->q, .w = w[DT_B], .skip = w[SKIP], .dy = s->d_h,
                  .dx = s->d_c, .dr = s->d_delta, .dk = s->d_k, .dq = s->d_q, .dw = dw[DT_B], .dskip = dw[SKIP]};
    MIXER_TIMED(m, &m->core_seconds, be->scan->bwd(be, &d, &io));
    // delta = W_dt (W_x,dt c); k, q = W_x,k c, W_x,q c: into c beside the scan's own gradient
    MN_TRY(be->linear_bwd(be, s->d_dlr, dw[DT_W], NULL, s->d_delta, s->dlr, w[DT_W], N, z.R, z.E, 0));
    MN_TRY(be->linear_bwd(be, s->d_c, dw[XP_DT], NULL, s->d_dlr, s->c, w[XP_DT], N, z.E, z.R, 1));
    MN_TRY(be->linear_bwd(be, s->d_c, dw[XP_K], NULL, s->d_k, s->c, w[XP_K], N, z.E, z.N, 1));
    MN_TRY(be->linear_bwd(be, s->d_c, dw[XP_Q], NULL, s->d_q, s->c, w[XP_Q], N, z.E, z.N, 1));
    // c = SiLU(conv(x) + b)
    MN_TRY(be->silu_bwd(be, s->tmp, s->d_c, s->xconv, ne));
    MN_TRY(be->bias_bwd(be, dw[CONV_B], s->tmp, N, z.E));
    MN_TRY(be->conv_bwd(be, s->d_c, dw[CONV_W], s->tmp, s->x, w[CONV_W], B, T, z.E, z.K, NULL));
    MN_TRY(be->linear_bwd(be, du, dw[IN_X], NULL, s->d_c, s->u, w[IN_X], N, z.D, z.E, 0));
    return be->linear_bwd(be, du, dw[IN_Z], NULL, s->d_z, s->u, w[IN_Z], N, z.D, z.E, 1);
}

// The decoding state per sequence (floats): the scan's E x N, the convolution's K - 1 inputs of E.
static size_t scan_floats(const ModelConfig *c) { return (size_t)c->expand * c->dim * c->d_state; }
static size_t tail_floats(const ModelConfig *c) { return (size_t)(c->conv_size - 1) * c->expand * c->dim; }

// The decoding state: the conv's last inputs [B,K-1,E] and the scan's S [B,E,N].
static int state_bufs(Mixer *m, int B, MixerStateBuf *b) {
    Longhorn *s = m->priv;
    b[0] = (MixerStateBuf){&s->tail, (size_t)B * tail_floats(m->cfg), MEM_ACT};
    b[1] = (MixerStateBuf){&s->S, (size_t)B * scan_floats(m->cfg), MEM_F32};
    return 2;
}

static void free_state(Mixer *m) {
    MixerStateBuf b[2];
    mixer_state_free(m->be, b, state_bufs(m, 0, b), &((Longhorn *)m->priv)->state_B);
}

static int lh_reset_state(Mixer *m, int B) {
    MixerStateBuf b[2];
    return mixer_state_reset(m->be, b, state_bufs(m, B, b), &((Longhorn *)m->priv)->state_B, B);
}

static size_t lh_state_floats(const ModelConfig *c) { return scan_floats(c) + tail_floats(c); }

static void lh_destroy(Mixer *m) {
    Longhorn *s = m->priv;
    if (!s) return;
    MixerBuf d[LH_BUFS];
    LhSizes z = {0};
    buffers(s, &z, d);
    mixer_bufs_free(m->be, d, LH_BUFS);
    free_state(m);
    free(s);
    m->priv = NULL;
}

static int lh_create(Mixer *m) {
    const Backend *be = m->be;
    if (!be->scan || !be->scan->fwd || !be->scan->bwd) return mixer_unsupported(m, "it has no diagonal-scan core");
    if (!be->bias_fwd || !be->bias_bwd) return mixer_unsupported(m, "it lacks the bias op (the convolution's bias)");
    LhSizes z = sizes(m->cfg);
    ScanDims d = scan_dims(&z, 1, 1);
    if (be->scan->supports) MN_TRY(mixer_supports(m, be->scan->supports(be, &d)));
    Longhorn *s = calloc(1, sizeof(Longhorn));
    if (!s) return mn_error(MN_ERR_NOMEM, "out of memory");
    m->priv = s;
    return MN_OK;
}

// The official block's RMSNorm eps (1e-5); d_state 16 and expand 2 are the defaults.
static void lh_preset(ModelConfig *c) { c->norm_eps = 1e-5f; }

const MixerOps mixer_longhorn = {
    .name = "longhorn",
    .about = "Longhorn's Mamba-style block: in_proj x2, conv4, x_proj (low-rank beta, k, q), diagonal online-regression "
             "scan, SiLU gate, out_proj",
    .state_about = "S (expand D x d_state), and the convolution's last inputs",
    .fields = CF_CONV | CF_D_STATE | CF_EXPAND,
    .block = {.ffn = FFN_NONE},
    .declare = lh_declare,
    .preset = lh_preset,
    .activation_bytes = lh_activation_bytes,
    .scratch_elems = lh_scratch_elems,
    .create = lh_create,
    .forward = lh_forward,
    .backward = lh_backward,
    .reset_state = lh_reset_state,
    .state_floats = lh_state_floats,
    .destroy = lh_destroy,
};
