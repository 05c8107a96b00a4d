/*
 * The language model: parameters, forward, backward, decoding (model.h).
 */
#include "model.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/half.h"
#include "model/names.h"
#include "model/norm.h"

// A view `elems` elements into a backend buffer.
static void *at(const Model *m, void *base, size_t elems, MemKind k) {
    return (char *)base + elems * m->be->elem_size(m->be, k);
}

// The role of tensors [from, n) (declare_all).
static void set_roles(ParamSpec *s, int from, int n, ParamRole role) {
    for (int i = from; i < n; i++) {
        s[i].role = role;
        s[i].block = -1;  // (the blocks' own: set after them)
    }
}

// Declares every tensor of the model in checkpoint order: the embedding, each block (attn_norm,
// the mixer's tensors, then its feed-forward half's: ffn_declare), the final norm and, unless
// tied, the head. With the autoencoder head its tensors (ae_declare) replace the final norm and the
// head; *norm_f and *head then name its first and its unembedding (block_offset: the tensors after
// the blocks).
static int declare_all(const ModelConfig *c, ParamSpec *s, int *n, BlockParams *blocks, int *embed, int *norm_f,
                       int *head, AeHead *ae) {
    int64_t D = c->dim, V = c->vocab_size;
    int max = MODEL_MAX_PARAMS;
    int64_t vd[2] = {V, D}, d1[1] = {D};
    // Embedding N(0, 1/D): with the sqrt(D) scale the residual stream starts at variance 1.
    // Tensor names: the architecture's home implementation's (names.h).
    const ArchNames *an = arch_names(c);
    *embed = param_add(s, n, max, an->embed, 2, vd, INIT_NORMAL, 1 / sqrt((double)D), 0);
    set_roles(s, 0, *n, ROLE_EMBED);
    size_t ffn_off = 0;
    for (int l = 0; l < c->n_layers; l++) {
        char pre[64], name[96];
        snprintf(pre, sizeof pre, an->block, l);
        BlockParams *b = &blocks[l];
        snprintf(name, sizeof name, "%s%s.weight", pre, an->mixer_norm);
        b->attn_norm = param_add(s, n, max, name, 1, d1, INIT_CONST, 1, 0);
        if (b->attn_norm < 0) return mn_error(MN_ERR_ARG, "too many parameter tensors");
        s[b->attn_norm].file_offset = norm_file_offset(c);
        set_roles(s, b->attn_norm, *n, ROLE_NORM);
        int first = *n - 1;
        b->first = *n;
        const MixerOps *ops = mixer_at(c, l);
        if (!ops) return MN_ERR_ARG;
        MN_TRY(ops->declare(c, pre, s, n, max));
        b->count = *n - b->first;
        set_roles(s, b->first, *n, ROLE_MIXER);
        int f0 = *n;
        MN_TRY(ffn_declare(c, ffn_block_shape(c, ops), pre, s, n, max, &b->ffn));
        set_roles(s, f0, *n, ROLE_FFN);
        if (b->ffn.norm >= 0) s[b->ffn.norm].role = ROLE_NORM;
        b->ffn_off = ffn_off;
        ffn_off += (size_t)b->ffn.F;
        for (int i = first; i < *n; i++) s[i].block = l;
    }
    if (!strcmp(c->head, "autoencoder")) {
        int h0 = *n;
        MN_TRY(ae_declare(c, s, n, max, ae));
        set_roles(s, h0, *n, ROLE_HEAD);
        *norm_f = ae->norm0, *head = ae->wout;
        return MN_OK;
    }
    *norm_f = param_add(s, n, max, an->final_norm, 1, d1, INIT_CONST, 1, 0);
    *head = c->tie_embeddings ? *embed : param_add(s, n, max, "lm_head.weight", 2, vd, INIT_NORMAL, 1 / sqrt((double)D), 1);
    if (*norm_f < 0 || *head < 0) return mn_error(MN_ERR_ARG, "too many parameter tensors");
    s[*norm_f].role = ROLE_NORM;
    s[*norm_f].file_offset = norm_file_offset(c);
    if (!c->tie_embeddings) s[*head].role = ROLE_HEAD;
    return MN_OK;
}

// A config a model can be built from (its mixers valid: config_validate checks the pattern).
static int usable_config(const ModelConfig *c) {
    MN_TRY(config_validate(c, "model config"));
    if (c->vocab_size <= 0) return mn_error(MN_ERR_ARG, "model config: vocab_size is not set (0 means: from the data)");
    return MN_OK;
}

size_t model_state_floats(const ModelConfig *c) {
    size_t n = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const MixerOps *ops = mixer_at(c, l);
        if (ops) n += ops->state_floats(c);
    }
    return n;
}

size_t model_state_floats_per_token(const ModelConfig *c) {
    size_t n = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const MixerOps *ops = mixer_at(c, l);
        if (ops && ops->state_floats_per_token) n += ops->state_floats_per_token(c);
    }
    return n;
}

int model_uses_cg(const ModelConfig *c) {
    for (int l = 0; l < c->n_layers; l++)
        if (mixer_at(c, l) && mixer_at(c, l)->uses_cg) return 1;
    return 0;
}

int model_specs(const ModelConfig *c, ParamSpec **specs, int *n) {
    MN_TRY(usable_config(c));
    *specs = calloc(MODEL_MAX_PARAMS, sizeof(ParamSpec));
    BlockParams *blocks = calloc((size_t)c->n_layers, sizeof(BlockParams));
    int e, f, h, s = (!*specs || !blocks) ? mn_error(MN_ERR_NOMEM, "out of memory") : MN_OK;
    AeHead ae = {0};
    *n = 0;
    if (!s) s = declare_all(c, *specs, n, blocks, &e, &f, &h, &ae);
    free(blocks);
    if (s) {
        free(*specs);
        *specs = NULL;
    }
    return s;
}

static double gib(double bytes) { return bytes / (1024.0 * 1024.0 * 1024.0); }

// The weights and their gradients against what the backend can still give.
static int check_params_fit(const Model *m) {
    const Backend *be = m->be;
    double need = (double)m->runs * (double)m->total * (double)(be->elem_size(be, MEM_PARAM) + be->elem_size(be, MEM_F32));
    size_t avail = be->mem_available ? be->mem_available(be) : SIZE_MAX;
    if (avail == SIZE_MAX || need <= (double)avail) return MN_OK;
    return mn_error(MN_ERR_NOMEM,
                    "model: %d x %zu parameters need about %.0f bytes (%.2f GiB) for the weights and their gradients, "
                    "but %zu bytes (%.2f GiB) are available on backend '%s'",
                    m->runs, m->count, need, gib(need), avail, gib((double)avail), be->name);
}

int model_create(Model **out, const ModelConfig *cfg, const Backend *be) { return model_create_runs(out, cfg, be, 1); }

int model_create_runs(Model **out, const ModelConfig *cfg, const Backend *be, int runs) {
    MN_TRY(usable_config(cfg));
    if (runs < 1) return mn_error(MN_ERR_ARG, "model: %d runs (at least 1)", runs);
    Model *m = calloc(1, sizeof *m);
    if (!m) return mn_error(MN_ERR_NOMEM, "out of memory");
    m->runs = runs;
    if (runs > 1) {  // the ops go through the backend that tells the runs apart
        int st = (m->rb = malloc(sizeof *m->rb)) ? runs_backend_init(m->rb, be, runs) : mn_error(MN_ERR_NOMEM, "out of memory");
        if (st) {
            free(m->rb);
            free(m);
            return st;
        }
        be = &m->rb->be;
    }
    m->cfg = *cfg;
    config_normalize(&m->cfg);  // what the model does not read stays out of its saved config
    m->be = be;
    m->solver = mn_solver_default();
    m->solver.max_steps = cfg->cg_steps;
    m->use_graphs = be->graph_begin != NULL;
    int st = MN_OK;
    m->specs = calloc(MODEL_MAX_PARAMS, sizeof(ParamSpec));
    m->blocks = calloc((size_t)cfg->n_layers, sizeof(BlockParams));
    m->mixers = calloc((size_t)cfg->n_layers, sizeof(Mixer));
    if (!m->specs || !m->blocks || !m->mixers) {
        st = mn_error(MN_ERR_NOMEM, "out of memory");
        goto fail;
    }
    for (int l = 0; l < cfg->n_layers; l++) {  // block l's own mixer (a pattern repeats over the blocks)
        const MixerOps *ops = mixer_at(&m->cfg, l);
        if (!ops) {
            st = MN_ERR_ARG;
            goto fail;
        }
        m->mixers[l].ops = ops;
        if (ops->no_graph) m->use_graphs = 0;  // attention: n, the slot and positions change per step
        m->mixers[l].be = be;
        m->mixers[l].cfg = &m->cfg;
        m->mixers[l].scratch = &m->scratch;
        if ((st = ops->create(&m->mixers[l]))) goto fail;
    }
    if ((st = declare_all(&m->cfg, m->specs, &m->nparams, m->blocks, &m->embed, &m->norm_f, &m->head, &m->ae))) goto fail;
    for (int l = 0; l < cfg->n_layers; l++) {
        const Ffn *f = &m->blocks[l].ffn;
        m->ffn_sum += (size_t)f->F;
        m->ffn_max = (size_t)f->F > m->ffn_max ? (size_t)f->F : m->ffn_max;
        if ((f->kind == FFN_GEGLU && (!be->geglu_fwd || !be->geglu_bwd)) ||
            (f->kind == FFN_GEGLU_TANH && (!be->geglu_tanh_fwd || !be->geglu_tanh_bwd))) {
            st = mn_error(MN_ERR_UNSUPPORTED, "block %d (mixer %s): its GELU-gated feed-forward part is not available on "
                                              "the %s backend yet",
                          l, m->mixers[l].ops->name, be->name);
            goto fail;
        }
    }
    // Tensors start 16-byte aligned in their bf16 copies on the GPU: cuBLAS runs its fast kernels
    // only on aligned operands. (Packed, a bias of 6 elements misaligned every tensor after it,
    // and half the model's products ran 4-byte-aligned Ampere kernels.)
    for (int i = 0; i < m->nparams; i++) {
        m->specs[i].offset = m->total = (m->total + 7) / 8 * 8;
        m->total += m->specs[i].numel;
        m->count += m->specs[i].numel;
    }
    if ((st = check_params_fit(m))) goto fail;
    m->params = be->alloc(be, (size_t)runs * m->total, MEM_PARAM);
    m->grads = be->alloc(be, (size_t)runs * m->total, MEM_F32);  // float32 gradients on every backend
    m->p = calloc((size_t)m->nparams, sizeof(void *));
    m->g = calloc((size_t)m->nparams, sizeof(void *));
    if (!m->params || !m->grads || !m->p || !m->g) {
        st = mn_error(MN_ERR_NOMEM, "model: out of memory for %zu parameters", m->total);
        goto fail;
    }
    for (int i = 0; i < m->nparams; i++) {
        m->p[i] = at(m, m->params, m->specs[i].offset, MEM_PARAM);
        m->g[i] = at(m, m->grads, m->specs[i].offset, MEM_F32);
    }
    if (m->rb)
        runs_backend_slabs(m->rb, m->params, m->total * be->elem_size(be, MEM_PARAM), m->grads,
                           m->total * be->elem_size(be, MEM_F32));
    for (int l = 0; l < cfg->n_layers; l++) {
        m->mixers[l].w = m->p + m->blocks[l].first;
        m->mixers[l].dw = m->g + m->blocks[l].first;
        m->mixers[l].solver = m->solver;
    }
    *out = m;
    return MN_OK;
fail:
    model_free(m);
    return st;
}

// The model's own activation buffers for N tokens (its blocks' FFN widths summed and largest):
// their elements per token and kinds. One table serves the allocation and the memory estimate.
enum { MODEL_BUFS = 20 };

static void model_buffers(Model *m, size_t L, size_t D, size_t V, size_t fsum, size_t fmax, MixerBuf *out) {
    MixerBuf d[MODEL_BUFS] = {
        {&m->tokens, 1, 0, MEM_I32},     {&m->targets, 1, 0, MEM_I32},    {&m->x, (L + 1) * D, 0, MEM_ACT},
        {&m->mid, L * D, 0, MEM_ACT},    {&m->n1, D, 0, MEM_ACT},         {&m->n2, D, 0, MEM_ACT},
        {&m->r1, L * NORM_STATS, 0, MEM_F32}, {&m->r2, L * NORM_STATS, 0, MEM_F32},         {&m->gate, fsum, 0, MEM_ACT},
        {&m->up, fsum, 0, MEM_ACT},      {&m->act, fsum, 0, MEM_ACT},     {&m->xf, D, 0, MEM_ACT},
        {&m->rf, NORM_STATS, 0, MEM_F32},         {&m->logits, V, 0, MEM_ACT},     {&m->losses, 1, 0, MEM_F32},
        {&m->dx, D, 0, MEM_ACT},         {&m->dn, D, 0, MEM_ACT},         {&m->dact, fmax, 0, MEM_ACT},
        {&m->dgate, fmax, 0, MEM_ACT},   {&m->dup, fmax, 0, MEM_ACT},
    };
    memcpy(out, d, sizeof d);
}

static void drop_graph(Model *m) { recorded_reset(&m->graph, m->be); }

static void free_activations(Model *m) {
    MixerBuf d[MODEL_BUFS];
    model_buffers(m, 0, 0, 0, 0, 0, d);
    mixer_bufs_free(m->be, d, MODEL_BUFS);
    ae_free(m);
    m->cap = 0;
    m->act_gen++;   // recordings point into them
    drop_graph(m);
}

void model_free(Model *m) {
    if (!m) return;
    free_activations(m);
    if (m->mixers)
        for (int l = 0; l < m->cfg.n_layers; l++)
            if (m->mixers[l].ops && m->mixers[l].priv) m->mixers[l].ops->destroy(&m->mixers[l]);
    if (m->scratch.p) m->be->free(m->be, m->scratch.p);
    if (m->params) m->be->free(m->be, m->params);
    if (m->grads) m->be->free(m->be, m->grads);
    free(m->p);
    free(m->g);
    free(m->mixers);
    free(m->blocks);
    free(m->specs);
    free(m->rb);  // (last: the frees above went through it)
    free(m);
}

int model_find_param(const Model *m, const char *name) {
    for (int i = 0; i < m->nparams; i++)
        if (!strcmp(m->specs[i].name, name)) return i;
    return -1;
}

// Forget-gate biases: gamma_h = 1 - 10^(-1 - 2h/(H-1)), from 0.9 (short memory)
// to 0.999 (long), so that heads start at different time scales.
static double forget_bias(int h, int H) {
    double one_minus = pow(10.0, -1.0 - 2.0 * h / (H > 1 ? H - 1 : 1));
    return log((1 - one_minus) / one_minus);
}

// Element e of an sLSTM's biases [4, H, Dh] in block s->block of L (INIT_SLSTM_BIAS).
static double slstm_bias(const ParamSpec *s, size_t e, int L) {
    size_t Dh = (size_t)s->shape[2], per_gate = s->numel / 4;
    if (e / per_gate != 1) return 0;  // only the forget gate's
    double j = (double)(e % Dh), r = L > 1 ? (double)s->block / (L - 1) : 0;
    return 5 - 12 * pow(Dh > 1 ? j / (double)(Dh - 1) : 0, 0.3 + 1.3 * r);
}

Model model_run_view(const Model *m, int r) {
    Model v = *m;
    v.be = m->rb ? m->rb->in : m->be;
    v.runs = 1, v.rb = NULL;
    v.params = at(m, m->params, (size_t)r * m->total, MEM_PARAM);
    v.grads = at(m, m->grads, (size_t)r * m->total, MEM_F32);
    v.p = v.g = NULL;  // (per-tensor views are run 0's: a view's readers go by specs' offsets)
    return v;
}

// Run r's tensor i (its slab r total elements past run 0's).
static void *run_param(const Model *m, int i, int r) { return at(m, m->p[i], (size_t)r * m->total, MEM_PARAM); }

static int init_run(Model *m, int run, uint64_t seed) {
    enum { CHUNK = 1 << 20 };
    double *buf = malloc(sizeof(double) * CHUNK);
    if (!buf) return mn_error(MN_ERR_NOMEM, "out of memory");
    int st = MN_OK;
    for (int i = 0; i < m->nparams && !st; i++) {
        const ParamSpec *s = &m->specs[i];
        MnRng r;
        mn_rng_seed(&r, seed * 1000003ull + (uint64_t)i);  // per tensor: independent of the others' sizes
        for (size_t off = 0; off < s->numel && !st; off += CHUNK) {
            size_t n = s->numel - off < CHUNK ? s->numel - off : CHUNK;
            for (size_t j = 0; j < n; j++) {
                switch (s->init) {
                case INIT_NORMAL: buf[j] = s->init_value * mn_rng_normal(&r); break;
                case INIT_CONST: buf[j] = s->init_value; break;
                case INIT_FORGET_BIAS: buf[j] = forget_bias((int)(off + j), (int)s->numel); break;
                case INIT_A_LOG: buf[j] = log(16 * (1 - mn_rng_uniform(&r))); break;  // A in (0, 16]
                case INIT_LINSPACE_3_6: buf[j] = s->numel > 1 ? 3 + 3.0 * (double)(off + j) / (double)(s->numel - 1) : 3; break;
                case INIT_SLSTM_BIAS: buf[j] = slstm_bias(s, off + j, m->cfg.n_layers); break;
                case INIT_RGLRU_LAMBDA: {
                    double u = 0.81 + 1e-8 + (0.998001 - 0.81) * mn_rng_uniform(&r);  // a^2, transformers' range
                    buf[j] = log(1 / sqrt(u) - 1);
                    break;
                }
                case INIT_DT_BIAS: {
                    double dt = exp(log(1e-3) + mn_rng_uniform(&r) * (log(1e-1) - log(1e-3)));
                    dt = dt < 1e-4 ? 1e-4 : dt;
                    buf[j] = dt + log(-expm1(-dt));  // softplus^-1
                    break;
                }
                }
            }
            st = m->be->upload(m->be, at(m, run_param(m, i, run), off, MEM_PARAM), buf, n, MEM_PARAM);
        }
    }
    free(buf);
    return st;
}

int model_init_params_runs(Model *m, const uint64_t *seeds) {
    for (int r = 0; r < m->runs; r++) MN_TRY(init_run(m, r, seeds[r]));
    return MN_OK;
}

int model_init_params(Model *m, uint64_t seed) {
    for (int r = 0; r < m->runs; r++) MN_TRY(init_run(m, r, seed));
    return MN_OK;
}

// Bytes per token of every activation buffer: the model's (model_buffers), each block's mixer's
// (MixerOps.activation_bytes), the largest of the mixers' shares of the shared scratch and the
// autoencoder head's. An estimate for refusing batches that cannot fit, so it errs on neither side
// by much: the CPU kernels' per-thread workspaces, which do not grow with the batch, are left out.
static size_t activation_bytes_per_token(const ModelConfig *c, const Backend *be) {
    size_t fsum = 0, fmax = 0, mixers = 0, scratch = 0;
    for (int l = 0; l < c->n_layers; l++) {
        const MixerOps *ops = mixer_at(c, l);
        if (!ops) continue;  // (a valid config has none such)
        size_t F = (size_t)ffn_width(c, ffn_block_shape(c, ops));
        fsum += F;
        fmax = F > fmax ? F : fmax;
        mixers += ops->activation_bytes(c, be);
        size_t sc = ops->scratch_elems(c);
        scratch = sc > scratch ? sc : scratch;
    }
    Model dummy;
    MixerBuf d[MODEL_BUFS];
    model_buffers(&dummy, (size_t)c->n_layers, (size_t)c->dim, (size_t)c->vocab_size, fsum, fmax, d);
    return mixer_bufs_bytes(be, d, MODEL_BUFS) + mixers + scratch * be->elem_size(be, MEM_ACT) +
           ae_activation_bytes_per_token(c, be);
}

size_t model_activation_bytes(const ModelConfig *c, const Backend *be, size_t N) {
    size_t per = activation_bytes_per_token(c, be);
    return N && per > SIZE_MAX / N ? SIZE_MAX : per * N;
}

int model_check_batch(const Model *m, int B, int T, const MemNeeds *needs) {
    const Backend *be = m->be;
    if (B <= 0 || T <= 0) return mn_error(MN_ERR_ARG, "model: a batch of %d sequences of %d tokens", B, T);
    const char *what = needs && needs->what ? needs->what : "model";
    int device = be->device_mem_used != NULL;  // the buffers in device memory, the caller's on the host
    int sharers = needs && needs->sharers > 1 ? needs->sharers : 1;
    double per_act = (double)model_activation_bytes(&m->cfg, be, (size_t)T);
    double per_host = needs ? (double)needs->host_per_seq : 0;
    // The current activations are freed before the new ones are made: they count as available.
    size_t av = be->mem_available ? be->mem_available(be) : SIZE_MAX;
    double held = (double)model_activation_bytes(&m->cfg, be, (size_t)m->cap);
    double avail = av == SIZE_MAX ? INFINITY : (double)av + held;
    double host_avail = device ? (double)host_mem_available() : avail;
    if (host_avail >= (double)SIZE_MAX) host_avail = INFINITY;
    host_avail /= sharers;
    if (!device) avail = host_avail;
    // The largest batch each pool of memory allows, and the smaller of the two.
    double per_pool = device ? per_act : per_act + per_host;
    double fit = per_pool > 0 ? floor(avail / per_pool) : INFINITY;
    double fit_host = device && per_host > 0 ? floor(host_avail / per_host) : INFINITY;
    if (fmin(fit, fit_host) >= (double)B) return MN_OK;
    int host_short = fit_host < fit;
    double need = host_short ? per_host * B : per_pool * B, have = host_short ? host_avail : avail;
    double model_bytes = (double)m->total * (double)(be->elem_size(be, MEM_PARAM) + be->elem_size(be, MEM_F32));
    // The batch suggested leaves room for what the estimate leaves out (the backends' own
    // workspaces: measured 6% beyond it for the 1b config on an H100, at 2048 tokens a sequence).
    const double margin = 1.15;
    double fits = fmin(floor(avail / (per_pool * margin)), (double)B);
    if (device && per_host > 0) fits = fmin(fits, floor(host_avail / (per_host * margin)));
    char advice[160];
    if (fits >= 1)
        snprintf(advice, sizeof advice, "a batch of at most %.0f sequences of %d tokens fits", fits, T);
    else
        snprintf(advice, sizeof advice, "not even one sequence of %d tokens fits: try shorter sequences or a smaller model", T);
    return mn_error(MN_ERR_NOMEM,
                    "%s: a batch of %d sequences of %d tokens needs about %.0f bytes (%.2f GiB) of %s memory (%s), besides "
                    "the %.0f bytes (%.2f GiB) of parameters and gradients%s, but %.0f bytes (%.2f GiB) are available%s; %s",
                    what, B, T, need, gib(need), host_short || !device ? "host" : "device",
                    host_short ? "the batch's token buffers" : device ? "activations" : "activations and token buffers",
                    model_bytes + (needs ? (double)needs->held : 0), gib(model_bytes + (needs ? (double)needs->held : 0)),
                    needs && needs->held ? " and optimizer state" : "", have, gib(have),
                    sharers > 1 ? " to each of the processes sharing the host" : "", advice);
}

static int ensure_capacity(Model *m, int B, int T) {
    int N = B * T;  // (the callers checked that it is an int)
    if (N <= m->cap) return MN_OK;
    MN_TRY(model_check_batch(m, B, T, NULL));
    free_activations(m);
    size_t n = (size_t)N;
    MixerBuf d[MODEL_BUFS];
    model_buffers(m, (size_t)m->cfg.n_layers, (size_t)m->cfg.dim, (size_t)m->cfg.vocab_size, m->ffn_sum, m->ffn_max, d);
    MN_TRY(mixer_bufs_alloc(m->be, d, MODEL_BUFS, n));
    if (m->ae.on && ae_alloc(m, n)) {
        free_activations(m);
        return MN_ERR_NOMEM;
    }
    m->cap = N;
    return MN_OK;
}

static int check_tokens(const Model *m, const int32_t *tokens, const int32_t *targets, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (tokens[i] < 0 || tokens[i] >= m->cfg.vocab_size)
            return mn_error(MN_ERR_ARG, "token %d at position %zu is outside the vocabulary [0, %d)", tokens[i], i,
                            m->cfg.vocab_size);
        if (targets && targets[i] >= m->cfg.vocab_size)
            return mn_error(MN_ERR_ARG, "target %d at position %zu is outside the vocabulary [0, %d)", targets[i], i,
                            m->cfg.vocab_size);
    }
    return MN_OK;
}

// Block l's FFN activations and the temporaries all blocks share, over N tokens.
static FfnActs ffn_acts(const Model *m, int l, size_t N) {
    const BlockParams *bp = &m->blocks[l];
    FfnActs a = {at(m, m->gate, bp->ffn_off * N, MEM_ACT), at(m, m->up, bp->ffn_off * N, MEM_ACT),
                 at(m, m->act, bp->ffn_off * N, MEM_ACT), at(m, m->r2, l * N * NORM_STATS, MEM_F32)};
    return a;
}

static FfnShared ffn_shared(const Model *m) {
    FfnShared s = {m->n2, m->dn, m->dact, m->dgate, m->dup};
    return s;
}

// The blocks and the final norm over N = B*T tokens (embedding already in x[0]).
static int forward_blocks(Model *m, int B, int T, int use_state) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    size_t N = (size_t)B * T, D = (size_t)c->dim;
    m->fwd_B = B, m->fwd_T = T, m->fwd_state = use_state;
    FfnShared sh = ffn_shared(m);
    for (int l = 0; l < c->n_layers; l++) {
        const BlockParams *bp = &m->blocks[l];
        void *x = at(m, m->x, l * N * D, MEM_ACT), *xn = at(m, m->x, (l + 1) * N * D, MEM_ACT);
        void *mid = at(m, m->mid, l * N * D, MEM_ACT), *n1 = m->n1;
        void *r1 = at(m, m->r1, l * N * NORM_STATS, MEM_F32);
        // u = x + Mixer(RMSNorm(x))
        MN_TRY(norm_fwd(be, norm_kind(c), n1, r1, x, m->p[bp->attn_norm], (int)N, (int)D, c->norm_eps));
        Mixer *mx = &m->mixers[l];
        mx->solver = m->solver;
        mx->profile = m->profile;
        MIXER_TIMED(mx, &m->mixer_seconds, mx->ops->forward(mx, mid, n1, B, T, use_state));
        MN_TRY(be->add(be, mid, x, N * D));
        // x' = u + FFN(RMSNorm(u))
        FfnActs a = ffn_acts(m, l, N);
        MN_TRY(ffn_forward(be, &bp->ffn, m->p, &a, &sh, mid, xn, (int)N, (int)D, c->norm_eps));
    }
    if (m->ae.on) return MN_OK;  // the autoencoder head decodes x_L itself (ae_forward)
    void *xl = at(m, m->x, (size_t)c->n_layers * N * D, MEM_ACT);
    return norm_fwd(be, norm_kind(c), m->xf, m->rf, xl, m->p[m->norm_f], (int)N, (int)D, c->norm_eps);
}

// sqrt(D) where the architecture scales the embedding; RecurrentGemma's is a bf16 constant (its
// `normalizer` buffer: sqrt(2560) = 50.596 multiplies as 50.5).
static float embed_scale(const ModelConfig *c) {
    if (!c->embed_scale) return 1.0f;
    float s = (float)sqrt((double)c->dim);
    return strcmp(c->arch, "recurrent_gemma") ? s : bf16_to_f32(f32_to_bf16(s));
}

// The checks and buffers of a forward over B sequences of T tokens (host arrays; targets may be NULL).
static int forward_begin(Model *m, const char *who, const int32_t *tokens, const int32_t *targets, int B, int T) {
    if (B <= 0 || T <= 0) return mn_error(MN_ERR_ARG, "%s: B = %d, T = %d must be > 0", who, B, T);
    size_t N = (size_t)B * T;
    if (N > INT_MAX) return mn_error(MN_ERR_ARG, "%s: B x T = %d x %d tokens, at most %d", who, B, T, INT_MAX);
    MN_TRY(check_tokens(m, tokens, targets, N));
    MN_TRY(ensure_capacity(m, B, T));
    m->B = B;
    m->T = T;
    m->grad_ready = 0;
    return MN_OK;
}

// The forward's ops from the tokens in m->tokens: the logits, and with targets (in m->targets)
// the per-token losses and, where grad_weight != 0, the gradient of grad_weight (or of the value
// at weight_at) times their sum in place of the logits.
static int forward_ops(Model *m, int targets, float grad_weight, const void *weight_at) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int N = m->B * m->T;
    MN_TRY(be->embed_fwd(be, m->x, m->tokens, m->p[m->embed], N, c->dim, embed_scale(c)));
    MN_TRY(forward_blocks(m, m->B, m->T, 0));
    if (m->ae.on) MN_TRY(ae_forward(m));
    else MN_TRY(be->linear_fwd(be, m->logits, m->xf, m->p[m->head], NULL, N, c->dim, c->vocab_size));
    if (!targets) return MN_OK;
    MN_TRY(be->xent(be, m->logits, m->losses, m->targets, N, c->vocab_size, c->logit_cap, grad_weight, weight_at));
    m->grad_ready = grad_weight != 0;
    return MN_OK;
}

int model_forward(Model *m, const int32_t *tokens, const int32_t *targets, int B, int T, float grad_weight,
                  double *loss) {
    const Backend *be = m->be;
    MN_TRY(forward_begin(m, "model_forward", tokens, targets, B, T));
    size_t N = (size_t)B * T;
    MN_TRY(be->upload_i32(be, m->tokens, tokens, N));
    if (targets) MN_TRY(be->upload_i32(be, m->targets, targets, N));
    MN_TRY(forward_ops(m, targets != NULL, grad_weight, NULL));
    if (!targets || !loss) return MN_OK;
    // summed in double from the backend's own precision (the reference's gradient checks need it),
    // in order, as Backend.sum_f32 sums them for a training step
    double *l = malloc(sizeof(double) * N);
    if (!l) return mn_error(MN_ERR_NOMEM, "out of memory");
    int st = be->download(be, l, m->losses, N, MEM_F32);
    double sum = 0;
    for (size_t i = 0; i < N; i++) sum += l[i];
    free(l);
    MN_TRY(st);
    *loss = sum;
    return MN_OK;
}

int model_train_begin(Model *m, const int32_t *tokens, const int32_t *targets, int B, int T) {
    return forward_begin(m, "model_train_begin", tokens, targets, B, T);
}

int model_train_ops(Model *m, const void *tokens, const void *targets, const void *weight, void *loss) {
    const Backend *be = m->be;
    size_t N = (size_t)m->B * m->T;
    be->copy(be, m->tokens, tokens, N, MEM_I32);
    be->copy(be, m->targets, targets, N, MEM_I32);
    MN_TRY(forward_ops(m, 1, 1.0f, weight));  // (1: a gradient is wanted; its weight is at `weight`)
    MN_TRY(be->sum_f32(be, loss, m->losses, N));
    return model_backward(m);
}

// Hands the slab's elements [from, to) to the grads_done hook, if any.
static int grads_done(Model *m, size_t from, size_t to) {
    return m->grads_done ? m->grads_done(m->grads_done_arg, at(m, m->grads, from, MEM_F32), to - from) : MN_OK;
}

// Where block l's tensors begin in the slab (l = n_layers: the final norm's): the blocks, the
// final norm and the head follow the embedding in this order (declare_all).
static size_t block_offset(const Model *m, int l) {
    return m->specs[l < m->cfg.n_layers ? m->blocks[l].attn_norm : m->norm_f].offset;
}

int model_backward(Model *m) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    int B = m->B, T = m->T;
    size_t N = (size_t)B * T, D = (size_t)c->dim;
    if (!m->grad_ready) return mn_error(MN_ERR_ARG, "model_backward: the last forward had no targets and grad_weight");
    m->grad_ready = 0;
    // logits now hold dloss/dlogits (model_forward with grad_weight)
    if (m->ae.on) {
        MN_TRY(ae_backward(m));  // into dx, the gradient of the stream leaving the last block
    } else {
        MN_TRY(be->linear_bwd(be, m->dn, m->g[m->head], NULL, m->logits, m->xf, m->p[m->head], (int)N, (int)D,
                              c->vocab_size, 0));
        void *xl = at(m, m->x, (size_t)c->n_layers * N * D, MEM_ACT);
        MN_TRY(norm_bwd(be, norm_kind(c), m->dx, m->g[m->norm_f], m->dn, xl, m->p[m->norm_f], m->rf, (int)N, (int)D, 0));
    }
    MN_TRY(grads_done(m, block_offset(m, c->n_layers), m->total));  // the final norm (or the autoencoder head)
                                                                    // and an untied head
    FfnShared sh = ffn_shared(m);
    for (int l = c->n_layers - 1; l >= 0; l--) {
        const BlockParams *bp = &m->blocks[l];
        void *x = at(m, m->x, l * N * D, MEM_ACT), *mid = at(m, m->mid, l * N * D, MEM_ACT);
        void *r1 = at(m, m->r1, l * N * NORM_STATS, MEM_F32);
        // FFN: dx (the gradient of x') flows to u directly and through the FFN
        FfnActs a = ffn_acts(m, l, N);
        MN_TRY(ffn_backward(be, &bp->ffn, m->p, m->g, &a, &sh, mid, m->dx, (int)N, (int)D, c->norm_eps));
        // mixer: dx (now the gradient of u) flows to x directly and through the mixer, whose
        // input (n1) must hold its forward's values again
        MN_TRY(norm_fwd(be, norm_kind(c), m->n1, r1, x, m->p[bp->attn_norm], (int)N, (int)D, c->norm_eps));
        Mixer *mx = &m->mixers[l];
        mx->solver = m->solver;
        mx->profile = m->profile;
        MIXER_TIMED(mx, &m->mixer_seconds, mx->ops->backward(mx, m->dn, m->dx));
        MN_TRY(norm_bwd(be, norm_kind(c), m->dx, m->g[bp->attn_norm], m->dn, x, m->p[bp->attn_norm], r1, (int)N,
                        (int)D, 1));
        MN_TRY(grads_done(m, block_offset(m, l), block_offset(m, l + 1)));
    }
    MN_TRY(be->embed_bwd(be, m->g[m->embed], m->dx, m->tokens, (int)N, (int)D, embed_scale(c)));
    return grads_done(m, 0, block_offset(m, 0));  // the embedding (and a tied head)
}

int model_zero_grad(Model *m) {
    m->be->zero(m->be, m->grads, (size_t)m->runs * m->total, MEM_F32);
    return MN_OK;
}

int model_losses(const Model *m, float *out) {
    return m->be->download_f32(m->be, out, m->losses, (size_t)m->B * m->T, MEM_F32);
}

int model_reset_state(Model *m, int B) {
    if (B <= 0) return mn_error(MN_ERR_ARG, "model_reset_state: B = %d must be > 0", B);
    if (m->runs > 1)
        return mn_error(MN_ERR_ARG, "model: a model of %d runs trains and scores; it does not decode", m->runs);
    if (m->ae.on)
        return mn_error(MN_ERR_ARG, "model: the autoencoder head decodes a whole sequence from its last position; it "
                                    "has no token-by-token decoding");
    if (B != m->state_B) drop_graph(m);  // the states are reallocated
    for (int l = 0; l < m->cfg.n_layers; l++) MN_TRY(m->mixers[l].ops->reset_state(&m->mixers[l], B));
    m->state_B = B;
    return MN_OK;
}

// The ops of a decode call whose tokens are already on the backend: logits [B, V] of each
// sequence's last token into m->logits.
static int decode_ops(Model *m, int B, int T) {
    const Backend *be = m->be;
    const ModelConfig *c = &m->cfg;
    size_t N = (size_t)B * T, D = (size_t)c->dim;
    MN_TRY(be->embed_fwd(be, m->x, m->tokens, m->p[m->embed], (int)N, (int)D, embed_scale(c)));
    MN_TRY(forward_blocks(m, B, T, 1));
    const void *last = m->xf;  // with T = 1 the rows are the last tokens already
    if (T > 1) {
        for (int b = 0; b < B; b++)
            be->copy(be, at(m, m->dn, (size_t)b * D, MEM_ACT), at(m, m->xf, ((size_t)b * T + T - 1) * D, MEM_ACT), D,
                     MEM_ACT);
        last = m->dn;
    }
    MN_TRY(be->linear_fwd(be, m->logits, last, m->p[m->head], NULL, B, (int)D, c->vocab_size));
    return c->logit_cap > 0 ? be->softcap(be, m->logits, (size_t)B * c->vocab_size, c->logit_cap) : MN_OK;
}

int model_solver_same(const MnSolver *a, const MnSolver *b) {
    return a->max_steps == b->max_steps && a->tol == b->tol && a->precond == b->precond && a->init == b->init &&
           a->form == b->form && a->chunk == b->chunk && a->precision == b->precision && a->check == b->check;
}

typedef struct {
    Model *m;
    int B;
} DecodeStep;

static int decode_step_ops(void *arg) {
    DecodeStep *d = arg;
    return decode_ops(d->m, d->B, 1);
}

// One token per sequence through a recording (recorded_run: made on the second step with the same
// settings, after an eager one has loaded every kernel and sized every buffer).
static int decode_step_recorded(Model *m, int B) {
    if (m->graph_B != B || !model_solver_same(&m->graph_solver, &m->solver)) {  // new settings: start over
        drop_graph(m);
        m->graph_B = B;
        m->graph_solver = m->solver;
    }
    DecodeStep d = {m, B};
    return recorded_run(&m->graph, m->be, decode_step_ops, &d);
}

// One decode call over tokens already checked: logits of each sequence's last token to the host
// (logits NULL: left on the backend, for a prefill piece that is not the last).
static int decode_call(Model *m, const int32_t *tokens, int B, int T, float *logits) {
    const Backend *be = m->be;
    size_t N = (size_t)B * T;
    MN_TRY(ensure_capacity(m, B, T));
    m->B = B;
    m->T = T;
    m->grad_ready = 0;
    MN_TRY(be->upload_i32(be, m->tokens, tokens, N));
    if (T == 1 && m->use_graphs && be->graph_begin && !m->profile) MN_TRY(decode_step_recorded(m, B));
    else MN_TRY(decode_ops(m, B, T));
    return logits ? be->download_f32(be, logits, m->logits, (size_t)B * m->cfg.vocab_size, MEM_ACT) : MN_OK;
}

static int decode_args(const Model *m, const char *who, int B, int T) {
    if (B != m->state_B)
        return mn_error(MN_ERR_ARG, "%s: %d sequences, but the state was reset for %d", who, B, m->state_B);
    if (T <= 0) return mn_error(MN_ERR_ARG, "%s: T = %d must be > 0", who, T);
    if ((size_t)B * T > INT_MAX) return mn_error(MN_ERR_ARG, "%s: B x T = %d x %d tokens, at most %d", who, B, T, INT_MAX);
    return MN_OK;
}

// The prefill in pieces of tokens already checked (1 <= piece <= T).
static int decode_pieces(Model *m, const int32_t *tokens, int B, int T, int piece, float *logits) {
    int32_t *buf = malloc(sizeof(int32_t) * (size_t)B * piece);
    if (!buf) return mn_error(MN_ERR_NOMEM, "out of memory");
    int st = MN_OK;
    for (int t0 = 0; t0 < T && !st; t0 += piece) {
        int n = T - t0 < piece ? T - t0 : piece;
        for (int b = 0; b < B; b++) memcpy(buf + (size_t)b * n, tokens + (size_t)b * T + t0, sizeof(int32_t) * n);
        // the mixers' states carry each piece on to the next; only the last piece's logits matter
        st = decode_call(m, buf, B, n, t0 + n == T ? logits : NULL);
    }
    free(buf);
    return st;
}

int model_prefill_pieces(Model *m, const int32_t *tokens, int B, int T, int piece, float *logits) {
    MN_TRY(decode_args(m, "model_prefill_pieces", B, T));
    if (piece < 1) return mn_error(MN_ERR_ARG, "model_prefill_pieces: piece = %d must be > 0", piece);
    MN_TRY(check_tokens(m, tokens, NULL, (size_t)B * T));
    return decode_pieces(m, tokens, B, T, piece < T ? piece : T, logits);
}

// Whether pieces of p tokens for B sequences fit (model_check_batch) with `reserve` bytes left
// over besides.
static int piece_fits(const Model *m, int B, int p, double reserve) {
    if (model_check_batch(m, B, p, NULL)) return 0;
    size_t av = m->be->mem_available ? m->be->mem_available(m->be) : SIZE_MAX;
    double held = (double)model_activation_bytes(&m->cfg, m->be, (size_t)m->cap);  // freed first
    return av == SIZE_MAX ||
           (double)model_activation_bytes(&m->cfg, m->be, (size_t)B * p) + reserve <= (double)av + held;
}

// The longest prefill piece (T, halved until it fits) whose activations the backend can hold, or
// 0 (the refusal of the whole prompt then the last error). The pieces leave room for what the
// key/value caches grow by over the prompt, twice (a growing cache is copied into a larger one),
// where some piece does. A refusal that a shorter piece answers is handled: its message does not
// stay as the last error.
static int prefill_piece(const Model *m, int B, int T) {
    if ((size_t)B * T <= (size_t)m->cap) return T;
    char saved[MN_ERROR_MAX];
    mn_error_save(saved);
    if (!model_check_batch(m, B, T, NULL)) return T;
    double grow = 2.0 * (double)model_state_floats_per_token(&m->cfg) * B * T * m->be->elem_size(m->be, MEM_ACT);
    for (int pass = 0; pass < 2; pass++)
        for (int p = T / 2; p >= 1; p /= 2)
            if (piece_fits(m, B, p, pass ? 0 : grow)) {
                mn_error_restore(saved);
                return p;
            }
    model_check_batch(m, B, T, NULL);  // the whole prompt's message, which names the batch that fits
    return 0;
}

int model_decode(Model *m, const int32_t *tokens, int B, int T, float *logits) {
    MN_TRY(decode_args(m, "model_decode", B, T));
    MN_TRY(check_tokens(m, tokens, NULL, (size_t)B * T));
    // A prefill runs through the training activations' buffers (B*T tokens of them): a long prompt
    // that does not fit goes in pieces, which give the same state and logits.
    int piece = T > 1 ? prefill_piece(m, B, T) : T;
    if (!piece) return MN_ERR_NOMEM;
    if (piece < T) return decode_pieces(m, tokens, B, T, piece, logits);
    return decode_call(m, tokens, B, T, logits);
}

int model_take_cg_steps(Model *m, double *mean) {
    double steps = 0, systems = 0;
    for (int l = 0; l < m->cfg.n_layers; l++) {
        if (m->mixers[l].ops->collect) MN_TRY(m->mixers[l].ops->collect(&m->mixers[l]));
        steps += m->mixers[l].cg_steps;
        systems += m->mixers[l].cg_systems;
        m->mixers[l].cg_steps = m->mixers[l].cg_systems = 0;
    }
    *mean = systems > 0 ? steps / systems : 0;
    return MN_OK;
}
