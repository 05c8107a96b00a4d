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

// INC2 (0 or 1, a constant at each call, folded by the inlining) selects the adjoint walk's own
// increments (lf_walk2_kernel). With LF_WDB, A and B in two stages (Ah0/Bh0, Ah1/Bh1): the next
// chunk's copies are issued once this chunk's have landed (after the adjoint walk's second
// increment's own copy), and the barriers inside a chunk then do not wait for them.
static __device__ __forceinline__ void lf_walk_body(const LcDims d, const LfWalk k, const int INC2) {
    extern __shared__ __align__(16) unsigned char lf_dsmem[];
    bf16 *Ah0 = (bf16 *)lf_dsmem, *Al = Ah0 + LF_TK, *Bh0 = Al + LF_LO(LF_TK), *Bl = Bh0 + LF_TK,
         *Xh = Bl + LF_LO(LF_TK) + (LF_WDB ? 2 * LF_TK : 0), *Xl = Xh + LF_TX, *Yh = Xl + LF_LO(LF_TX), *Yl = Yh + LF_TY;
    bf16 *const Ah1 = Bh0 + LF_TK, *const Bh1 = Ah1 + LF_TK;  // (LF_WDB: the second stage)
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, Dk = d.Dk, Dv = d.Dv, NT = Dk / 8;
    const int p = blockIdx.y, r0 = blockIdx.x * LF_R, lr = lane >> 2, lc = 2 * (lane & 3);
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
            lf_prefetch(d, k.y0, nx, r0, LF_R);
            if (INC2) {
                lf_prefetch(d, k.y2, nx, r0, LF_R);
                lf_prefetch(d, k.b2, nx, 0, Dk);
            }
            if (threadIdx.x < 2) {
                if (k.ra) prefetch_l2(k.ra + nx * LF_C + 32 * threadIdx.x);
                if (k.rb) prefetch_l2(k.rb + nx * LF_C + 32 * threadIdx.x);
            }
            if (k.inc)
                for (int e = threadIdx.x; e < LF_R * Dk / 32; e += blockDim.x)
                    if (r0 + e / (Dk / 32) < Dv) prefetch_l2(k.inc + (nx * Dv + r0) * Dk + 32 * e);
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
        if (LF_WDB) __syncthreads();  // (the next chunk's copies left in flight)
        else lf_sync();
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
#pragma unroll
        for (int pass = 0; pass < (INC2 ? 2 : 1); pass++) {
            const int bex = pass ? 1 : k.b_exact;
            if (pass) {  // the second increment: B2 into B's hi tile, sb2 diag(rb2) Y2 into Y's tiles
                lf_sync();
                lf_load(d, k.b2, ch, 0, Dk, Bh, LF_LDK, LF_UNR_WALK);
                for (int e = threadIdx.x; e < LF_C * LF_R / 2; e += blockDim.x) {
                    int t = e / (LF_R / 2), j = 2 * (e - t * (LF_R / 2));
                    float sc = k.rb2 ? k.sb2 * k.rb2[ch * LF_C + t] : k.sb2;
                    lf_st2s(Yh + t * LF_LDR + j, Yl + t * LF_LDR + j, sc * lf_at(d, k.y2, ch, t, r0 + j),
                            sc * lf_at(d, k.y2, ch, t, r0 + j + 1));
                }
                lf_sync();
                if (LF_WDB && it + 1 < d.N) lf_walk_load_ab(d, k, nx, An, Al, Bn, Bl);
            }
            for (int kt = 0; kt < LF_C / 16; kt++) {
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
                    const int bo = (kt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LF_LDK + ((lane >> 4) ? n1 : n0) * 8;
                    uint32_t bh[4], bl[4];
                    ldsm_x4_t(bh, Bh + bo);
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
                    if (LF_SPLIT) ldsm_x4_t(bl, Bl + bo);
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        mma3(x[mt][2 * sp], ah[mt], al[mt], bh[0], bh[1], bl[0], bl[1]);
                        if (two && n0 + 4 < NT)
                            mma3(x[mt][(2 * sp + 1) % LF_NS], ah[mt], al[mt], bh[2], bh[3], bl[2], bl[3]);
                    }
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
    lf_walk_body(d, k, 0);
}
static __global__ void __launch_bounds__(LF_THREADS, LF_WALK_MINB) lf_walk2_kernel(const LcDims d, const LfWalk k) {
    lf_walk_body(d, k, 1);
}

// One launch of lf_walk_kernel (its shared memory above the 48 KiB default allowed at every call, as
// attn_cuda.cu does: the attribute is the current device's).
int lf_walk(CudaCtx *c, const LcDims *d, const LfWalk *wk) {
    const dim3 grid((unsigned)((d->Dv + LF_R - 1) / LF_R), (unsigned)d->P);
    if (wk->y2.p) {
        CU_TRY(cudaFuncSetAttribute(lf_walk2_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_WALK_SMEM));
        lf_walk2_kernel<<<grid, LF_THREADS, LF_WALK_SMEM, c->stream>>>(*d, *wk);
    } else {
        CU_TRY(cudaFuncSetAttribute(lf_walk_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LF_WALK_SMEM));
        lf_walk_kernel<<<grid, LF_THREADS, LF_WALK_SMEM, c->stream>>>(*d, *wk);
    }
    LAUNCH_CHECK();
    return MN_OK;
}
