/*
 * mesa_cuda.cu's chunk kernels: cg_forward_kernel, cg_backward_kernel, grads_kernel, and the
 * backward's final-state term (final_dot_kernel) and reverse cumulative sum (dg_scan_kernel).
 *
 * A section of mesa_cuda.cu's translation unit, not a header of its own: it uses the macros, Geo
 * and the pieces mesa_cuda.cu defines and includes before it (and is built twice with them: see
 * mesa_cuda.cu).
 */

// ---------------------------------------------------------------- the chunk kernels

// The token index of the thread's row i of the chunk at t0 in [B,T,H] order;
// false past the end of the sequence (the per-row results' writers).
static __device__ __forceinline__ int row_token(size_t *ti, const Geo *g, int pair, int t0, int i) {
    int t = t0 + f_row(i);
    if (t >= g->T) return 0;
    *ti = tok_index(g, pair, t);
    return 1;
}

// Writes per-row integers (CG steps) for the thread's rows, one writer per row.
static __device__ void store_row_ints(int *dst, const int v[FR], const Geo *g, int pair, int t0) {
    if (!dst || !row_owner()) return;
    size_t ti;
#pragma unroll
    for (int i = 0; i < FR; i++)
        if (row_token(&ti, g, pair, t0, i)) dst[ti] = v[i];
}

// Whether the forward stages G in smem during CG (stage_g): Bm and Dg are free
// then unless CG uses the Jacobi diagonal, and hold [DP][DP] floats.
static_assert(MAXD * MAXD <= CH * (2 * MAXD + 8), "Bm and Dg hold a [DP][DP] float matrix");
static __device__ __forceinline__ int g_staged(const Geo *g, int vec) { return vec && !cg_jacobi(g); }

// Starts copying the chunk's G ([Dv][Dk] float, global) into Bm and Dg as
// [DP][DP] floats (zero outside), in the background while CG runs.
static __device__ __forceinline__ void stage_g(const Smem *s, const float *G, const Geo *g) {
    Src sg = mat_src(G, g->Dv, g->Dk, DP, DP, 1);
    stage_raw(s->Bm, DP, &sg);
}

// The forward's output O = e^b (.) X G^T + ((X K^T) (.) M) V (G: the chunk's
// entry state [Dv][Dk], global, or staged in smem by stage_g when g_staged)
// on fp16 operands (tile_gla16): X split hi + lo at per-row scales into Bm's
// region, G hi + lo into the state's buffers, V into the Jacobi diagonal's; K
// (scale sK) is still in place from CG.
static __device__ __forceinline__ void forward_output(Tile *out, const Tile *xp, float sK, const Smem *sp, const bf16 *v,
                                            const float *G, int vec, const Geo *gp, int pair, int t0) {
    const Smem s = *sp;
    const Geo g = *gp;
    const Tile xt = *xp;
    Op16 op = op16_carve(&s, &g);
    int nc = NTILES(DP), ldk = ldrow(DP), staged = g_staged(&g, vec);  // (keys and values: both DP wide)
    __half *Xh = (__half *)s.Bm, *Xl = Xh + CH * ldk, *V16 = (__half *)s.Dg;
    __half *Gh = (__half *)s.Hs, *Gl = Gh + DP * ldk;  // G hi + lo, in the state's region
    Src sg = staged ? mat_src(s.Bm, DP, DP, DP, DP, 1) : mat_src(G, g.Dv, g.Dk, DP, DP, vec);
    Src sv = tok_src(v, 0, g.Dv, DP, &g, pair, t0, vec);
    float sx[FR], sG, sV;
    {
        Vec16 gv[MAXD * MAXD / 4 / NT], vv[CH * MAXD / 8 / NT];
        stage_fetch(vv, CH * MAXD / 8 / NT, &sv);
        if (staged) {
            cp_async_wait();
            __syncthreads();  // G is in place
        }
        stage_fetch(gv, MAXD * MAXD / 4 / NT, &sg);
        float xx[FR];
        tile_dot(xx, &xt, &xt, nc, s.red, 0);  // (its barriers also end CG's reads, and those of the staged G)
        row_scales16(sx, xx);
        tile_put16(Xh, Xl, ldk, &xt, sx, nc);
        float m[2] = {stage_absmax(gv, MAXD * MAXD / 4 / NT, 1), stage_absmax(vv, CH * MAXD / 8 / NT, 0)};
        block_max_n(m, 2, s.red);
        sG = fp16_scale(m[0]);
        sV = fp16_scale(m[1]);
        stage_put16(gv, MAXD * MAXD / 4 / NT, &sg, Gh, Gl, ldk, sG);
        stage_put16(vv, CH * MAXD / 8 / NT, &sv, V16, NULL, ldk, sV);
    }
    __syncthreads();
    Gla16 f = {Xh, Xl, Gh, Gl, op.K, V16, ldk, ldk, ldk, ldk, 1, DP, nc, sG, sK, sV};
    tile_gla16(out, &f, sx, op.Sh, op.Sl, &s, 1);
}

// Forward per chunk: CG for the chunk's systems, then the output (forward_output).
static __global__ void __launch_bounds__(NT, CHUNK_BLOCKS) cg_forward_kernel(bf16 *o, bf16 *x_out, int *steps_out, const bf16 *q,
                                                           const bf16 *k, const bf16 *v, const float *glog,
                                                           const float *gbeta, const float *lambda, const float *states,
                                                           const bf16 *x0, int vec, Geo g) {
    assume_threads(NT);
    grid_wait();
    extern __shared__ float sm[];
    Smem s = carve(sm, &g);
    // chunk-major from the last chunk down: the last wave is of first chunks, whose systems (a state of
    // few tokens) take the fewest CG steps, so the kernel's tail is short (cg_backward alike)
    int c = g.nchunks - 1 - blockIdx.y, pair = g.pair0 + blockIdx.x, t0 = c * CH, nc = NTILES(DP);
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    const float *st_in = states + ((size_t)pair * (g.nchunks + 1) + c) * hg;
    Op16 op = op16_carve(&s, &g);
    chunk_fetch(s.b, s.beta, s.lam, glog, gbeta, lambda, &g, pair, t0);
    op16_stage(&op, &s, st_in, k, q, vec, &g, pair, t0);
    l2_prefetch_rows(v, 2, g.Dv, &g, pair, t0);  // the values, for the output after CG
    chunk_put(s.b);
    __syncthreads();
    chunk_consts(&s, &g);
    Tile qt, xt, x0t;
    if (x0) tile_load(&x0t, x0, &g, pair, t0, g.Dk, nc);
    op16_load(&op, &s, &qt);
    if (g_staged(&g, vec)) stage_g(&s, st_in + hh, &g);  // for the output, while CG runs
    int steps[FR];
    cg_solve(&xt, &qt, &s, &g, &op, steps, &x0t, x0 != NULL);
    tile_store(x_out, 0, &xt, &g, pair, t0, g.Dk, nc);
    store_row_ints(steps_out, steps, &g, pair, t0);
    Tile out;
    forward_output(&out, &xt, op.sK, &s, v, st_in + hh, vec, &g, pair, t0);
    tile_store(o, 0, &out, &g, pair, t0, g.Dv, nc);
}

// Where rhs_stage copies the right-hand side's operands raw: G (float, [DP][DP]) in the state's
// region, Delta in the second half of Bm's, V in the direction's, the keys in the scores' (each
// free until backward_rhs has taken them into fp16).
typedef struct {
    float *G;
    bf16 *D, *V, *K;
} RhsRaw;

static __device__ __forceinline__ RhsRaw rhs_raw(const Smem *s) {
    int ld = ldrow(DP);
    RhsRaw r = {s->Hs, (bf16 *)s->Bm + CH * ld, (bf16 *)s->Kp + CH * ld, (bf16 *)s->St};
    return r;
}

// Starts copying the chunk's Delta, V, keys and G (the entry state [Dv][Dk], global) into smem as
// they are (rhs_raw), in the background, for backward_rhs once the chunk's constants are worked
// out (as op16_stage does for the forward).
static __device__ void rhs_stage(const Smem *s, const bf16 *dout, const bf16 *v, const bf16 *k, const float *G, int vec,
                                 const Geo *g, int pair, int t0) {
    RhsRaw r = rhs_raw(s);
    int ld = ldrow(DP);
    Src sg = mat_src(G, g->Dv, g->Dk, DP, DP, vec), sd = tok_src(dout, 0, g->Dv, DP, g, pair, t0, vec);
    Src sv = tok_src(v, 0, g->Dv, DP, g, pair, t0, vec), sk = tok_src(k, 0, g->Dk, DP, g, pair, t0, vec);
    stage_raw(r.G, DP, &sg);
    stage_raw(r.D, ld, &sd);
    stage_raw(r.V, ld, &sv);
    stage_raw(r.K, ld, &sk);
}

// The backward's right-hand side R = e^b (.) Delta G + ((Delta V^T) (.) M) K
// on fp16 operands (tile_gla16), from the raw copies of rhs_stage: G into the
// state's buffers (through registers: its raw copy lies there), K into CG's,
// Delta into Bm's region, V into the Jacobi diagonal's; meanwhile CG's state
// (sh) is fetched into hv, registers. Returns the keys' scale (they stay in
// CG's buffer). (Inlined: as a called function it left ptxas spilling less,
// but the kernels ran slower.)
static __device__ __forceinline__ float backward_rhs(Tile *rhs, Vec16 *hv, const Src *sh, const Smem *sp, const Geo *gp) {
    const Smem s = *sp;
    const Geo g = *gp;
    Op16 op = op16_carve(&s, &g);
    int nc = NTILES(DP), ldk = ldrow(DP);  // (keys and values: both DP wide)
    // G [DP][ldk] hi + lo in the state's region
    __half *D16 = (__half *)s.Bm, *V16 = (__half *)s.Dg, *Gh = (__half *)s.Hs, *Gl = Gh + DP * ldk;
    RhsRaw raw = rhs_raw(&s);
    cp_async_wait();
    __syncthreads();
    Vec16 gv[MAXD * MAXD / 4 / NT];
#pragma unroll
    for (int u = 0; u < MAXD * MAXD / 4 / NT; u++) gv[u].u = ((const uint4 *)raw.G)[threadIdx.x + u * NT];
    float sc[4] = {raw16_absmax(raw.D, ldk), raw16_absmax(raw.V, ldk), raw16_absmax(raw.K, ldk),
                   stage_absmax(gv, MAXD * MAXD / 4 / NT, 1)};  // the scales of Delta, V, K, G
    block_max_n(sc, 4, s.red);  // (its barriers also end the reads of G's raw copy)
    for (int i = 0; i < 4; i++) sc[i] = fp16_scale(sc[i]);
    raw16_put(raw.D, ldk, D16, ldk, sc[0]);
    raw16_put(raw.V, ldk, V16, ldk, sc[1]);
    raw16_put(raw.K, ldk, op.K, ldk, sc[2]);
#pragma unroll
    for (int u = 0; u < MAXD * MAXD / 4 / NT; u++) {
        int e = threadIdx.x + u * NT;
        vec_put16(&gv[u], 1, e / (DP / 4), e % (DP / 4) * 4, Gh, Gl, ldk, sc[3]);
    }
    stage_fetch(hv, MAXD * MAXD / 4 / NT, sh);  // CG's state, in flight while the right-hand side is computed
    __syncthreads();
    Gla16 f = {D16, NULL, Gh, Gl, V16, op.K, ldk, ldk, ldk, ldk, 0, DP, nc, sc[3], sc[1], sc[2]};
    float sa[FR] = {sc[0], sc[0]};
    tile_gla16(rhs, &f, sa, op.Sh, op.Sl, &s, 1);
    return sc[2];
}

// Backward, per chunk: R = G_t^T delta, Y = A^{-1} R (the second solve);
// writes dq = Y, Y (float) for the adjoints, the per-token term y.(lambda (.) x)
// of dL/db (src/cpu/mesa_chunk.c says why this form), and adds -sum_t y (.) x
// to dlambda.
static __global__ void __launch_bounds__(NT, CHUNK_BLOCKS) cg_backward_kernel(bf16 *dq, float *y_out, float *tok_terms, float *dlambda,
                                                            int *steps_out, const bf16 *k, const bf16 *v, const bf16 *x,
                                                            const bf16 *dout, const float *glog, const float *gbeta,
                                                            const float *lambda, const float *states, int vec, Geo g) {
    assume_threads(NT);
    grid_wait();
    extern __shared__ float sm[];
    Smem s = carve(sm, &g);
    int c = g.nchunks - 1 - blockIdx.y, pair = g.pair0 + blockIdx.x, t0 = c * CH, nc = NTILES(DP);
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    const float *st_in = states + ((size_t)pair * (g.nchunks + 1) + c) * hg;
    chunk_fetch(s.b, s.beta, NULL, glog, gbeta, NULL, &g, pair, t0);
    rhs_stage(&s, dout, v, k, st_in + hh, vec, &g, pair, t0);
    l2_prefetch(st_in, hh * sizeof(float));  // CG's state, fetched while the right-hand side is computed
    const size_t lat = lam_index(&g, pair);
    for (int i = threadIdx.x; i < DP; i += NT) s.lam[i] = i < g.Dk ? lambda[lat + i] : 1.0f;
    chunk_put(s.b);
    __syncthreads();
    chunk_consts(&s, &g);
    Tile rhs;
    Op16 op = op16_carve(&s, &g);
    Vec16 hv[MAXD * MAXD / 4 / NT];
    Src sh = mat_src(st_in, g.Dk, g.Dk, DP, DP, vec);
    op.sK = backward_rhs(&rhs, hv, &sh, &s, &g);  // leaves the keys in op.K
    // the second solve, with the forward's operator: H over the right-hand side's G
    op16_put_state(&op, &s, hv, &sh, &g);
    Src xs = tok_src(x, 0, g.Dk, DP, &g, pair, t0, vec);
    stage_raw(s.Bm, ldrow(DP), &xs);  // x, for after CG, in the background (CG leaves Bm alone)
    Tile y, xt;
    int steps[FR];
    cg_solve(&y, &rhs, &s, &g, &op, steps, &y, 0);
    cp_async_wait();
    __syncthreads();
    tile_from_bf16(&xt, (const bf16 *)s.Bm, ldrow(DP), nc);
    // y.(lambda (.) x) per token, and -sum over the chunk's rows of y (.) x for dlambda
    Tile lx;
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) lx.v[j][e] = j < nc ? s.lam[f_col(j, e, nc)] * xt.v[j][e] : 0.0f;
    float ylx[FR];
    tile_dot(ylx, &y, &lx, nc, s.red, 0);
    tile_store(dq, 0, &y, &g, pair, t0, g.Dk, nc);
    tile_store(y_out, 1, &y, &g, pair, t0, g.Dk, nc);
    size_t ti;
    if (row_owner())
#pragma unroll
        for (int i = 0; i < FR; i++)
            if (row_token(&ti, &g, pair, t0, i)) {
                tok_terms[ti] = ylx[i];
                if (steps_out) steps_out[ti] = steps[i];
            }
    __syncthreads();
    for (int i = threadIdx.x; i < DP; i += NT) s.red[i] = 0;
    __syncthreads();
    // column sums: over the quad's 8 row groups by shuffles, then across warps in smem
#pragma unroll
    for (int j = 0; j < MAXNT; j++) {
        if (j >= nc) continue;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            float acc = 0;
#pragma unroll
            for (int i = 0; i < FR; i++)
                if (t0 + f_row(i) < g.T) acc -= y.v[j][e + 2 * i] * xt.v[j][e + 2 * i];
            for (int o = 4; o < 32; o <<= 1) acc += __shfl_xor_sync(0xffffffffu, acc, o);
            if (lane_id() < 4) atomicAdd(&s.red[f_col(j, e, nc)], acc);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < g.Dk; i += NT) atomicAdd(&dlambda[lat + i], s.red[i]);
}

// Shared memory of grads_kernel: fp16 operands, each times a power of two
// (ld = ldrow(DP)).
typedef struct {
    __half *Mh, *Ml;                  // [DP][ld] an adjoint, hi + lo: Hn, then Gbar
    __half *Yh, *Yl;                  // [CH][ld] Y, hi + lo
    __half *S1h, *S1l, *S2h, *S2l;    // [CH][ldrow(CH)] the masked scores S1 and S2 (below), hi + lo
    __half *K, *X, *V, *D;            // [CH][ld] the chunk's k, x, v and Delta (exact in fp16)
    float *b, *beta, *red;            // [CH], [CH], [NCG][CH]
} GradSmem;

static size_t grads_smem(const Geo *g) {
    size_t ld = ldrow(DP);
    size_t halves = 2 * DP * ld + 2 * CH * ld + 4 * (size_t)CH * ldrow(CH) + 4 * CH * ld;
    return 2 * halves + sizeof(float) * (2 * CH + NCG * CH);
}

static __device__ GradSmem grads_carve(float *base, const Geo *g) {
    int ld = ldrow(DP), ls = CH * ldrow(CH);
    GradSmem s;
    s.Mh = (__half *)base;
    s.Ml = s.Mh + DP * ld;
    s.Yh = s.Ml + DP * ld;
    s.Yl = s.Yh + CH * ld;
    s.S1h = s.Yl + CH * ld;
    s.S1l = s.S1h + ls;
    s.S2h = s.S1l + ls;
    s.S2l = s.S2h + ls;
    s.K = s.S2l + ls;
    s.X = s.K + CH * ld;
    s.V = s.X + CH * ld;
    s.D = s.V + CH * ld;
    s.b = (float *)(s.D + CH * ld);
    s.beta = s.b + CH;
    s.red = s.beta + CH;
    return s;
}

// acc = f (.) (A S) + C R for the thread's rows, C masked scores of the
// backward mask (hi + lo, [CH][ldrow(CH)]: only columns from the warp's first
// row on are nonzero); A [CH][k], S (hi + lo; by k, or by n with s_nmajor) and
// R [CH][n] fp16 with stride ld.
static __device__ __forceinline__ void tile_gla16_rev(Tile *acc, const __half *A, const __half *Sh, const __half *Sl,
                                               int s_nmajor, int dk, const float f[FR], const __half *Ch,
                                               const __half *Cl, const __half *R, int ld, int nc) {
    tile_zero(acc);
    tile_mma16(acc, A, NULL, ld, Sh, Sl, ld, s_nmajor, 0, dk, nc);
    tile_scale_rows(acc, f);
    tile_mma16(acc, Ch, Cl, ldrow(CH), R, NULL, ld, 0, 16 * (warp_id() & 3), CH, nc);
}

// Backward, per chunk, with the adjoints Gbar and Hn = -Hbar at the chunk's
// end. With the backward mask M (chunk_mask, dir 1) and u = e^{b_n - b_t}
// (the decay from a token to the chunk's end):
//   S1 = (K X^T) (.) M                S2 = (V Delta^T - K Y^T) (.) M
//   P  = S1 Delta + u (.) K Gbar^T     T  = S1 Y + u (.) K (Hn + Hn^T)
//   Q  = S2 X + u (.) V Gbar
//   dv = beta P, dk = beta (Q - T), dbeta = v.P - k.T + u k.Hn k, db = y.(lambda (.) x) - beta dbeta
// These regroup R1, R2 and Qv of src/cpu/mesa_chunk.c: with W = (K Y^T) (.) M,
// R1 + R2 = T + W X and Qv = Q + W X, so Qv - R1 - R2 = Q - T. The two state
// terms of Hn meet in one product, the two score matrices that multiply X in
// one; and k.R1 = k.T - u k.Hn k.
//
// Every product runs in fp16 on the tensor cores (tile_mma16): the bf16 rows
// are exact in fp16 after a power-of-two scale; Y, the adjoints and the
// scores are split hi + lo (22 bits, as the TF32 split was). All operands are
// fetched with 16-byte loads in three batches (the rows and Y; Hn while the
// scores are computed; Gbar while T is), so the kernel waits on global memory
// once per batch, not once per element row.
static __global__ void __launch_bounds__(NT, CHUNK_BLOCKS) grads_kernel(bf16 *dk_out, bf16 *dv_out, float *dbeta_out, float *db_out,
                                                      const bf16 *k, const bf16 *v, const bf16 *x, const bf16 *dout,
                                                      const float *y, const float *tok_terms, const float *glog,
                                                      const float *gbeta, const float *adj, int vec, Geo g) {
    assume_threads(NT);
    grid_wait();
    extern __shared__ float sm[];
    GradSmem s = grads_carve(sm, &g);
    int c = blockIdx.x, pair = g.pair0 + blockIdx.y, t0 = c * CH, nc = NTILES(DP), ncs = NTILES(CH);
    int ld = ldrow(DP), lds = ldrow(CH), rb = 16 * (warp_id() & 3);
    size_t gg = (size_t)g.Dv * g.Dk, hh = (size_t)g.Dk * g.Dk;
    const float *gbar = adj + ((size_t)pair * g.nchunks + c) * (gg + hh), *hn = gbar + gg;
    chunk_fetch(s.b, s.beta, NULL, glog, gbeta, NULL, &g, pair, t0);

    // the chunk's rows and Y: every load in flight at once, then scaled into fp16
    Src src[5] = {tok_src(k, 0, g.Dk, DP, &g, pair, t0, vec), tok_src(x, 0, g.Dk, DP, &g, pair, t0, vec),
                  tok_src(v, 0, g.Dv, DP, &g, pair, t0, vec), tok_src(dout, 0, g.Dv, DP, &g, pair, t0, vec),
                  tok_src(y, 1, g.Dk, DP, &g, pair, t0, vec)};
    Src shn = mat_src(hn, g.Dk, g.Dk, DP, DP, vec), sgb = mat_src(gbar, g.Dv, g.Dk, DP, DP, vec);
    __half *dst[4] = {s.K, s.X, s.V, s.D};
    float sc[5];  // the scales of K, X, V, Delta, Y
    int lds4[4] = {ld, ld, ld, ld};
    stage_batch16(sc, src, dst, lds4, 4, &src[4], s.Yh, s.Yl, ld, CH * MAXD / 4 / NT, s.red, hn, hh * sizeof(float));
    float sK = sc[0], sX = sc[1], sV = sc[2], sD = sc[3], sY = sc[4];
    // (the adjoints are fetched a phase ahead; fetching them in the first batch spills registers)
    Vec16 hv[MAXD * MAXD / 4 / NT];  // Hn, in flight while S1 and S2 are computed
    stage_fetch(hv, MAXD * MAXD / 4 / NT, &shn);
    l2_prefetch(gbar, gg * sizeof(float));  // Gbar, for the third phase
    chunk_put(s.b);
    __syncthreads();
    float u[FR];
    decay_to_end(u, s.b, min(CH, g.T - t0));

    // S1 and S2, in true units, then each scaled into fp16 by its block maximum
    Tile s1, s2, ky;
    tile_zero(&s1);
    tile_zero(&s2);
    tile_zero(&ky);
    if (!scores_masked_out(1)) {
        tile_mma16(&s1, s.K, NULL, ld, s.X, NULL, ld, 1, 0, DP, ncs);
        tile_mma16(&s2, s.V, NULL, ld, s.D, NULL, ld, 1, 0, DP, ncs);
        tile_mma16(&ky, s.K, NULL, ld, s.Yh, s.Yl, ld, 1, 0, DP, ncs);
    }
    float ikx = 1.0f / (sK * sX), ivd = 1.0f / (sV * sD), iky = 1.0f / (sK * sY);  // powers of two: exact
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            s1.v[j][e] *= ikx;
            s2.v[j][e] = s2.v[j][e] * ivd - ky.v[j][e] * iky;
        }
    tile_mask(&s1, s.b, s.beta, 1);
    tile_mask(&s2, s.b, s.beta, 1);
    float ms[3] = {tile_absmax(&s1, ncs), tile_absmax(&s2, ncs), stage_absmax(hv, MAXD * MAXD / 4 / NT, 1)};
    block_max_n(ms, 3, s.red);
    float ss1 = fp16_scale(ms[0]), ss2 = fp16_scale(ms[1]), sH = fp16_scale(ms[2]);
    stage_put16(hv, MAXD * MAXD / 4 / NT, &shn, s.Mh, s.Ml, ld, sH);
    {
        float f1[FR] = {ss1, ss1}, f2[FR] = {ss2, ss2};
        tile_put16(s.S1h, s.S1l, lds, &s1, f1, ncs);
        tile_put16(s.S2h, s.S2l, lds, &s2, f2, ncs);
    }
    __syncthreads();

    Vec16 gv[MAXD * MAXD / 4 / NT];  // Gbar, in flight while T is computed
    stage_fetch(gv, MAXD * MAXD / 4 / NT, &sgb);

    // T = u (.) K (Hn^T + Hn) + S1 Y, and k.R1 = k.T - (1/2) k.(its state term)
    Tile t;
    float f[FR], ka[FR], kt[FR], kr[FR];
    tile_zero(&t);
    tile_mma16(&t, s.K, NULL, ld, s.Mh, s.Ml, ld, 1, 0, DP, nc);  // K Hn^T
    tile_mma16(&t, s.K, NULL, ld, s.Mh, s.Ml, ld, 0, 0, DP, nc);  // K Hn
#pragma unroll
    for (int i = 0; i < FR; i++) f[i] = u[i] * (ss1 * sY) / (sK * sH);
    tile_scale_rows(&t, f);
    tile_rowdot16(ka, &t, s.K, ld, 1.0f, nc);
    tile_mma16(&t, s.S1h, s.S1l, lds, s.Yh, s.Yl, ld, 0, rb, CH, nc);
    float it = 1.0f / (ss1 * sY), iK = 1.0f / sK;
    for (int i = 0; i < FR; i++) f[i] = it;
    tile_scale_rows(&t, f);
    tile_rowdot16(kt, &t, s.K, ld, iK, nc);
    for (int i = 0; i < FR; i++) kt[i] -= 0.5f * ka[i] * it * iK;
    rows_join(kr, kt, s.red, 0);  // (its barriers also end the reads of Hn)
    float sG = stage_absmax(gv, MAXD * MAXD / 4 / NT, 1);
    block_max_n(&sG, 1, s.red);
    sG = fp16_scale(sG);
    stage_put16(gv, MAXD * MAXD / 4 / NT, &sgb, s.Mh, s.Ml, ld, sG);
    __syncthreads();

    // P = u (.) K Gbar^T + S1 Delta; dv = beta P
    Tile pq;
    float vp[FR];
#pragma unroll
    for (int i = 0; i < FR; i++) f[i] = u[i] * (ss1 * sD) / (sK * sG);
    tile_gla16_rev(&pq, s.K, s.Mh, s.Ml, 1, DP, f, s.S1h, s.S1l, s.D, ld, nc);
    for (int i = 0; i < FR; i++) f[i] = 1.0f / (ss1 * sD);
    tile_scale_rows(&pq, f);
    tile_rowdot16(kt, &pq, s.V, ld, 1.0f / sV, nc);
    rows_join(vp, kt, s.red, 0);
    for (int i = 0; i < FR; i++) f[i] = s.beta[f_row(i)];
    tile_scale_rows(&pq, f);
    tile_store(dv_out, 0, &pq, &g, pair, t0, g.Dv, nc);

    // Q = u (.) V Gbar + S2 X; dk = beta (Q - T)
#pragma unroll
    for (int i = 0; i < FR; i++) f[i] = u[i] * (ss2 * sX) / (sV * sG);
    tile_gla16_rev(&pq, s.V, s.Mh, s.Ml, 0, DP, f, s.S2h, s.S2l, s.X, ld, nc);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            pq.v[j][e] = s.beta[f_row(e >> 1)] * (pq.v[j][e] * (1.0f / (ss2 * sX)) - t.v[j][e]);
    tile_store(dk_out, 0, &pq, &g, pair, t0, g.Dk, nc);
    size_t ti;
    if (row_owner())
#pragma unroll
        for (int i = 0; i < FR; i++)
            if (row_token(&ti, &g, pair, t0, i)) {
                float dbeta = vp[i] - kr[i];
                dbeta_out[ti] = dbeta;
                db_out[ti] = tok_terms[ti] - s.beta[f_row(i)] * dbeta;
            }
}

// db_final[pair] = <dhT, H_T> + <dgT, G_T> (the final states' term of dL/db), one block per pair.
static __global__ void final_dot_kernel(float *db_final, const float *states, const float *dhT, const float *dgT, Geo g) {
    grid_wait();
    __shared__ float red[32];
    int pair = g.pair0 + blockIdx.x;
    size_t hh = (size_t)g.Dk * g.Dk, gg = (size_t)g.Dv * g.Dk;
    const float *fin = states + ((size_t)pair * (g.nchunks + 1) + g.nchunks) * (hh + gg);
    float acc = 0;
    for (size_t e = threadIdx.x; e < hh + gg; e += blockDim.x)
        acc += e < hh ? (dhT ? dhT[(size_t)pair * hh + e] * fin[e] : 0.0f) : (dgT ? dgT[(size_t)pair * gg + e - hh] * fin[e] : 0.0f);
    acc = block_sum(acc, red);
    if (threadIdx.x == 0) db_final[pair] = acc;
}

// dg_t = db_final + sum_{u >= t} db_u (db_final NULL: 0): a block per pair, over tiles of
// DG_THREADS x DG_RUN tokens from the end. Each thread loads its run of DG_RUN consecutive tokens
// (all loads in flight) and sums it; a block scan of the runs' sums gives each run what lies after
// it. (One warp walking windows of 32 tokens, a dependent load each, is a chain of latencies.)
#define DG_THREADS 256
#define DG_RUN 8
static __global__ void __launch_bounds__(DG_THREADS) dg_scan_kernel(float *dg, const float *db, const float *db_final, Geo g) {
    assume_threads(DG_THREADS);
    grid_wait();
    __shared__ float part[DG_THREADS / 32];
    int pair = g.pair0 + blockIdx.x, lane = lane_id(), w = warp_id();
    float carry = db_final ? db_final[pair] : 0.0f;
    for (int end = g.T; end > 0; end -= DG_THREADS * DG_RUN) {
        int top = end - 1 - (int)threadIdx.x * DG_RUN;  // thread 0 takes the latest run
        float v[DG_RUN], s = 0;
#pragma unroll
        for (int r = 0; r < DG_RUN; r++) v[r] = top - r >= 0 ? db[tok_index(&g, pair, top - r)] : 0.0f;
#pragma unroll
        for (int r = 0; r < DG_RUN; r++) v[r] = s += v[r];  // the run's sums from its top down
        float x = s;  // then the sums over this warp's runs up to this one
        for (int o = 1; o < 32; o <<= 1) {
            float u = __shfl_up_sync(0xffffffffu, x, o);
            if (lane >= o) x += u;
        }
        if (lane == 31) part[w] = x;
        __syncthreads();
        float after = carry + x - s, total = 0;  // after: the tokens after this run
        for (int i = 0; i < DG_THREADS / 32; i++) {
            if (i < w) after += part[i];
            total += part[i];
        }
#pragma unroll
        for (int r = 0; r < DG_RUN; r++)
            if (top - r >= 0) dg[tok_index(&g, pair, top - r)] = after + v[r];
        carry += total;
        __syncthreads();  // part is written again
    }
}

