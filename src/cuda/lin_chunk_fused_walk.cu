/*
 * The fused path's state walks (lin_chunk_fused.cuh): a block per (pair, slice of LF_R rows of Dv)
 * walks the chunks with its slice of the state (or, reversed, of its adjoint) in registers, the
 * chunk's operands staged in shared memory as bf16 (hi + lo where they are not exact), the next
 * chunk's asked of the L2 meanwhile. The walk is the chain that cannot be batched over chunks.
 */
#include "lin_chunk_fused.cuh"

// Asks the L2 for rows 0..63, columns c0 .. c0 + ncols - 1 of chunk ch of s (and its row scales):
// the state walk's next chunk, fetched while it works on this one (its loads then wait on the L2,
// not on DRAM: the walk is a chain of dependent loads and products with nothing else to run).
static __device__ __forceinline__ void lf_prefetch(const LcDims d, const LfSrc s, size_t ch, int c0, int ncols) {
    if (!s.p) return;
    if (c0 + ncols > s.D) ncols = s.D - c0;
    if (ncols <= 0) return;
    const int es = s.tok ? 2 : 4, bytes = ncols * es, lines = (bytes + 127) / 128 + 1;  // +1: an unaligned row's tail
    const int p = (int)(ch / d.N), tb = (int)(ch % d.N) * LF_C;
    for (int e = threadIdx.x; e < LF_C * lines; e += blockDim.x) {
        const int t = e / lines, off = min(128 * (e - t * lines), bytes - 1);
        if (tb + t >= d.T) continue;
        const size_t el = s.tok == 1 ? lc_tok(d, p, tb + t) * s.D + c0 : (ch * LF_C + t) * s.D + c0;
        prefetch_l2((const char *)s.p + el * es + off);
    }
    if (s.rs && threadIdx.x < 2) prefetch_l2(s.rs + ch * LF_C + 32 * threadIdx.x);
}

// Chunk ch's A and B tiles (A only where the walk has one): copied where exact, split hi + lo else.
static __device__ __forceinline__ void lf_walk_load_ab(const LcDims d, const LfWalk &k, size_t ch, bf16 *Ah, bf16 *Al,
                                                       bf16 *Bh, bf16 *Bl) {
    if (k.a.p && k.a_exact) lf_load(d, k.a, ch, 0, d.Dk, Ah, LF_LDK, LF_UNR_WALK);
    else if (k.a.p) lf_load2(d, k.a, ch, 0, d.Dk, Ah, Al, LF_LDK, LF_UNR_WALK);
    if (k.b_exact) lf_load(d, k.b, ch, 0, d.Dk, Bh, LF_LDK, LF_UNR_WALK);
    else lf_load2(d, k.b, ch, 0, d.Dk, Bh, Bl, LF_LDK, LF_UNR_WALK);
}

// INC2 (0 or 1, a constant at each call, folded by the inlining) selects the adjoint walk's second
// increment (lf_walk2_kernel), folded into the first as one product over 128 rows: [Y; Y2]^T [B; B2],
// Y2's tile beside Y's, B2 copied into the X region once the first product has read X. With LF_WDB,
// A and B in two stages (Ah0/Bh0, Ah1/Bh1): the next chunk's copies are issued once this chunk's
// have landed (INC2: once B2's has), and the barriers inside a chunk then do not wait for them. G
// (1 or 2, a constant as INC2) groups of 4 warps a block, group g walking rows LF_R g .. of the
// block's LF_R G with its own X and Y tiles, the A and B tiles shared (lf_walk_groups says when).
// Shared memory (LF_WALK_SMEM_G): A, B hi and lo (LF_WDB: a second stage of A, B hi); the X region,
// the groups' X tiles hi, then lo (INC2: at least [64][LF_LDK], for B2); each group's Y tile hi,
// then lo, [64 (INC2: 128)][LF_LDR].
static __device__ __forceinline__ void lf_walk_body(const LcDims d, const LfWalk k, const int INC2, const int G) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Ah0 = (bf16 *)lf_dsmem, *Al = Ah0 + LF_TK, *Bh0 = Al + LF_LO(LF_TK), *Bl = Bh0 + LF_TK;
    bf16 *const Ah1 = Bh0 + LF_TK, *const Bh1 = Ah1 + LF_TK;  // (LF_WDB: the second stage)
    bf16 *const xr = Bl + LF_LO(LF_TK) + (LF_WDB ? 2 * LF_TK : 0), *const yr = xr + LF_XREG(G, INC2);
    const int grp = threadIdx.x >> 7, YT = LF_YT(INC2);
    bf16 *const Xh = xr + grp * LF_TX, *const Xl = xr + G * LF_TX + grp * LF_TX;
    bf16 *const Yh = yr + grp * (YT + LF_LO(YT)), *const Yl = Yh + YT;
    const int lane = threadIdx.x & 31, w = (threadIdx.x >> 5) & 3, Dk = d.Dk, Dv = d.Dv, NT = Dk / 8;
    const int p = blockIdx.y, rb0 = blockIdx.x * LF_R * G, r0 = rb0 + LF_R * grp;
    const int lr = lane >> 2, lc = 2 * (lane & 3);
    float x[2][LF_NS][4];  // [m tile: rows r0 + 16 mt][slot s: columns 8 (w + 4 s)][fragment]
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int s = 0; s < LF_NS; s++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int r = r0 + 16 * mt + lr + 8 * (e >> 1), col = 8 * (w + 4 * s) + lc + (e & 1);
                x[mt][s][e] = k.init && r < Dv && w + 4 * s < NT ? k.init[((size_t)p * Dv + r) * Dk + col] : 0.0f;
            }
    const size_t ch0 = (size_t)p * d.N + (k.reverse ? d.N - 1 : 0);
    if (LF_WDB) lf_walk_load_ab(d, k, ch0, Ah0, Al, Bh0, Bl);
    for (int it = 0; it < d.N; it++) {
        const size_t ch = (size_t)p * d.N + (k.reverse ? d.N - 1 - it : it), nx = k.reverse ? ch - 1 : ch + 1;
        bf16 *const Ah = LF_WDB && (it & 1) ? Ah1 : Ah0, *const Bh = LF_WDB && (it & 1) ? Bh1 : Bh0;
        // the next chunk's A and B into the other stage (LF_WDB), once this chunk's have landed
        bf16 *const An = LF_WDB && (it & 1) ? Ah0 : Ah1, *const Bn = LF_WDB && (it & 1) ? Bh0 : Bh1;
        if (it + 1 < d.N) {
            if (!LF_WDB) {
                lf_prefetch(d, k.a, nx, 0, Dk);
                lf_prefetch(d, k.b, nx, 0, Dk);
            }
            lf_prefetch(d, k.y0, nx, rb0, LF_R * G);
            if (INC2) {
                lf_prefetch(d, k.y2, nx, rb0, LF_R * G);
                lf_prefetch(d, k.b2, nx, 0, Dk);
            }
            if (threadIdx.x < 2) {
                if (k.ra) prefetch_l2(k.ra + nx * LF_C + 32 * threadIdx.x);
                if (k.rb) prefetch_l2(k.rb + nx * LF_C + 32 * threadIdx.x);
            }
            if (k.inc)
                for (int e = threadIdx.x; e < LF_R * G * Dk / 32; e += blockDim.x)
                    if (rb0 + e / (Dk / 32) < Dv) prefetch_l2(k.inc + (nx * Dv + rb0) * Dk + 32 * e);
        }
        if (!LF_WDB) lf_walk_load_ab(d, k, ch, Ah, Al, Bh, Bl);
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int s = 0; s < LF_NS; s++) {
                int nt = w + 4 * s;
                if (nt >= NT) continue;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    int rl = 16 * mt + lr + 8 * h, col = 8 * nt + lc;
                    lf_st2s(Xh + rl * LF_LDK + col, Xl + rl * LF_LDK + col, x[mt][s][2 * h], x[mt][s][2 * h + 1]);
                    if (k.xs && r0 + rl < Dv) {
                        float *o = k.xs + (ch * Dv + r0 + rl) * Dk + col;
                        o[0] = x[mt][s][2 * h];
                        o[1] = x[mt][s][2 * h + 1];
                    }
                }
            }
        lf_sync();
        if (LF_WDB && !INC2 && it + 1 < d.N) lf_walk_load_ab(d, k, nx, An, Al, Bn, Bl);
        // Y rows 16 w .. 16 w + 15, all LF_R columns
        float y[4][4];
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) y[n][e] = 0.0f;
        if (k.a.p) {
            for (int ks = 0; ks < Dk / 16; ks++) {
                uint32_t ah[4], al[4], bh[4], bl[4];
                const int ao = (16 * w + (lane & 15)) * LF_LDK + ks * 16 + (lane >> 4) * 8;
                ldsm_x4(ah, Ah + ao);
                if (LF_SPLIT && !k.a_exact) ldsm_x4(al, Al + ao);
#pragma unroll
                for (int np = 0; np < 2; np++) {
                    const int bo = (np * 16 + (lane & 7) + (lane >> 4) * 8) * LF_LDK + ks * 16 + ((lane >> 3) & 1) * 8;
                    ldsm_x4(bh, Xh + bo);
                    if (LF_SPLIT) ldsm_x4(bl, Xl + bo);
                    if (k.a_exact) {
                        if (LF_SPLIT) mma_bf16_x2(&y[2 * np], ah, bl);
                        mma_bf16_x2(&y[2 * np], ah, bh);
                    } else {
                        mma3(y[2 * np], ah, al, bh[0], bh[1], bl[0], bl[1]);
                        mma3(y[2 * np + 1], ah, al, bh[2], bh[3], bl[2], bl[3]);
                    }
                }
            }
        }
        if (INC2) {  // every warp done with X: B2 into its region
            __syncthreads();
            lf_load(d, k.b2, ch, 0, Dk, xr, LF_LDK, LF_UNR_WALK);
        }
#pragma unroll
        for (int n = 0; n < 4; n++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int t = 16 * w + lr + 8 * h, j = 8 * n + lc;
                float sa = k.ra ? k.sa * k.ra[ch * LF_C + t] : k.sa, sb = k.rb ? k.sb * k.rb[ch * LF_C + t] : k.sb;
                float v0 = lf_at(d, k.y0, ch, t, r0 + j) + sa * y[n][2 * h];
                float v1 = lf_at(d, k.y0, ch, t, r0 + j + 1) + sa * y[n][2 * h + 1];
                if (k.y) {
                    float *o = k.y + (ch * LF_C + t) * Dv + r0 + j;
                    if (r0 + j < Dv) o[0] = v0;
                    if (r0 + j + 1 < Dv) o[1] = v1;
                }
                lf_st2s(Yh + t * LF_LDR + j, Yl + t * LF_LDR + j, sb * v0, sb * v1);
            }
        if (INC2)  // Y2 = sb2 diag(rb2) Y2 below Y, the group's rows
            for (int e = threadIdx.x & (LF_THREADS - 1); e < LF_C * LF_R / 2; e += LF_THREADS) {
                int t = e / (LF_R / 2), j = 2 * (e - t * (LF_R / 2));
                float sc = k.rb2 ? k.sb2 * k.rb2[ch * LF_C + t] : k.sb2;
                lf_st2s(Yh + (LF_C + t) * LF_LDR + j, Yl + (LF_C + t) * LF_LDR + j, sc * lf_at(d, k.y2, ch, t, r0 + j),
                        sc * lf_at(d, k.y2, ch, t, r0 + j + 1));
            }
        if (LF_WDB && !INC2) __syncthreads();  // (the next chunk's copies left in flight)
        else lf_sync();                        // (INC2: B2's copy landed)
        if (LF_WDB && INC2 && it + 1 < d.N) lf_walk_load_ab(d, k, nx, An, Al, Bn, Bl);
        const float dec = k.dec[ch];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int s = 0; s < LF_NS; s++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = r0 + 16 * mt + lr + 8 * (e >> 1), col = 8 * (w + 4 * s) + lc + (e & 1);
                    float a = dec * x[mt][s][e];
                    if (k.inc && r < Dv && w + 4 * s < NT) a += k.inc[(ch * Dv + r) * Dk + col];
                    x[mt][s][e] = a;
                }
        for (int kt = 0; kt < (1 + INC2) * LF_C / 16; kt++) {  // rows 16 kt of [Y; Y2] and [B; B2]
            const int bex = kt < LF_C / 16 ? k.b_exact : 1;
            const bf16 *const Bt = kt < LF_C / 16 ? Bh + kt * 16 * LF_LDK : xr + (kt - LF_C / 16) * 16 * LF_LDK;
            const bf16 *const Blt = Bl + kt * 16 * LF_LDK;  // (B's lo tile: kt < 4 only)
            uint32_t ah[2][4], al[2][4];
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                const int ao = (kt * 16 + (lane & 7) + (lane >> 4) * 8) * LF_LDR + mt * 16 + ((lane >> 3) & 1) * 8;
                ldsm_x4_t(ah[mt], Yh + ao);
                if (LF_SPLIT) ldsm_x4_t(al[mt], Yl + ao);
            }
#pragma unroll
            for (int sp = 0; sp < (LF_NS + 1) / 2; sp++) {  // slots 2 sp, 2 sp + 1 (a slot past Dk reads a valid tile, unused)
                const int two = 2 * sp + 1 < LF_NS;         // (a build with one slot has no second)
                int n0 = w + 8 * sp, n1 = two && n0 + 4 < NT ? n0 + 4 : n0;
                if (n0 >= NT) continue;
                const int bo = ((lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDK + ((lane >> 4) ? n1 : n0) * 8;
                uint32_t bh[4], bl[4];
                ldsm_x4_t(bh, Bt + bo);
                if (bex) {
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        if (LF_SPLIT) mma_bf16(x[mt][2 * sp], al[mt], bh[0], bh[1]);
                        mma_bf16(x[mt][2 * sp], ah[mt], bh[0], bh[1]);
                        if (two && n0 + 4 < NT) {
                            if (LF_SPLIT) mma_bf16(x[mt][(2 * sp + 1) % LF_NS], al[mt], bh[2], bh[3]);
                            mma_bf16(x[mt][(2 * sp + 1) % LF_NS], ah[mt], bh[2], bh[3]);
                        }
                    }
                    continue;
                }
                if (LF_SPLIT) ldsm_x4_t(bl, Blt + bo);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    mma3(x[mt][2 * sp], ah[mt], al[mt], bh[0], bh[1], bl[0], bl[1]);
                    if (two && n0 + 4 < NT)
                        mma3(x[mt][(2 * sp + 1) % LF_NS], ah[mt], al[mt], bh[2], bh[3], bl[2], bl[3]);
                }
            }
        }
        if (LF_WDB) __syncthreads();
        else lf_sync();
    }
    if (k.xfin)
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int s = 0; s < LF_NS; s++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = r0 + 16 * mt + lr + 8 * (e >> 1), col = 8 * (w + 4 * s) + lc + (e & 1);
                    if (r < Dv && w + 4 * s < NT) k.xfin[((size_t)p * Dv + r) * Dk + col] = x[mt][s][e];
                }
}

// INC2 = 0 (lf_walk_kernel, the forward's and GLA's walks) or 1 (lf_walk2_kernel, the delta rule's
// adjoint walk with its second increment), two kernels so that the first keeps its registers.
// (Minimum blocks 1: without it ptxas holds lf_walk2_kernel to 128 registers and spills in the
// chunk loop; shared memory allows two blocks either way, the bf16 build's two stages of A and B
// included.)
#define LF_WALK_MINB (LF_SPLIT ? 1 : 2)
static __global__ void __launch_bounds__(LF_THREADS, LF_WALK_MINB) lf_walk_kernel(const LcDims d, const LfWalk k) {
    lf_walk_body(d, k, 0, 1);
}
static __global__ void __launch_bounds__(LF_THREADS, LF_WALK_MINB) lf_walk2_kernel(const LcDims d, const LfWalk k) {
    lf_walk_body(d, k, 1, 1);
}
#if LF_WALK_G2
// The same with two groups a block, two blocks a multiprocessor (128 registers a thread, no spills).
static __global__ void __launch_bounds__(2 * LF_THREADS, 2) lf_walk_g2_kernel(const LcDims d, const LfWalk k) {
    lf_walk_body(d, k, 0, 2);
}
static __global__ void __launch_bounds__(2 * LF_THREADS, 2) lf_walk2_g2_kernel(const LcDims d, const LfWalk k) {
    lf_walk_body(d, k, 1, 2);
}
#endif

// Groups a walk block (1 or 2): two where that takes fewer waves of blocks (a walk block is a chain
// of chunks, all of one length: the blocks past the device's slots wait for a whole walk). Both
// kinds of block run two to a multiprocessor (one group: LF_WALK_MINB and its shared memory; two:
// their launch bounds), so a block of two groups holds twice the warps of one, and shares one copy
// of the A and B tiles between them. Gdn at 8 x 2048 x 16 x 128: 512 blocks of one group on the
// 264 slots of an H200 (two waves), 256 of two (one).
static int lf_walk_groups(const CudaCtx *c, const LcDims *d) {
    if (!LF_WALK_G2 || c->smem_optin < LF_WALK_SMEM_G(2, 1)) return 1;
    const long s = (d->Dv + LF_R - 1) / LF_R, b1 = (long)d->P * s, b2 = (long)d->P * ((s + 1) / 2);
    const long slots = 2L * (c->sm_count > 0 ? c->sm_count : 1);
    return (b2 + slots - 1) / slots < (b1 + slots - 1) / slots ? 2 : 1;
}

// One launch of lf_walk_kernel (its shared memory above the 48 KiB default allowed at every call, as
// attn_cuda.cu does: the attribute is the current device's).
int lf_walk(CudaCtx *c, const LcDims *d, const LfWalk *wk) {
    const int G = lf_walk_groups(c, d);
    const dim3 grid((unsigned)((d->Dv + LF_R * G - 1) / (LF_R * G)), (unsigned)d->P);
    void (*kern)(const LcDims, const LfWalk) = wk->y2.p ? lf_walk2_kernel : lf_walk_kernel;
#if LF_WALK_G2
    if (G == 2) kern = wk->y2.p ? lf_walk2_g2_kernel : lf_walk_g2_kernel;
#endif
    const size_t smem = LF_WALK_SMEM_G(G, wk->y2.p != NULL);
    CU_TRY(cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    kern<<<grid, LF_THREADS * G, smem, c->stream>>>(*d, *wk);
    LAUNCH_CHECK();
    return MN_OK;
}
