/*
 * Softmax attention: the Transformer++ baselines (docs/spec/mixers.md section 7). `mha` is
 * causal multi-head attention with rotary position embeddings (RoPE) and optionally grouped
 * key/value heads; `swa` is the same within the last `window` tokens (the current one included):
 *
 *   q = RoPE(W_q u), k = RoPE(W_k u), v = W_v u     (H query heads, Hkv key/value heads of D)
 *   o[t,h] = sum_{s in S(t)} softmax_s(D^-1/2 q[t,h] . k[s,h']) v[s,h'],  h' = h / (H / Hkv)
 *   y = W_o o
 *
 * S(t) = {s <= t} (mha) or {t - window < s <= t} (swa). RoPE is Llama's "rotate half" with the
 * config's rope_theta, over the first rope_dim features of each head (all of them by default;
 * RecurrentGemma rotates the first half); positions are 0..T-1 in training, and continue from the
 * tokens seen so far when decoding. No biases, but o_bias puts one on W_o (RecurrentGemma's o_proj).
 *
 * Tensors (prefix "model.layers.N."), as fla's Attention layer names them (fla's
 * TransformerForCausalLM and its hybrids): attn.q_proj.weight [H*D, dim], attn.k_proj.weight
 * [Hkv*D, dim], attn.v_proj.weight [Hkv*D, dim], attn.o_proj.weight [dim, H*D] (and attn.o_proj.bias
 * [dim] with o_bias); under the llama architecture self_attn.* as Hugging Face's LlamaForCausalLM,
 * under the recurrent_gemma architecture temporal_block.* as its RecurrentGemmaForCausalLM.
 *
 * Decoding keeps a key/value cache per layer, [B, cap, Hkv, D] each for keys and values:
 * mha's grows with the sequence (capacity in chunks of ATTN_CACHE_CHUNK tokens, reallocated as
 * needed): 2 Hkv D numbers per token and layer; swa's is a ring buffer of `window` slots (token
 * p in slot p mod window), fixed: 2 window Hkv D numbers per layer. The cores are the backend's
 * attention sub-table (AttnOps: fwd, bwd, decode, rope); a backend without it refuses these mixers.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "mixer.h"

enum { ATTN_CACHE_CHUNK = 256 };  // mha's cache grows by this many tokens at a time

enum { W_Q, W_K, W_V, W_O, W_COUNT, W_OB = W_COUNT };  // W_OB: o_proj's bias, with o_bias

typedef struct {
    int D, H, Hkv, Dh, Q, KV, window;
    int rot;     // the features of each head RoPE rotates
    int o_bias;  // W_o has a bias (m->w[W_OB])
    float scale, theta;
} Dims;

static Dims dims_of_config(const ModelConfig *c, const MixerOps *ops) {
    Dims z;
    z.D = c->dim;
    z.H = c->n_heads;
    z.Hkv = c->n_kv_heads ? c->n_kv_heads : c->n_heads;
    z.Dh = c->head_dim;
    z.Q = z.H * z.Dh;
    z.KV = z.Hkv * z.Dh;
    z.window = ops == &mixer_swa ? c->window : 0;
    z.rot = c->rope_dim ? c->rope_dim : c->head_dim;
    z.o_bias = c->o_bias;
    z.scale = (float)(1 / sqrt((double)z.Dh));
    z.theta = c->rope_theta;
    return z;
}

static Dims dims_of(const Mixer *m) { return dims_of_config(m->cfg, m->ops); }

typedef struct {
    int cap;            // tokens the buffers hold
    int B, T;           // the last forward's
    const void *u;      // its input (the model's buffer)
    void *q, *k, *v;    // [N,Q], [N,KV], [N,KV] after RoPE (q, k)
    void *o;            // [N,Q]
    void *lse;          // [N*H] f32
    void *pos;          // [N] i32
    int32_t *hpos;      // [N] host copy
    int pos_B, pos_T;   // pos holds a training forward's positions for this shape (0: other positions)
    // decoding: the key/value cache
    int state_B;
    int ccap;           // slots per sequence (swa: window)
    long seen;          // tokens decoded so far (each sequence: they advance together)
    void *kc, *vc;      // [B, ccap, Hkv, Dh]
} Attn;

enum { ATTN_BUFS = 6 };

static void buffers(Attn *s, const Dims *z, MixerBuf *out) {
    MixerBuf d[ATTN_BUFS] = {
        {&s->q, z->Q, 0, MEM_ACT}, {&s->k, z->KV, 0, MEM_ACT}, {&s->v, z->KV, 0, MEM_ACT},
        {&s->o, z->Q, 0, MEM_ACT}, {&s->lse, z->H, 0, MEM_F32}, {&s->pos, 1, 0, MEM_I32},
    };
    memcpy(out, d, sizeof d);
}

static void free_buffers(const Backend *be, Attn *s) {
    MixerBuf d[ATTN_BUFS];
    Dims z = {0};
    buffers(s, &z, d);
    mixer_bufs_free(be, d, ATTN_BUFS);
    free(s->hpos);
    s->hpos = NULL;
    s->cap = 0;
    s->pos_B = s->pos_T = 0;
}

static size_t attn_activation_bytes(const ModelConfig *c, const Backend *be) {
    Attn s;
    Dims z = dims_of_config(c, &mixer_mha);
    MixerBuf d[ATTN_BUFS];
    buffers(&s, &z, d);
    return mixer_bufs_bytes(be, d, ATTN_BUFS);
}

// The shared scratch: d_o, d_q [N,Q] and d_k, d_v [N,KV] of the backward.
static size_t attn_scratch_elems(const ModelConfig *c) {
    Dims z = dims_of_config(c, &mixer_mha);
    return 2 * (size_t)z.Q + 2 * (size_t)z.KV;
}

static int alloc_buffers(Mixer *m, Attn *s, int N) {
    const Backend *be = m->be;
    free_buffers(be, s);
    Dims z = dims_of(m);
    MixerBuf d[ATTN_BUFS];
    buffers(s, &z, d);
    s->hpos = malloc((size_t)N * sizeof(int32_t));
    if (!s->hpos || mixer_bufs_alloc(be, d, ATTN_BUFS, (size_t)N)) {
        free_buffers(be, s);
        return mn_error(MN_ERR_NOMEM, "%s: out of memory for %d tokens' activations", m->ops->name, N);
    }
    MN_TRY(mixer_scratch_reserve(m, (size_t)N * attn_scratch_elems(m->cfg)));
    s->cap = N;
    return MN_OK;
}

static char *at(const Backend *be, const void *p, size_t elems) {
    return (char *)p + elems * be->elem_size(be, MEM_ACT);
}

static void free_state(const Backend *be, Attn *s) {
    if (s->kc) be->free(be, s->kc);
    if (s->vc) be->free(be, s->vc);
    s->kc = s->vc = NULL;
    s->state_B = 0;
    s->ccap = 0;
    s->seen = 0;
}

// Grows mha's cache to hold `need` tokens a sequence, keeping the first `keep`.
static int cache_grow(Mixer *m, Attn *s, long need, long keep) {
    const Backend *be = m->be;
    Dims z = dims_of(m);
    if (need > 1L << 30) return mn_error(MN_ERR_ARG, "%s: %ld tokens exceed the key/value cache's limit", m->ops->name, need);
    int ncap = (int)((need + ATTN_CACHE_CHUNK - 1) / ATTN_CACHE_CHUNK * ATTN_CACHE_CHUNK);
    size_t n = (size_t)s->state_B * ncap * z.KV;
    void *kc = be->alloc(be, n, MEM_ACT), *vc = be->alloc(be, n, MEM_ACT);
    if (!kc || !vc) {
        if (kc) be->free(be, kc);
        if (vc) be->free(be, vc);
        return mn_error(MN_ERR_NOMEM, "%s: out of memory for a key/value cache of %d tokens", m->ops->name, ncap);
    }
    if (s->kc && keep > 0) {  // each sequence's first `keep` slots, one strided copy for all
        size_t ds = (size_t)ncap * z.KV, ss = (size_t)s->ccap * z.KV, rows = (size_t)s->state_B;
        be->copy_rows(be, kc, ds, s->kc, ss, rows, (size_t)keep * z.KV, MEM_ACT);
        be->copy_rows(be, vc, ds, s->vc, ss, rows, (size_t)keep * z.KV, MEM_ACT);
    }
    if (s->kc) be->free(be, s->kc);
    if (s->vc) be->free(be, s->vc);
    s->kc = kc;
    s->vc = vc;
    s->ccap = ncap;
    return MN_OK;
}

// Tokens [t0, t1) of every sequence of the current call's k, v (T tokens a sequence, token t at
// position seen + t) into their cache slots: mha's slot is the position, swa's the position mod
// window. A token has the same slot in every sequence, and consecutive tokens take consecutive
// slots, so a run of tokens is one strided copy over the sequences for k and one for v: one run
// for mha, two where swa's ring wraps (given at most `window` tokens).
static void cache_put(const Backend *be, Attn *s, const Dims *z, int B, int t0, int t1, int T, long seen) {
    while (t0 < t1) {
        long p = seen + t0;
        int slot = z->window ? (int)(p % z->window) : (int)p, run = t1 - t0;
        if (z->window && run > z->window - slot) run = z->window - slot;
        size_t dst = (size_t)slot * z->KV, src = (size_t)t0 * z->KV, ds = (size_t)s->ccap * z->KV, ss = (size_t)T * z->KV;
        be->copy_rows(be, at(be, s->kc, dst), ds, at(be, s->k, src), ss, (size_t)B, (size_t)run * z->KV, MEM_ACT);
        be->copy_rows(be, at(be, s->vc, dst), ds, at(be, s->v, src), ss, (size_t)B, (size_t)run * z->KV, MEM_ACT);
        t0 += run;
    }
}

static int check_state(const Mixer *m, const Attn *s, int B) {
    if (s->state_B == B) return MN_OK;
    if (!s->state_B)
        return mn_error(MN_ERR_ARG, "%s: decoding %d sequences, but the state was not reset (reset_state first)",
                        m->ops->name, B);
    return mn_error(MN_ERR_ARG, "%s: decoding %d sequences, but the state was reset for %d", m->ops->name, B,
                    s->state_B);
}

// Token t of every sequence (position seen + t, already in the cache) attends to the first n
// slots: its queries gathered into a [B, Q] block of the shared scratch, one decoding call for all
// sequences, the outputs scattered back to their rows of o.
static int attend_token(Mixer *m, Attn *s, const Dims *z, int B, int t, int T, long n) {
    const Backend *be = m->be;
    size_t Q = (size_t)z->Q, TQ = (size_t)T * Q;
    if (m->scratch->n < 2 * (size_t)B * Q)  // (reserved for B T tokens by alloc_buffers: never short)
        return mn_error(MN_ERR_ARG, "%s: the shared scratch holds %zu elements, %zu needed", m->ops->name,
                        m->scratch->n, 2 * (size_t)B * Q);
    char *qt = m->scratch->p, *ot = at(be, qt, (size_t)B * Q);
    AttnDims ad = {B, 1, z->H, z->Hkv, z->Dh, z->window, z->scale};
    be->copy_rows(be, qt, Q, at(be, s->q, (size_t)t * Q), TQ, (size_t)B, Q, MEM_ACT);
    MN_TRY(be->attn->decode(be, &ad, (int)n, s->ccap, qt, s->kc, s->vc, ot));
    be->copy_rows(be, at(be, s->o, (size_t)t * Q), TQ, ot, Q, (size_t)B, Q, MEM_ACT);
    return MN_OK;
}

// A prefill after earlier tokens, a token at a time (for all sequences at once). mha's slots are
// positions: all T keys and values go in first, and token t reads only the first seen + t + 1
// slots, never a later token's. swa's ring can give a later token the slot of a key an earlier
// query still needs, so there each token goes in just before it attends.
static int prefill_after(Mixer *m, Attn *s, const Dims *z, int B, int T) {
    const Backend *be = m->be;
    long seen = s->seen;
    if (!z->window) cache_put(be, s, z, B, 0, T, T, seen);
    for (int t = 0; t < T; t++) {
        long n = seen + t + 1;
        if (z->window && n > z->window) n = z->window;
        if (z->window) cache_put(be, s, z, B, t, t + 1, T, seen);
        MN_TRY(attend_token(m, s, z, B, t, T, n));
    }
    return MN_OK;
}

// Attention of the T new tokens of each sequence with the cache (use_state): appends their keys
// and values, and attends. A first call on an empty cache runs the whole-sequence core.
static int attend_with_cache(Mixer *m, Attn *s, const Dims *z, int B, int T) {
    const Backend *be = m->be;
    long seen = s->seen;
    if (!z->window && seen + T > s->ccap) MN_TRY(cache_grow(m, s, seen + T, seen));
    AttnDims ad = {B, T, z->H, z->Hkv, z->Dh, z->window, z->scale};
    if (seen == 0 && (T > 1 || !be->attn->decode)) {
        AttnFwd io = {s->q, s->k, s->v, s->o, s->lse};
        MN_TRY(be->attn->fwd(be, &ad, &io));
        // only the last `window` tokens stay in swa's ring
        int first = z->window && T > z->window ? T - z->window : 0;
        cache_put(be, s, z, B, first, T, T, seen);
    } else if (T == 1) {
        cache_put(be, s, z, B, 0, 1, 1, seen);
        long n = seen + 1;
        if (z->window && n > z->window) n = z->window;
        ad.T = 1;
        MN_TRY(be->attn->decode(be, &ad, (int)n, s->ccap, s->q, s->kc, s->vc, s->o));
    } else {
        MN_TRY(prefill_after(m, s, z, B, T));
    }
    s->seen = seen + T;
    return MN_OK;
}

static int attn_forward(Mixer *m, void *y, const void *u, int B, int T, int use_state) {
    const Backend *be = m->be;
    Attn *s = m->priv;
    int N = B * T;
    if (use_state) MN_TRY(check_state(m, s, B));
    if (N > s->cap) MN_TRY(alloc_buffers(m, s, N));
    Dims z = dims_of(m);
    void **w = m->w;
    s->u = u;
    s->B = B;
    s->T = T;
    long base = use_state ? s->seen : 0;
    if (base + T > INT32_MAX) return mn_error(MN_ERR_ARG, "%s: position %ld is past the int32 range", m->ops->name, base + T);
    // A training forward's positions (0..T-1 in each sequence) are uploaded once per shape: the
    // forward then queues no host copy, and a recorded training step replays without one
    // (model.h: fwd_B, fwd_T: a replay follows a forward of its shape, which left them here).
    if (use_state || s->pos_B != B || s->pos_T != T) {
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) s->hpos[(size_t)b * T + t] = (int32_t)(base + t);
        MN_TRY(be->upload_i32(be, s->pos, s->hpos, (size_t)N));
        s->pos_B = use_state ? 0 : B;
        s->pos_T = use_state ? 0 : T;
    }
    MN_TRY(be->linear_fwd(be, s->q, u, w[W_Q], NULL, N, z.D, z.Q));
    MN_TRY(be->linear_fwd(be, s->k, u, w[W_K], NULL, N, z.D, z.KV));
    MN_TRY(be->linear_fwd(be, s->v, u, w[W_V], NULL, N, z.D, z.KV));
    MN_TRY(be->attn->rope(be, s->q, s->pos, N, z.H, z.Dh, z.rot, z.theta, 0));
    MN_TRY(be->attn->rope(be, s->k, s->pos, N, z.Hkv, z.Dh, z.rot, z.theta, 0));
    AttnDims ad = {B, T, z.H, z.Hkv, z.Dh, z.window, z.scale};
    AttnFwd io = {s->q, s->k, s->v, s->o, s->lse};
    MIXER_TIMED(m, &m->core_seconds, use_state ? attend_with_cache(m, s, &z, B, T) : be->attn->fwd(be, &ad, &io));
    return be->linear_fwd(be, y, s->o, w[W_O], z.o_bias ? w[W_OB] : NULL, N, z.Q, z.D);
}

static int attn_backward(Mixer *m, void *du, const void *dy) {
    const Backend *be = m->be;
    Attn *s = m->priv;
    if (!s->cap) return mn_error(MN_ERR_ARG, "%s: backward before any forward", m->ops->name);
    int B = s->B, T = s->T, N = B * T;
    Dims z = dims_of(m);
    void **w = m->w, **dw = m->dw;
    size_t n = (size_t)N;
    char *p = m->scratch->p;
    void *d_o = p, *d_q = at(be, p, n * z.Q), *d_k = at(be, p, 2 * n * z.Q), *d_v = at(be, p, 2 * n * z.Q + n * z.KV);
    MN_TRY(be->linear_bwd(be, d_o, dw[W_O], z.o_bias ? dw[W_OB] : NULL, dy, s->o, w[W_O], N, z.Q, z.D, 0));
    AttnDims ad = {B, T, z.H, z.Hkv, z.Dh, z.window, z.scale};
    AttnBwd io = {s->q, s->k, s->v, s->o, s->lse, d_o, d_q, d_k, d_v};
    MIXER_TIMED(m, &m->core_seconds, be->attn->bwd(be, &ad, &io));
    // positions: the forward's (0..T-1), still in s->pos
    MN_TRY(be->attn->rope(be, d_q, s->pos, N, z.H, z.Dh, z.rot, z.theta, 1));
    MN_TRY(be->attn->rope(be, d_k, s->pos, N, z.Hkv, z.Dh, z.rot, z.theta, 1));
    const void *u = s->u;
    MN_TRY(be->linear_bwd(be, du, dw[W_Q], NULL, d_q, u, w[W_Q], N, z.D, z.Q, 0));
    MN_TRY(be->linear_bwd(be, du, dw[W_K], NULL, d_k, u, w[W_K], N, z.D, z.KV, 1));
    MN_TRY(be->linear_bwd(be, du, dw[W_V], NULL, d_v, u, w[W_V], N, z.D, z.KV, 1));
    return MN_OK;
}

static int attn_reset_state(Mixer *m, int B) {
    const Backend *be = m->be;
    Attn *s = m->priv;
    Dims z = dims_of(m);
    if (B <= 0) return mn_error(MN_ERR_ARG, "%s: reset_state with B = %d", m->ops->name, B);
    if (s->state_B != B) {
        free_state(be, s);
        s->state_B = B;
        if (z.window) {
            size_t n = (size_t)B * z.window * z.KV;
            s->kc = be->alloc(be, n, MEM_ACT);
            s->vc = be->alloc(be, n, MEM_ACT);
            if (!s->kc || !s->vc) {
                free_state(be, s);
                return mn_error(MN_ERR_NOMEM, "%s: out of memory for a key/value cache of %d tokens", m->ops->name,
                                z.window);
            }
            s->ccap = z.window;
        }
    }
    // the cache's contents need no zeroing: only the slots written since are read
    s->seen = 0;
    return MN_OK;
}

static size_t kv_floats_per_token(const ModelConfig *c) {
    int hkv = c->n_kv_heads ? c->n_kv_heads : c->n_heads;
    return 2 * (size_t)hkv * c->head_dim;
}

static size_t mha_state_floats(const ModelConfig *c) {
    (void)c;
    return 0;  // all of it grows with the sequence: mha_state_floats_per_token
}

static size_t swa_state_floats(const ModelConfig *c) { return (size_t)c->window * kv_floats_per_token(c); }

static size_t zero_per_token(const ModelConfig *c) {
    (void)c;
    return 0;
}

static int attn_declare(const ModelConfig *c, const char *prefix, ParamSpec *out, int *n, int max) {
    int hkv = c->n_kv_heads ? c->n_kv_heads : c->n_heads;
    int64_t D = c->dim, Q = (int64_t)c->n_heads * c->head_dim, KV = (int64_t)hkv * c->head_dim;
    double in_std = 1 / sqrt((double)D), resid = pow((double)c->n_layers, -c->resid_scale);
    struct {
        const char *name;
        int64_t rows, cols;
        double std;
    } t[W_COUNT] = {{"q_proj", Q, D, in_std},
                    {"k_proj", KV, D, in_std},
                    {"v_proj", KV, D, in_std},
                    {"o_proj", D, Q, resid / sqrt((double)Q)}};
    // Hugging Face Llama's names under the llama architecture, RecurrentGemma's under recurrent_gemma,
    // fla's otherwise
    const char *layer = !strcmp(c->arch, "llama")             ? "self_attn."
                        : !strcmp(c->arch, "recurrent_gemma") ? "temporal_block."
                                                              : "attn.";
    char full[96];
    for (int i = 0; i < W_COUNT; i++) {
        int64_t shape[2] = {t[i].rows, t[i].cols};
        snprintf(full, sizeof full, "%s%s%s.weight", prefix, layer, t[i].name);
        if (param_add(out, n, max, full, 2, shape, INIT_NORMAL, t[i].std, 1) < 0)
            return mn_error(MN_ERR_ARG, "too many parameter tensors");
    }
    snprintf(full, sizeof full, "%s%so_proj.bias", prefix, layer);
    if (c->o_bias && param_add(out, n, max, full, 1, &D, INIT_CONST, 0, 0) < 0)
        return mn_error(MN_ERR_ARG, "too many parameter tensors");
    return MN_OK;
}

// RoPE rotates pairs (i, i + rot/2) of each head's first rot features: an even head_dim, and an even
// rope_dim of at most head_dim. The key/value heads divide the query heads; swa attends to at least
// the current token.
static int attn_validate(const ModelConfig *c, const char *where) {
    if (c->head_dim % 2)
        return mn_error(MN_ERR_ARG, "%s: head_dim = %d, but attention's rotary embedding (RoPE) rotates pairs of "
                                    "features: expected an even head_dim",
                        where, c->head_dim);
    if (c->rope_dim % 2 || c->rope_dim > c->head_dim)
        return mn_error(MN_ERR_ARG, "%s: rope_dim = %d, but RoPE rotates pairs of a head's first rope_dim features: "
                                    "expected 0 (all) or an even number up to head_dim = %d",
                        where, c->rope_dim, c->head_dim);
    int hkv = c->n_kv_heads ? c->n_kv_heads : c->n_heads;
    if (c->n_heads % hkv)
        return mn_error(MN_ERR_ARG, "%s: n_kv_heads = %d does not divide n_heads = %d (each key/value head serves "
                                    "n_heads / n_kv_heads query heads)",
                        where, c->n_kv_heads, c->n_heads);
    return MN_OK;
}

static int swa_validate(const ModelConfig *c, const char *where) {
    if (c->window < 1)
        return mn_error(MN_ERR_ARG, "%s: window = %d, but mixer swa attends to the last window tokens: expected at "
                                    "least 1",
                        where, c->window);
    return attn_validate(c, where);
}

// A preset made for swa attends to half its training context (at most 1024 tokens, the 125m and
// 400m sizes' window), so that the window is shorter than the sequences it trains on.
static void swa_preset(ModelConfig *c) { c->window = c->seq_len / 2 < 1024 ? c->seq_len / 2 : 1024; }

static int attn_create(Mixer *m) {
    const Backend *be = m->be;
    if (!be->attn || !be->attn->fwd || !be->attn->bwd || !be->attn->decode || !be->attn->rope || !be->copy_rows)
        return mixer_unsupported(m, "it has no attention kernels");
    Dims z = dims_of(m);
    AttnDims ad = {1, 1, z.H, z.Hkv, z.Dh, z.window, z.scale};
    if (be->attn->supports) MN_TRY(mixer_supports(m, be->attn->supports(be, &ad)));
    Attn *s = calloc(1, sizeof(Attn));
    if (!s) return mn_error(MN_ERR_NOMEM, "out of memory");
    m->priv = s;
    return MN_OK;
}

static void attn_destroy(Mixer *m) {
    Attn *s = m->priv;
    if (!s) return;
    free_buffers(m->be, s);
    free_state(m->be, s);
    free(s);
    m->priv = NULL;
}

const MixerOps mixer_mha = {
    .name = "mha",
    .about = "causal softmax attention with RoPE: o = softmax(D^-1/2 q k^T, causal) v, "
             "optionally grouped key/value heads (n_kv_heads)",
    .state_about = "a key/value cache that grows with the sequence: 2 n_kv_heads head_dim numbers per token",
    .no_graph = 1,
    .fields = CF_ROPE | CF_KV_HEADS | CF_O_BIAS,
    .declare = attn_declare,
    .validate = attn_validate,
    .activation_bytes = attn_activation_bytes,
    .scratch_elems = attn_scratch_elems,
    .create = attn_create,
    .forward = attn_forward,
    .backward = attn_backward,
    .reset_state = attn_reset_state,
    .state_floats = mha_state_floats,
    .collect = NULL,
    .destroy = attn_destroy,
    .state_floats_per_token = kv_floats_per_token,
};

const MixerOps mixer_swa = {
    .name = "swa",
    .about = "sliding-window softmax attention with RoPE over the last `window` tokens (the current one included)",
    .state_about = "a ring buffer of the last `window` keys and values: 2 window n_kv_heads head_dim numbers",
    .no_graph = 1,
    .fields = CF_ROPE | CF_KV_HEADS | CF_WINDOW | CF_O_BIAS,
    .declare = attn_declare,
    .validate = swa_validate,
    .preset = swa_preset,
    .activation_bytes = attn_activation_bytes,
    .scratch_elems = attn_scratch_elems,
    .create = attn_create,
    .forward = attn_forward,
    .backward = attn_backward,
    .reset_state = attn_reset_state,
    .state_floats = swa_state_floats,
    .collect = NULL,
    .destroy = attn_destroy,
    .state_floats_per_token = zero_per_token,
};
