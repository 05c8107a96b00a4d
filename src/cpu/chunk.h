/*
 * The chunked gated-linear-attention machinery shared by the Mesa layer, GLA,
 * Mamba2 and the delta rules (spec section 3).
 *
 * A sequence is cut into chunks of n <= C tokens. Inside a chunk, with the
 * chunk-local cumulative log decay b_t = g_1 + ... + g_t, every quantity of the
 * form "state entering the chunk, decayed to t, plus the decayed sum over the
 * chunk's earlier tokens" is two matrix products:
 *
 *     out = diag(rowscale) X S  +  ((X A^T) (.) mask) B
 *
 * forward (mask = D, D_ts = exp(b_t - b_s) for s <= t, rowscale = exp(b)) and
 * backward (mask = D^T, rowscale = exp(b_n - b)) alike. Decays are only ever
 * exponentials of differences b_t - b_s <= 0: nothing overflows.
 */
#ifndef MN_CHUNK_H
#define MN_CHUNK_H

#include <stddef.h>

typedef struct {
    int n;          // tokens in the chunk
    int C;          // chunk capacity: the mask's row stride
    float *b;       // [n] chunk-local cumulative log decay
    float *head;    // [n] exp(b_t): decay from the chunk start through t
    float *tail;    // [n] exp(b_n - b_t): decay after t to the chunk end
    float *decay;   // [1] exp(b_n): decay across the whole chunk
    float *mask;    // [n*n] D_ts = exp(b_t - b_s) for s <= t, else 0 (row-major, C x C slots)
} ChunkDecay;

// Floats needed for a ChunkDecay of up to C tokens, and carving it from mem.
size_t chunk_decay_floats(int C);
void chunk_decay_init(ChunkDecay *cd, float *mem, int C);
// Fills cd for n tokens with log decays g[0], g[stride], ..., g[(n-1)*stride] (g NULL: no decay).
void chunk_decay_compute(ChunkDecay *cd, const float *g, int stride, int n);

// out[r] = rowscale[i] X[r] op(S) + sum_s mask(i, s) (X[r] . A[s]) B[s],  i = rows ? rows[r] : r
//   X: m x dx (row r), op(S): dx x dout (S^T if s_trans), A: n x dx, B: n x dout,
//   mask(i, s) = mask[i*C + s], or mask[s*C + i] if mask_trans. S may be NULL (no state term).
//   attn: scratch of m*n floats. All matrices contiguous (leading dimension = columns).
typedef struct {
    const float *x, *s, *a, *b, *mask, *rowscale;
    const int *rows;
    int m, n, C, dx, dout, s_trans, mask_trans;
} GlaTerms;
void gla_apply(const GlaTerms *t, float *out, float *attn);

// S = decay S + L^T R: the state hand-off across a chunk. S: p x q, L: n x p, R: n x q.
void state_advance(float *s, float decay, const float *l, const float *r, int n, int p, int q);

// out[t] = v[t] * in[t] for rows of width d (row scaling into another buffer).
void scale_rows(float *out, const float *in, const float *v, int n, int d);

#endif
