/*
 * mesa_cuda.cu's chunk loading: a chunk's operands from global memory into registers or shared
 * memory (fp16 hi + lo at block scales, or raw by cp.async), L2 prefetches, the chunk's decays.
 *
 * A section of mesa_cuda.cu's translation unit, not a header of its own: it uses the macros, Geo
 * and the pieces mesa_cuda.cu defines and includes before it (and is built twice with them: see
 * mesa_cuda.cu).
 */

// ------------------------------------------------------------------ chunk loading

// One operand of a block in global memory: rows x cols values of a bf16 or
// float tensor, row r at p + r rstride elements, read as an rpad x cpad block
// (zero outside) in 16-byte vectors: 8 bf16 or 4 floats.
typedef struct {
    const void *p;
    size_t rstride;
    int rows, cols, rpad, cpad;
    int f32;  // float elements, else bf16
    int vec;  // every row starts 16-byte aligned: one load per vector, else element by element
} Src;

// Rows t0 .. t0+C of one (sequence, head) of a [B,T,H,d] tensor, padded to dpad columns.
static __device__ __forceinline__ Src tok_src(const void *p, int f32, int d, int dpad, const Geo *g, int pair, int t0, int vec) {
    size_t o = tok_index(g, pair, t0) * d;
    Src s = {f32 ? (const void *)((const float *)p + o) : (const void *)((const bf16 *)p + o), (size_t)g->H * d,
             min(CH, g->T - t0), d, CH, dpad, f32, vec};
    return s;
}

// A rows x cols float matrix (row stride cols), padded to rpad x cpad.
static __device__ __forceinline__ Src mat_src(const float *p, int rows, int cols, int rpad, int cpad, int vec) {
    Src s = {p, (size_t)cols, rows, cols, rpad, cpad, 1, vec};
    return s;
}

typedef union {
    uint4 u;
    float f[4];
    unsigned short h[8];  // bf16 bits
} Vec16;

static __device__ __forceinline__ float vec_at(const Vec16 *v, int i, int f32) {
    return f32 ? v->f[i] : __uint_as_float((unsigned)v->h[i] << 16);
}

// Asks the L2 for the n bytes at p, a 128-byte line a thread, so that a later phase's loads of
// them hit the L2 instead of waiting on DRAM with nothing else to run (one block fills a
// multiprocessor in the chunk kernels).
static __device__ __forceinline__ void l2_prefetch(const void *p, size_t n) {
    for (size_t o = (size_t)threadIdx.x * 128; o < n; o += (size_t)NT * 128)
        prefetch_l2((const char *)p + o);
}
// The same for the rows of tokens t0.. of a token-major tensor [B, T, H, d] (es bytes an element).
static __device__ __forceinline__ void l2_prefetch_rows(const void *p, int es, int d, const Geo *g, int pair, int t0) {
    int n = min(CH, g->T - t0), lines = (d * es + 127) / 128;
    for (int e = threadIdx.x; e < n * lines; e += NT)
        prefetch_l2((const char *)p + tok_index(g, pair, t0 + e / lines) * d * es + e % lines * 128);
}

// The thread's vectors u = 0 .. nv-1 of the block (vector threadIdx.x + u NT,
// row-major over the padded block) into registers. nv is a constant at every
// call, so that v stays in registers; every load is issued before any is used.
static __device__ __forceinline__ void stage_fetch(Vec16 *v, int nv, const Src *s) {
    int w = s->f32 ? 4 : 8, vpr = s->cpad / w;
#pragma unroll
    for (int u = 0; u < nv; u++) {
        int e = threadIdx.x + u * NT, r = e / vpr, c = e % vpr * w;
        v[u].u = make_uint4(0, 0, 0, 0);
        if (r >= s->rows || c >= s->cols) continue;
        size_t i = r * s->rstride + c;
        if (s->vec) {
            v[u].u = s->f32 ? *(const uint4 *)((const float *)s->p + i) : *(const uint4 *)((const bf16 *)s->p + i);
        } else if (s->f32) {
#pragma unroll
            for (int k = 0; k < 4; k++)
                if (c + k < s->cols) v[u].f[k] = ((const float *)s->p)[i + k];
        } else {
#pragma unroll
            for (int k = 0; k < 8; k++)
                if (c + k < s->cols) v[u].h[k] = ((const unsigned short *)s->p)[i + k];
        }
    }
}

// The largest magnitude among the thread's staged values.
static __device__ __forceinline__ float stage_absmax(const Vec16 *v, int nv, int f32) {
    float m = 0;
#pragma unroll
    for (int u = 0; u < nv; u++)
#pragma unroll
        for (int k = 0; k < 8; k++)
            if (k < (f32 ? 4 : 8)) m = fmaxf(m, fabsf(vec_at(&v[u], k, f32)));
    return m;
}

// One vector (4 floats or 8 bf16 values, from column c of row r) times `scale` into fp16 smem,
// row-major (M[r ld + c]; or LD_CORE), split hi + lo when lo is given.
static __device__ __forceinline__ void vec_put16(const Vec16 *v, int f32, int r, int c, __half *hi, __half *lo, int ld,
                                                 float scale) {
    __half2 h[4], l[4];
#pragma unroll
    for (int k = 0; k < 4; k++) {
        if (f32 && k >= 2) break;
        float a = vec_at(v, 2 * k, f32) * scale, b = vec_at(v, 2 * k + 1, f32) * scale;
        if (lo) split_half2(a, b, &h[k], &l[k]);
        else h[k] = __floats2half2_rn(a, b);
    }
    __half *dh = hi + mat_off(r, c, ld), *dl = lo ? lo + mat_off(r, c, ld) : NULL;
    if (!f32) {
        *(uint4 *)dh = *(const uint4 *)h;
        if (lo) *(uint4 *)dl = *(const uint4 *)l;
    } else {
        *(uint2 *)dh = *(const uint2 *)h;
        if (lo) *(uint2 *)dl = *(const uint2 *)l;
    }
}

// The staged values times `scale` into fp16 smem (vec_put16).
static __device__ __forceinline__ void stage_put16(const Vec16 *v, int nv, const Src *s, __half *hi, __half *lo, int ld,
                                            float scale) {
    int w = s->f32 ? 4 : 8, vpr = s->cpad / w;
#pragma unroll
    for (int u = 0; u < nv; u++) {
        int e = threadIdx.x + u * NT, r = e / vpr, c = e % vpr * w;
        if (r >= s->rpad) continue;
        vec_put16(&v[u], s->f32, r, c, hi, lo, ld, scale);
    }
}

// A batch of a block's operands into fp16 smem with every load in flight at
// once: n (at most 4) blocks of bf16 token rows, each exact at its own scale,
// and one fp32 block (nf vectors per thread, at most 8) split hi + lo. One
// reduction gives all the scales: sc[0..n-1] the rows', sc[n] the fp32
// block's. No barrier after the stores. Behind the batch's loads, the L2 is
// asked for the pf_bytes at pf (the next phase's operands; none if 0): ahead
// of them, such requests delayed the batch (measured).
static __device__ __forceinline__ void stage_batch16(float *sc, const Src *rows, __half *const *dst, const int *ld, int n,
                                              const Src *f, __half *fh, __half *fl, int fld, int nf, float *red,
                                              const void *pf, size_t pf_bytes) {
    Vec16 rv[4][CH * MAXD / 8 / NT], fv[MAXD * MAXD / 4 / NT];
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < n) stage_fetch(rv[i], CH * MAXD / 8 / NT, &rows[i]);
    stage_fetch(fv, nf, f);
    l2_prefetch(pf, pf_bytes);
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < n) sc[i] = stage_absmax(rv[i], CH * MAXD / 8 / NT, 0);
    sc[n] = stage_absmax(fv, nf, 1);
    block_max_n(sc, n + 1, red);
    for (int i = 0; i <= n; i++) sc[i] = fp16_scale(sc[i]);
#pragma unroll
    for (int i = 0; i < 4; i++)
        if (i < n) stage_put16(rv[i], CH * MAXD / 8 / NT, &rows[i], dst[i], NULL, ld[i], sc[i]);
    stage_put16(fv, nf, f, fh, fl, fld, sc[n]);
}

// 16-byte copies from global to smem in the background are mma.cuh's cp_async16 (`bytes` 16 or 0
// read, the rest zero-filled), grouped by its cp_async_commit and waited for by its cp_async_wait0 /
// cp_async_wait1 (at most 0 or 1 of the thread's committed groups still in flight).
// The same for 4 bytes (`bytes` 4 or 0), through L1 (.ca: 4-byte copies cannot bypass it).
static __device__ __forceinline__ void cp_async4(void *dst, const void *src, int bytes) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(bytes) : "memory");
}
// Completes all of the thread's copies, committed or not (cp.async.wait_all, which mma.cuh does not
// wrap: it is a commit and a wait for none in flight); a barrier after it publishes them to the block.
static __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// n floats from global to smem (16-byte aligned) in the background, the block's nt threads
// striding: 16-byte copies when src and n allow, else 4-byte ones.
static __device__ void copy_async_f32(float *dst, const float *src, int n, int nt) {
    if ((uintptr_t)src % 16 == 0 && n % 4 == 0)
        for (int e = 4 * threadIdx.x; e < n; e += 4 * nt) cp_async16(dst + e, src + e, 16);
    else
        for (int e = threadIdx.x; e < n; e += nt) cp_async4(dst + e, src + e, 4);
}

// The block of s (rpad x cpad, zero outside rows x cols) into smem as it is,
// bf16 or float, row-major with stride ld elements: 16-byte copies in the
// background, or element by element (at once) when rows are not 16-byte aligned.
static __device__ void stage_raw(void *dst, int ld, const Src *s) {
    int es = s->f32 ? 4 : 2, w = 16 / es, vpr = s->cpad / w;
    for (int e = threadIdx.x; e < s->rpad * vpr; e += NT) {
        int r = e / vpr, c = e % vpr * w, in = r < s->rows && c < s->cols;
        char *d = (char *)dst + ((size_t)r * ld + c) * es;
        const char *p = (const char *)s->p + ((size_t)r * s->rstride + c) * es;
        if (s->vec) {
            cp_async16(d, in ? p : s->p, in ? 16 : 0);
        } else if (s->f32) {
            for (int k = 0; k < w; k++) ((float *)d)[k] = in && c + k < s->cols ? ((const float *)p)[k] : 0.0f;
        } else {
            for (int k = 0; k < w; k++)
                ((unsigned short *)d)[k] = in && c + k < s->cols ? ((const unsigned short *)p)[k] : 0;
        }
    }
}

// One warp (warp 0 of the block, or of a scan block's warpgroup): a chunk's log decays and betas
// of tokens lane and lane + 32 (0 past the end) into smem in the background (cp.async;
// cp_async_wait completes it): glog[t], beta[t].
// (Fetched into registers a chunk ahead, the scan kept them across the chunk's products and ptxas
// spilled them: warp 0 then waited for the loads before every chunk's barrier, and the block with it.)
static __device__ __forceinline__ void fetch_decays_async(float *glog, float *beta, const float *g_log, const float *g_beta,
                                                   const Geo *g, int pair, int t0) {
    int n = min(CH, g->T - t0);
    size_t base = tok_index(g, pair, t0);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        int t = lane_id() + 32 * h, in = t < n;
        size_t i = in ? base + (size_t)t * g->H : 0;
        cp_async4(glog + t, g_log + i, in ? 4 : 0);
        cp_async4(beta + t, g_beta + i, in ? 4 : 0);
    }
}

// A warp: b = the inclusive cumulative sum over the chunk of the fetched log
// decays, for tokens lane and lane + 32 (a warp scan; rows past the end repeat the last).
static __device__ __forceinline__ void chunk_cumsum(float b[2], const float glog[2]) {
    float run = 0;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float v = glog[h];
        for (int o = 1; o < 32; o <<= 1) {
            float u = __shfl_up_sync(0xffffffffu, v, o);
            if (lane_id() >= o) v += u;
        }
        b[h] = run + v;
        run += __shfl_sync(0xffffffffu, v, 31);
    }
}

// A chunk kernel's small first loads, in two steps: chunk_fetch requests them (cp.async, one
// committed group) before the chunk's large operands, behind which their latency held up the
// chunk's constants that wait on them (measured); chunk_put waits for that group alone and
// cumulates b. Warp 0: the raw log decays into b, and beta; threads below DP, where lam is given:
// lambda (1 past Dk). (cg_backward loads lambda after its operands: with it here, ptxas spilled
// there and the kernel was no faster.)
static __device__ __forceinline__ void chunk_fetch(float *b, float *beta, float *lam, const float *g_log, const float *g_beta,
                                                   const float *lambda, const Geo *g, int pair, int t0) {
    if (threadIdx.x < 32) fetch_decays_async(b, beta, g_log, g_beta, g, pair, t0);
    int i = threadIdx.x;
    if (lam && i < DP) {
        if (i < g->Dk) cp_async4(lam + i, lambda + lam_index(g, pair) + i, 4);
        else lam[i] = 1.0f;
    }
    cp_async_commit();
}

// Once the group of chunk_fetch has landed: b, the cumulative log decay (rows past the end repeat
// the last). Callers synchronise before reading b, beta and lambda.
static __device__ __forceinline__ void chunk_put(float *b) {
    cp_async_wait0();  // (the copies issued since are not committed yet: not waited for)
    if (threadIdx.x < 32) {
        float gl[2] = {b[threadIdx.x], b[threadIdx.x + 32]}, c[2];
        chunk_cumsum(c, gl);
        __syncwarp();
        b[threadIdx.x] = c[0];
        b[threadIdx.x + 32] = c[1];
    }
}

// The thread's tiles against rows t0 .. t0+C of a [B,T,H,d] tensor (zero past T
// and d): a thread's two adjacent columns are one 4-byte (bf16) or 8-byte (float)
// access where d is even and the tensor so aligned, else two.
static __device__ __forceinline__ int pairs_ok(const void *p, int d, int size) {
    return d % 2 == 0 && (uintptr_t)p % (2 * size) == 0;
}

static __device__ void tile_load(Tile *t, const bf16 *src, const Geo *g, int pair, int t0, int d, int nc) {
    int two = pairs_ok(src, d, 2);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int i = 0; i < FR; i++) {
            int tt = t0 + f_row(i), c = f_col(j, 2 * i, nc);
            float2 v = make_float2(0.0f, 0.0f);
            if (j < nc && tt < g->T && c < d) {
                const bf16 *p = src + tok_index(g, pair, tt) * d + c;
                if (two) v = __bfloat1622float2(*(const __nv_bfloat162 *)p);
                else v = make_float2(ld(p, 0), c + 1 < d ? ld(p, 1) : 0.0f);
            }
            t->v[j][2 * i] = v.x;
            t->v[j][2 * i + 1] = v.y;
        }
}

// Stores the thread's tile to rows t0 .. of a [B,T,H,d] tensor of bf16 or (f32) float.
static __device__ void tile_store(void *dst, int f32, const Tile *t, const Geo *g, int pair, int t0, int d, int nc) {
    int two = pairs_ok(dst, d, f32 ? 4 : 2);
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int i = 0; i < FR; i++) {
            int tt = t0 + f_row(i), c = f_col(j, 2 * i, nc);
            if (j >= nc || tt >= g->T || c >= d) continue;
            size_t o = tok_index(g, pair, tt) * d + c;
            float a = t->v[j][2 * i], b = t->v[j][2 * i + 1];
            if (f32 && two) {
                *(float2 *)((float *)dst + o) = make_float2(a, b);
            } else if (two) {
                *(__nv_bfloat162 *)((bf16 *)dst + o) = __floats2bfloat162_rn(a, b);
            } else if (f32) {
                ((float *)dst)[o] = a;
                if (c + 1 < d) ((float *)dst)[o + 1] = b;
            } else {
                st((bf16 *)dst, o, a);
                if (c + 1 < d) st((bf16 *)dst, o + 1, b);
            }
        }
}

// The thread's tile of a [CH][ld] bf16 block in smem (nc n-tiles).
static __device__ __forceinline__ void tile_from_bf16(Tile *t, const bf16 *m, int ld, int nc) {
#pragma unroll
    for (int j = 0; j < MAXNT; j++)
#pragma unroll
        for (int i = 0; i < FR; i++) {
            float2 v = j < nc ? __bfloat1622float2(*(const __nv_bfloat162 *)(m + f_row(i) * ld + f_col(j, 2 * i, nc)))
                              : make_float2(0.0f, 0.0f);
            t->v[j][2 * i] = v.x;
            t->v[j][2 * i + 1] = v.y;
        }
}

