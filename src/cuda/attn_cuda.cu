/*
 * Causal softmax attention (full, or within a sliding window; grouped key/value heads) and RoPE on
 * the GPU, for the mha / swa mixers: the backend's attention sub-table (AttnOps: fwd, bwd, decode, rope) of
 * core/backend.h, as src/cpu/attn.c and the float64 reference src/ref/attn_ref.c.
 * q, k, v, o, dout, dq, dk, dv bf16 (MEM_ACT); lse, and every sum, float32.
 *
 * Head sizes: D a multiple of 8 up to 128. Every kernel is built twice, for a padded head size
 * DP = 64 and DP = 128 (a body function inlined with a constant DP, so that its register arrays
 * and loops are sized at compile time); D < DP is zero-filled on the loads (cp.async's zero fill),
 * which leaves the scores and the padded columns of every product zero. Other D: MN_ERR_UNSUPPORTED.
 *
 * Forward (FlashAttention-2): grid (ceil(T / 128), H, B), the longest query tiles first; 4 warps,
 * each 32 query rows (two m16 tiles, so that every K and V fragment read from shared memory feeds
 * two products: shared-memory reads, not the tensor cores, would bound one tile a warp); key/value
 * tiles of 64 rows. Shared memory: the Q tile and two buffers each of K and V (cp.async double
 * buffering: the next tile loads while this one is computed), rows padded by 8 elements (16 bytes)
 * so that the 8 rows one ldmatrix reads fall on different banks: (128 + 4 x 64) (DP + 8) x 2 bytes
 * = 104 KiB at DP = 128, two blocks a Hopper multiprocessor.
 * S = Q K^T and O += P V on the tensor cores (mma.sync m16n8k16 bf16 -> fp32, operands by
 * ldmatrix; Q's fragments re-read each tile, the registers going to the accumulators; P goes from
 * the S accumulators to A fragments in registers). Online softmax in fp32 in log2 units: scores
 * times scale log2(e), ex2.approx. Masks only on the tiles that need them (the diagonal, a
 * window's lower edge); key tiles outside every row's window are not visited, and a warp skips
 * the tiles its own rows do not see. lse is natural-log, as the CPU's: max + log(sum) of the
 * scaled scores.
 *
 * Backward (FlashAttention-2, P = exp(S - lse) rebuilt): Delta = rowsum(dO o O) first
 * (attn_delta_kernel), then
 *   one kernel, grid (ceil(T / 64), Hkv, B), 4 warps of 16 keys: the block loops over the query
 *   tiles of 64 that see its keys and over the H / Hkv query heads of its group (so that dK, dV
 *   sum the group in registers, without atomics), with Q, dO (and their lse, Delta)
 *   double-buffered in shared memory; per item S^T = K Q^T, dP^T = V dO^T, dV += P^T dO,
 *   dK += dS^T Q, and dQ += dS K through a dS^T tile in shared memory, added to a float32 dQ in
 *   scratch with atomics (then attn_dq_convert_kernel: scale, bf16). Five products per item; a
 *   separate dQ kernel looping over key tiles would be deterministic but recompute S and dP
 *   (seven products, ~1.4x the backward's tensor work), which is why the atomics: the key blocks
 *   of a query are summed in a run-dependent order, so dq varies in its last bits from run to run
 *   (as FlashAttention-2's and torch SDPA's do). Scratch: T B H (D + 1) floats.
 *
 * Decode (flash-decoding): the n cache slots are split into chunks so that B = 1 fills the GPU:
 * grid (nsplit, H, B), 4 warps taking keys in turn; each block leaves its chunk's (max, sum,
 * unnormalised output) in scratch, and a combine kernel rescales and sums them. No host sync and
 * no allocation beyond the grow-only scratch. (The model does not record attention's decode step
 * into a CUDA graph: n, the cache slot and the positions are host values a recording would freeze.)
 *
 * RoPE: a thread per (token, frequency), the angle in double as src/cpu/attn.c computes it (so that
 * CPU and GPU agree to the last bit of the angle), applied to every head of the token.
 */
#include <math.h>

#include "cuda_common.cuh"
#include "mma.cuh"

extern "C" {
#include "ref/ref.h"
}

#define ATTN_BK 64    // keys per tile (forward, dQ)
#define ATTN_BQ 128   // query rows per forward block: FWD_WARPS x FWD_MT x 16
#define FWD_WARPS 4   // warps of a forward block
#define FWD_MT 2      // m16 tiles per forward warp: 32 query rows
#define ATTN_BQB 64   // query rows per tile in the backward: 4 warps x 16
#define ATTN_BKB 64   // keys per dK/dV block: 4 warps x 16
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define DEC_WARPS 4

static __device__ __forceinline__ int amin(int a, int b) { return a < b ? a : b; }
static __device__ __forceinline__ int amax(int a, int b) { return a > b ? a : b; }

extern __shared__ __align__(16) bf16 attn_smem[];

typedef struct {
    const bf16 *q;  // [B,T,H,D]
    const bf16 *k;  // [B,T,Hkv,D]
    const bf16 *v;  // [B,T,Hkv,D]
    bf16 *o;        // [B,T,H,D]
    float *lse;     // [B,T,H] or NULL
    int T, H, Hkv, D, window;
    float sl2;      // scale log2(e)
} FwdArgs;

typedef struct {
    const bf16 *q, *k, *v, *dout;  // as FwdArgs; dout [B,T,H,D]
    const float *lse;              // [B,T,H] natural log
    const float *delta;            // [B,T,H] rowsum(dout o o)
    bf16 *dq, *dk, *dv;            // shapes of q, k, v
    float *dqacc;                  // [B,T,H,D] float32, zeroed: dQ / scale, summed over the key blocks
    int T, H, Hkv, D, window;
    float scale, sl2;
} BwdArgs;

typedef struct {
    const float *dqacc;  // [n]
    bf16 *dq;            // [n] = dqacc scale
    size_t n;
    float scale;
} DqArgs;

#define DS_LD (ATTN_BQB + 8)  // row stride of the dS^T tile in shared memory (conflict-free ldmatrix)

typedef struct {
    const bf16 *o, *dout;  // [B,T,H,D]
    float *delta;          // [B,T,H]
    int rows, D;           // B T H
} DeltaArgs;

typedef struct {
    const bf16 *q;      // [B,H,D]
    const bf16 *kc;     // [B,cap,Hkv,D]
    const bf16 *vc;     // [B,cap,Hkv,D]
    bf16 *o;            // [B,H,D]
    float *part;        // [B,H,nsplit,D+2]: max (log2 units), sum, unnormalised output per chunk
    int H, Hkv, D, n, cap, chunk, nsplit;
    float sl2;
} DecArgs;

typedef struct {
    bf16 *x;           // [N,H,D]
    const int32_t *pos; // [N]
    int N, H, D, rot, inverse;  // the first rot features of each head rotate (rot even, <= D)
    double ltheta;     // log(theta)
} RopeArgs;

// Rows [r0, r0 + nrows) of a [*, stride] bf16 array (row r at src + r stride) into shared memory
// rows of LDS elements, DP columns: rows past T and columns past D zero-filled.
static __device__ __forceinline__ void load_rows(bf16 *dst, const bf16 *src, size_t stride, int r0, int nrows, int T,
                                                 int D, const int DP, const int LDS) {
    const int per = DP / 8;  // 16-byte chunks per row
    for (int c = threadIdx.x; c < nrows * per; c += blockDim.x) {
        int r = c / per, j = (c % per) * 8, ok = r0 + r < T && j < D;
        cp_async16(dst + r * LDS + j, ok ? src + (size_t)(r0 + r) * stride + j : src, ok ? 16 : 0);
    }
}

// Two bf16 at p (4-byte aligned: D even).
static __device__ __forceinline__ void st_pair(bf16 *p, float lo, float hi) { *(uint32_t *)p = pack_bf16(lo, hi); }

// ------------------------------------------------------------------------------------- forward

static __device__ __forceinline__ void fwd_body(const FwdArgs a, const int DP) {
    const int LDS = DP + 8;
    bf16 *sq = attn_smem, *sk = sq + ATTN_BQ * LDS, *sv = sk + 2 * ATTN_BK * LDS;
    const int T = a.T, H = a.H, D = a.D, W = a.window;
    const int qt = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / (H / a.Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t qs = (size_t)H * D, ks = (size_t)a.Hkv * D;
    const bf16 *qb = a.q + ((size_t)b * T * H + h) * D;
    const bf16 *kb = a.k + ((size_t)b * T * a.Hkv + hk) * D, *vb = a.v + ((size_t)b * T * a.Hkv + hk) * D;
    const int t0 = qt * ATTN_BQ, last = amin(T, t0 + ATTN_BQ) - 1;
    const int kt0 = (W ? amax(0, t0 - W + 1) : 0) / ATTN_BK, kt1 = last / ATTN_BK;
    load_rows(sq, qb, qs, t0, ATTN_BQ, T, D, DP, LDS);
    load_rows(sk, kb, ks, kt0 * ATTN_BK, ATTN_BK, T, D, DP, LDS);
    load_rows(sv, vb, ks, kt0 * ATTN_BK, ATTN_BK, T, D, DP, LDS);
    cp_async_commit();

    // this lane's rows: row + 16 mt + 8 i (m16 tile mt of the warp's two, fragment half i)
    float m[FWD_MT][2], l[FWD_MT][2];  // running max (log2 units), this lane's share of the row sum
    float acc[FWD_MT][128 / 8][4];
#pragma unroll
    for (int mt = 0; mt < FWD_MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY;
        l[mt][0] = l[mt][1] = 0;
#pragma unroll
        for (int j = 0; j < DP / 8; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0;
    }
    const int wlo = t0 + warp * 16 * FWD_MT, row = wlo + (lane >> 2);
    for (int kt = kt0; kt <= kt1; kt++) {
        const int buf = (kt - kt0) & 1;
        if (kt < kt1) {
            load_rows(sk + (buf ^ 1) * ATTN_BK * LDS, kb, ks, (kt + 1) * ATTN_BK, ATTN_BK, T, D, DP, LDS);
            load_rows(sv + (buf ^ 1) * ATTN_BK * LDS, vb, ks, (kt + 1) * ATTN_BK, ATTN_BK, T, D, DP, LDS);
            cp_async_commit();
            cp_async_wait1();
        } else {
            cp_async_wait0();
        }
        __syncthreads();
        const bf16 *K = sk + buf * ATTN_BK * LDS, *V = sv + buf * ATTN_BK * LDS;
        const int s0 = kt * ATTN_BK, whi = wlo + 16 * FWD_MT - 1;
        // a warp whose rows see no key of the tile (the upper part of a diagonal tile, a window's
        // lower edge) skips it; the masks below still apply within the tiles it computes
        if (s0 <= whi && !(W && s0 + ATTN_BK - 1 <= wlo - W)) {
            float sc[FWD_MT][ATTN_BK / 8][4];
#pragma unroll
            for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
                for (int j = 0; j < ATTN_BK / 8; j++) sc[mt][j][0] = sc[mt][j][1] = sc[mt][j][2] = sc[mt][j][3] = 0;
            // S = Q K^T: Q's fragments from shared memory at each step (registers go to the two
            // tiles' accumulators); each K fragment feeds both m16 tiles
#pragma unroll
            for (int s = 0; s < DP / 16; s++) {
                uint32_t qf[FWD_MT][4];
#pragma unroll
                for (int mt = 0; mt < FWD_MT; mt++)
                    ldsm_x4(qf[mt], sq + (wlo - t0 + mt * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + s * 16 + (lane >> 4) * 8);
#pragma unroll
                for (int np = 0; np < ATTN_BK / 16; np++) {
                    uint32_t bb[4];
                    ldsm_x4(bb, K + (np * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + s * 16 + ((lane >> 3) & 1) * 8);
#pragma unroll
                    for (int mt = 0; mt < FWD_MT; mt++) {
                        mma_bf16(sc[mt][2 * np], qf[mt], bb[0], bb[1]);
                        mma_bf16(sc[mt][2 * np + 1], qf[mt], bb[2], bb[3]);
                    }
                }
            }
            // a mask where some key of the tile is past some row of the warp (the diagonal), or
            // before some row's window
            const int masked = s0 + ATTN_BK - 1 > wlo || (W && s0 <= whi - W);
#pragma unroll
            for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
                for (int j = 0; j < ATTN_BK / 8; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float x = sc[mt][j][e] * a.sl2;
                        if (masked) {
                            int key = s0 + j * 8 + 2 * (lane & 3) + (e & 1), t = row + mt * 16 + (e >> 1) * 8;
                            if (key > t || (W && key <= t - W)) x = -INFINITY;
                        }
                        sc[mt][j][e] = x;
                    }
#pragma unroll
            for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float mx = m[mt][i];
#pragma unroll
                    for (int j = 0; j < ATTN_BK / 8; j++) mx = fmaxf(mx, fmaxf(sc[mt][j][2 * i], sc[mt][j][2 * i + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                    const float base = mx == -INFINITY ? 0.0f : mx;  // a row with nothing visible yet stays at 0
                    const float alpha = ex2(m[mt][i] - base);
                    float rs = 0;
#pragma unroll
                    for (int j = 0; j < ATTN_BK / 8; j++) {
                        sc[mt][j][2 * i] = ex2(sc[mt][j][2 * i] - base);
                        sc[mt][j][2 * i + 1] = ex2(sc[mt][j][2 * i + 1] - base);
                        rs += sc[mt][j][2 * i] + sc[mt][j][2 * i + 1];
                    }
                    l[mt][i] = l[mt][i] * alpha + rs;  // the quad's shares are summed at the end
                    m[mt][i] = mx;
#pragma unroll
                    for (int j = 0; j < DP / 8; j++) acc[mt][j][2 * i] *= alpha, acc[mt][j][2 * i + 1] *= alpha;
                }
            // O += P V: P from the S accumulators as A fragments; each V fragment feeds both tiles
#pragma unroll
            for (int kk = 0; kk < ATTN_BK / 16; kk++) {
                uint32_t pa[FWD_MT][4];
#pragma unroll
                for (int mt = 0; mt < FWD_MT; mt++) {
                    pa[mt][0] = pack_bf16(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
                    pa[mt][1] = pack_bf16(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
                    pa[mt][2] = pack_bf16(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
                    pa[mt][3] = pack_bf16(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
                }
#pragma unroll
                for (int dp = 0; dp < DP / 16; dp++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, V + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + dp * 16 + (lane >> 4) * 8);
#pragma unroll
                    for (int mt = 0; mt < FWD_MT; mt++) {
                        mma_bf16(acc[mt][2 * dp], pa[mt], bb[0], bb[1]);
                        mma_bf16(acc[mt][2 * dp + 1], pa[mt], bb[2], bb[3]);
                    }
                }
            }
        }
        __syncthreads();  // every warp is done with this buffer before the next load refills it
    }
#pragma unroll
    for (int mt = 0; mt < FWD_MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float li = l[mt][i];
            li += __shfl_xor_sync(0xffffffffu, li, 1);
            li += __shfl_xor_sync(0xffffffffu, li, 2);
            const int t = row + mt * 16 + i * 8;
            if (t >= T) continue;
            const float inv = 1.0f / li;
            bf16 *orow = a.o + ((size_t)b * T + t) * qs + (size_t)h * D;
#pragma unroll
            for (int j = 0; j < DP / 8; j++) {
                int c = j * 8 + 2 * (lane & 3);
                if (c < D) st_pair(orow + c, acc[mt][j][2 * i] * inv, acc[mt][j][2 * i + 1] * inv);
            }
            if (a.lse && (lane & 3) == 0) a.lse[((size_t)b * T + t) * H + h] = (m[mt][i] + log2f(li)) * LN2;
        }
}

static __global__ void __launch_bounds__(FWD_WARPS * 32, 2) attn_fwd_kernel_64(const FwdArgs a) { fwd_body(a, 64); }
static __global__ void __launch_bounds__(FWD_WARPS * 32, 2) attn_fwd_kernel_128(const FwdArgs a) { fwd_body(a, 128); }

// ------------------------------------------------------------------------------------ backward

// delta[row] = sum_d dout[row, d] o[row, d]: a warp per row.
static __global__ void attn_delta_kernel(const DeltaArgs a) {
    const int lane = threadIdx.x & 31;
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= a.rows) return;
    float s = 0;
    for (int j = lane; j < a.D; j += 32) s += ld(a.o, (size_t)row * a.D + j) * ld(a.dout, (size_t)row * a.D + j);
    s = warp_sum(s);
    if (lane == 0) a.delta[row] = s;
}

// dK, dV of the 64 keys [s0, s0 + 64) of kv head hk: over the query tiles that see them and the
// group's query heads. Warp w owns keys s0 + 16 w ..; S^T, dP^T (keys x queries) in registers.
static __device__ __forceinline__ void dkdv_body(const BwdArgs a, const int DP) {
    const int LDS = DP + 8;
    bf16 *sk = attn_smem, *sv = sk + ATTN_BKB * LDS, *sq = sv + ATTN_BKB * LDS, *sdo = sq + 2 * ATTN_BQB * LDS;
    float *sl = (float *)(sdo + 2 * ATTN_BQB * LDS), *sdl = sl + 2 * ATTN_BQB;  // [2][64] each
    bf16 *sds = (bf16 *)(sdl + 2 * ATTN_BQB);  // [64 keys][DS_LD]: the item's dS^T, for dQ
    const int T = a.T, H = a.H, D = a.D, W = a.window, g = H / a.Hkv;
    const int kt = blockIdx.x, hk = blockIdx.y, b = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const size_t qs = (size_t)H * D, ks = (size_t)a.Hkv * D;
    const int s0 = kt * ATTN_BKB;
    const bf16 *kb = a.k + ((size_t)b * T * a.Hkv + hk) * D, *vb = a.v + ((size_t)b * T * a.Hkv + hk) * D;
    // queries that see some key of the tile: [s0, s0 + 63 + W) within T
    const int thi = W ? amin(T, s0 + ATTN_BKB - 1 + W) : T;
    const int qa = s0 / ATTN_BQB, nq = (thi - 1) / ATTN_BQB - qa + 1, nj = nq * g;
    load_rows(sk, kb, ks, s0, ATTN_BKB, T, D, DP, LDS);
    load_rows(sv, vb, ks, s0, ATTN_BKB, T, D, DP, LDS);

    float dk[128 / 8][4], dv[128 / 8][4];
#pragma unroll
    for (int j = 0; j < DP / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[j][e] = dv[j][e] = 0;
    const int key = s0 + warp * 16 + (lane >> 2);  // this lane's keys: key, key + 8
    for (int jj = 0; jj <= nj; jj++) {
        // item jj: query tile qa + jj / g, head hk g + jj % g; loaded one item ahead
        if (jj < nj) {
            const int buf = jj & 1, t0 = (qa + jj / g) * ATTN_BQB, h = hk * g + jj % g;
            const bf16 *qb = a.q + ((size_t)b * T * H + h) * D, *dob = a.dout + ((size_t)b * T * H + h) * D;
            load_rows(sq + buf * ATTN_BQB * LDS, qb, qs, t0, ATTN_BQB, T, D, DP, LDS);
            load_rows(sdo + buf * ATTN_BQB * LDS, dob, qs, t0, ATTN_BQB, T, D, DP, LDS);
            for (int i = threadIdx.x; i < ATTN_BQB; i += blockDim.x) {
                int t = t0 + i;
                size_t r = ((size_t)b * T + t) * H + h;
                // rows past T: lse = +inf makes their P exactly 0
                sl[buf * ATTN_BQB + i] = t < T ? a.lse[r] * LOG2E : INFINITY;
                sdl[buf * ATTN_BQB + i] = t < T ? a.delta[r] : 0.0f;
            }
            cp_async_commit();
        }
        if (jj == 0) continue;
        const int j = jj - 1, buf = j & 1, t0 = (qa + j / g) * ATTN_BQB, h = hk * g + j % g;
        if (jj < nj) cp_async_wait1();
        else cp_async_wait0();
        __syncthreads();
        const bf16 *Q = sq + buf * ATTN_BQB * LDS, *DO = sdo + buf * ATTN_BQB * LDS;
        const float *L = sl + buf * ATTN_BQB, *DL = sdl + buf * ATTN_BQB;
        const int k0 = s0 + warp * 16;
        // a warp whose 16 keys no query of the tile sees (the diagonal: all queries before them; a
        // window: all past them) skips it
        if (t0 + ATTN_BQB - 1 >= k0 && !(W && t0 - (k0 + 15) >= W)) {
            float st[ATTN_BQB / 8][4], dp[ATTN_BQB / 8][4];
#pragma unroll
            for (int n = 0; n < ATTN_BQB / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) st[n][e] = dp[n][e] = 0;
#pragma unroll
            for (int s = 0; s < DP / 16; s++) {
                uint32_t ka[4], va[4];
                const int aoff = (warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + s * 16 + (lane >> 4) * 8;
                ldsm_x4(ka, sk + aoff);
                ldsm_x4(va, sv + aoff);
#pragma unroll
                for (int np = 0; np < ATTN_BQB / 16; np++) {
                    uint32_t bb[4];
                    const int boff = (np * 16 + (lane & 7) + (lane >> 4) * 8) * LDS + s * 16 + ((lane >> 3) & 1) * 8;
                    ldsm_x4(bb, Q + boff);  // S^T = K Q^T
                    mma_bf16(st[2 * np], ka, bb[0], bb[1]);
                    mma_bf16(st[2 * np + 1], ka, bb[2], bb[3]);
                    ldsm_x4(bb, DO + boff);  // dP^T = V dO^T
                    mma_bf16(dp[2 * np], va, bb[0], bb[1]);
                    mma_bf16(dp[2 * np + 1], va, bb[2], bb[3]);
                }
            }
            // some query of the tile before some key (the diagonal), or past some key's window
            const int masked = t0 < k0 + 15 || (W && t0 + ATTN_BQB - 1 - k0 >= W);
#pragma unroll
            for (int n = 0; n < ATTN_BQB / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int qi = n * 8 + 2 * (lane & 3) + (e & 1), t = t0 + qi, s = key + (e >> 1) * 8;
                    float p = ex2(st[n][e] * a.sl2 - L[qi]);
                    if (masked && (t < s || (W && t - s >= W))) p = 0;
                    st[n][e] = p;
                    dp[n][e] = p * (dp[n][e] - DL[qi]);  // dS^T
                }
#pragma unroll
            for (int kk = 0; kk < ATTN_BQB / 16; kk++) {
                uint32_t pa[4] = {pack_bf16(st[2 * kk][0], st[2 * kk][1]), pack_bf16(st[2 * kk][2], st[2 * kk][3]),
                                  pack_bf16(st[2 * kk + 1][0], st[2 * kk + 1][1]),
                                  pack_bf16(st[2 * kk + 1][2], st[2 * kk + 1][3])};
                uint32_t da[4] = {pack_bf16(dp[2 * kk][0], dp[2 * kk][1]), pack_bf16(dp[2 * kk][2], dp[2 * kk][3]),
                                  pack_bf16(dp[2 * kk + 1][0], dp[2 * kk + 1][1]),
                                  pack_bf16(dp[2 * kk + 1][2], dp[2 * kk + 1][3])};
#pragma unroll
                for (int d = 0; d < DP / 16; d++) {
                    uint32_t bb[4];
                    const int boff = (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + d * 16 + (lane >> 4) * 8;
                    ldsm_x4_t(bb, DO + boff);  // dV += P^T dO
                    mma_bf16(dv[2 * d], pa, bb[0], bb[1]);
                    mma_bf16(dv[2 * d + 1], pa, bb[2], bb[3]);
                    ldsm_x4_t(bb, Q + boff);  // dK += dS^T Q
                    mma_bf16(dk[2 * d], da, bb[0], bb[1]);
                    mma_bf16(dk[2 * d + 1], da, bb[2], bb[3]);
                }
            }
#pragma unroll
            for (int n = 0; n < ATTN_BQB / 8; n++)
#pragma unroll
                for (int i = 0; i < 2; i++)
                    st_pair(sds + (warp * 16 + (lane >> 2) + 8 * i) * DS_LD + n * 8 + 2 * (lane & 3), dp[n][2 * i],
                            dp[n][2 * i + 1]);
        } else {
#pragma unroll
            for (int n = 0; n < ATTN_BQB / 8; n++)
#pragma unroll
                for (int i = 0; i < 2; i++)
                    st_pair(sds + (warp * 16 + (lane >> 2) + 8 * i) * DS_LD + n * 8 + 2 * (lane & 3), 0.0f, 0.0f);
        }
        __syncthreads();  // the whole dS^T tile written
        // dQ (/ scale) of the tile's queries += dS K over the block's 64 keys: warp w takes queries
        // t0 + 16 w .. + 15 (if any of them is real and sees a key of the block), D in slices of
        // 16 columns, added to dqacc with float32 atomics (the key blocks of a query run in parallel)
        const int q0 = t0 + warp * 16;
        if (q0 < T && q0 + 15 >= s0 && !(W && q0 - (s0 + ATTN_BKB - 1) >= W)) {
            uint32_t sa[ATTN_BKB / 16][4];
#pragma unroll
            for (int kk = 0; kk < ATTN_BKB / 16; kk++)
                ldsm_x4_t(sa[kk], sds + (kk * 16 + (lane & 7) + (lane >> 4) * 8) * DS_LD + warp * 16 + ((lane >> 3) & 1) * 8);
            float *dqr = a.dqacc + (((size_t)b * T + q0 + (lane >> 2)) * H + h) * D;
#pragma unroll
            for (int dc = 0; dc < DP / 16; dc++) {
                float acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
#pragma unroll
                for (int kk = 0; kk < ATTN_BKB / 16; kk++) {
                    uint32_t bb[4];
                    ldsm_x4_t(bb, sk + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LDS + dc * 16 + (lane >> 4) * 8);
                    mma_bf16(acc[0], sa[kk], bb[0], bb[1]);
                    mma_bf16(acc[1], sa[kk], bb[2], bb[3]);
                }
#pragma unroll
                for (int n = 0; n < 2; n++) {
                    const int c = dc * 16 + n * 8 + 2 * (lane & 3);
                    if (c >= D) continue;
                    if (q0 + (lane >> 2) < T) red_add2(dqr + c, acc[n][0], acc[n][1]);
                    if (q0 + (lane >> 2) + 8 < T) red_add2(dqr + (size_t)8 * H * D + c, acc[n][2], acc[n][3]);
                }
            }
        }
        __syncthreads();  // done with this buffer (and dS^T) before the load two items on refills it
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int s = key + i * 8;
        if (s >= T) continue;
        bf16 *dkr = a.dk + ((size_t)b * T + s) * ks + (size_t)hk * D, *dvr = a.dv + ((size_t)b * T + s) * ks + (size_t)hk * D;
#pragma unroll
        for (int j = 0; j < DP / 8; j++) {
            int c = j * 8 + 2 * (lane & 3);
            if (c < D) {
                st_pair(dkr + c, dk[j][2 * i] * a.scale, dk[j][2 * i + 1] * a.scale);
                st_pair(dvr + c, dv[j][2 * i], dv[j][2 * i + 1]);
            }
        }
    }
}

static __global__ void __launch_bounds__(128) attn_dkdv_kernel_64(const BwdArgs a) { dkdv_body(a, 64); }
static __global__ void __launch_bounds__(128) attn_dkdv_kernel_128(const BwdArgs a) { dkdv_body(a, 128); }

// dq = bf16(dqacc scale), four elements a thread.
static __global__ void attn_dq_convert_kernel(const DqArgs a) {
    for (size_t i = 4 * ((size_t)blockIdx.x * blockDim.x + threadIdx.x); i < a.n; i += 4 * (size_t)gridDim.x * blockDim.x) {
        const float4 x = *(const float4 *)(a.dqacc + i);
        st_pair(a.dq + i, x.x * a.scale, x.y * a.scale);
        st_pair(a.dq + i + 2, x.z * a.scale, x.w * a.scale);
    }
}

// -------------------------------------------------------------------------------------- decode

// One chunk of cache slots for query head h of sequence b: 4 warps take its keys in turn, lane l
// holding elements l, l + 32, .. (D <= 128: 4 a lane) of q, the keys and the output; the warps'
// partial results are merged through shared memory into the chunk's (max, sum, output).
static __global__ void __launch_bounds__(DEC_WARPS * 32) attn_dec_split_kernel(const DecArgs a) {
    __shared__ float wm[DEC_WARPS], wl[DEC_WARPS], wacc[DEC_WARPS][128];
    const int split = blockIdx.x, h = blockIdx.y, b = blockIdx.z, hk = h / (a.H / a.Hkv), D = a.D;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float q[4], acc[4] = {0, 0, 0, 0}, m = -INFINITY, l = 0;
    const bf16 *qh = a.q + ((size_t)b * a.H + h) * D;
#pragma unroll
    for (int i = 0; i < 4; i++) q[i] = lane + 32 * i < D ? ld(qh, lane + 32 * i) * a.sl2 : 0.0f;
    const int sb = split * a.chunk, se = amin(a.n, sb + a.chunk);
    const size_t ks = (size_t)a.Hkv * D;
    const bf16 *kb = a.kc + ((size_t)b * a.cap * a.Hkv + hk) * D, *vb = a.vc + ((size_t)b * a.cap * a.Hkv + hk) * D;
    for (int s = sb + warp; s < se; s += DEC_WARPS) {
        float x = 0;
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (lane + 32 * i < D) x += q[i] * ld(kb, (size_t)s * ks + lane + 32 * i);
        x = warp_sum(x);
        const float mn = fmaxf(m, x), alpha = exp2f(m - mn), p = exp2f(x - mn);
        l = l * alpha + p;
#pragma unroll
        for (int i = 0; i < 4; i++)
            acc[i] = acc[i] * alpha + (lane + 32 * i < D ? p * ld(vb, (size_t)s * ks + lane + 32 * i) : 0.0f);
        m = mn;
    }
    if (lane == 0) wm[warp] = m, wl[warp] = l;
#pragma unroll
    for (int i = 0; i < 4; i++) wacc[warp][lane + 32 * i] = acc[i];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < DEC_WARPS; w++) M = fmaxf(M, wm[w]);
    float *part = a.part + (((size_t)b * a.H + h) * a.nsplit + split) * (D + 2);
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float s = 0;
        for (int w = 0; w < DEC_WARPS; w++) s += wm[w] == -INFINITY ? 0.0f : wacc[w][j] * exp2f(wm[w] - M);
        part[2 + j] = s;
    }
    if (threadIdx.x == 0) {
        float L = 0;
        for (int w = 0; w < DEC_WARPS; w++) L += wm[w] == -INFINITY ? 0.0f : wl[w] * exp2f(wm[w] - M);
        part[0] = M;
        part[1] = L;
    }
}

// o[b, h] from the chunks' partial results: grid (H, B), a thread per output element.
static __global__ void attn_dec_combine_kernel(const DecArgs a) {
    const int h = blockIdx.x, b = blockIdx.y, D = a.D;
    const float *part = a.part + ((size_t)b * a.H + h) * a.nsplit * (D + 2);
    float M = -INFINITY;
    for (int s = 0; s < a.nsplit; s++) M = fmaxf(M, part[(size_t)s * (D + 2)]);
    float L = 0;
    for (int s = 0; s < a.nsplit; s++) L += part[(size_t)s * (D + 2) + 1] * exp2f(part[(size_t)s * (D + 2)] - M);
    for (int j = threadIdx.x; j < D; j += blockDim.x) {
        float o = 0;
        for (int s = 0; s < a.nsplit; s++) o += part[(size_t)s * (D + 2) + 2 + j] * exp2f(part[(size_t)s * (D + 2)] - M);
        st(a.o, ((size_t)b * a.H + h) * D + j, o / L);
    }
}

// ---------------------------------------------------------------------------------------- rope

static __global__ void attn_rope_kernel(const RopeArgs a) {
    const int half = a.rot / 2;
    const long idx = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (long)a.N * half) return;
    const int n = (int)(idx / half), i = (int)(idx % half);
    // as src/cpu/attn.c: the angle in double (positions in the 1e5s would lose it in float)
    const double ang = a.pos[n] * exp(-2.0 * i / a.rot * a.ltheta);
    const float c = (float)cos(ang), s = (float)(a.inverse ? -sin(ang) : sin(ang));
    for (int h = 0; h < a.H; h++) {
        const size_t r = ((size_t)n * a.H + h) * a.D;
        const float x1 = ld(a.x, r + i), x2 = ld(a.x, r + i + half);
        st(a.x, r + i, x1 * c - x2 * s);
        st(a.x, r + i + half, x2 * c + x1 * s);
    }
}

// ---- host side (cut by scripts/cuda_emulate.sh attn, which mirrors it in tests/cuda_emu/attn_emu.cpp)

#include "attn_cudnn.h"

static int head_size_ok(const char *fn, int D) {
    if (D % 8 || D > 128)
        return mn_error(MN_ERR_UNSUPPORTED, "%s: head size D = %d is not supported by the cuda backend (multiples of 8 up to 128)",
                        fn, D);
    return MN_OK;
}

// q, k, v, dout are copied in 16-byte pieces (cp.async): their rows (D a multiple of 8) are then
// aligned when the buffers are.
static int aligned16(const char *fn, const void *const *p, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if ((uintptr_t)p[i] % 16)
            return mn_error(MN_ERR_UNSUPPORTED, "%s: %s is not 16-byte aligned (the cuda kernels copy 16-byte pieces)", fn,
                            names[i]);
    return MN_OK;
}

static size_t fwd_smem(int DP) { return (size_t)(ATTN_BQ + 4 * ATTN_BK) * (DP + 8) * sizeof(bf16); }
// K, V; Q, dO double-buffered; lse, Delta double-buffered; the dS^T tile: 112 KiB at DP = 128, so
// that two blocks fit a Hopper multiprocessor (228 KiB, 1 KiB of it reserved per block)
static size_t dkdv_smem(int DP) {
    return (size_t)(2 * ATTN_BKB + 4 * ATTN_BQB) * (DP + 8) * sizeof(bf16) + 4 * ATTN_BQB * sizeof(float) +
           (size_t)ATTN_BKB * DS_LD * sizeof(bf16);
}

extern "C" int cuda_attn_fwd(const Backend *be, const AttnDims *d, const AttnFwd *io) {
    MN_TRY(ref_attn_check("attn_fwd", d));
    if (!io || !io->q || !io->k || !io->v || !io->o) return mn_error(MN_ERR_ARG, "attn_fwd: q, k, v and o are required");
    MN_TRY(head_size_ok("attn_fwd", d->D));
    const void *al[] = {io->q, io->k, io->v};
    const char *aln[] = {"q", "k", "v"};
    MN_TRY(aligned16("attn_fwd", al, aln, 3));
    {  // cuDNN's fused attention first (attn_cudnn.cu); ours where it declines
        int r = cuda_attn_fwd_cudnn(be, d, io);
        if (r != ATTN_CUDNN_DECLINED) return r;
    }
    CudaCtx *c = cuda_ctx(be);
    FwdArgs a = {(const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v, (bf16 *)io->o, (float *)io->lse,
                 d->T, d->H, d->Hkv, d->D, d->window, d->scale * LOG2E};
    const int DP = d->D <= 64 ? 64 : 128;
    const size_t smem = fwd_smem(DP);
    void (*k)(const FwdArgs) = DP == 64 ? attn_fwd_kernel_64 : attn_fwd_kernel_128;
    CU_TRY(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    k<<<dim3((d->T + ATTN_BQ - 1) / ATTN_BQ, d->H, d->B), FWD_WARPS * 32, smem, c->stream>>>(a);
    LAUNCH_CHECK();
    return MN_OK;
}

extern "C" int cuda_attn_bwd(const Backend *be, const AttnDims *d, const AttnBwd *io) {
    MN_TRY(ref_attn_check("attn_bwd", d));
    if (!io || !io->q || !io->k || !io->v || !io->o || !io->lse || !io->dout || !io->dq || !io->dk || !io->dv)
        return mn_error(MN_ERR_ARG, "attn_bwd: q, k, v, o, lse, dout, dq, dk and dv are required");
    MN_TRY(head_size_ok("attn_bwd", d->D));
    const void *al[] = {io->q, io->k, io->v, io->dout};
    const char *aln[] = {"q", "k", "v", "dout"};
    MN_TRY(aligned16("attn_bwd", al, aln, 4));
    {
        int r = cuda_attn_bwd_cudnn(be, d, io);
        if (r != ATTN_CUDNN_DECLINED) return r;
    }
    CudaCtx *c = cuda_ctx(be);
    const size_t rows = (size_t)d->B * d->T * d->H, nq = rows * d->D;
    const size_t off = (rows * sizeof(float) + 255) / 256 * 256;  // dqacc 256-byte aligned after delta
    char *ws = (char *)cuda_scratch(be, off + nq * sizeof(float));
    if (!ws) return MN_ERR_NOMEM;
    float *delta = (float *)ws, *dqacc = (float *)(ws + off);
    CU_TRY(cudaMemsetAsync(dqacc, 0, nq * sizeof(float), c->stream));
    DeltaArgs da = {(const bf16 *)io->o, (const bf16 *)io->dout, delta, (int)rows, d->D};
    attn_delta_kernel<<<(unsigned)((rows + 7) / 8), 256, 0, c->stream>>>(da);
    LAUNCH_CHECK();
    BwdArgs a = {(const bf16 *)io->q, (const bf16 *)io->k,  (const bf16 *)io->v, (const bf16 *)io->dout,
                 (const float *)io->lse, delta, (bf16 *)io->dq, (bf16 *)io->dk, (bf16 *)io->dv, dqacc,
                 d->T, d->H, d->Hkv, d->D, d->window, d->scale, d->scale * LOG2E};
    const int DP = d->D <= 64 ? 64 : 128;
    void (*kk)(const BwdArgs) = DP == 64 ? attn_dkdv_kernel_64 : attn_dkdv_kernel_128;
    CU_TRY(cudaFuncSetAttribute(kk, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dkdv_smem(DP)));
    kk<<<dim3((d->T + ATTN_BKB - 1) / ATTN_BKB, d->Hkv, d->B), 128, dkdv_smem(DP), c->stream>>>(a);
    LAUNCH_CHECK();
    DqArgs qa = {dqacc, (bf16 *)io->dq, nq, d->scale};
    attn_dq_convert_kernel<<<grid_for(nq / 4, 256), 256, 0, c->stream>>>(qa);
    LAUNCH_CHECK();
    return MN_OK;
}

extern "C" int cuda_attn_decode(const Backend *be, const AttnDims *d, int n, int cap, const void *q, const void *kc,
                                const void *vc, void *o) {
    if (!d || d->B <= 0 || d->H <= 0 || d->Hkv <= 0 || d->D <= 0 || d->H % d->Hkv)
        return mn_error(MN_ERR_ARG, "attn_decode: bad dims");
    if (n <= 0 || n > cap) return mn_error(MN_ERR_ARG, "attn_decode: n = %d, must be in 1..cap = %d", n, cap);
    if (!q || !kc || !vc || !o) return mn_error(MN_ERR_ARG, "attn_decode: q, kc, vc and o are required");
    MN_TRY(head_size_ok("attn_decode", d->D));
    CudaCtx *c = cuda_ctx(be);
    // chunks of at least 64 slots, enough of them for ~4 blocks per multiprocessor
    const long pairs = (long)d->B * d->H, want = (4L * c->sm_count + pairs - 1) / pairs;
    int chunk = (int)((n + want - 1) / want);
    if (chunk < 64) chunk = 64;
    const int nsplit = (n + chunk - 1) / chunk;
    float *part = (float *)cuda_scratch(be, (size_t)pairs * nsplit * (d->D + 2) * sizeof(float));
    if (!part) return MN_ERR_NOMEM;
    DecArgs a = {(const bf16 *)q, (const bf16 *)kc, (const bf16 *)vc, (bf16 *)o, part,
                 d->H, d->Hkv, d->D, n, cap, chunk, nsplit, d->scale * LOG2E};
    attn_dec_split_kernel<<<dim3(nsplit, d->H, d->B), DEC_WARPS * 32, 0, c->stream>>>(a);
    LAUNCH_CHECK();
    attn_dec_combine_kernel<<<dim3(d->H, d->B), 128, 0, c->stream>>>(a);
    LAUNCH_CHECK();
    return MN_OK;
}

extern "C" int cuda_rope(const Backend *be, void *x, const void *pos, int N, int H, int D, int rot, float theta,
                         int inverse) {
    MN_TRY(ref_rope_check(x, pos, N, H, D, rot, theta));
    RopeArgs a = {(bf16 *)x, (const int32_t *)pos, N, H, D, rot, inverse, log((double)theta)};
    const size_t n = (size_t)N * (rot / 2);
    attn_rope_kernel<<<(unsigned)((n + 255) / 256), 256, 0, cuda_ctx(be)->stream>>>(a);
    LAUNCH_CHECK();
    return MN_OK;
}
