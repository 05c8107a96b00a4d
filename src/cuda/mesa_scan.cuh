/*
 * mesa_cuda.cu's scans: the chunk-to-chunk recurrences of the states (forward) and of their
 * adjoints (reverse), by mma.sync (scan_kernel) and, on Hopper, by wgmma with TMA copies
 * (scan_wg_kernel), with the host's tensor maps.
 *
 * A section of mesa_cuda.cu's translation unit, not a header of its own: it uses the macros, Geo
 * and the pieces mesa_cuda.cu defines and includes before it (and is built twice with them: see
 * mesa_cuda.cu).
 */

// ---------------------------------------------------------------- the chunk scan

// One recurrence over the chunks of each (sequence, head), for two matrices
// side by side (rows d[0] + d[1], columns Dk):
//   S <- e^{b_n} S + (diag(w) L)^T R   per chunk,
// forward (the states: L = K for H, V for G; R = K; w_s = e^{b_n - b_s} beta_s)
// or in reverse (the adjoints: L = Delta for Gbar, Y for Hn; R = X; w_s = e^{b_s}).
// out[pair][slot] holds S at every chunk boundary: forward, slot c is the entry
// of chunk c (slot nchunks the final state); reverse, slot c is the end of chunk c.
typedef struct {
    const bf16 *l16[2];    // left factors [B,T,H,d], bf16 ...
    const float *l32[2];   // ... or float
    int d[2];              // rows of the two matrices
    const bf16 *r;         // right factor [B,T,H,Dk]
    const float *init[2];  // the starting values [pair][d x Dk] (NULL: zero), times init_sign
    float init_sign[2];
    float *out;            // [pair][nslots][(d0 + d1) x Dk]
    int nslots;
    float *fin[2];         // reverse: where S before chunk 0 goes [pair][d x Dk] (NULL: nowhere), times fin_sign
    float fin_sign[2];
    int reverse;
    int vec;               // every row of every factor starts 16-byte aligned: 16-byte loads (run_scan sets it)
} Scan;

// Stores the block's 64-row slice (rows i0.., of a matrix of `rows` rows and
// Dk columns) times sign; a thread's two adjacent columns as one 8-byte store.
static __device__ void slice_store(float *dst, const Tile *acc, int i0, int rows, int dk, int nc, float sign) {
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int i = 0; i < FR; i++) {
            int r = i0 + f_row(i), c = f_col(j, 2 * i, nc);
            if (j >= nc || r >= rows || c >= dk) continue;
            float *d = dst + (size_t)r * dk + c, v0 = sign * acc->v[j][2 * i], v1 = sign * acc->v[j][2 * i + 1];
            if (dk % 2 == 0) {
                *(float2 *)d = make_float2(v0, v1);
            } else {
                d[0] = v0;
                if (c + 1 < dk) d[1] = v1;
            }
        }
}

// slice_store through 1 KB of smem per warp (scr), so that every store instruction writes four
// whole 128-byte rows: from the mma layout (two adjacent columns a thread), 8-byte stores had cost
// an L2 request per 32 bytes, and the scan was bound by L2 tag lookups.
// Needs dk % 4 == 0 and dst 16-byte aligned (slice_rows_ok). A row's 8-byte units are swizzled
// (unit u of row r at u ^ 4 (r & 3)), so that the writes and the 16-byte reads are free of bank conflicts.
static __device__ void slice_store_rows(float *dst, const Tile *acc, int i0, int rows, int dk, float sign, float *scr) {
    int l = lane_id(), w = warp_id(), c0 = (w >> 2) * 8 * MAXNT;
    float *my = scr + w * 8 * 32;  // 8 rows x 32 columns: the warp's rows f_row(i) for one i
#pragma unroll
    for (int i = 0; i < FR; i++) {
        int r = l >> 2;
#pragma unroll
        for (int j = 0; j < MAXNT; j++) {
            int u = 4 * j + (l & 3);  // columns 2u, 2u + 1 of the warp's 32
            *(float2 *)(my + r * 32 + 2 * (u ^ (4 * (r & 3)))) = make_float2(sign * acc->v[j][2 * i], sign * acc->v[j][2 * i + 1]);
        }
        __syncwarp();
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int rr = (l >> 3) + 4 * h, f = l & 7;  // row rr, columns 4f .. 4f + 3
            float4 v = *(const float4 *)(my + rr * 32 + 2 * ((2 * f) ^ (4 * (rr & 3))));
            int row = i0 + 16 * (w & 3) + 8 * i + rr, col = c0 + 4 * f;
            if (row < rows && col < dk) *(float4 *)(dst + (size_t)row * dk + col) = v;
        }
        __syncwarp();
    }
}

static __device__ __forceinline__ int slice_rows_ok(const float *dst, int dk) {
    return MAXNT == 4 && dk % 4 == 0 && (uintptr_t)dst % 16 == 0;
}

// A scan chunk's raw operands, fetched in the background: the left factor's
// 64-column slice (from column i0 of dl; stride CH + 4 floats or CH + 8 bf16)
// at dst, the right factor (stride ldrow(DP)) at dst + lbytes.
static __device__ __forceinline__ void scan_stage(unsigned char *dst, size_t lbytes, const void *l, int l32, int i0, int dl,
                                           const bf16 *r, int vec, const Geo *g, int pair, int t0) {
    Src ls = tok_src(l, l32, dl, CH, g, pair, t0, vec), rs = tok_src(r, 0, g->Dk, DP, g, pair, t0, vec);
    ls.p = (const char *)ls.p + (size_t)i0 * (l32 ? 4 : 2);
    ls.cols = min(CH, dl - i0);
    stage_raw(dst, l32 ? CH + 4 : CH + 8, &ls);
    stage_raw(dst + lbytes, ldrow(DP), &rs);
}

// A warp: a scan chunk's token weights for tokens lane and lane + 32 (forward
// e^{b_n - b_s} beta_s, reverse e^{b_s}; 0 past the end); returns its decay e^{b_n}.
static __device__ __forceinline__ float chunk_weights(float wt[2], const float glog[2], const float beta[2], int n,
                                                      int reverse) {
    float b[2];
    chunk_cumsum(b, glog);
    float bn = __shfl_sync(0xffffffffu, n > 32 ? b[1] : b[0], (n - 1) & 31);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = lane_id() + 32 * h;
        wt[h] = t < n ? (reverse ? __expf(b[h]) : __expf(bn - b[h]) * beta[h]) : 0.0f;
    }
    return __expf(bn);
}

// Warp 0: the same into smem (w, decay).
static __device__ __forceinline__ void scan_weights(float *w, float *decay, const float glog[2], const float beta[2], int n,
                                             int reverse) {
    float wt[2], d = chunk_weights(wt, glog, beta, n, reverse);
    w[threadIdx.x] = wt[0];
    w[threadIdx.x + 32] = wt[1];
    if (threadIdx.x == 0) *decay = d;
}

// a, b as three bf16 terms each, hi + mid + lo: 24 significant bits (float32's)
// with float32's exponent range, so that no operand needs scaling.
static __device__ __forceinline__ void split_bf16x3(float a, float b, __nv_bfloat162 t[3]) {
#pragma unroll
    for (int i = 0; i < 3; i++) {
        t[i] = __floats2bfloat162_rn(a, b);
        float2 f = __bfloat1622float2(t[i]);
        a -= f.x;
        b -= f.y;
    }
}

// The left operand A(s, i) = w_s L[s][i] of the staged slice (bf16 or float),
// split in three (split_bf16x3) into A, A + CH ldrow(CH), A + 2 CH ldrow(CH):
// k-major (by token s), stride ldrow(CH).
static __device__ __forceinline__ void scan_put_a(bf16 *A, const unsigned char *L, int l32, const float *w) {
    for (int e = threadIdx.x; e < CH * CH / 8; e += NT) {  // 8 values of one token each
        int s = e / 8, i = 8 * (e % 8), o = s * ldrow(CH) + i;
        float v[8];
        if (l32) {
            const float4 *p = (const float4 *)((const float *)L + s * (CH + 4) + i);
            float4 x = p[0], y = p[1];
            v[0] = x.x, v[1] = x.y, v[2] = x.z, v[3] = x.w, v[4] = y.x, v[5] = y.y, v[6] = y.z, v[7] = y.w;
        } else {
            Vec16 x;
            x.u = *(const uint4 *)((const bf16 *)L + s * (CH + 8) + i);
#pragma unroll
            for (int k = 0; k < 8; k++) v[k] = vec_at(&x, k, 0);
        }
        __nv_bfloat162 t[4][3];
#pragma unroll
        for (int k = 0; k < 4; k++) split_bf16x3(w[s] * v[2 * k], w[s] * v[2 * k + 1], t[k]);
#pragma unroll
        for (int q = 0; q < 3; q++) {
            __nv_bfloat162 u[4] = {t[0][q], t[1][q], t[2][q], t[3][q]};
            *(uint4 *)(A + q * CH * ldrow(CH) + o) = *(const uint4 *)u;
        }
    }
}

// Grid (slices, pairs): slice z < ceil(d0 / 64) covers rows 64 z.. of matrix 0,
// the rest matrix 1. Per chunk, two barriers: the chunk's raw operands (fetched
// by cp.async during the previous chunk into one of two stage buffers) and its
// weights are in place; then the split left operand. The products run in bf16
// (mma m16n8k16): the right factor is bf16 and used as fetched, the weighted
// left one is split in three (24 bits), so the state keeps float32 accuracy
// with no scaling. Two blocks per multiprocessor (95 KB of smem each).
static __global__ void __launch_bounds__(NT, 2) scan_kernel(Scan sc, const float *glog, const float *gbeta, Geo g) {
    assume_threads(NT);
    grid_wait();
    extern __shared__ __align__(16) unsigned char smb[];
    int pair = g.pair0 + blockIdx.y, z = blockIdx.x, s0 = (sc.d[0] + CH - 1) / CH, m = z < s0 ? 0 : 1;
    // the slice's operands, picked without indexing the parameter arrays (which would copy them to the stack)
    int i0 = CH * (m ? z - s0 : z), dl = m ? sc.d[1] : sc.d[0], dk = g.Dk, nc = NTILES(DP);
    const float *l32p = m ? sc.l32[1] : sc.l32[0], *init = m ? sc.init[1] : sc.init[0];
    const void *l = l32p ? (const void *)l32p : (const void *)(m ? sc.l16[1] : sc.l16[0]);
    int l32 = l32p != NULL;
    float *fin = m ? sc.fin[1] : sc.fin[0];
    float init_sign = m ? sc.init_sign[1] : sc.init_sign[0], fin_sign = m ? sc.fin_sign[1] : sc.fin_sign[0];
    size_t lbytes = (size_t)CH * (CH + 4) * sizeof(float), sbytes = lbytes + (size_t)CH * ldrow(DP) * sizeof(bf16);
    bf16 *A = (bf16 *)(smb + 2 * sbytes);
    float *w = (float *)(A + 3 * CH * ldrow(CH)), *decay = w + 2 * CH, *dec = decay + 2;  // dec: [2][glog, beta][CH]
    size_t slot_sz = (size_t)(sc.d[0] + sc.d[1]) * dk, off = m ? (size_t)sc.d[0] * dk : 0;
    float *out = sc.out + (size_t)pair * sc.nslots * slot_sz + off;
    Tile acc;
    tile_zero(&acc);
    if (init) {
        const float *src = init + (size_t)pair * dl * dk;
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int i = i0 + f_row(e >> 1), c = f_col(j, e, nc);
                if (j < nc && i < dl && c < dk) acc.v[j][e] = init_sign * src[(size_t)i * dk + c];
            }
    }
    int dir = sc.reverse ? -1 : 1, c = sc.reverse ? g.nchunks - 1 : 0;
    int rows_ok = slice_rows_ok(out, dk) && slot_sz % 4 == 0;
    scan_stage(smb, lbytes, l, l32, i0, dl, sc.r, sc.vec, &g, pair, c * CH);
    if (threadIdx.x < 32) fetch_decays_async(dec, dec + CH, glog, gbeta, &g, pair, c * CH);
    for (int step = 0; step < g.nchunks; step++, c += dir) {
        int n = min(CH, g.T - c * CH), buf = step & 1, more = step + 1 < g.nchunks;
        const unsigned char *st = smb + buf * sbytes;
        float *scr = (float *)(smb + buf * sbytes);  // the left slice's space, free once A is in place
        cp_async_wait();
        if (threadIdx.x < 32) {
            const float *d = dec + buf * 2 * CH;
            float gl[2] = {d[threadIdx.x], d[threadIdx.x + 32]}, bt[2] = {d[CH + threadIdx.x], d[CH + threadIdx.x + 32]};
            scan_weights(w + buf * CH, decay + buf, gl, bt, n, sc.reverse);
        }
        __syncthreads();  // chunk c's operands and weights are in place; the other stage buffer and A are free
        if (more) {
            scan_stage(smb + (buf ^ 1) * sbytes, lbytes, l, l32, i0, dl, sc.r, sc.vec, &g, pair, (c + dir) * CH);
            if (threadIdx.x < 32)
                fetch_decays_async(dec + (buf ^ 1) * 2 * CH, dec + (buf ^ 1) * 2 * CH + CH, glog, gbeta, &g, pair, (c + dir) * CH);
        }
        scan_put_a(A, st, l32, w + buf * CH);
        if (!rows_ok) slice_store(out + (size_t)c * slot_sz, &acc, i0, dl, dk, nc, 1.0f);
        __syncthreads();  // A is in place
        if (rows_ok) slice_store_rows(out + (size_t)c * slot_sz, &acc, i0, dl, dk, 1.0f, scr);
        float d = decay[buf];
#pragma unroll
        for (int j = 0; j < MAXNT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc.v[j][e] *= d;
        const __half *a = (const __half *)A, *r = (const __half *)(st + lbytes);
        tile_mma_b16(&acc, a + 2 * CH * ldrow(CH), NULL, ldrow(CH), 1, r, NULL, ldrow(DP), 0, 0, CH, nc, 1);
        tile_mma_b16(&acc, a, a + CH * ldrow(CH), ldrow(CH), 1, r, NULL, ldrow(DP), 0, 0, CH, nc, 1);
    }
    // (each warp stores through its own part of the last chunk's scratch, which it alone uses)
    float *scr = (float *)(smb + ((g.nchunks - 1) & 1) * sbytes);
    float *last = sc.reverse ? (fin ? fin + (size_t)pair * dl * dk : NULL) : out + (size_t)g.nchunks * slot_sz;
    float sign = sc.reverse ? fin_sign : 1.0f;
    if (last && slice_rows_ok(last, dk)) slice_store_rows(last, &acc, i0, dl, dk, sign, scr);
    else if (last) slice_store(last, &acc, i0, dl, dk, nc, sign);
}

// Two stage buffers (the left slice as floats at most, the right factor), the split left operand,
// weights, decays and two chunks' fetched log decays and betas.
static size_t scan_smem(const Geo *g) {
    return 2 * ((size_t)CH * (CH + 4) * sizeof(float) + (size_t)CH * ldrow(DP) * sizeof(bf16)) +
           3 * (size_t)CH * ldrow(CH) * sizeof(bf16) + 2 * CH * sizeof(float) + 2 * sizeof(float) + 4 * CH * sizeof(float);
}

// ---------------------------------------------------------------- the scan by wgmma (sm_90a)

// The same recurrence on Hopper, one warpgroup a block (grid and slices as scan_kernel's), when
// the state is DP columns wide and both matrices' rows come in whole slices of 64. What the
// profile of scan_kernel said: 16 warps in lockstep between two barriers a chunk, every warp
// computing addresses and loading fragments for its part of the product, and the state stored
// through a per-warp scratch, with neither the issue slots nor DRAM near their limits. Here a chunk
// needs one barrier: the warpgroup's product is asynchronous (wgmma, the right factor read once
// from smem), the left factor goes straight from the staged slice into the A fragments in
// registers (weighted and split in three there), and each warp hands its 16 rows of the state to
// the tensor-memory accelerator (TMA) in one store. The right factor comes by TMA too (one copy a
// chunk), the left by cp.async.
#define SW_NT 128                      // threads of a slice: one warpgroup
#define SW_OBYTES (CH * DP * 4)        // the staged state, fp32, in the out map's swizzled boxes
#define SW_RBYTES (CH * DP * 2)        // the right factor, bf16, in wgmma's 128-byte swizzled layout
#define SW_LBYTES (CH * (CH + 4) * 4)  // the left factor's slice, as fetched (float at most)
// a warpgroup's smem, with two mbarriers, in whole KB so that every staged state is aligned to 1024
// bytes (the swizzle's period)
#define SW_WG_SMEM ((SW_OBYTES + 2 * SW_RBYTES + 2 * SW_LBYTES + 4 * CH * 4 + 2 * 8 + 1023) / 1024 * 1024)
// Warpgroups a block, each its own slice, independent but for sharing a multiprocessor. Where a
// chunk block takes a whole multiprocessor (head size 128), two: as two blocks of one warpgroup,
// the 256 scan blocks of a half-call left 8 multiprocessors half used in their second wave, where
// no chunk block fits (docs/cuda.md, "Where the GPU sits idle"). Where two chunk blocks share one
// (mesa_cuda_d64.cu), one, so that a scan block still fits beside a chunk block.
#define SW_WGS (MAXD > 64 ? 2 : 1)
#define SW_SMEM (SW_WGS * SW_WG_SMEM + 1024)  // + 1 KB to align

#if WGMMA
// A scan block's thread and warp within its warpgroup
static __device__ __forceinline__ int wg_thread() { return threadIdx.x & (SW_NT - 1); }
static __device__ __forceinline__ int wg_warp() { return warp_id() & 3; }
// The warpgroup's own barrier (named barrier 1 + wg of SW_NT threads; 0 is __syncthreads')
static __device__ __forceinline__ void wg_sync(int wg) { asm volatile("bar.sync %0, %1;" ::"r"(1 + wg), "n"(SW_NT) : "memory"); }
// acc += A B over the warpgroup's 64 x DP tile: A (64 x 16 bf16) from registers in mma.sync's
// fragment layout (warp w: rows 16 w..), B (16 x DP bf16) from smem by descriptor, N-major (its
// rows are k, as the scan's right factor is stored). acc in the accumulator layout: element e of
// 8-column group j at row 16 w + lane / 4 + 8 (e >> 1), column 8 j + 2 (lane & 3) + (e & 1).
static __device__ __forceinline__ void wg_mma_rs(float *acc, const unsigned a[4], unsigned long long db) {
#if DP == 128
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
        "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]), "+f"(acc[6]),
          "+f"(acc[7]), "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]), "+f"(acc[12]), "+f"(acc[13]),
          "+f"(acc[14]), "+f"(acc[15]), "+f"(acc[16]), "+f"(acc[17]), "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]),
          "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]), "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]),
          "+f"(acc[28]), "+f"(acc[29]), "+f"(acc[30]), "+f"(acc[31]), "+f"(acc[32]), "+f"(acc[33]), "+f"(acc[34]),
          "+f"(acc[35]), "+f"(acc[36]), "+f"(acc[37]), "+f"(acc[38]), "+f"(acc[39]), "+f"(acc[40]), "+f"(acc[41]),
          "+f"(acc[42]), "+f"(acc[43]), "+f"(acc[44]), "+f"(acc[45]), "+f"(acc[46]), "+f"(acc[47]), "+f"(acc[48]),
          "+f"(acc[49]), "+f"(acc[50]), "+f"(acc[51]), "+f"(acc[52]), "+f"(acc[53]), "+f"(acc[54]), "+f"(acc[55]),
          "+f"(acc[56]), "+f"(acc[57]), "+f"(acc[58]), "+f"(acc[59]), "+f"(acc[60]), "+f"(acc[61]), "+f"(acc[62]),
          "+f"(acc[63])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#elif DP == 64
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
        "}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
        : "+f"(acc[0]), "+f"(acc[1]), "+f"(acc[2]), "+f"(acc[3]), "+f"(acc[4]), "+f"(acc[5]), "+f"(acc[6]),
          "+f"(acc[7]), "+f"(acc[8]), "+f"(acc[9]), "+f"(acc[10]), "+f"(acc[11]), "+f"(acc[12]), "+f"(acc[13]),
          "+f"(acc[14]), "+f"(acc[15]), "+f"(acc[16]), "+f"(acc[17]), "+f"(acc[18]), "+f"(acc[19]), "+f"(acc[20]),
          "+f"(acc[21]), "+f"(acc[22]), "+f"(acc[23]), "+f"(acc[24]), "+f"(acc[25]), "+f"(acc[26]), "+f"(acc[27]),
          "+f"(acc[28]), "+f"(acc[29]), "+f"(acc[30]), "+f"(acc[31])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
#else
#error "the wgmma scan is written for head sizes 64 and 128"
#endif
}

// Keeps the compiler from moving accesses of n registers across the asynchronous products.
static __device__ __forceinline__ void wg_pin_n(float *v, int n) {
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+f"(v[i])::"memory");
}
static __device__ __forceinline__ void wg_pin_u(unsigned *v, int n) {
#pragma unroll
    for (int i = 0; i < n; i++) asm volatile("" : "+r"(v[i])::"memory");
}

// The descriptor of the right factor as the TMA copy lays it out (scan_right_map), read N-major
// (k along its rows) with the 128-byte swizzle: each token's 64 columns of a half are one 128-byte
// row, 8 rows (k) a swizzle atom, atoms 1024 bytes apart along k (SBO), the halves CH x 128 bytes
// apart along n (LBO).
static __device__ __forceinline__ unsigned long long wg_desc_kn(const void *p) {
    return (unsigned long long)((smem_addr(p) & 0x3FFFF) >> 4) | (unsigned long long)(CH * 128 >> 4) << 16 |
           (unsigned long long)(1024 >> 4) << 32 | 1ull << 62;
}

// mbarriers, for the completion of the TMA copies: one arrival (the thread that issues the copy,
// announcing its bytes) and the copy's bytes complete a phase; the readers wait on its parity.
static __device__ __forceinline__ void mbar_init(unsigned long long *bar) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}
static __device__ __forceinline__ void mbar_wait(unsigned long long *bar, int parity) {
    asm volatile(
        "{\n.reg .pred p;\nWAIT:\nmbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n@!p bra WAIT;\n}\n" ::"r"(
            smem_addr(bar)),
        "r"(parity)
        : "memory");
}
// The right factor's chunk at token t0 of pair (b, h) into R (SW_RBYTES), completing on bar.
static __device__ __forceinline__ void tma_right(unsigned char *R, const CUtensorMap *map, int t0, int pair, int H,
                                                 unsigned long long *bar) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "n"(SW_RBYTES) : "memory");
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {0, %2, 0, %3, %4}], "
        "[%5];" ::"r"(smem_addr(R)),
        "l"(map), "r"(t0), "r"(pair % H), "r"(pair / H), "r"(smem_addr(bar))
        : "memory");
}

// Waits until this thread's bulk stores have read their smem (read) or are done (all).
static __device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }
static __device__ __forceinline__ void bulk_wait_all() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }

// The left factor's chunk into smem in the background (cp.async, zero past the sequence's end):
// its 64 columns from i0 (dl wide, es = 2: bf16, 4: float) row-major at L (stride CH + 8 bf16 or
// CH + 4 floats). es is a constant at both calls (scan_wg_stage), so that a thread's 16-byte unit
// e splits into row and column by shifts: with es read at run time, the division by a row's units
// was a sizeable share of a warp's instructions. (The general stage_raw, with a thread count as
// parameter, made the scan slower: here the loops' counts and strides are constants and rows
// always 16-byte aligned.)
static __device__ __forceinline__ void scan_wg_stage_es(unsigned char *L, const void *l, int es, int i0, int dl,
                                                        const Geo *g, int pair, int t0) {
    const int w = 16 / es, units = CH / w, ld = es == 4 ? CH + 4 : CH + 8;  // units: a row's 16-byte units
    int n = min(CH, g->T - t0);
    size_t base = tok_index(g, pair, t0);
#pragma unroll
    for (int e = wg_thread(); e < CH * units; e += SW_NT) {
        int s = e / units, c = e % units * w;
        const char *src = (const char *)l + ((base + (size_t)s * g->H) * dl + i0 + c) * es;
        cp_async16(L + (s * ld + c) * es, s < n ? (const void *)src : l, s < n ? 16 : 0);
    }
}
static __device__ __forceinline__ void scan_wg_stage(unsigned char *L, const void *l, int l32, int i0, int dl,
                                                     const Geo *g, int pair, int t0) {
    if (l32) scan_wg_stage_es(L, l, 4, i0, dl, g, pair, t0);
    else scan_wg_stage_es(L, l, 2, i0, dl, g, pair, t0);
}

// The warpgroup's state to rows row0.. of the out map (scan_out_map), each warp its 16 rows
// through its 8 KB of the staging O: DP / 32 boxes of 16 rows x 32 floats, each row's 16-byte
// units at unit ^ (row & 7) (TMA's 128-byte swizzle), so that a warp's 8-byte stores (8 rows x 4
// lanes) fill every bank twice, no more; lane 0 then hands them to one TMA store. (Stores of a row
// each, by cp.async.bulk, were 16 a warp and a chunk, issued one lane at a time, and a good part
// of the scan's stalls waited on them.)
static __device__ __forceinline__ void scan_wg_put(const CUtensorMap *map, int row0, const float *acc, unsigned char *O) {
    int w = wg_warp(), l = lane_id(), r = l >> 2, q = l & 3;
    unsigned char *Ow = O + w * (SW_OBYTES / 4);
    if (l == 0) bulk_wait_read();  // the warp's previous store has read its rows
    __syncwarp();
#pragma unroll
    for (int j = 0; j < DP / 8; j++)  // columns 8 j + 2 q, + 1: box j / 4, unit 2 (j % 4) + q / 2
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int row = r + 8 * h, unit = (2 * (j & 3) + (q >> 1)) ^ r;
            *(float2 *)(Ow + (j >> 2) * 2048 + row * 128 + unit * 16 + (q & 1) * 8) =
                make_float2(acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
        }
    fence_async_smem();
    __syncwarp();
    if (l == 0)
        asm volatile(
            "cp.async.bulk.tensor.3d.global.shared::cta.bulk_group [%0, {0, %1, 0}], [%2];\n"
            "cp.async.bulk.commit_group;" ::"l"(map),
            "r"(row0 + 16 * w), "r"(smem_addr(Ow))
            : "memory");
}

// The same straight from registers to dst (rows 0..63, stride DP), times sign: the one final
// store of a reverse scan, into a buffer of its own.
static __device__ __forceinline__ void scan_wg_put_direct(float *dst, const float *acc, float sign) {
    int r0 = 16 * wg_warp() + (lane_id() >> 2), q = lane_id() & 3;
#pragma unroll
    for (int j = 0; j < DP / 8; j++)
#pragma unroll
        for (int h = 0; h < 2; h++)
            *(float2 *)(dst + (size_t)(r0 + 8 * h) * DP + 8 * j + 2 * q) =
                make_float2(sign * acc[4 * j + 2 * h], sign * acc[4 * j + 2 * h + 1]);
}

// The thread's A fragments of k-step kk (tokens 16 kk..) of A(i, s) = w_s L[s][i], split in three
// (split_bf16x3) into t[0] (hi), t[1], t[2] (lo). wt: the weights of tokens lane and lane + 32.
static __device__ __forceinline__ void scan_wg_afrag(unsigned t[3][4], const unsigned char *L, int l32, int kk,
                                                     const float wt[2]) {
    int l = lane_id(), q = l & 3, r0 = 16 * wg_warp() + (l >> 2);
    float ws[4], v[8];  // ws: tokens 2q, 2q + 1, 2q + 8, 2q + 9 of the k-step
#pragma unroll
    for (int d = 0; d < 4; d++) ws[d] = __shfl_sync(0xffffffffu, wt[kk >> 1], (16 * kk + 2 * q + (d & 1) + 8 * (d >> 1)) & 31);
    if (l32) {
        const float *F = (const float *)L + 16 * kk * (CH + 4);
#pragma unroll
        for (int f = 0; f < 4; f++)  // fragment f: row r0 + 8 (f & 1), tokens 2q (+ 8 (f >> 1)), + 1
#pragma unroll
            for (int e = 0; e < 2; e++) v[2 * f + e] = F[(2 * q + e + 8 * (f >> 1)) * (CH + 4) + r0 + 8 * (f & 1)];
    } else {
        unsigned b[4];
        ldsm4(b, (const __half *)L + a_frag_off(CH + 8, 1) + 16 * kk * (CH + 8), 1);
#pragma unroll
        for (int f = 0; f < 4; f++) {
            v[2 * f] = __uint_as_float(b[f] << 16);
            v[2 * f + 1] = __uint_as_float(b[f] & 0xffff0000u);
        }
    }
#pragma unroll
    for (int f = 0; f < 4; f++) {
        __nv_bfloat162 p[3];
        split_bf16x3(ws[2 * (f >> 1)] * v[2 * f], ws[2 * (f >> 1) + 1] * v[2 * f + 1], p);
#pragma unroll
        for (int i = 0; i < 3; i++) t[i][f] = *(const unsigned *)&p[i];
    }
}
#endif

static __global__ void __launch_bounds__(SW_WGS * SW_NT, 3 - SW_WGS) scan_wg_kernel(Scan sc, const float *glog, const float *gbeta, Geo g,
                                                                  const __grid_constant__ CUtensorMap rmap,
                                                                  const __grid_constant__ CUtensorMap omap) {
    assume_threads(SW_WGS * SW_NT);
    grid_wait();
#if WGMMA
    extern __shared__ __align__(128) unsigned char smw[];
    int wg = threadIdx.x / SW_NT, pair = g.pair0 + blockIdx.y, z = SW_WGS * blockIdx.x + wg, s0 = sc.d[0] / CH, m = z < s0 ? 0 : 1;
    if (z >= s0 + sc.d[1] / CH) return;  // (an odd count of slices: the last block's second warpgroup)
    int i0 = CH * (m ? z - s0 : z), dl = m ? sc.d[1] : sc.d[0];
    const float *l32p = m ? sc.l32[1] : sc.l32[0], *init = m ? sc.init[1] : sc.init[0];
    const void *l = l32p ? (const void *)l32p : (const void *)(m ? sc.l16[1] : sc.l16[0]);
    int l32 = l32p != NULL;
    float *fin = m ? sc.fin[1] : sc.fin[0];
    float init_sign = m ? sc.init_sign[1] : sc.init_sign[0], fin_sign = m ? sc.fin_sign[1] : sc.fin_sign[0];
    unsigned char *O = smw + (-smem_addr(smw) & 1023) + wg * SW_WG_SMEM, *Rb = O + SW_OBYTES, *Lb = Rb + 2 * SW_RBYTES;
    float *dec = (float *)(Lb + 2 * SW_LBYTES);                      // [2][glog, beta][CH]
    unsigned long long *bar = (unsigned long long *)(dec + 4 * CH);  // [2]: the right factor's copies
    // the slice's row in the out map at slot 0; a slot is d0 + d1 rows on
    int slot_rows = sc.d[0] + sc.d[1], orow = pair * sc.nslots * slot_rows + (m ? sc.d[0] : 0) + i0;
    int lane = lane_id(), r0 = 16 * wg_warp() + (lane >> 2), q = lane & 3, t = wg_thread();
    float acc[DP / 2];
#pragma unroll
    for (int j = 0; j < DP / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            acc[4 * j + e] = init ? init_sign * init[((size_t)pair * dl + i0 + r0 + 8 * (e >> 1)) * DP + 8 * j + 2 * q + (e & 1)]
                                  : 0.0f;
    int dir = sc.reverse ? -1 : 1, c = sc.reverse ? g.nchunks - 1 : 0;
    if (t == 0) {
        mbar_init(&bar[0]);
        mbar_init(&bar[1]);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");  // (visible to the copies)
        tma_right(Rb, &rmap, c * CH, pair, g.H, &bar[0]);
    }
    scan_wg_stage(Lb, l, l32, i0, dl, &g, pair, c * CH);
    if (t < 32) fetch_decays_async(dec, dec + CH, glog, gbeta, &g, pair, c * CH);
    for (int step = 0; step < g.nchunks; step++, c += dir) {
        int n = min(CH, g.T - c * CH), buf = step & 1;
        cp_async_wait();
        wg_sync(wg);  // chunk c's left factor and decays are in place; the other buffers' readers are done
        if (step + 1 < g.nchunks) {
            int nb = buf ^ 1;
            if (t == 0) tma_right(Rb + nb * SW_RBYTES, &rmap, (c + dir) * CH, pair, g.H, &bar[nb]);
            scan_wg_stage(Lb + nb * SW_LBYTES, l, l32, i0, dl, &g, pair, (c + dir) * CH);
            if (t < 32) fetch_decays_async(dec + nb * 2 * CH, dec + nb * 2 * CH + CH, glog, gbeta, &g, pair, (c + dir) * CH);
        }
        scan_wg_put(&omap, orow + c * slot_rows, acc, O);
        // the chunk's weights and decay (chunk_weights)
        const float *d = dec + buf * 2 * CH;
        float gl[2] = {d[lane], d[lane + 32]}, bt[2] = {d[CH + lane], d[CH + lane + 32]}, wt[2];
        float decay = chunk_weights(wt, gl, bt, n, sc.reverse);
        unsigned a[CH / 16][3][4];
#pragma unroll
        for (int kk = 0; kk < CH / 16; kk++) scan_wg_afrag(a[kk], Lb + buf * SW_LBYTES, l32, kk, wt);
#pragma unroll
        for (int i = 0; i < DP / 2; i++) acc[i] *= decay;
        unsigned long long db = wg_desc_kn(Rb + buf * SW_RBYTES);
        mbar_wait(&bar[buf], (step >> 1) & 1);  // chunk c's right factor has arrived
        wg_pin_n(acc, DP / 2);  // (the fence must follow every write of the products' registers)
        wg_pin_u(&a[0][0][0], CH / 16 * 12);
        asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#pragma unroll
        for (int kk = 0; kk < CH / 16; kk++)
#pragma unroll
            for (int i = 2; i >= 0; i--)  // lo, mid, hi: the small terms first
                wg_mma_rs(acc, a[kk][i], db + (unsigned long long)(kk * 16 * 128 >> 4));
        asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;" ::: "memory");
        wg_pin_n(acc, DP / 2);  // (no read of acc moves above the wait)
    }
    if (!sc.reverse) scan_wg_put(&omap, orow + g.nchunks * slot_rows, acc, O);
    else if (fin) scan_wg_put_direct(fin + ((size_t)pair * dl + i0) * DP, acc, fin_sign);
    if (lane == 0) bulk_wait_all();  // (smem must outlive the stores' reads)
#endif
}

// The driver's tensor-map encoder (cuTensorMapEncodeTiled), looked up once through the runtime,
// so that the build needs no link to the driver library; NULL where the driver lacks it.
static PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
    void *fn = NULL;
    cudaDriverEntryPointQueryResult found;
#if CUDART_VERSION >= 12050
    cudaError_t e = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found);
#else
    cudaError_t e = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &fn, cudaEnableDefault, &found);
#endif
    if (e != cudaSuccess || found != cudaDriverEntryPointSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return (PFN_cuTensorMapEncodeTiled_v12000)fn;
}

// A tensor map (cuTensorMapEncodeTiled's arguments, strides of the dimensions above the first);
// false (with a warning, once) where the driver cannot encode it: the scan then takes scan_kernel.
static int encode_map(CUtensorMap *map, CUtensorMapDataType type, int rank, const void *p, const cuuint64_t *dim,
                      const cuuint64_t *stride, const cuuint32_t *box, CUtensorMapSwizzle swizzle) {
    static const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
    static int warned;
    const cuuint32_t step[5] = {1, 1, 1, 1, 1};
    CUresult e = encode ? encode(map, type, (cuuint32_t)rank, (void *)p, dim, stride, box, step, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                 swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE)
                        : CUDA_ERROR_NOT_FOUND;
    if (e != CUDA_SUCCESS && !warned) {
        warned = 1;
        fprintf(stderr, "cuda mesa: no tensor map for the scans (CUresult %d); they run without TMA, slower\n", (int)e);
    }
    return e == CUDA_SUCCESS;
}

// The right factor r [B, T, H, DP] bf16 as scan_wg_kernel's TMA copies see it: five dimensions
// (column within a half of 64, token, half, head, sequence), so that one box of {64, CH, DP / 64,
// 1, 1} lands a chunk as the halves' 128-byte token rows, swizzled (see wg_desc_kn), tokens past T
// read as zeros. (A box of 16-byte pieces in the unswizzled core-matrix layout had the L2 serve a
// 32-byte sector for each.)
static int scan_right_map(CUtensorMap *map, const bf16 *r, const Geo *g) {
    const cuuint64_t row = (cuuint64_t)DP * 2;  // bytes
    cuuint64_t dim[5] = {64, (cuuint64_t)g->T, DP / 64, (cuuint64_t)g->H, (cuuint64_t)g->B};
    cuuint64_t stride[4] = {g->H * row, 128, row, (cuuint64_t)g->T * g->H * row};
    cuuint32_t box[5] = {64, CH, DP / 64, 1, 1};
    return encode_map(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 5, r, dim, stride, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

// The scan's output [pair][slot][d0 + d1][DP] fp32 as its TMA stores see it: rows of DP floats
// in groups of 32 (128 bytes, the swizzle's span), so that a box of {32, 16, DP / 32} is a warp's
// 16 rows (scan_wg_put).
static int scan_out_map(CUtensorMap *map, const Scan *s, const Geo *g) {
    cuuint64_t rows = (cuuint64_t)g->B * g->H * s->nslots * (s->d[0] + s->d[1]);
    cuuint64_t dim[3] = {32, rows, DP / 32}, stride[2] = {(cuuint64_t)DP * 4, 128};
    cuuint32_t box[3] = {32, 16, DP / 32};
    return encode_map(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3, s->out, dim, stride, box, CU_TENSOR_MAP_SWIZZLE_128B);
}

// Whether scan_wg_kernel takes a scan: a Hopper device (the sm_90a build), the state DP columns
// wide, both matrices in whole slices, 16-byte rows everywhere.
static int scan_wg_ok(const CudaCtx *c, const Scan *s, const Geo *g) {
    int ok = c->cc_major == 9 && g->Dk == DP && s->d[0] % CH == 0 && s->d[1] % CH == 0 && s->vec &&
             (uintptr_t)s->out % 16 == 0;
    // the TMA stores' row coordinate in the out map (scan_out_map) is a 32-bit int
    ok &= (size_t)g->B * g->H * s->nslots * (s->d[0] + s->d[1]) <= (size_t)INT_MAX;
    for (int m = 0; m < 2; m++) ok &= !s->fin[m] || (uintptr_t)s->fin[m] % 16 == 0;
    return ok;
}

