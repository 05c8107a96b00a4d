/*
 * The sLSTM core on the GPU (core/backend.h's SlstmOps; docs/spec/mixers.md section 5,
 * xlstm-notes.md 1.3-1.4): x, h, dh, dx bf16; R, the states, the cache and dR float32.
 *
 * On Hopper (compute capability 9) the walks run as slstm_cluster.cu's kernels: a head over a cluster of
 * blocks, R wholly in registers (MESANET_SLSTM=single picks the kernels below there too). Below:
 *
 * Forward: one persistent kernel (slstm_fwd_kernel) over all T steps, a block per (head, 8 sequences):
 * the head's R stays on chip the whole time, as mma.sync A fragments (bf16) in registers and shared
 * memory (what does not fit, at Dh > 192, is read from the L2 every step: fragment-ordered, 512
 * contiguous bytes a warp and fragment). A step is one product r = R^T h_{t-1} (M = the head's 4 Dh
 * gate columns, ordered cell-major (4 cell + gate) so that a 16-row tile holds the four gates of 4
 * cells; N = the 8 sequences; K = Dh), the gates gathered by 4 shuffles, the pointwise step in
 * float32 (each lane owns one (cell, sequence) of each of its tiles, and its c, n, m), h_t into a
 * double-buffered shared tile for the next step: one barrier a step.
 *
 * Backward: the gate pre-activations are recomputed for all steps at once (G = x + bf16(h_{t-1}) R,
 * cuBLAS, bf16 products with float32 sums: the forward's operands), then slstm_bwd_kernel walks the
 * steps in reverse, a block per (head, 8 sequences), warp w owning cells 16 w .. 16 w + 15 of every
 * sequence (the mma accumulator's rows): the pointwise backward, dg into a double-buffered shared
 * tile, then dh_rec = R dg (A = R as [Dh, 4 Dh], on chip as in the forward), whose accumulator is
 * already the next step's dh_rec of the lane's own cells: one barrier a step, the carried dc, dn in
 * registers. dR += bf16(h_{t-1})^T dg is one more cuBLAS product after the walk (deterministic: no
 * atomics anywhere). The walk's per-step inputs are fetched a step ahead into registers.
 *
 * Heads up to 256 cells (supports refuses more, naming the size); any B, T, H.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "slstm_cuda.cuh"

extern "C" int cuda_slstm_fwd(const Backend *be, const SlstmDims *d, const SlstmFwd *io);
extern "C" int cuda_slstm_bwd(const Backend *be, const SlstmDims *d, const SlstmBwd *io);
extern "C" int cuda_slstm_supports(const Backend *be, const SlstmDims *d);

#define SL_MAXD 256    // cells a head, at most
#define SL_FRAG 512    // bytes of a warp's fragment (32 lanes x four 32-bit registers)

// A grid-stride loop over 0 .. n-1.
#define GRID_LOOP_SL(i, n) for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

typedef struct {
    const bf16 *x;
    const uint4 *frag;  // [H][warps][NF][32] fragments
    const float *s0;
    bf16 *h;
    float *cache, *sT;
    int B, T, H, Dh, nw, nf, nsm;  // nw warps, nf fragments a warp, nsm of them in shared memory
} SlFwd;

typedef struct {
    const float *G;     // [B,T,H,4,Dh] the gate pre-activations, x included
    const uint4 *frag;
    const float *cache;
    const bf16 *dh;
    bf16 *dx, *dG;      // dx [B,T,4,D]; dG [B,T,H,4,Dh]
    int B, T, H, Dh, nw, nf, nsm;
    float clip;
} SlBwd;

// Fragment f of this lane: registers (f < RREG, reg), shared memory (f < RREG + nsm) or global memory.
static __device__ __forceinline__ uint4 sl_frag(const uint4 *sm, const uint4 *gl, int f, int RREG, int nsm, int lane) {
    const int s = f - RREG;
    return s < nsm ? sm[s * 32 + lane] : gl[(size_t)f * 32 + lane];
}

static __device__ __forceinline__ void sl_mma(float c[4], const uint4 a, uint32_t b0, uint32_t b1) {
    const uint32_t r[4] = {a.x, a.y, a.z, a.w};
    mma_bf16(c, r, b0, b1);
}

// ------------------------------------------------------------------------------ forward

static __device__ __forceinline__ void sl_fwd_body(const SlFwd a, const int KS, const int MTW, const int RREG) {
    extern __shared__ __align__(16) unsigned char sl_smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, hd = blockIdx.x, b0 = blockIdx.y * SL_NB;
    const int Dh = a.Dh, D = a.H * Dh, T = a.T, LDH = KS * 16 + 8;
    uint4 *fsm = (uint4 *)sl_smem + (size_t)w * a.nsm * 32;
    bf16 *hs = (bf16 *)((uint4 *)sl_smem + (size_t)a.nw * a.nsm * 32);  // [2][SL_NB][LDH]
    const uint4 *fgl = a.frag + ((size_t)hd * a.nw + w) * a.nf * 32;
    uint4 freg[16];
#pragma unroll
    for (int f = 0; f < RREG; f++) freg[f] = fgl[(size_t)f * 32 + lane];
    for (int f = RREG; f < RREG + a.nsm && f < a.nf; f++) fsm[(f - RREG) * 32 + lane] = fgl[(size_t)f * 32 + lane];
    for (int e = threadIdx.x; e < 2 * SL_NB * LDH; e += blockDim.x) st(hs, e, 0.0f);
    __syncthreads();
    // this lane's element of each of its tiles: cell = 4 tile + (lane >> 4) + 2 (gd >> 1), sequence b0 + 2 (lane & 3) + (gd & 1)
    const int gd = (lane >> 2) & 3, bl = 2 * (lane & 3) + (gd & 1), b = b0 + bl;
    int cell[4], ok[4];
    float cs[4], ns[4], ms[4], xv[4][4];
#pragma unroll
    for (int mt = 0; mt < MTW; mt++) {
        cell[mt] = 4 * (w * MTW + mt) + (lane >> 4) + 2 * (gd >> 1);
        ok[mt] = cell[mt] < Dh && b < a.B;
        const size_t si = (size_t)b * 4 * D + (size_t)hd * Dh + cell[mt];
        float h0 = 0.0f;
        cs[mt] = ns[mt] = ms[mt] = 0.0f;
        if (ok[mt] && a.s0) {
            h0 = a.s0[si];
            cs[mt] = a.s0[si + D];
            ns[mt] = a.s0[si + 2 * D];
            ms[mt] = a.s0[si + 3 * D];
        }
        if (cell[mt] < Dh) st(hs, (size_t)bl * LDH + cell[mt], h0);  // (this block's rows of hs[0])
#pragma unroll
        for (int g = 0; g < 4; g++)
            xv[mt][g] = ok[mt] && T > 0 ? ld(a.x, (size_t)b * T * 4 * D + (size_t)g * D + (size_t)hd * Dh + cell[mt]) : 0.0f;
    }
    __syncthreads();
    float hl[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int t = 0; t < T; t++) {
        const bf16 *hc = hs + (t & 1) * SL_NB * LDH;
        bf16 *hn = hs + ((t + 1) & 1) * SL_NB * LDH;
        float xn[4][4];
#pragma unroll
        for (int mt = 0; mt < MTW; mt++)
#pragma unroll
            for (int g = 0; g < 4; g++)
                xn[mt][g] = ok[mt] && t + 1 < T
                                ? ld(a.x, ((size_t)b * T + t + 1) * 4 * D + (size_t)g * D + (size_t)hd * Dh + cell[mt])
                                : 0.0f;
        float acc[4][4];
#pragma unroll
        for (int mt = 0; mt < MTW; mt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][e] = 0.0f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            const bf16 *hr = hc + (lane >> 2) * LDH + 16 * ks + 2 * (lane & 3);
            const uint32_t hb0 = *(const uint32_t *)hr, hb1 = *(const uint32_t *)(hr + 8);
#pragma unroll
            for (int mt = 0; mt < MTW; mt++) {
                const int f = mt * KS + ks;
                sl_mma(acc[mt], f < RREG ? freg[f < RREG ? f : 0] : sl_frag(fsm, fgl, f, RREG, a.nsm, lane), hb0,
                       hb1);
            }
        }
#pragma unroll
        for (int mt = 0; mt < MTW; mt++) {
            // the four gates of this lane's (cell, sequence): round k takes gate (gd + k) & 3 from its lane
            float r[4];
#pragma unroll
            for (int k = 0; k < 4; k++) {
                const int e = (gd - k) & 3, gs = (gd + k) & 3;
                const float send = e == 0 ? acc[mt][0] : e == 1 ? acc[mt][1] : e == 2 ? acc[mt][2] : acc[mt][3];
                const float v = __shfl_sync(0xffffffffu, send, (lane & ~12) | (gs << 2));
                if (gs == 0) r[0] = v;
                else if (gs == 1) r[1] = v;
                else if (gs == 2) r[2] = v;
                else r[3] = v;
            }
#pragma unroll
            for (int g = 0; g < 4; g++) r[g] += xv[mt][g];
            const float lf = sl_logsigmoid(r[1]) + ms[mt];
            const float m = ns[mt] == 0.0f ? r[0] : fmaxf(lf, r[0]);
            const float ip = fminf(1.0f, __expf(r[0] - m)), fp = fminf(1.0f, __expf(lf - m));
            const float z = tanhf(r[2]), o = sigmoidf_(r[3]);
            const float c = fp * cs[mt] + ip * z, n = fp * ns[mt] + ip, h = ok[mt] ? o * c / n : 0.0f;
            cs[mt] = c, ns[mt] = n, ms[mt] = m, hl[mt] = h;
            if (cell[mt] < Dh) st(hn, (size_t)bl * LDH + cell[mt], h);
            if (ok[mt]) {
                const size_t bt = (size_t)b * T + t, hi = bt * D + (size_t)hd * Dh + cell[mt];
                st(a.h, hi, h);
                if (a.cache) {
                    float *cp = a.cache + bt * 4 * D + (size_t)hd * Dh + cell[mt];
                    cp[0] = h, cp[D] = c, cp[2 * D] = n, cp[3 * D] = m;
                }
            }
#pragma unroll
            for (int g = 0; g < 4; g++) xv[mt][g] = xn[mt][g];
        }
        __syncthreads();
    }
    if (a.sT)
#pragma unroll
        for (int mt = 0; mt < MTW; mt++)
            if (ok[mt]) {
                float *sp = a.sT + (size_t)b * 4 * D + (size_t)hd * Dh + cell[mt];
                sp[0] = hl[mt], sp[D] = cs[mt], sp[2 * D] = ns[mt], sp[3 * D] = ms[mt];
            }
}

// ------------------------------------------------------------------------------ backward

// The walk's per-step inputs, fetched a step ahead (G, h, dh of step t - 1) or two (c, n, m of
// step t - 2, the previous state of step t - 1).
static __device__ __forceinline__ void sl_in_ghd(const SlBwd &a, int b, int t, int hd, int i, int ok, float g[4],
                                                 float *h, float *dh) {
    const int D = a.H * a.Dh;
    if (!ok || t < 0) {
        g[0] = g[1] = g[2] = g[3] = *h = *dh = 0.0f;
        return;
    }
    const size_t bt = (size_t)b * a.T + t;
    const float *G = a.G + (bt * a.H + hd) * 4 * a.Dh + i;
#pragma unroll
    for (int j = 0; j < 4; j++) g[j] = G[(size_t)j * a.Dh];
    *h = a.cache[bt * 4 * D + (size_t)hd * a.Dh + i];
    *dh = ld(a.dh, bt * D + (size_t)hd * a.Dh + i);
}

static __device__ __forceinline__ void sl_in_cnm(const SlBwd &a, int b, int t, int hd, int i, int ok, float *c, float *n,
                                                 float *m) {
    const int D = a.H * a.Dh;
    if (!ok || t < 0) {
        *c = *n = *m = 0.0f;
        return;
    }
    const float *s = a.cache + ((size_t)b * a.T + t) * 4 * D + (size_t)a.Dh * hd + i;
    *c = s[D];
    *n = s[2 * (size_t)D];
    *m = s[3 * (size_t)D];
}

static __device__ __forceinline__ void sl_bwd_body(const SlBwd a, const int KSB, const int RREG) {
    extern __shared__ __align__(16) unsigned char sl_smem[];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, hd = blockIdx.x, b0 = blockIdx.y * SL_NB;
    const int Dh = a.Dh, D = a.H * Dh, T = a.T, LDG = KSB * 16 + 8;
    uint4 *fsm = (uint4 *)sl_smem + (size_t)w * a.nsm * 32;
    bf16 *gs = (bf16 *)((uint4 *)sl_smem + (size_t)a.nw * a.nsm * 32);  // [2][SL_NB][LDG]: dg, cell-major
    const uint4 *fgl = a.frag + ((size_t)hd * a.nw + w) * a.nf * 32;
    uint4 freg[16];
#pragma unroll
    for (int f = 0; f < RREG; f++) freg[f] = fgl[(size_t)f * 32 + lane];
    for (int f = RREG; f < RREG + a.nsm && f < a.nf; f++) fsm[(f - RREG) * 32 + lane] = fgl[(size_t)f * 32 + lane];
    for (int e = threadIdx.x; e < 2 * SL_NB * LDG; e += blockDim.x) st(gs, e, 0.0f);
    // elements: cell 16 w + (lane >> 2) + 8 (e >> 1), sequence b0 + 2 (lane & 3) + (e & 1) (the accumulator's)
    int ci[4], bi[4], ok[4];
    float dc[4], dn[4], acc[4];
    float cg[4][4], ch[4], cdh[4], cn[4], cm[4];  // step t: G, h, dh, n, m
    float pc[4], pn[4], pm[4];                    // step t - 1: c, n, m
    float ng[4][4], nh[4], ndh[4], qc[4], qn[4], qm[4];
#pragma unroll
    for (int e = 0; e < 4; e++) {
        ci[e] = 16 * w + (lane >> 2) + 8 * (e >> 1);
        bi[e] = b0 + 2 * (lane & 3) + (e & 1);
        ok[e] = ci[e] < Dh && bi[e] < a.B;
        dc[e] = dn[e] = acc[e] = 0.0f;
        float c_;
        sl_in_ghd(a, bi[e], T - 1, hd, ci[e], ok[e], cg[e], &ch[e], &cdh[e]);
        sl_in_cnm(a, bi[e], T - 1, hd, ci[e], ok[e], &c_, &cn[e], &cm[e]);
        sl_in_cnm(a, bi[e], T - 2, hd, ci[e], ok[e], &pc[e], &pn[e], &pm[e]);
    }
    __syncthreads();
    for (int t = T - 1; t >= 0; t--) {
        bf16 *gb = gs + (t & 1) * SL_NB * LDG;
#pragma unroll
        for (int e = 0; e < 4; e++) {
            sl_in_ghd(a, bi[e], t - 1, hd, ci[e], ok[e], ng[e], &nh[e], &ndh[e]);
            sl_in_cnm(a, bi[e], t - 2, hd, ci[e], ok[e], &qc[e], &qn[e], &qm[e]);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
            float dr = acc[e];
            if (a.clip > 0.0f) dr = fminf(fmaxf(dr, -a.clip), a.clip);
            const float *r = cg[e], m = cm[e], ip = fminf(1.0f, __expf(r[0] - m));
            const float fp = fminf(1.0f, __expf(sl_logsigmoid(r[1]) + pm[e] - m));
            const float z = tanhf(r[2]), o = sigmoidf_(r[3]), h = ch[e], n = cn[e];
            const float dy = cdh[e] + dr;
            float g0 = 0.0f, g1 = 0.0f, g2 = 0.0f, g3 = 0.0f;
            if (ok[e]) {
                dc[e] += dy * o / n;
                dn[e] -= dy * h / n;
                g0 = ip * (z * dc[e] + dn[e]);
                g1 = fp * (dc[e] * pc[e] + dn[e] * pn[e]) * sigmoidf_(-r[1]);
                g2 = dc[e] * ip * (1.0f - z * z);
                g3 = (1.0f - o) * h * dy;
                dc[e] *= fp;
                dn[e] *= fp;
                const size_t bt = (size_t)bi[e] * T + t;
                bf16 *dx = a.dx + bt * 4 * D + (size_t)hd * Dh + ci[e], *dG = a.dG + (bt * a.H + hd) * 4 * Dh + ci[e];
                st(dx, 0, g0), st(dx, D, g1), st(dx, 2 * (size_t)D, g2), st(dx, 3 * (size_t)D, g3);
                st(dG, 0, g0), st(dG, Dh, g1), st(dG, 2 * (size_t)Dh, g2), st(dG, 3 * (size_t)Dh, g3);
            }
            uint2 u = {pack_bf16(g0, g1), pack_bf16(g2, g3)};
            *(uint2 *)(gb + (size_t)(bi[e] - b0) * LDG + 4 * ci[e]) = u;
        }
#pragma unroll
        for (int e = 0; e < 4; e++) {
#pragma unroll
            for (int j = 0; j < 4; j++) cg[e][j] = ng[e][j];
            ch[e] = nh[e], cdh[e] = ndh[e], cn[e] = pn[e], cm[e] = pm[e];
            pc[e] = qc[e], pn[e] = qn[e], pm[e] = qm[e];
        }
        __syncthreads();
        if (t == 0) break;
        // dh_rec of step t - 1 = R dg_t: this warp's 16 cells (rows), the 8 sequences (columns): the
        // accumulator's elements are the lane's own
        float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
        for (int ks = 0; ks < KSB; ks++) {
            const bf16 *gr = gb + (lane >> 2) * LDG + 16 * ks + 2 * (lane & 3);
            const uint32_t g0 = *(const uint32_t *)gr, g1 = *(const uint32_t *)(gr + 8);
            sl_mma(c4, ks < RREG ? freg[ks < RREG ? ks : 0] : sl_frag(fsm, fgl, ks, RREG, a.nsm, lane), g0, g1);
        }
#pragma unroll
        for (int e = 0; e < 4; e++) acc[e] = c4[e];
    }
}

// -------------------------------------------------------------------- kernels and fragments

// Variant v of a head of Dh cells: forward k-steps KS = 1, 2, 4, 8, 12, 16; tiles a warp MTW =
// max(1, KS / 4); the backward's k-steps KSB = 4 KS; fragments kept in registers RREG, RREGB.
static int sl_variant(int Dh) { return Dh <= 16 ? 0 : Dh <= 32 ? 1 : Dh <= 64 ? 2 : Dh <= 128 ? 3 : Dh <= 192 ? 4 : 5; }
static const int SL_KS[6] = {1, 2, 4, 8, 12, 16};

// (FT, BT: the variant's largest blocks, for the register budget: 16 warps at most a forward block,
// ceil(Dh / 16) a backward one.)
#define SL_KERNELS(V, KS, MTW, RREG, FT, KSB, RREGB, BT)                                                \
    static __global__ void __launch_bounds__(FT, 1) slstm_fwd_kernel_##V(const SlFwd a) {               \
        sl_fwd_body(a, KS, MTW, RREG);                                                                  \
    }                                                                                                   \
    static __global__ void __launch_bounds__(BT, 1) slstm_bwd_kernel_##V(const SlBwd a) {               \
        sl_bwd_body(a, KSB, RREGB);                                                                     \
    }
SL_KERNELS(0, 1, 1, 1, 128, 4, 4, 128)
SL_KERNELS(1, 2, 1, 2, 256, 8, 8, 128)
SL_KERNELS(2, 4, 1, 4, 512, 16, 16, 128)
SL_KERNELS(3, 8, 2, 16, 512, 32, 16, 256)
SL_KERNELS(4, 12, 3, 10, 512, 48, 16, 384)
SL_KERNELS(5, 16, 4, 4, 512, 64, 8, 512)

typedef void (*SlFwdKernel)(const SlFwd);
typedef void (*SlBwdKernel)(const SlBwd);
static const SlFwdKernel sl_fwd_kernels[6] = {slstm_fwd_kernel_0, slstm_fwd_kernel_1, slstm_fwd_kernel_2,
                                              slstm_fwd_kernel_3, slstm_fwd_kernel_4, slstm_fwd_kernel_5};
static const SlBwdKernel sl_bwd_kernels[6] = {slstm_bwd_kernel_0, slstm_bwd_kernel_1, slstm_bwd_kernel_2,
                                              slstm_bwd_kernel_3, slstm_bwd_kernel_4, slstm_bwd_kernel_5};
static const int SL_RREG[6] = {1, 2, 4, 16, 10, 4}, SL_RREGB[6] = {4, 8, 16, 16, 16, 8};

// R [H, Dh, 4, Dh] (float32) as bf16 mma A fragments, [H][nw][nf][32 lanes] x 16 bytes: the forward's
// (bwd = 0: A[gate column 4 cell + g][i], tile mt = w MTW + f / KS, k-step f % KS) or the backward's
// (A[i][gate column], tile w, k-step f); and, where rb is given, R as bf16 in its own layout.
static __global__ void slstm_frag_kernel(uint4 *frag, bf16 *rb, const float *R, int H, int Dh, int nw, int nf, int KS,
                                         int MTW, int bwd) {
    const size_t n = (size_t)H * nw * nf * 32;
    GRID_LOOP_SL(idx, n) {
        const int lane = (int)(idx % 32), f = (int)(idx / 32 % nf), w = (int)(idx / 32 / nf % nw), hd = (int)(idx / 32 / nf / nw);
        uint32_t r[4];
#pragma unroll
        for (int j = 0; j < 4; j++) {
            float v[2];
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const int row = (lane >> 2) + 8 * (j & 1), col = 2 * (lane & 3) + hf + 8 * (j >> 1);
                int i, gc;
                if (bwd) {
                    i = 16 * w + row;
                    gc = 16 * f + col;
                } else {
                    gc = 16 * (w * MTW + f / KS) + row;
                    i = 16 * (f % KS) + col;
                }
                const int cell = gc >> 2, g = gc & 3;
                v[hf] = i < Dh && cell < Dh ? R[(((size_t)hd * Dh + i) * 4 + g) * Dh + cell] : 0.0f;
            }
            r[j] = pack_bf16(v[0], v[1]);
        }
        frag[idx] = make_uint4(r[0], r[1], r[2], r[3]);
    }
    if (rb) {
        const size_t m = (size_t)H * Dh * 4 * Dh;
        GRID_LOOP_SL(i, m) st(rb, i, R[i]);
    }
}

// The backward's operands of the products: hb [B*T, D] = bf16(h_{t-1}) (0 at t = 0), G [B,T,H,4,Dh] = x.
static __global__ void slstm_bprep_kernel(bf16 *hb, float *G, const float *cache, const bf16 *x, int B, int T, int H,
                                          int Dh) {
    const int D = H * Dh;
    const size_t n = (size_t)B * T * D;
    GRID_LOOP_SL(e, n) {
        const size_t bt = e / D;
        const int k = (int)(e % D), t = (int)(bt % T), hd = k / Dh, i = k % Dh;
        st(hb, e, t > 0 ? cache[(bt - 1) * 4 * D + k] : 0.0f);
#pragma unroll
        for (int g = 0; g < 4; g++) G[((bt * H + hd) * 4 + g) * Dh + i] = ld(x, bt * 4 * D + (size_t)g * D + k);
    }
}

// ------------------------------------------------------------------------------ host side

extern "C" int cuda_slstm_supports(const Backend *be, const SlstmDims *d) {
    if (d->Dh > SL_MAXD)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda slstm: %d cells a head; the CUDA kernels take at most %d", d->Dh,
                        SL_MAXD);
    if ((d->B + SL_NB - 1) / SL_NB > 65535)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda slstm: B = %d sequences, the kernels take at most %d", d->B,
                        65535 * SL_NB);
    return MN_OK;
}

static int sl_check(const char *fn, const SlstmDims *d) {
    if (!d) return mn_error(MN_ERR_ARG, "%s: dims are NULL", fn);
    if (d->B <= 0 || d->T <= 0 || d->H <= 0 || d->Dh <= 0)
        return mn_error(MN_ERR_ARG, "%s: B, T, H, Dh must be > 0 (got %d, %d, %d, %d)", fn, d->B, d->T, d->H, d->Dh);
    if (!(d->clip >= 0) || isinf(d->clip))
        return mn_error(MN_ERR_ARG, "%s: clip = %g, must be finite and >= 0", fn, (double)d->clip);
    return cuda_slstm_supports(NULL, d);
}

// Shape of a head's fragments: warps nw, fragments a warp nf, of them in shared memory nsm (the
// rest past the registers' RREG from global memory), and the block's shared memory.
typedef struct {
    int v, nw, nf, nsm, rreg;
    size_t smem;
} SlShape;

static SlShape sl_shape(const CudaCtx *c, int Dh, int bwd) {
    SlShape s;
    s.v = sl_variant(Dh);
    const int KS = SL_KS[s.v], MTW = KS >= 4 ? KS / 4 : 1, Dhp = (Dh + 3) / 4 * 4;
    s.nw = bwd ? (Dh + 15) / 16 : (Dhp / 4 + MTW - 1) / MTW;
    s.nf = bwd ? 4 * KS : MTW * KS;
    s.rreg = bwd ? SL_RREGB[s.v] : SL_RREG[s.v];
    const size_t tile = (size_t)2 * SL_NB * ((bwd ? 4 * KS : KS) * 16 + 8) * 2;
    const size_t room = c->smem_optin > tile ? (c->smem_optin - tile) / ((size_t)s.nw * SL_FRAG) : 0;
    s.nsm = (int)mn_min((size_t)(s.nf > s.rreg ? s.nf - s.rreg : 0), room);
    s.smem = (size_t)s.nw * s.nsm * SL_FRAG + tile;
    return s;
}

// The Hopper kernels (slstm_cluster.cu) unless MESANET_SLSTM=single or an older GPU.
static int sl_use_cluster(const CudaCtx *c) {
    const char *e = getenv("MESANET_SLSTM");
    return c->cc_major >= 9 && !(e && !strcmp(e, "single"));
}

extern "C" int cuda_slstm_fwd(const Backend *be, const SlstmDims *d, const SlstmFwd *io) {
    const char *fn = "cuda slstm forward";
    MN_TRY(sl_check(fn, d));
    if (!io || !io->x || !io->r || !io->h) return mn_error(MN_ERR_ARG, "%s: x, r and h are required", fn);
    CudaCtx *c = cuda_ctx(be);
    if (sl_use_cluster(c)) {
        uint4 *frag = (uint4 *)cuda_scratch(be, slc_frag_count(d->H, d->Dh) * sizeof(uint4));
        if (!frag) return MN_ERR_NOMEM;
        return slc_forward(c, frag, d, io);
    }
    const SlShape s = sl_shape(c, d->Dh, 0);
    const int KS = SL_KS[s.v], MTW = KS >= 4 ? KS / 4 : 1;
    const size_t nfr = (size_t)d->H * s.nw * s.nf * 32;
    uint4 *frag = (uint4 *)cuda_scratch(be, nfr * sizeof(uint4));
    if (!frag) return MN_ERR_NOMEM;
    const float *R = (const float *)io->r;
    slstm_frag_kernel<<<grid_for(nfr, 256), 256, 0, c->stream>>>(frag, NULL, R, d->H, d->Dh, s.nw, s.nf, KS, MTW, 0);
    LAUNCH_CHECK();
    SlFwd a = {(const bf16 *)io->x, frag, (const float *)io->s0, (bf16 *)io->h, (float *)io->cache, (float *)io->sT,
               d->B, d->T, d->H, d->Dh, s.nw, s.nf, s.nsm};
    SlFwdKernel k = sl_fwd_kernels[s.v];
    CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s.smem));
    dim3 grid((unsigned)d->H, (unsigned)((d->B + SL_NB - 1) / SL_NB));
    k<<<grid, s.nw * 32, s.smem, c->stream>>>(a);
    LAUNCH_CHECK();
    return MN_OK;
}

extern "C" int cuda_slstm_bwd(const Backend *be, const SlstmDims *d, const SlstmBwd *io) {
    const char *fn = "cuda slstm backward";
    MN_TRY(sl_check(fn, d));
    if (!io || !io->x || !io->r || !io->cache || !io->dh || !io->dx || !io->dr)
        return mn_error(MN_ERR_ARG, "%s: x, r, cache, dh, dx and dr are required", fn);
    CudaCtx *c = cuda_ctx(be);
    const int B = d->B, T = d->T, H = d->H, Dh = d->Dh, D = H * Dh;
    const SlShape s = sl_shape(c, Dh, 1);
    const int KS = SL_KS[s.v], cl = sl_use_cluster(c);
    const size_t nfr = cl ? slc_frag_count(H, Dh) : (size_t)H * s.nw * s.nf * 32, nr = (size_t)H * Dh * 4 * Dh;
    const size_t n = (size_t)B * T * D;
    // scratch: fragments, R in bf16, hb = bf16(h_{t-1}), G (float32), dG (bf16); 256-byte aligned parts
    const size_t o_rb = nfr * sizeof(uint4), o_hb = o_rb + (nr * 2 + 255) / 256 * 256, o_G = o_hb + (n * 2 + 255) / 256 * 256,
                 o_dG = o_G + 4 * n * 4, total = o_dG + 4 * n * 2;
    unsigned char *ws = (unsigned char *)cuda_scratch(be, total);
    if (!ws) return MN_ERR_NOMEM;
    uint4 *frag = (uint4 *)ws;
    bf16 *rb = (bf16 *)(ws + o_rb), *hb = (bf16 *)(ws + o_hb), *dG = (bf16 *)(ws + o_dG);
    float *G = (float *)(ws + o_G);
    const float *R = (const float *)io->r, *cache = (const float *)io->cache;
    slstm_frag_kernel<<<grid_for(nfr, 256), 256, 0, c->stream>>>(frag, rb, R, H, Dh, cl ? 0 : s.nw, s.nf, KS, 1, 1);
    LAUNCH_CHECK();
    slstm_bprep_kernel<<<grid_for(n, 256), 256, 0, c->stream>>>(hb, G, cache, (const bf16 *)io->x, B, T, H, Dh);
    LAUNCH_CHECK();
    const float one = 1.0f;
    // G += hb R per head: column-major G^T [4Dh x BT] = R_h^T [4Dh x Dh] hb_h^T [Dh x BT]
    CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_N, 4 * Dh, B * T, Dh, &one, rb, CUDA_R_16BF,
                                          4 * Dh, (long long)Dh * 4 * Dh, hb, CUDA_R_16BF, D, (long long)Dh, &one, G,
                                          CUDA_R_32F, 4 * D, (long long)4 * Dh, H, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
    if (cl) {
        MN_TRY(slc_backward_walk(c, frag, d, R, G, cache, (const bf16 *)io->dh, (bf16 *)io->dx, dG));
    } else {
        SlBwd a = {G, frag, cache, (const bf16 *)io->dh, (bf16 *)io->dx, dG, B, T, H, Dh, s.nw, s.nf, s.nsm, d->clip};
        SlBwdKernel k = sl_bwd_kernels[s.v];
        CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)s.smem));
        dim3 grid((unsigned)H, (unsigned)((B + SL_NB - 1) / SL_NB));
        k<<<grid, s.nw * 32, s.smem, c->stream>>>(a);
        LAUNCH_CHECK();
    }
    // dR_h [Dh][4Dh] += hb_h^T dG_h: column-major dR^T [4Dh x Dh] += dG_h^T [4Dh x BT] hb_h [BT x Dh]
    CUBLAS_TRY(cublasGemmStridedBatchedEx(c->blas, CUBLAS_OP_N, CUBLAS_OP_T, 4 * Dh, Dh, B * T, &one, dG, CUDA_R_16BF,
                                          4 * D, (long long)4 * Dh, hb, CUDA_R_16BF, D, (long long)Dh, &one, io->dr,
                                          CUDA_R_32F, 4 * Dh, (long long)Dh * 4 * Dh, H, CUBLAS_COMPUTE_32F,
                                          CUBLAS_GEMM_DEFAULT));
    return MN_OK;
}
