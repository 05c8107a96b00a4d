/*
 * mesa_cuda.cu's tiles in registers and tensor-core products: a 64-row tile in the mma accumulator
 * layout, the per-row reductions, the fp16 / bf16 products on operands scaled by powers of two
 * (split hi + lo where they are fp32), and Hopper's warpgroup products for the CG operator.
 *
 * A section of mesa_cuda.cu's translation unit, not a header of its own: it uses the macros, Geo
 * and the pieces mesa_cuda.cu defines and includes before it (and is built twice with them: see
 * mesa_cuda.cu).
 */

// ------------------------------------------------------------ tiles in registers

// A 64 x (16 nc) tile in the mma accumulator layout: element e of n-tile j is
// at row f_row(e >> 1), column f_col(j, e, nc).
typedef struct {
    float v[MAXNT][4];
} Tile;

static __device__ __forceinline__ int lane_id() { return threadIdx.x & 31; }
// Tells the compiler that the block has n threads (a constant), which __launch_bounds__ leaves
// unsaid; the chunk kernels, the scans, dg_scan and decode call it first. In the chunk kernels the
// staging loops' tests whether a thread's vector lies inside its block then fold away where the
// vectors cover it exactly, which also leaves ptxas fewer spills (docs/cuda.md).
static __device__ __forceinline__ void assume_threads(unsigned n) { __builtin_assume(threadIdx.x < n); }
static __device__ __forceinline__ int warp_id() { return threadIdx.x >> 5; }
static __device__ __forceinline__ int f_row(int i) { return 16 * (warp_id() & 3) + (lane_id() >> 2) + 8 * i; }
static __device__ __forceinline__ int f_col(int j, int e, int nc) {
    return (warp_id() >> 2) * 8 * nc + 8 * j + 2 * (lane_id() & 3) + (e & 1);
}
// Whether this thread reports its rows' scalars (one thread per row).
static __device__ __forceinline__ int row_owner() { return (lane_id() & 3) == 0 && warp_id() < 4; }

static __device__ __forceinline__ void tile_zero(Tile *t) {
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) t->v[j][e] = 0;
}

// The thread's partial sums of a_row . b_row for its rows (over its own columns; rows_join completes them).
static __device__ __forceinline__ void tile_rowdot(float s[FR], const Tile *a, const Tile *b, int nc) {
    s[0] = s[1] = 0;
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        if (j < nc)
#pragma unroll
            for (int e = 0; e < 4; e++) s[e >> 1] += a->v[j][e] * b->v[j][e];
}

// out[i] = the sum of the partials s[i] of the thread's rows: rows span the 4
// lanes of a quad and the NCG column-group warps; `red` ([NCG][CH] floats of
// smem) joins the groups. Called by all threads (it synchronizes the block).
// With `fresh`, the caller guarantees that every thread has passed a barrier
// since its last reads of red (the CG loop alternates two buffers), and the
// join takes one barrier instead of two.
static __device__ void rows_join(float out[FR], float s[FR], float *red, int fresh) {
#pragma unroll
    for (int i = 0; i < FR; i++) {
        s[i] += __shfl_xor_sync(0xffffffffu, s[i], 1);
        s[i] += __shfl_xor_sync(0xffffffffu, s[i], 2);
    }
    if (!fresh) __syncthreads();  // the previous readers of red are done
    if ((lane_id() & 3) == 0)
#pragma unroll
        for (int i = 0; i < FR; i++) red[(warp_id() >> 2) * CH + f_row(i)] = s[i];
    __syncthreads();
#pragma unroll
    for (int i = 0; i < FR; i++) {
        out[i] = 0;
#pragma unroll
        for (int q = 0; q < NCG; q++) out[i] += red[q * CH + f_row(i)];
    }
}

// out[i] = a_row . b_row for the thread's rows (all threads; synchronizes).
static __device__ __forceinline__ void tile_dot(float out[FR], const Tile *a, const Tile *b, int nc, float *red,
                                         int fresh) {
    float s[FR];
    tile_rowdot(s, a, b, nc);
    rows_join(out, s, red, fresh);
}

// Multiplies the thread's rows by f.
static __device__ __forceinline__ void tile_scale_rows(Tile *t, const float f[FR]) {
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) t->v[j][e] *= f[e >> 1];
}

// The largest magnitude in the thread's part of the tile.
static __device__ __forceinline__ float tile_absmax(const Tile *t, int nc) {
    float m = 0;
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        if (j < nc)
#pragma unroll
            for (int e = 0; e < 4; e++) m = fmaxf(m, fabsf(t->v[j][e]));
    return m;
}

// The block's maxima of n per-thread values at once (non-negative): m in, the
// maxima out, for every thread. red: n NT / 32 floats of smem (n <= 5: at most
// 20 NCG, inside the [NCG][CH] regions that callers pass). Synchronizes.
static __device__ void block_max_n(float *m, int n, float *red) {
    for (int i = 0; i < n; i++) m[i] = warp_max(m[i]);
    __syncthreads();  // the previous readers of red are done
    if (lane_id() == 0)
        for (int i = 0; i < n; i++) red[NT / 32 * i + warp_id()] = m[i];
    __syncthreads();
    for (int i = 0; i < n; i++) {
        float v = 0;
        for (int w = 0; w < NT / 32; w++) v = fmaxf(v, red[NT / 32 * i + w]);
        m[i] = v;
    }
}

// ------------------------------------------------------------ tensor-core products

// ------------------------------------------- fp16 tensor-core products (the CG operator)
//
// CG applies the same operator (state H, keys K) to a new direction at every
// step, which makes it the bulk of the chunk kernels' time. These products run
// in fp16 (mma m16n8k16: twice TF32's rate) with operands fetched by ldmatrix
// (one instruction per 16 x 16 block instead of eight scalar loads), each
// operand scaled by a power of two into fp16's range so that nothing is lost:
// bf16 keys are exact in fp16's 11 bits, the state is split hi + lo (22 bits,
// as the TF32 split), the direction is rounded to 11 bits (as TF32 rounding
// was; see cg_solve), and the masked scores are split hi + lo.

// Four 8 x 8 blocks of 16-bit values (mma.cuh's ldsm_x4); `trans` transposes each block.
static __device__ __forceinline__ void ldsm4(unsigned r[4], const __half *p, int trans) {
    if (trans) ldsm_x4_t(r, p);
    else ldsm_x4(r, p);
}

// Two blocks (mma.cuh has no x2 form).
static __device__ __forceinline__ void ldsm2(unsigned r[2], const __half *p, int trans) {
    if (trans)
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
    else
        asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(smem_addr(p)));
}

// c += a b, m16n8k16 with fp32 accumulation, fp16 operands or (bf) bf16 ones. The bf16 instruction
// is mma.cuh's mma_bf16's, but that one is asm volatile, which the compiler may neither drop nor
// move across other side effects (the fragment loads, the shared-memory stores); these are plain
// asm, free to be scheduled around them, as these kernels have always been compiled.
static __device__ __forceinline__ void mma16(float c[4], const unsigned a[4], const unsigned b[2], int bf) {
    if (bf)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The B operand of a warp's product: B and B2 (B2, the low half of a split
// operand, may be NULL) by k (B(k, n) = B[k ldb + n]) or, with b_nmajor, by n
// (B(k, n) = B[n ldb + k]), and where the lane's ldmatrix rows lie in them.
typedef struct {
    const __half *B, *B2;
    int off, kstep, jstep, trans;  // the lane's row at k = 0, n-tile 0; the steps to k + 1 and to n-tile + 1
} BFrag;

// The lane's row address inside the 16 (k) x 16 (n) block of B (two n-tiles) at k = 0, column n0
// (the first of its warp's columns: (w >> 2) 8 nc for nc n-tiles a warp).
static __device__ __forceinline__ int b_lane_off(int l, int n0, int ldb, int b_nmajor) {
    return b_nmajor ? (n0 + (l & 7) + (l >> 4) * 8) * ldb + ((l >> 3) & 1) * 8
                    : ((l & 7) + ((l >> 3) & 1) * 8) * ldb + n0 + (l >> 4) * 8;
}

// B's fragments for the lane at offset off (b_lane_off). (The caller computes the offset: computed
// in here, it made ptxas spill more in the CG forward kernel, which ran slower.)
static __device__ __forceinline__ BFrag b_frag_at(const __half *B, const __half *B2, int ldb, int b_nmajor, int off) {
    BFrag f = {B, B2, off, b_nmajor ? 1 : ldb, b_nmajor ? 8 * ldb : 8, !b_nmajor};
    return f;
}

// acc += (a + a2) B[k:k+16, :] + a B2[k:k+16, :] over the warp's nc n-tiles, for
// A's fragments a (and, with has_a2, its low half's a2) of the k-step at k.
static __device__ __forceinline__ void mma_kstep(Tile *acc, const unsigned a[4], const unsigned a2[4], int has_a2,
                                             const BFrag *f, int k, int nc, int bf) {
#pragma unroll
    for (int j = 0; j < MAXNT; j += 2) {
        if (j >= nc) break;
        int off = f->off + k * f->kstep + j * f->jstep;
        if (j + 1 < nc) {
            unsigned b[4];
            ldsm4(b, f->B + off, f->trans);
            mma16(acc->v[j], a, b, bf);
            mma16(acc->v[j + 1], a, b + 2, bf);
            if (has_a2) {
                mma16(acc->v[j], a2, b, bf);
                mma16(acc->v[j + 1], a2, b + 2, bf);
            }
            if (f->B2) {
                ldsm4(b, f->B2 + off, f->trans);
                mma16(acc->v[j], a, b, bf);
                mma16(acc->v[j + 1], a, b + 2, bf);
            }
        } else {
            unsigned b[2];
            ldsm2(b, f->B + off, f->trans);
            mma16(acc->v[j], a, b, bf);
            if (has_a2) mma16(acc->v[j], a2, b, bf);
            if (f->B2) {
                ldsm2(b, f->B2 + off, f->trans);
                mma16(acc->v[j], a, b, bf);
            }
        }
    }
}

// The lane's row address inside the warp's 16 x 16 block of A at k = 0: A
// row-major (A(i, k) = A[i lda + k], or lda LD_CORE) or, with a_kmajor, by k (A(i, k) = A[k lda + i]).
static __device__ __forceinline__ int a_frag_off(int lda, int a_kmajor) {
    int l = lane_id(), m0 = 16 * (warp_id() & 3);
    if (lda == LD_CORE) return mat_off(m0 + (l & 15), (l >> 4) * 8, LD_CORE);
    return a_kmajor ? ((l & 7) + (l >> 4) * 8) * lda + m0 + ((l >> 3) & 1) * 8 : (m0 + (l & 15)) * lda + (l >> 4) * 8;
}
// The step of that address from k to k + 1 (k a multiple of 16 where lda is LD_CORE).
static __device__ __forceinline__ int a_frag_kstep(int lda, int a_kmajor) { return lda == LD_CORE ? 8 : a_kmajor ? lda : 1; }

// acc += (A + A2)[:, k0:k1] (B + B2)[k0:k1, :] less A2 B2, for this warp's part
// of the tile (nc n-tiles). 16-bit operands in smem, fp16 or, with bf, bf16
// (passed as __half pointers: ldmatrix moves bits); layouts as a_frag_off's and
// BFrag's. A2 and B2 (the low halves of split operands) may be NULL. k0, k1
// multiples of 16; strides of 16 mod 128 bytes (ldrow) keep ldmatrix free of
// bank conflicts.
static __device__ __forceinline__ void tile_mma_b16(Tile *acc, const __half *A, const __half *A2, int lda, int a_kmajor,
                                             const __half *B, const __half *B2, int ldb, int b_nmajor, int k0, int k1,
                                             int nc, int bf) {
    int a_off = a_frag_off(lda, a_kmajor), akstep = a_frag_kstep(lda, a_kmajor);
    BFrag f = b_frag_at(B, B2, ldb, b_nmajor, b_lane_off(lane_id(), (warp_id() >> 2) * 8 * nc, ldb, b_nmajor));
    for (int k = k0; k < k1; k += 16) {
        unsigned a[4], a2[4];
        ldsm4(a, A + a_off + k * akstep, a_kmajor);
        if (A2) ldsm4(a2, A2 + a_off + k * akstep, a_kmajor);
        mma_kstep(acc, a, a2, A2 != NULL, &f, k, nc, bf);
    }
}

#if WGMMA
#if MAXNT != 4
#error "the wgmma state term is written for 4 n-tiles a warp (m64n32)"
#endif
// The descriptor of a 16-bit operand in LD_CORE layout from p (16-byte aligned): core matrices
// 128 bytes apart along k (LBO), rows of them DP / 8 x 128 bytes apart along m or n (SBO), no
// swizzle. Its high word (SBO) is the same for every operand, so the products take the low word
// (the address and LBO) and add the high one themselves: half the registers per descriptor.
static __device__ __forceinline__ unsigned wg_desc(const __half *p) {
    return ((smem_addr(p) & 0x3FFFF) >> 4) | ((128 >> 4) << 16);
}
#define WG_DESC_HI (DP / 8 * 128 >> 4)

// Keeps the compiler from moving the accumulator's uses across the asynchronous product.
static __device__ __forceinline__ void wg_pin(Tile *acc) {
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        asm volatile("" : "+f"(acc->v[j][0]), "+f"(acc->v[j][1]), "+f"(acc->v[j][2]), "+f"(acc->v[j][3])::"memory");
}

// acc += A B for the warpgroup's 64 x 32 tile (warp w: rows 16 (w & 3).., the mma.sync layout),
// A and B from their descriptors (both k-major), issued asynchronously.
static __device__ __forceinline__ void wg_mma_n32(Tile *acc, unsigned da, unsigned db) {
    asm volatile(
        "{\n.reg .pred p;\n.reg .b64 da, db;\nsetp.ne.b32 p, 1, 0;\n"
        "mov.b64 da, {%16, %18};\nmov.b64 db, {%17, %18};\n"
        "wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, da, db, p, 1, 1, 0, 0;\n}\n"
        : "+f"(acc->v[0][0]), "+f"(acc->v[0][1]), "+f"(acc->v[0][2]), "+f"(acc->v[0][3]), "+f"(acc->v[1][0]),
          "+f"(acc->v[1][1]), "+f"(acc->v[1][2]), "+f"(acc->v[1][3]), "+f"(acc->v[2][0]), "+f"(acc->v[2][1]),
          "+f"(acc->v[2][2]), "+f"(acc->v[2][3]), "+f"(acc->v[3][0]), "+f"(acc->v[3][1]), "+f"(acc->v[3][2]),
          "+f"(acc->v[3][3])
        : "r"(da), "r"(db), "r"(WG_DESC_HI));
}

// Starts acc += A (Bh + Bl) for the warpgroup's 32 columns (w >> 2): A [64][DP] and B [DP][DP] in
// LD_CORE layout, B's rows read as its columns (B symmetric: the state H), over k = 0 .. DP.
// wg_state_wait completes it. Callers have made the operands visible to the async proxy
// (fence_async_smem, then a barrier).
//
// A descriptor's address field counts 16 bytes, and the block k .. k + 15 of a row of core matrices
// starts 16 k bytes after column 0: stepping over k adds k to the descriptor (no carry: shared
// addresses stay under 2^18). The bases are computed once, so that a product costs an add, not the
// descriptor's masks and shifts again (ptxas then keeps the descriptors in uniform registers).
static __device__ __forceinline__ void wg_state_start(Tile *acc, const __half *A, const __half *Bh, const __half *Bl) {
    // (the warpgroup's number broadcast from lane 0, so that ptxas knows it is the same across the
    // warp and keeps the descriptors in uniform registers: from warp_id() it moved each of them to
    // one (R2UR) before every product, 32 instructions a CG step)
    int n0 = __shfl_sync(0xffffffffu, warp_id() >> 2, 0) * 32;
    unsigned da = wg_desc(A), dh = wg_desc(Bh + mat_off(n0, 0, LD_CORE)), dl = wg_desc(Bl + mat_off(n0, 0, LD_CORE));
    wg_pin(acc);
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
    for (int k = 0; k < DP; k += 16) {
        wg_mma_n32(acc, da + k, dh + k);
        wg_mma_n32(acc, da + k, dl + k);
    }
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
}

static __device__ __forceinline__ void wg_state_wait(Tile *acc) {
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
    wg_pin(acc);
}
#endif

// Orders this thread's writes to shared memory before later reads by the async proxy (wgmma).
static __device__ __forceinline__ void fence_async_smem() {
#if WGMMA
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

// The chunk kernels' fp16 products: A row-major.
static __device__ __forceinline__ void tile_mma16(Tile *acc, const __half *A, const __half *A2, int lda, const __half *B,
                                           const __half *B2, int ldb, int b_nmajor, int k0, int k1, int nc) {
    tile_mma_b16(acc, A, A2, lda, 0, B, B2, ldb, b_nmajor, k0, k1, nc, 0);
}

// floor(log2 m) for a positive normal m, clamped to [-100, 100]; 0 for zero, subnormal or non-finite m.
static __device__ __forceinline__ int log2_floor(float m) {
    int e = ((__float_as_int(m) >> 23) & 0xff) - 127;
    return (m > 0 && e > -127 && e < 128) ? max(-100, min(100, e)) : 0;
}

static __device__ __forceinline__ float pow2f_(int e) { return __int_as_float((127 + e) << 23); }  // 2^e, |e| <= 126
// 1 / x for x a power of two 2^e, |e| <= 126: exact, by negating the exponent (a division costs a
// reciprocal, its refinement and a branch to IEEE's slow path, in the CG loop's critical path).
static __device__ __forceinline__ float inv_pow2(float x) { return __int_as_float((254 << 23) - __float_as_int(x)); }

// The power of two that brings a largest magnitude m into [1, 2) (1 for m = 0).
static __device__ __forceinline__ float fp16_scale(float m) { return pow2f_(-log2_floor(m)); }

// fp16 hi + lo of v (both halves of a value pair)
static __device__ __forceinline__ void split_half2(float v0, float v1, __half2 *hi, __half2 *lo) {
    *hi = __floats2half2_rn(v0, v1);
    float2 h = __half22float2(*hi);
    *lo = __floats2half2_rn(v0 - h.x, v1 - h.y);
}

// Where the thread's tile elements lie in a matrix with row stride ld (or LD_CORE): the pair
// (f_row(i), f_col(j, 2 i, nc)) at frag_off + i frag_rstep + j frag_cstep. (Written as a base and
// constant steps, the addresses cost one add each; ptxas did not see that f_row and f_col move by
// whole 8 x 8 blocks, and recomputed mat_off's shifts and masks for every element at every CG step.)
static __device__ __forceinline__ int frag_off(int ld, int nc) { return mat_off(f_row(0), f_col(0, 0, nc), ld); }
static __device__ __forceinline__ int frag_rstep(int ld) { return ld == LD_CORE ? 8 * DP : 8 * ld; }
static __device__ __forceinline__ int frag_cstep(int ld) { return ld == LD_CORE ? 64 : 8; }

// Writes the tile, each row times its scale sc, into fp16 smem, row-major
// (M[r ld + c]; or LD_CORE); split hi + lo when lo is given.
static __device__ __forceinline__ void tile_put16(__half *hi, __half *lo, int ld, const Tile *t, const float sc[FR], int nc) {
    int o0 = frag_off(ld, nc), rs = frag_rstep(ld), cs = frag_cstep(ld);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        if (j < nc)
#pragma unroll
            for (int i = 0; i < FR; i++) {
                int o = o0 + i * rs + j * cs;
                float v0 = t->v[j][2 * i] * sc[i], v1 = t->v[j][2 * i + 1] * sc[i];
                if (lo) split_half2(v0, v1, (__half2 *)(hi + o), (__half2 *)(lo + o));
                else *(__half2 *)(hi + o) = __floats2half2_rn(v0, v1);
            }
}

// The thread's partial sums of t_row . M_row (M fp16 in smem, row-major, times
// `scale`) for its rows; rows_join completes them.
static __device__ __forceinline__ void tile_rowdot16(float s[FR], const Tile *t, const __half *M, int ld, float scale, int nc) {
    s[0] = s[1] = 0;
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
        if (j < nc)
#pragma unroll
            for (int i = 0; i < FR; i++) {
                float2 m = __half22float2(*(const __half2 *)(M + f_row(i) * ld + f_col(j, 2 * i, nc)));
                s[i] += scale * (t->v[j][2 * i] * m.x + t->v[j][2 * i + 1] * m.y);
            }
}

