/*
 * mesa_cuda.cu's GLA forms and CG: the chunk kernels' shared memory, the causal masks, the GLA
 * form e^b (.) A S + ((A B^T) (.) M) R on fp16 operands (tile_gla16), the CG operator built on it
 * (apply_operator) and the CG solve of a chunk's 64 systems (cg_solve).
 *
 * A section of mesa_cuda.cu's translation unit, not a header of its own: it uses the macros, Geo
 * and the pieces mesa_cuda.cu defines and includes before it (and is built twice with them: see
 * mesa_cuda.cu).
 */

// ------------------------------------------------------------------ the GLA forms

// The chunk's causal decay mask at (row r, column s): forward (dir 0)
// e^{b_r - b_s} beta_s for s <= r; backward (dir 1) e^{b_s - b_r} for s >= r.
static __device__ __forceinline__ float chunk_mask(const float *b, const float *beta, int r, int s, int dir) {
    if (dir == 0) return s <= r ? __expf(b[r] - b[s]) * beta[s] : 0.0f;
    return s >= r ? __expf(b[s] - b[r]) : 0.0f;
}

// Whether the warp's block of a 64 x 64 tile of scores (rows 16 (w & 3).., CH / NCG columns from
// (w >> 2) CH / NCG) lies wholly outside the mask of direction dir, so that its product can be
// skipped: the mask would zero it. At NCG 4, 6 of the 16 warps (about a tenth of a CG step's
// operand traffic through shared memory, where the loop is bound).
static __device__ __forceinline__ int scores_masked_out(int dir) {
    int r0 = 16 * (warp_id() & 3), c0 = (warp_id() >> 2) * (CH / NCG);
    return dir == 0 ? c0 > r0 + 15 : c0 + CH / NCG - 1 < r0;
}

// Multiplies a 64 x 64 tile of scores by the mask of direction dir.
static __device__ __forceinline__ void tile_mask(Tile *t, const float *b, const float *beta, int dir) {
#pragma unroll
    for (int j = 0; j < NTILES(CH); j++)
#pragma unroll
        for (int e = 0; e < 4; e++) t->v[j][e] *= chunk_mask(b, beta, f_row(e >> 1), f_col(j, e, NTILES(CH)), dir);
}

// The same with the forward mask precomputed in fragment order (chunk_consts): a 16-byte load per n-tile.
static __device__ __forceinline__ void tile_mask_f(Tile *t, const float *Mf) {
    const float4 *m = (const float4 *)(Mf + MFN * threadIdx.x);
#pragma unroll
    for (int j = 0; j < NTILES(CH); j++) {
        float4 v = m[j];
        t->v[j][0] *= v.x;
        t->v[j][1] *= v.y;
        t->v[j][2] *= v.z;
        t->v[j][3] *= v.w;
    }
}

// Shared-memory layout of the CG kernels: regions of floats, most of them
// holding fp16 operands (DP: the padded head size).
typedef struct {
    float *Hs;   // [DP][ldrow(DP)] the state term's matrix hi + lo (H; G for the output and the rhs)
    float *Kp;   // [CH][ldrow(DP)] the chunk's keys and CG's direction
    float *Bm;   // [CH][ldrow(DP)] X hi + lo (the forward's output) or Delta (the backward's rhs)
    float *St;   // [CH][LDT] the masked scores, hi + lo
    float *Dg;   // [CH][DP]  the Jacobi diagonal; then V (the output and the rhs)
    float *b, *beta, *lam, *red;  // [CH], [CH], [DP], [NCG][CH] (tile_dot's, at least DP)
    float *red2;                  // [NCG][CH] a second one (the CG loop alternates them)
    // constant over the chunk, in the thread's fragment order (chunk_consts)
    float *Mf;    // [NT][MFN] the forward mask at the thread's elements of a 64 x 64 tile
    float *eb;    // [CH] e^{b_row}
    float *lamf;  // [NCG][4][2 MAXNT] lambda at the columns of a DP-wide tile's fragments
} Smem;

static size_t smem_floats(void) {
    return (size_t)DP * ldrow(DP) + 2 * CH * ldrow(DP) + (size_t)CH * LDT + CH * DP + 2 * CH + DP + 2 * NCG * CH +
           (size_t)NT * MFN + CH + NCG * 4 * 2 * MAXNT;
}

static __device__ Smem carve(float *base, const Geo *g) {
    Smem s;
    s.Hs = base;
    s.Kp = s.Hs + DP * ldrow(DP);
    s.St = s.Kp + CH * ldrow(DP);
    s.Bm = s.St + CH * LDT;
    s.Dg = s.Bm + CH * ldrow(DP);  // right after Bm: the two hold the forward's staged G (stage_g)
    s.b = s.Dg + CH * DP;
    s.beta = s.b + CH;
    s.lam = s.beta + CH;
    s.red = s.lam + DP;
    s.red2 = s.red + NCG * CH;
    s.Mf = s.red2 + NCG * CH;  // 16-byte aligned: every region above is a multiple of 4 floats
    s.eb = s.Mf + NT * MFN;
    s.lamf = s.eb + CH;
    return s;
}

// u[i] = e^{b_{n-1} - b_row}, the decay from the thread's rows to the end of a chunk of n tokens.
static __device__ __forceinline__ void decay_to_end(float u[FR], const float *b, int n) {
#pragma unroll
    for (int i = 0; i < FR; i++) u[i] = __expf(b[n - 1] - b[f_row(i)]);
}

// lambda at the thread's columns of a DP-wide tile: element (j, e) is lambda[2 j + (e & 1)].
static __device__ __forceinline__ float *lam_frag(const Smem *s) {
    return s->lamf + ((warp_id() >> 2) * 4 + (lane_id() & 3)) * 2 * MAXNT;
}
// Whether this thread writes its lam_frag (one writer per column group and lane & 3).
static __device__ __forceinline__ int lamf_writer() { return (lane_id() >> 2) == 0 && (warp_id() & 3) == 0; }

// The chunk's constants that CG would otherwise recompute at every step, in
// the order the threads read them: the forward mask, e^b, lambda (s->b,
// s->beta and s->lam loaded and synchronized). Ends synchronized.
static __device__ void chunk_consts(const Smem *s, const Geo *g) {
    int nc = NTILES(DP);
#pragma unroll
    for (int j = 0; j < NTILES(CH); j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            s->Mf[MFN * threadIdx.x + 4 * j + e] = chunk_mask(s->b, s->beta, f_row(e >> 1), f_col(j, e, NTILES(CH)), 0);
    for (int r = threadIdx.x; r < CH; r += NT) s->eb[r] = __expf(s->b[r]);
    if (lamf_writer())
        for (int j = 0; j < nc; j++)
            for (int e = 0; e < 2; e++) lam_frag(s)[2 * j + e] = s->lam[f_col(j, e, nc)];
    __syncthreads();
}

// The CG operator's fp16 operands, carved from the Smem regions. Every value is held
// times a power-of-two scale, so rounding to fp16 loses nothing but what is
// stated at tile_mma16.
typedef struct {
    __half *Hh, *Hl;  // [DP][ldrow(DP)] the state times sH, hi + lo, in LD_OP layout
    __half *K;        // [CH][ldrow(DP)] the chunk's keys times sK
    __half *P;        // [CH][ldrow(DP)] the direction, each row times its scale (LD_OP layout)
    __half *Sh, *Sl;  // [CH][ldrow(CH)] the masked scores (scaled), hi + lo
    float sH, sK;
} Op16;

static __device__ Op16 op16_carve(const Smem *s, const Geo *g) {
    int ld = ldrow(DP);
    Op16 o;
    o.Hh = (__half *)s->Hs;
    o.Hl = o.Hh + DP * ld;
    o.K = (__half *)s->Kp;  // with P: CH ldrow(DP) floats
    o.P = o.K + CH * ld;
    o.Sh = (__half *)s->St;  // both halves: exactly St
    o.Sl = o.Sh + CH * ldrow(CH);
    o.sH = o.sK = 1;
    return o;
}

// Starts copying the chunk's operator into smem as it is, in the background (stage_raw), for
// op16_load to take into fp16 once the chunk's constants are worked out: the state (Hg: [Dk][Dk]
// float, global) into Bm and Dg (free until stage_g), the keys into the scores' region and the
// queries into the direction's (both free until CG starts). (Fetched into registers after the
// constants, the loads waited alone, with nothing to overlap them.)
static __device__ void op16_stage(const Op16 *o, const Smem *s, const float *Hg, const bf16 *kg, const bf16 *qg, int vec,
                                  const Geo *g, int pair, int t0) {
    Src keys = tok_src(kg, 0, g->Dk, DP, g, pair, t0, vec), state = mat_src(Hg, g->Dk, g->Dk, DP, DP, vec);
    Src qs = tok_src(qg, 0, g->Dk, DP, g, pair, t0, vec);
    stage_raw(s->Bm, DP, &state);
    stage_raw(s->St, ldrow(DP), &keys);
    stage_raw(o->P, ldrow(DP), &qs);
}

// Blocks copied raw into smem (stage_raw), then taken into fp16 by the block: R holds CH rows of
// DP bf16 values (stride ld), F DP rows of DP floats (stride DP). raw16_absmax and raw32_absmax:
// the thread's share of the largest magnitude; raw16_put and raw32_put: the values times `scale`
// into fp16 (vec_put16; F split hi + lo).
static __device__ __forceinline__ float raw16_absmax(const bf16 *R, int ld) {
    float m = 0;
    for (int e = threadIdx.x; e < CH * DP / 8; e += NT) {
        Vec16 v;
        v.u = *(const uint4 *)(R + e / (DP / 8) * ld + e % (DP / 8) * 8);
        m = fmaxf(m, stage_absmax(&v, 1, 0));
    }
    return m;
}
static __device__ __forceinline__ void raw16_put(const bf16 *R, int ld, __half *dst, int ldd, float scale) {
    for (int e = threadIdx.x; e < CH * DP / 8; e += NT) {
        int r = e / (DP / 8), c = e % (DP / 8) * 8;
        Vec16 v;
        v.u = *(const uint4 *)(R + r * ld + c);
        vec_put16(&v, 0, r, c, dst, NULL, ldd, scale);
    }
}
static __device__ __forceinline__ float raw32_absmax(const float *F) {
    float m = 0;
    for (int e = threadIdx.x; e < DP * DP / 4; e += NT) {
        Vec16 v;
        v.u = *(const uint4 *)(F + 4 * e);
        m = fmaxf(m, stage_absmax(&v, 1, 1));
    }
    return m;
}
static __device__ __forceinline__ void raw32_put(const float *F, __half *hi, __half *lo, int ld, float scale) {
    for (int e = threadIdx.x; e < DP * DP / 4; e += NT) {
        Vec16 v;
        v.u = *(const uint4 *)(F + 4 * e);
        vec_put16(&v, 1, e / (DP / 4), e % (DP / 4) * 4, hi, lo, ld, scale);
    }
}

// The staged state and keys (op16_stage) into fp16, scaled so that their largest magnitudes lie
// in [1, 2), the state split hi + lo; the queries into the tile q. Ends synchronized.
static __device__ void op16_load(Op16 *o, const Smem *s, Tile *q) {
    static_assert(DP * DP <= CH * ((DP + 8) + DP), "Bm and Dg (ldrow: n + 8) hold the raw state");
    static_assert(CH * (DP + 8) <= 2 * CH * LDT, "St holds the raw keys");
    const bf16 *K = (const bf16 *)s->St;
    int ld = ldrow(DP);
    cp_async_wait();
    __syncthreads();
    float m[2] = {raw16_absmax(K, ld), raw32_absmax(s->Bm)};  // the keys', the state's
    block_max_n(m, 2, s->red);
    o->sK = fp16_scale(m[0]);
    o->sH = fp16_scale(m[1]);
    raw16_put(K, ld, o->K, ld, o->sK);
    raw32_put(s->Bm, o->Hh, o->Hl, LD_OP, o->sH);
    __syncthreads();
    tile_from_bf16(q, (const bf16 *)o->P, ld, NTILES(DP));
}

// The state alone into fp16 (as op16_load does), from registers: hv, fetched ahead
// by stage_fetch from `state`. Every thread must be done with the previous
// contents of o->Hh, o->Hl (block_max_n's first barrier orders them). Ends
// synchronized.
static __device__ void op16_put_state(Op16 *o, const Smem *s, const Vec16 *hv, const Src *state, const Geo *g) {
    float m = stage_absmax(hv, MAXD * MAXD / 4 / NT, 1);
    block_max_n(&m, 1, s->red);
    o->sH = fp16_scale(m);
    stage_put16(hv, MAXD * MAXD / 4 / NT, state, o->Hh, o->Hl, LD_OP, o->sH);
    __syncthreads();
}

// Per-row power-of-two scales from norm2 (the row's squared norm, or CG's
// r.z) that bring the row's norm near [1/4, 1/2), far inside fp16's range.
// (floor(log2 sqrt(n)) = floor(floor(log2 n) / 2): no square root needed.)
static __device__ __forceinline__ void row_scales16(float sc[FR], const float norm2[FR]) {
#pragma unroll
    for (int i = 0; i < FR; i++) sc[i] = pow2f_(-((log2_floor(norm2[i]) >> 1) + 2));
}

// Rounds each of the tile's (DP-wide) rows to fp16 at its scale (row_scales16, returned in sc),
// stores the rounded rows, times their scales, into P ([CH][DP], LD_OP layout: the operand of the
// next product, fenced for wgmma; the caller's next barrier publishes it) and keeps them in t: the
// exact values of the operand, which the caller uses instead of the unrounded ones, in true units
// or, without true_units, as stored (times the scales: CG folds the scales into its step lengths).
static __device__ __forceinline__ void round_put_rows16(Tile *t, float sc[FR], const float norm2[FR], __half *P,
                                                        int true_units) {
    row_scales16(sc, norm2);
    float inv[FR] = {inv_pow2(sc[0]), inv_pow2(sc[1])};
    int o0 = frag_off(LD_OP, NTILES(DP)), rs = frag_rstep(LD_OP), cs = frag_cstep(LD_OP);
#pragma unroll
    for (int j = 0; j < NTILES(DP); j++)
#pragma unroll
        for (int i = 0; i < FR; i++) {
            __half2 h = __floats2half2_rn(t->v[j][2 * i] * sc[i], t->v[j][2 * i + 1] * sc[i]);
            *(__half2 *)(P + o0 + i * rs + j * cs) = h;
            float2 f = __half22float2(h);
            t->v[j][2 * i] = true_units ? f.x * inv[i] : f.x;
            t->v[j][2 * i + 1] = true_units ? f.y * inv[i] : f.y;
        }
    fence_async_smem();  // (P, and the state and keys written before CG)
}

// The operands of a forward GLA form of the chunk, fp16 in smem, each times
// a power of two (rows of A each times their own):
//   out = e^b (.) A S + ((A B^T) (.) M) R
// (M the forward mask; A [CH][k] row-major; S [k][n] hi + lo, stored by k or,
// with s_nmajor, by n; B [CH][k] and R [CH][n] row-major). Forms: the CG
// operator (A = P, S = H, B = R = K), the forward's output (A = X, S = G^T,
// B = K, R = V), the backward's right-hand side (A = Delta, S = G, B = V, R = K).
typedef struct {
    const __half *Ah, *Al;  // Al: NULL when A is exact in fp16
    const __half *Sh, *Sl;
    const __half *B, *R;
    int lda, lds, ldb, ldr;
    int s_nmajor;
    int dk, nc;             // A's columns (padded), the output's n-tiles
    float sS, sB, sR;       // the scales of S, B, R
} Gla16;

// The scores tile masked (unless the mask zeroes all of it: skip) and split into fp16 hi + lo.
static __device__ __forceinline__ void put_scores(Tile *sc, int skip, __half *Sh, __half *Sl, const Smem *s) {
    const float one[FR] = {1.0f, 1.0f};
    if (!skip) tile_mask_f(sc, s->Mf);
    tile_put16(Sh, Sl, ldrow(CH), sc, one, NTILES(CH));
}

// acc = the form, for the thread's rows (sa: the scales of A's rows), through
// the fp16 scores buffers Sh, Sl ([CH][ldrow(CH)], hi + lo), with the chunk's
// constants (chunk_consts). Evaluated on the
// scaled operands as
//   [ (e^b sB sR / sS) (.) (A S)^ + ((A B^T)^ (.) M) R^ ] / (sa sB sR),
// or, without scale_out, the same times (sa sB sR): the form of the scaled A.
// Callers have synchronized since writing the operands and since the last
// reads of Sh, Sl.
static __device__ __forceinline__ void tile_gla16(Tile *acc, const Gla16 *f, const float sa[FR], __half *Sh, __half *Sl,
                                           const Smem *s, int scale_out) {
    // the scores A B^T and the state term A S in one pass over k, which loads each k-step's fragments
    // of A once for both (shared-memory traffic bounds the CG loop)
    Tile sc;
    tile_zero(&sc);
    tile_zero(acc);
    int skip = scores_masked_out(0), a_off = a_frag_off(f->lda, 0), ak = a_frag_kstep(f->lda, 0);
    int l = lane_id(), cg = warp_id() >> 2;
    BFrag fb = b_frag_at(f->B, NULL, f->ldb, 1, b_lane_off(l, cg * 8 * NTILES(CH), f->ldb, 1));
#if WGMMA
    if (f->lds == LD_CORE) {  // the CG operator (A = P exact in fp16, S = H symmetric): the state term
                              // by wgmma, running while the scores' pass loads its own fragments
        wg_state_start(acc, f->Ah, f->Sh, f->Sl);
        if (!skip)
            for (int k = 0; k < f->dk; k += 16) {
                unsigned a[4];
                ldsm4(a, f->Ah + a_off + k * ak, 0);
                mma_kstep(&sc, a, a, 0, &fb, k, NTILES(CH), 0);
            }
        put_scores(&sc, skip, Sh, Sl, s);  // while the state term runs
        wg_state_wait(acc);
    } else
#endif
    {
        BFrag fs = b_frag_at(f->Sh, f->Sl, f->lds, f->s_nmajor, b_lane_off(l, cg * 8 * f->nc, f->lds, f->s_nmajor));
        for (int k = 0; k < f->dk; k += 16) {
            unsigned a[4], a2[4];
            ldsm4(a, f->Ah + a_off + k * ak, 0);
            if (f->Al) ldsm4(a2, f->Al + a_off + k * ak, 0);
            if (!skip) mma_kstep(&sc, a, a2, f->Al != NULL, &fb, k, NTILES(CH), 0);
            mma_kstep(acc, a, a2, f->Al != NULL, &fs, k, f->nc, 0);
        }
        put_scores(&sc, skip, Sh, Sl, s);
    }
    float d[FR], inv[FR];
#pragma unroll
    for (int i = 0; i < FR; i++) {
        d[i] = s->eb[f_row(i)] * (f->sB * f->sR * inv_pow2(f->sS));
        inv[i] = inv_pow2(sa[i] * f->sB * f->sR);
    }
    tile_scale_rows(acc, d);
    __syncthreads();  // the scores are complete
    // the scores times R, over the causal range of the warp's rows
    tile_mma16(acc, Sh, Sl, ldrow(CH), f->R, NULL, f->ldr, 0, 0, 16 * (warp_id() & 3) + 16, f->nc);
    if (scale_out) tile_scale_rows(acc, inv);
}

// sK^2 A(P) = sK^2 [e^b (.) P Hc + ((P K^T) (.) M) K + lambda (.) P] for the tile's rows,
// P the direction on its rows' fp16 grids times their scales sp, as stored in o->P by
// round_put_rows16 and as passed in p: so A(P) is sp (.) A(p) for the direction p in true
// units, and the result is kept in the units of the scaled products (sp sK^2), which cg_solve
// folds into its step lengths (the scalings back cost two multiplies an element a step). The
// lambda term takes lamf times sK^2 (cg_solve). Rows that stopped pass p = 0. Callers have
// synchronized since writing o->P and since the last reads of o->S (cg_solve: the dots' barriers).
static __device__ void apply_operator(Tile *ap, const Tile *p, const float sp[FR], const Smem *s, const Op16 *o, const Geo *g) {
    int nc = NTILES(DP);
    Gla16 f = {o->P, NULL, o->Hh, o->Hl, o->K, o->K, LD_OP, LD_OP, ldrow(DP), ldrow(DP), 0, DP, nc, o->sH, o->sK, o->sK};
    tile_gla16(ap, &f, sp, o->Sh, o->Sl, s, 0);
    const float *lam = lam_frag(s);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        if (j < nc) {
            float2 l = *(const float2 *)(lam + 2 * j);
            ap->v[j][0] += l.x * p->v[j][0];
            ap->v[j][1] += l.y * p->v[j][1];
            ap->v[j][2] += l.x * p->v[j][2];
            ap->v[j][3] += l.y * p->v[j][3];
        }
}

// The Jacobi diagonal of each row's A_t into Dg: e^{b_t} diag(Hc) + sum_{s<=t} e^{b_t-b_s} beta_s k_s^2 + lambda
// (from the fp16 operands: a preconditioner need not be exact).
static __device__ void jacobi_diagonal(const Smem *s, const Op16 *o, const Geo *g) {
    int ld = ldrow(DP);
    float ih = 1.0f / o->sH, ik2 = 1.0f / (o->sK * o->sK);
    for (int e = threadIdx.x; e < CH * DP; e += NT) {
        int r = e / DP, c = e % DP;
        float hc = __half2float(o->Hh[mat_off(c, c, LD_OP)]) + __half2float(o->Hl[mat_off(c, c, LD_OP)]);
        float acc = __expf(s->b[r]) * hc * ih + s->lam[c];
        for (int t = 0; t <= r; t++) {
            float kv = __half2float(o->K[t * ld + c]);
            acc += __expf(s->b[r] - s->b[t]) * s->beta[t] * kv * kv * ik2;
        }
        s->Dg[r * DP + c] = acc;
    }
    __syncthreads();
}

// Whether CG uses the Jacobi diagonal (in Dg): preconditioned, or starting from q / diag.
static __device__ __forceinline__ int cg_jacobi(const Geo *g) { return g->precond || g->init == MN_CG_INIT_JACOBI; }

// z = r / diag (Jacobi) or r.
static __device__ __forceinline__ void precondition(Tile *z, const Tile *r, const Smem *s, const Geo *g, int use) {
    int nc = NTILES(DP);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            z->v[j][e] = (use && j < nc) ? r->v[j][e] / s->Dg[f_row(e >> 1) * DP + f_col(j, e, nc)] : r->v[j][e];
}

// Conjugate gradient for the chunk's rows (spec section 2): q in, x out,
// steps per row, with the operator o (op16_load: the chunk's entry state and
// keys). A row stops at its tolerance (or the floor); the block
// stops when all rows have, or after max_steps. Stopped rows carry p = 0;
// every thread runs every step (the dots synchronize the block).
//
// The directions p are rounded to fp16 at a per-row scale (11 bits), so the
// operator takes p in one tensor-core pass. x and r are updated with the same
// rounded p and its exact image A p, so r stays the residual of x and the
// stopping test keeps its meaning; only conjugacy is perturbed (relative
// 2^-12), which can cost a step, not accuracy. A starting guess is rounded
// the same way (it is only a guess).
static __device__ void cg_solve(Tile *x, const Tile *q, const Smem *s, const Geo *g, const Op16 *op, int steps[FR],
                                const Tile *x0, int use_given) {
    int nc = NTILES(DP), jac = cg_jacobi(g);
    const Op16 o = *op;
    Tile r, p, ap;
    float sp[FR], c = o.sK * o.sK;  // (apply_operator's units: sp c A p)
    if (lamf_writer())  // lambda in those units
        for (int j = 0; j < 2 * NTILES(DP); j++) lam_frag(s)[j] *= c;
    __syncthreads();
    if (jac) jacobi_diagonal(s, &o, g);
    if (use_given) {
        *x = *x0;
    } else if (g->init == MN_CG_INIT_JACOBI) {
        precondition(x, q, s, g, 1);
    } else {
        tile_zero(x);
    }
    int guess = use_given || g->init == MN_CG_INIT_JACOBI;  // else x = 0 and r = q
    if (guess) {
        float xx[FR];
        tile_dot(xx, x, x, nc, s->red, 0);
        round_put_rows16(x, sp, xx, o.P, 1);
        __syncthreads();
        float u[FR] = {inv_pow2(sp[0] * c), inv_pow2(sp[1] * c)};
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) p.v[j][e] = x->v[j][e] * sp[e >> 1];  // the guess as stored
        apply_operator(&ap, &p, sp, s, &o, g);
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) r.v[j][e] = q->v[j][e] - ap.v[j][e] * u[e >> 1];
    } else {
        r = *q;
    }
    float qq[FR], rr[FR], rz[FR], thresh[FR];
    int active[FR];
    tile_dot(qq, q, q, nc, s->red, 0);
    if (guess) tile_dot(rr, &r, &r, nc, s->red, 0);
    else
#pragma unroll
        for (int i = 0; i < FR; i++) rr[i] = qq[i];
    precondition(&p, &r, s, g, g->precond);
    if (g->precond) tile_dot(rz, &r, &p, nc, s->red, 0);
    else
#pragma unroll
        for (int i = 0; i < FR; i++) rz[i] = rr[i];  // z = r
#pragma unroll
    for (int i = 0; i < FR; i++) {
        thresh[i] = g->tol2 * qq[i];
        active[i] = rr[i] > thresh[i];
        steps[i] = 0;
    }
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (!active[e >> 1]) p.v[j][e] = 0.0f;
    round_put_rows16(&p, sp, rz, o.P, 0);
    // p is kept as stored, sp (.) p in true units, and Ap as apply_operator returns it, c sp (.) A p:
    // so p.Ap comes out times c sp^2, and the updates of x, r and p take the step lengths over
    // those factors (powers of two: exact).
    for (int step = 1; step <= g->max_steps; step++) {
        if (!__syncthreads_or(active[0] | active[1])) break;  // (also publishes P)
        apply_operator(&ap, &p, sp, s, &o, g);
        float pap[FR], ax[FR], ar[FR];
        // (the loop's dots join through red, red2, red in turn: each buffer's last readers have
        // passed a barrier since, so that a join needs one barrier, not two)
        tile_dot(pap, &p, &ap, nc, s->red, 1);
#pragma unroll
        for (int i = 0; i < FR; i++) {
            if (active[i] && (!(pap[i] > 0) || !(rz[i] > 0))) active[i] = 0;  // converged exactly, or non-finite input
            // __fdividef (2 ulp): a step length, with which x and r move alike, needs no IEEE division;
            // alpha = a c sp^2 moves x by alpha p = (a c sp) (sp p) and r by alpha Ap = (a sp) (c sp Ap)
            float a = active[i] ? __fdividef(rz[i], pap[i]) : 0.0f;
            ax[i] = a * c * sp[i];
            ar[i] = a * sp[i];
            if (active[i]) steps[i] = step;
        }
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                x->v[j][e] += ax[e >> 1] * p.v[j][e];
                r.v[j][e] -= ar[e >> 1] * ap.v[j][e];
            }
        tile_dot(rr, &r, &r, nc, s->red2, 1);
#pragma unroll
        for (int i = 0; i < FR; i++)
            if (active[i] && !(rr[i] > thresh[i])) active[i] = 0;
        precondition(&ap, &r, s, g, g->precond);  // z, in the space of ap
        float rzn[FR], beta[FR];
        if (g->precond) tile_dot(rzn, &r, &ap, nc, s->red, 1);
        else
#pragma unroll
            for (int i = 0; i < FR; i++) rzn[i] = rr[i];  // z = r
#pragma unroll
        for (int i = 0; i < FR; i++) {
            beta[i] = active[i] ? __fdividef(rzn[i], rz[i]) * inv_pow2(sp[i]) : 0.0f;  // (over p's scale)
            if (active[i]) rz[i] = rzn[i];
        }
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) p.v[j][e] = active[e >> 1] ? ap.v[j][e] + beta[e >> 1] * p.v[j][e] : 0.0f;
        round_put_rows16(&p, sp, rz, o.P, 0);
    }
}

