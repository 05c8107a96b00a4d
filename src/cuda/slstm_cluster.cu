/*
 * The sLSTM core's Hopper kernels (compute capability 9; slstm_cuda.cu's host side picks them, and
 * keeps its single-block kernels for older GPUs). A head's cells are split over a cluster of CS
 * blocks (CS = 1, 2 or 4 by the head's size; each block CL cells of the 8 sequences it takes), so
 * that each block's share of R fits in its registers as mma.sync A fragments: nothing of R is read
 * from memory after the start. Per step the blocks exchange what the others need through
 * distributed shared memory: st.async into every block of the cluster, each counting its bytes on the
 * receiver's mbarrier, three slots deep (a block can then be at most a step ahead of another, so a slot is
 * never written before all have read it: no barrier across the cluster per step); a cluster of one
 * (heads up to 64 cells) is a plain block with shared stores and a block barrier a step:
 *
 *   forward   a warp per 16 gate columns (4 cells x gates i, f, z, o) of its block's cells: r =
 *             R^T h_{t-1} (K = the head's cells), the four gates of a (cell, sequence) gathered by
 *             shuffles, the pointwise step (each lane one (cell, sequence), its c, n, m in
 *             registers), h_t into every block's h tile for the next step;
 *   backward  dh_rec = R dg_{t+1} for the block's cells (warps over 16-cell tiles x quarters of the
 *             gate columns, the quarters summed through shared memory), then the pointwise backward,
 *             a thread per (cell, sequence), its dc, dn in registers; dg_t into every block's tile.
 *
 * Per-step inputs (x; the backward's G, cache and dh) are staged by 4-byte cp.async two steps ahead
 * in three slots, each thread its own words (no barrier needed to read them).
 */
#include <math.h>

#include "slstm_cuda.cuh"

// -- device-only: begin (the cluster's PTX; scripts/cuda_emulate.sh slstm has its own)
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900
static __device__ __forceinline__ unsigned slc_rank(void) {
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// Every thread of every block of the cluster: writes before it (shared memory, the cluster's
// included) are seen after it.
static __device__ __forceinline__ void slc_sync(void) {
    asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// The address of p (this block's shared memory) in block `rank` of the cluster.
static __device__ __forceinline__ uint32_t slc_map(const void *p, unsigned rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(smem_addr(p)), "r"(rank));
    return r;
}
// mbarriers: init (count arrivals a phase), made visible to the cluster; thread 0's arrival with the
// bytes a phase expects; a wait for the phase of the given parity; remote stores that count their
// bytes on the receiver's mbarrier (st.async: no fence needed, the mbarrier's phase orders them).
static __device__ __forceinline__ void slc_mbar_init(void *m, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(m)), "r"(count) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
static __device__ __forceinline__ void slc_mbar_expect(void *m, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(m)), "r"(bytes) : "memory");
}
static __device__ __forceinline__ void slc_mbar_wait(void *m, unsigned parity) {
    asm volatile("{\n\t.reg .pred P1;\n\tLAB_WAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 P1, [%0], %1;\n\t"
                 "@P1 bra DONE;\n\tbra LAB_WAIT;\n\tDONE:\n\t}" ::"r"(smem_addr(m)), "r"(parity) : "memory");
}
static __device__ __forceinline__ void slc_st_async32(uint32_t a, uint32_t v, uint32_t mbar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(a), "r"(v), "r"(mbar)
                 : "memory");
}
static __device__ __forceinline__ void slc_st_async64(uint32_t a, uint32_t lo, uint32_t hi, uint32_t mbar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.b32 [%0], {%1, %2}, [%3];" ::"r"(a), "r"(lo),
                 "r"(hi), "r"(mbar) : "memory");
}
#else
static __device__ __forceinline__ unsigned slc_rank(void) { return 0; }
static __device__ __forceinline__ void slc_sync(void) { __syncthreads(); }
static __device__ __forceinline__ uint32_t slc_map(const void *p, unsigned rank) { return smem_addr(p); }
static __device__ __forceinline__ void slc_mbar_init(void *m, unsigned count) {}
static __device__ __forceinline__ void slc_mbar_expect(void *m, unsigned bytes) {}
static __device__ __forceinline__ void slc_mbar_wait(void *m, unsigned parity) {}
static __device__ __forceinline__ void slc_st_async32(uint32_t a, uint32_t v, uint32_t mbar) {}
static __device__ __forceinline__ void slc_st_async64(uint32_t a, uint32_t lo, uint32_t hi, uint32_t mbar) {}
#endif
// 4 bytes from global to shared memory in the background (`bytes` 4 or 0: zero-filled).
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
}
// -- device-only: end

// The bf16 at index i of p as a 4-byte word to stage: the aligned word holding it (the last element
// of an even count has no such word inside the buffer: written directly instead).
static __device__ __forceinline__ void slc_stage_bf16(uint32_t *dst, const bf16 *p, size_t i, size_t n, int ok) {
    if (ok && (i & 1) == 0 && i + 1 >= n) {
        *dst = pack_bf16(ld(p, i), 0.0f);
        return;
    }
    cp_async4(dst, (const char *)p + ((2 * i) & ~(size_t)3), ok ? 4 : 0);
}
static __device__ __forceinline__ float slc_pick(uint32_t u, size_t i) {
    return __uint_as_float((i & 1) ? (u & 0xffff0000u) : (u << 16));
}

// ------------------------------------------------------------------------------ forward

// x of step t for this thread's (cell, sequence): gates i, f, z, o into slot[g NT + tid].
static __device__ __forceinline__ void slc_x_stage(const SlcFwd &a, uint32_t *slot, int NT, int b, int t, int cell,
                                                   int ok) {
    const int D = a.H * a.Dh, hd = blockIdx.x / (gridDim.x / a.H);
    const size_t n = (size_t)a.B * a.T * 4 * D;
#pragma unroll
    for (int g = 0; g < 4; g++) {
        const size_t i = ok ? (((size_t)b * a.T + t) * 4 + g) * D + (size_t)hd * a.Dh + cell : 0;
        slc_stage_bf16(slot + g * NT + threadIdx.x, a.x, i, n, ok);
    }
    cp_async_commit();
}

static __device__ __forceinline__ void slc_fwd_body(const SlcFwd a, const int CS, const int CL, const int KS) {
    extern __shared__ __align__(16) unsigned char sl_smem[];
    const int NT = CL * 8, LDH = CS * CL + 8, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    const unsigned rank = slc_rank(), SLOT = SL_NB * CS * CL * 2;  // bytes landing in a slot a step
    const int hd = blockIdx.x / CS, b0 = blockIdx.y * SL_NB, Dh = a.Dh, D = a.H * Dh, T = a.T;
    uint64_t *mb = (uint64_t *)sl_smem;                 // [3] mbarriers of the h slots
    bf16 *hs = (bf16 *)(sl_smem + 32);                  // [3][SL_NB][LDH]: h_{t-1} of all the head's cells
    uint32_t *xs = (uint32_t *)(hs + 3 * SL_NB * LDH);  // [3][4][NT]: staged x
    const uint4 *fg = a.frag + ((size_t)(hd * CS + rank) * (CL / 4) + w) * KS * 32;
    uint4 fr[16];
#pragma unroll
    for (int f = 0; f < KS; f++) fr[f] = fg[f * 32 + lane];
    // this lane's (cell, sequence): the accumulator element of its gate index gd
    const int gd = (lane >> 2) & 3, bl = 2 * (lane & 3) + (gd & 1), b = b0 + bl;
    const int cell = rank * CL + 4 * w + (lane >> 4) + 2 * (gd >> 1), ok = cell < Dh && b < a.B;
    const size_t hbase = (size_t)b * T * D + (size_t)hd * Dh + cell;          // h of step t: + t D
    const size_t cbase = (size_t)b * T * 4 * D + (size_t)hd * Dh + cell;      // its cache: + 4 t D
    float c = 0.0f, n = 0.0f, m = 0.0f, h = 0.0f;
    if (ok && a.s0) {
        const float *s = a.s0 + (size_t)b * 4 * D + (size_t)hd * Dh + cell;
        h = s[0], c = s[D], n = s[2 * D], m = s[3 * D];
    }
    if (CS > 1 && threadIdx.x == 0)
        for (int j = 0; j < 3; j++) slc_mbar_init(mb + j, 1);
    slc_x_stage(a, xs, NT, b, 0, cell, ok);
    slc_x_stage(a, xs + 4 * NT, NT, b, 1 < T ? 1 : 0, cell, ok && 1 < T);
    if (CS > 1) slc_sync();  // the mbarriers initialised, every block running
    // h (bf16) of cells 2 j, 2 j + 1 of a sequence to slot `sl` of every block: lanes 0..15 with their
    // neighbours 16 above (the same sequence, the next cell)
    const uint32_t hoff = (uint32_t)(bl * LDH + cell) * 2;
// (a cluster of one: plain shared stores, a block barrier before the slot is read)
#define SLC_SEND_H(sl)                                                                                        \
    do {                                                                                                      \
        const float ho = __shfl_down_sync(0xffffffffu, h, 16);                                                \
        if (lane < 16 && CS == 1) *(uint32_t *)(hs + (sl) * SL_NB * LDH + bl * LDH + cell) = pack_bf16(h, ho);  \
        else if (lane < 16)                                                                                   \
            for (int q = 0; q < CS; q++)                                                                      \
                slc_st_async32(slc_map(hs, q) + hoff + (uint32_t)((sl) * SL_NB * LDH) * 2, pack_bf16(h, ho),  \
                               slc_map(mb + (sl), q));                                                        \
    } while (0)
    if (CS > 1 && threadIdx.x == 0) slc_mbar_expect(mb, SLOT);
    SLC_SEND_H(0);
    for (int t = 0; t < T; t++) {
        const int sl = t % 3;
        if (CS > 1 && threadIdx.x == 0 && t + 1 < T) slc_mbar_expect(mb + (t + 1) % 3, SLOT);
        cp_async_wait1();
        const uint32_t *xw = xs + sl * 4 * NT;
        float xv[4];
#pragma unroll
        for (int g = 0; g < 4; g++) {
            const size_t i = (((size_t)b * T + t) * 4 + g) * D + (size_t)hd * Dh + cell;
            xv[g] = ok ? slc_pick(xw[g * NT + threadIdx.x], i) : 0.0f;
        }
        if (t + 2 < T) slc_x_stage(a, xs + ((t + 2) % 3) * 4 * NT, NT, b, t + 2, cell, ok);
        else cp_async_commit();
        if (CS > 1) slc_mbar_wait(mb + sl, (unsigned)(t / 3) & 1u);
        else __syncthreads();
        const bf16 *hc = hs + sl * SL_NB * LDH;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f}, ac2[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // two chains of products
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const bf16 *hr = hc + (lane >> 2) * LDH + 16 * ks + 2 * (lane & 3);
            const uint32_t r[4] = {fr[ks].x, fr[ks].y, fr[ks].z, fr[ks].w};
            mma_bf16((ks & 1) ? ac2 : acc, r, *(const uint32_t *)hr, *(const uint32_t *)(hr + 8));
        }
#pragma unroll
        for (int e = 0; e < 4; e++) acc[e] += ac2[e];
        float r[4];
#pragma unroll
        for (int k = 0; k < 4; k++) {  // round k: gate (gd + k) & 3 of this lane's element, from its lane
            const int e = (gd - k) & 3, gs = (gd + k) & 3;
            const float send = e == 0 ? acc[0] : e == 1 ? acc[1] : e == 2 ? acc[2] : acc[3];
            const float v = __shfl_sync(0xffffffffu, send, (lane & ~12) | (gs << 2));
            if (gs == 0) r[0] = v;
            else if (gs == 1) r[1] = v;
            else if (gs == 2) r[2] = v;
            else r[3] = v;
        }
#pragma unroll
        for (int g = 0; g < 4; g++) r[g] += xv[g];
        const float lf = sl_logsigmoid(r[1]) + m, mt = n == 0.0f ? r[0] : fmaxf(lf, r[0]);
        const float ip = fminf(1.0f, __expf(r[0] - mt)), fp = fminf(1.0f, __expf(lf - mt));
        const float z = tanhf(r[2]), o = sigmoidf_(r[3]);
        c = fp * c + ip * z, n = fp * n + ip, m = mt;
        h = ok ? o * c / n : 0.0f;
        if (t + 1 < T) SLC_SEND_H((t + 1) % 3);
        if (ok) {
            const size_t hi = hbase + (size_t)t * D;
            st(a.h, hi, h);
            if (a.cache) {
                float *cq = a.cache + cbase + (size_t)t * 4 * D;
                cq[0] = h, cq[D] = c, cq[2 * D] = n, cq[3 * D] = m;
            }
        }
    }
#undef SLC_SEND_H
    if (CS > 1) slc_sync();  // no block leaves while stores to it may be in flight
    if (ok && a.sT) {
        float *s = a.sT + (size_t)b * 4 * D + (size_t)hd * Dh + cell;
        s[0] = h, s[D] = c, s[2 * D] = n, s[3 * D] = m;
    }
}

// ------------------------------------------------------------------------------ backward

// Step t's inputs of this thread's (cell i, sequence b): G (4), the cache's h, n, m of step t and
// c, n, m of step t - 1 (0 before the first), dh's word; into slot[j NT + tid], j < 11.
static __device__ __forceinline__ void slc_in_stage(const SlcBwd &a, uint32_t *slot, int NT, int b, int t, int i,
                                                    int ok) {
    const int D = a.H * a.Dh, hd = blockIdx.x / (gridDim.x / a.H), tid = threadIdx.x;
    const size_t bt = (size_t)b * a.T + t;
    const float *G = a.G + ((bt * a.H + hd) * 4) * a.Dh + i, *s = a.cache + bt * 4 * D + (size_t)hd * a.Dh + i;
#pragma unroll
    for (int g = 0; g < 4; g++) cp_async4(slot + g * NT + tid, ok ? G + (size_t)g * a.Dh : a.G, ok ? 4 : 0);
    cp_async4(slot + 4 * NT + tid, ok ? s : a.cache, ok ? 4 : 0);
    cp_async4(slot + 5 * NT + tid, ok ? s + 2 * (size_t)D : a.cache, ok ? 4 : 0);
    cp_async4(slot + 6 * NT + tid, ok ? s + 3 * (size_t)D : a.cache, ok ? 4 : 0);
    const int pk = ok && t > 0;
    const float *p = s - 4 * (size_t)D;
    cp_async4(slot + 7 * NT + tid, pk ? p + D : a.cache, pk ? 4 : 0);
    cp_async4(slot + 8 * NT + tid, pk ? p + 2 * (size_t)D : a.cache, pk ? 4 : 0);
    cp_async4(slot + 9 * NT + tid, pk ? p + 3 * (size_t)D : a.cache, pk ? 4 : 0);
    slc_stage_bf16(slot + 10 * NT + tid, a.dh, ok ? bt * D + (size_t)hd * a.Dh + i : 0, (size_t)a.B * a.T * D, ok);
    cp_async_commit();
}

static __device__ __forceinline__ void slc_bwd_body(const SlcBwd a, const int CS, const int CL, const int KPW) {
    extern __shared__ __align__(16) unsigned char sl_smem[];
    const int NT = CL * 8, MTL = CL / 16, LDG = 4 * CS * CL + 8, tid = threadIdx.x, lane = tid & 31, w = tid >> 5;
    const unsigned rank = slc_rank(), SLOT = SL_NB * CS * CL * 8;  // bytes landing in a dg slot a step
    const int hd = blockIdx.x / CS, b0 = blockIdx.y * SL_NB, Dh = a.Dh, D = a.H * Dh, T = a.T;
    uint64_t *mb = (uint64_t *)sl_smem;             // [3] mbarriers of the dg slots
    uint32_t *stg = (uint32_t *)(sl_smem + 32);     // [3][11][NT]: staged inputs
    float *part = (float *)(stg + 3 * 11 * NT);     // [2][4][CL][SL_NB]: dh_rec's quarters, by the step's parity
    bf16 *dgs = (bf16 *)(part + 8 * CL * SL_NB);    // [3][SL_NB][LDG]: dg, gate columns 4 cell + g of the head
    const int mt = w % MTL, kq = w / MTL;
    const uint4 *fg = a.frag + ((size_t)(hd * CS + rank) * (CL / 4) + w) * KPW * 32;
    uint4 fr[16];
#pragma unroll
    for (int f = 0; f < KPW; f++) fr[f] = fg[f * 32 + lane];
    const int il = tid >> 3, bl = tid & 7, i = rank * CL + il, b = b0 + bl, ok = i < Dh && b < a.B;
    slc_in_stage(a, stg + ((T - 1) % 3) * 11 * NT, NT, b, T - 1, i, ok);
    if (T >= 2) slc_in_stage(a, stg + ((T - 2) % 3) * 11 * NT, NT, b, T - 2, i, ok);
    else cp_async_commit();
    if (CS > 1 && tid == 0)
        for (int j = 0; j < 3; j++) slc_mbar_init(mb + j, 1);
    float dc = 0.0f, dn = 0.0f;
    if (CS > 1) slc_sync();  // the mbarriers initialised, every block running
    const uint32_t goff = (uint32_t)(bl * LDG + 4 * i) * 2;
    const size_t xbase = (size_t)b * T * 4 * D + (size_t)hd * Dh + i, gbase = ((size_t)b * T * a.H + hd) * 4 * Dh + i;
    for (int k = 0; k < T; k++) {  // walk step k: time t = T - 1 - k; dg_t into slot k % 3
        const int t = T - 1 - k;
        if (CS > 1 && tid == 0 && t > 0) slc_mbar_expect(mb + k % 3, SLOT);
        cp_async_wait1();
        const uint32_t *sv = stg + (t % 3) * 11 * NT + tid;
        float r[4], s[6];
#pragma unroll
        for (int g = 0; g < 4; g++) r[g] = __uint_as_float(sv[g * NT]);
#pragma unroll
        for (int j = 0; j < 6; j++) s[j] = __uint_as_float(sv[(4 + j) * NT]);
        const float dh = ok ? slc_pick(sv[10 * NT], ((size_t)b * T + t) * D + (size_t)hd * Dh + i) : 0.0f;
        if (t >= 2) slc_in_stage(a, stg + ((t - 2) % 3) * 11 * NT, NT, b, t - 2, i, ok);
        else cp_async_commit();
        float dr = 0.0f;
        if (k > 0) {  // dh_rec = R dg_{t+1}: this warp's 16 cells x its quarter of the gate columns
            const int sl = (k - 1) % 3;
            if (CS > 1) slc_mbar_wait(mb + sl, (unsigned)((k - 1) / 3) & 1u);
            else __syncthreads();
            const bf16 *gb = dgs + sl * SL_NB * LDG;
            float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c5[4] = {0.0f, 0.0f, 0.0f, 0.0f};  // two chains of products
#pragma unroll
            for (int f = 0; f < KPW; f++) {
                const bf16 *gr = gb + (lane >> 2) * LDG + 16 * (kq * KPW + f) + 2 * (lane & 3);
                const uint32_t q4[4] = {fr[f].x, fr[f].y, fr[f].z, fr[f].w};
                mma_bf16((f & 1) ? c5 : c4, q4, *(const uint32_t *)gr, *(const uint32_t *)(gr + 8));
            }
#pragma unroll
            for (int e = 0; e < 4; e++) c4[e] += c5[e];
            // (two tiles: the one written here was last read two steps ago, before the last step's barrier)
            float *pt = part + (k & 1) * 4 * CL * SL_NB;
#pragma unroll
            for (int e = 0; e < 4; e++)
                pt[(kq * CL + 16 * mt + (lane >> 2) + 8 * (e >> 1)) * SL_NB + 2 * (lane & 3) + (e & 1)] = c4[e];
            __syncthreads();
#pragma unroll
            for (int q = 0; q < 4; q++) dr += pt[(q * CL + il) * SL_NB + bl];
            if (a.clip > 0.0f) dr = fminf(fmaxf(dr, -a.clip), a.clip);
        }
        // the pointwise backward (s: h, n, m of step t; c, n, m of step t - 1)
        const float m = s[2], ip = fminf(1.0f, __expf(r[0] - m));
        const float fp = fminf(1.0f, __expf(sl_logsigmoid(r[1]) + s[5] - m));
        const float z = tanhf(r[2]), o = sigmoidf_(r[3]), h = s[0], n = s[1], dy = dh + dr;
        float g0 = 0.0f, g1 = 0.0f, g2 = 0.0f, g3 = 0.0f;
        if (ok) {
            dc += dy * o / n;
            dn -= dy * h / n;
            g0 = ip * (z * dc + dn);
            g1 = fp * (dc * s[3] + dn * s[4]) * sigmoidf_(-r[1]);
            g2 = dc * ip * (1.0f - z * z);
            g3 = (1.0f - o) * h * dy;
            dc *= fp;
            dn *= fp;
        }
        if (t > 0) {
            const uint32_t off = goff + (uint32_t)((k % 3) * SL_NB * LDG) * 2, lo = pack_bf16(g0, g1), hi = pack_bf16(g2, g3);
            if (CS == 1) {
                uint32_t *p = (uint32_t *)(dgs + (k % 3) * SL_NB * LDG + bl * LDG + 4 * i);
                p[0] = lo, p[1] = hi;
            } else {
                for (int q = 0; q < CS; q++) slc_st_async64(slc_map(dgs, q) + off, lo, hi, slc_map(mb + k % 3, q));
            }
        }
        if (ok) {
            bf16 *dx = a.dx + xbase + (size_t)t * 4 * D, *dG = a.dG + gbase + (size_t)t * a.H * 4 * Dh;
            st(dx, 0, g0), st(dx, D, g1), st(dx, 2 * (size_t)D, g2), st(dx, 3 * (size_t)D, g3);
            st(dG, 0, g0), st(dG, Dh, g1), st(dG, 2 * (size_t)Dh, g2), st(dG, 3 * (size_t)Dh, g3);
        }
    }
    if (CS > 1) slc_sync();  // no block leaves while stores to it may be in flight
}

// ------------------------------------------------------------------------- kernels, fragments

// R [H, Dh, 4, Dh] as the blocks' A fragments, [H][CS][CL / 4 warps][KS][32 lanes] x 16 bytes:
// forward (bwd 0) A[gate column 16 w + row: cell rank CL + 4 w + row / 4, gate row % 4][i = 16 f + col];
// backward A[i = rank CL + 16 (w % MTL) + row][gate column 16 ((w / MTL) KS + f) + col, cell-major].
static __global__ void slc_frag_kernel(uint4 *frag, const float *R, int H, int Dh, int CS, int CL, int bwd) {
    const int NW = CL / 4, KS = CS * CL / 16, MTL = CL / 16;
    const size_t n = (size_t)H * CS * NW * KS * 32;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        size_t q = idx / 32;
        const int lane = (int)(idx % 32), f = (int)(q % KS), w = (int)(q / KS % NW), rank = (int)(q / KS / NW % CS);
        const int hd = (int)(q / KS / NW / CS);
        uint32_t r[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float v[2];
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = (lane >> 2) + 8 * (j & 1), col = 2 * (lane & 3) + hf + 8 * (j >> 1);
                int i, cell, g;
                if (bwd) {
                    const int gc = 16 * ((w / MTL) * KS + f) + col;
                    i = rank * CL + 16 * (w % MTL) + row, cell = gc >> 2, g = gc & 3;
                } else {
                    i = 16 * f + col, cell = rank * CL + 4 * w + (row >> 2), g = row & 3;
                }
                v[hf] = i < Dh && cell < Dh ? R[(((size_t)hd * Dh + i) * 4 + g) * Dh + cell] : 0.0f;
            }
            r[j] = pack_bf16(v[0], v[1]);
        }
        frag[idx] = make_uint4(r[0], r[1], r[2], r[3]);
    }
}

// Variant v (slc_variant): CS blocks of CL cells; KS = CS CL / 16 fragments a warp.
#define SLC_KERNELS(V, CS, CL)                                                                                 \
    static __global__ void __launch_bounds__((CL) * 8, 1) slc_fwd_kernel_##V(const SlcFwd a) {                \
        slc_fwd_body(a, CS, CL, (CS) * (CL) / 16);                                                             \
    }                                                                                                          \
    static __global__ void __launch_bounds__((CL) * 8, 1) slc_bwd_kernel_##V(const SlcBwd a) {                \
        slc_bwd_body(a, CS, CL, (CS) * (CL) / 16);                                                             \
    }
SLC_KERNELS(0, 1, 16)
SLC_KERNELS(1, 1, 32)
SLC_KERNELS(2, 1, 64)
SLC_KERNELS(3, 2, 64)
SLC_KERNELS(4, 4, 48)
SLC_KERNELS(5, 4, 64)

static const int SLC_CS[6] = {1, 1, 1, 2, 4, 4}, SLC_CL[6] = {16, 32, 64, 64, 48, 64};
typedef void (*SlcFwdKernel)(const SlcFwd);
typedef void (*SlcBwdKernel)(const SlcBwd);
static const SlcFwdKernel slc_fwd_kernels[6] = {slc_fwd_kernel_0, slc_fwd_kernel_1, slc_fwd_kernel_2,
                                                slc_fwd_kernel_3, slc_fwd_kernel_4, slc_fwd_kernel_5};
static const SlcBwdKernel slc_bwd_kernels[6] = {slc_bwd_kernel_0, slc_bwd_kernel_1, slc_bwd_kernel_2,
                                                slc_bwd_kernel_3, slc_bwd_kernel_4, slc_bwd_kernel_5};

static int slc_variant(int Dh) { return Dh <= 16 ? 0 : Dh <= 32 ? 1 : Dh <= 64 ? 2 : Dh <= 128 ? 3 : Dh <= 192 ? 4 : 5; }

size_t slc_frag_count(int H, int Dh) {
    const int v = slc_variant(Dh), CS = SLC_CS[v], CL = SLC_CL[v];
    return (size_t)H * CS * (CL / 4) * (CS * CL / 16) * 32;
}

// A launch of kernel k on the cluster grid (CS H, ceil(B / 8)), CL 8 threads a block.
static cudaLaunchConfig_t slc_config(cudaLaunchAttribute *attr, const CudaCtx *c, int v, const SlstmDims *d, size_t smem) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(SLC_CS[v] * d->H), (unsigned)((d->B + SL_NB - 1) / SL_NB));
    cfg.blockDim = dim3((unsigned)(SLC_CL[v] * 8));
    cfg.dynamicSmemBytes = smem;
    cfg.stream = c->stream;
    attr->id = cudaLaunchAttributeClusterDimension;
    attr->val.clusterDim.x = (unsigned)SLC_CS[v];
    attr->val.clusterDim.y = 1;
    attr->val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = SLC_CS[v] > 1 ? 1 : 0;  // (a cluster of one: a plain launch, no cluster instructions)
    return cfg;
}

int slc_forward(CudaCtx *c, uint4 *frag, const SlstmDims *d, const SlstmFwd *io) {
    const int v = slc_variant(d->Dh), CS = SLC_CS[v], CL = SLC_CL[v];
    const size_t nfr = slc_frag_count(d->H, d->Dh);
    const float *R = (const float *)io->r;
    slc_frag_kernel<<<grid_for(nfr, 256), 256, 0, c->stream>>>(frag, R, d->H, d->Dh, CS, CL, 0);
    LAUNCH_CHECK();
    SlcFwd a = {(const bf16 *)io->x, frag, (const float *)io->s0, (bf16 *)io->h, (float *)io->cache, (float *)io->sT,
                d->B, d->T, d->H, d->Dh};
    const size_t smem = 32 + (size_t)3 * SL_NB * (CS * CL + 8) * 2 + (size_t)3 * 4 * CL * 8 * 4;
    SlcFwdKernel k = slc_fwd_kernels[v];
    CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = slc_config(&attr, c, v, d, smem);
    CU_TRY(cudaLaunchKernelEx(&cfg, k, a));
    return MN_OK;
}

int slc_backward_walk(CudaCtx *c, uint4 *frag, const SlstmDims *d, const float *R, const float *G, const float *cache,
                      const bf16 *dh, bf16 *dx, bf16 *dG) {
    const int v = slc_variant(d->Dh), CS = SLC_CS[v], CL = SLC_CL[v];
    const size_t nfr = slc_frag_count(d->H, d->Dh);
    slc_frag_kernel<<<grid_for(nfr, 256), 256, 0, c->stream>>>(frag, R, d->H, d->Dh, CS, CL, 1);
    LAUNCH_CHECK();
    SlcBwd a = {G, cache, frag, dh, dx, dG, d->B, d->T, d->H, d->Dh, d->clip};
    const size_t smem = 32 + (size_t)3 * 11 * CL * 8 * 4 + (size_t)8 * CL * SL_NB * 4 + (size_t)3 * SL_NB * (4 * CS * CL + 8) * 2;
    SlcBwdKernel k = slc_bwd_kernels[v];
    CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaLaunchAttribute attr;
    cudaLaunchConfig_t cfg = slc_config(&attr, c, v, d, smem);
    CU_TRY(cudaLaunchKernelEx(&cfg, k, a));
    return MN_OK;
}
