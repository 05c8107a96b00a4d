/*
 * mesa_cuda.cu's decode kernel: one token for every (sequence, head), the recurrent form with the
 * states updated in place.
 *
 * A section of mesa_cuda.cu's translation unit, not a header of its own: it uses the macros, Geo
 * and the pieces mesa_cuda.cu defines and includes before it (and is built twice with them: see
 * mesa_cuda.cu).
 */

#define DEC_ROWS 8  // rows of G each decode warp loads at once

// n floats rounded up to whole 16-byte units, so that what follows in smem stays aligned
static __host__ __device__ __forceinline__ size_t decode_pad4(size_t n) { return (n + 3) & ~(size_t)3; }

// Both sums over the block at once; red: 64 floats of smem. With fence, a barrier first lets the
// previous readers of red finish; without, the caller ensures a barrier has passed since they read.
static __device__ __forceinline__ void block_sum2(float *a, float *b, float *red, int fence) {
    float x = warp_sum(*a), y = warp_sum(*b);
    if (fence) __syncthreads();
    if (lane_id() == 0) {
        red[warp_id()] = x;
        red[32 + warp_id()] = y;
    }
    __syncthreads();
    int nw = blockDim.x >> 5;
    x = lane_id() < nw ? red[lane_id()] : 0.0f;
    y = lane_id() < nw ? red[32 + lane_id()] : 0.0f;
    *a = warp_sum(x);
    *b = warp_sum(y);
}

// CG's operator on p (in ps, 16-byte aligned, written before the call): returns (H' p)_i to the
// owners (tid < Dk) and sets *pap = p.(H' + diag(lambda)) p for every thread (lam: the thread's
// lambda_i, 0 for non-owners). H' is symmetric, so thread i reads column i (consecutive threads,
// consecutive banks); the parts = nt / 128 groups of 128 threads each take a contiguous range of
// k, whose p they read 4 at a time. The dot is summed from the groups' parts directly, so the
// parts (in `part`, [parts][128]) and the dot (in red, 32 floats) meet behind one barrier.
static __device__ __forceinline__ float decode_apply(const float *Hs, const float *ps, float *part, float *red, int dk,
                                                     int nt, float lam, float *pap) {
    const int parts = nt / 128;
    int i = threadIdx.x & 127, grp = threadIdx.x >> 7;
    float dot = 0;
    __syncthreads();  // ps is written; the previous readers of part and red are done
    if (i < dk) {
        int per = ((dk + parts - 1) / parts + 3) & ~3, k = grp * per, k1 = min(k + per, dk);
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma unroll 4
        for (; k + 4 <= k1; k += 4) {
            float4 p4 = *(const float4 *)(ps + k);
            const float *h = Hs + k * dk + i;
            s0 += h[0] * p4.x;
            s1 += h[dk] * p4.y;
            s2 += h[2 * dk] * p4.z;
            s3 += h[3 * dk] * p4.w;
        }
        for (; k < k1; k++) s0 += Hs[k * dk + i] * ps[k];
        float sum = (s0 + s1) + (s2 + s3), pi = ps[i];
        part[grp * 128 + i] = sum;
        dot = pi * (sum + lam * pi);
    }
    dot = warp_sum(dot);
    if (lane_id() == 0) red[warp_id()] = dot;
    __syncthreads();
    float y = 0;
    if (threadIdx.x < dk)
#pragma unroll
        for (int q = 0; q < parts; q++) y += part[q * 128 + threadIdx.x];
    *pap = warp_sum(lane_id() < nt / 32 ? red[lane_id()] : 0.0f);
    return y;
}

// One token for every (sequence, head), a block each (nt threads): the
// recurrent form (spec section 1) without the chunk machinery, which would pad
// the one row to 64. H' = gamma H + beta k k^T is built in smem (and written to
// hT), CG solves (H' + diag(lambda)) x = q with thread i < Dk owning x_i, then
// G' = gamma G + beta v k^T (written to gT) gives o = G' x. H is copied into
// smem by cp.async as the block starts; with stage_g G too, so that its load
// runs under the CG (else G streams from global after it). Two widths (the
// wrappers below): few blocks (small batches) run 512 threads each with G
// staged, shortening every phase; many run 256 at three blocks per
// multiprocessor, where G's 64 KB in smem would not fit.
// In place (hT = h0, gT = g0) is safe: H (and a staged G) is read whole
// before any of it is written, and a streamed G's elements are each read and
// written by the same thread.
static __device__ __forceinline__ void decode_body(bf16 *o, bf16 *x_out, int *steps_out, const bf16 *q, const bf16 *k,
                                            const bf16 *v, const float *glog, const float *gbeta, const float *lambda,
                                            const float *h0, const float *g0, float *hT, float *gT, const bf16 *x0,
                                            Geo g, int nt, int stage_g) {
    assume_threads(nt);  // (nt a constant at both kernels)
    extern __shared__ float sm[];
    int pair = blockIdx.x, dk = g.Dk, dv = g.Dv, tid = threadIdx.x, own = tid < dk;
    size_t hh = (size_t)dk * dk, gg = (size_t)dv * dk;
    float *Hs = sm, *Gs = Hs + decode_pad4(hh), *ps = Gs + (stage_g ? decode_pad4(gg) : 0), *ks = ps + decode_pad4(dk);
    float *vs = ks + dk, *part = vs + dv, *red = part + 4 * 128, *red_op = red + 64;
    size_t ti = pair;  // T = 1: token index = b H + h = pair
    const float *hin = h0 ? h0 + pair * hh : NULL, *gin = g0 ? g0 + pair * gg : NULL;
    float *hout = hT ? hT + pair * hh : NULL, *gout = gT ? gT + pair * gg : NULL;
    if (hin) copy_async_f32(Hs, hin, (int)hh, nt);
    cp_async_commit();
    if (stage_g && gin) copy_async_f32(Gs, gin, (int)gg, nt);
    cp_async_commit();
    float gamma = __expf(glog[ti]), beta = gbeta[ti];
    float qi = own ? ld(q, ti * dk + tid) : 0.0f, lam = own ? lambda[lam_index(&g, pair) + tid] : 0.0f;
    for (int j = tid; j < dk; j += nt) ks[j] = ld(k, ti * dk + j);
    for (int i = tid; i < dv; i += nt) vs[i] = beta * ld(v, ti * dv + i);
    cp_async_wait1();  // H has arrived (G may still be on its way)
    __syncthreads();
    // element e = (r, c) of H, its row and column stepped along (no division per element)
    for (int e = tid, r = tid / dk, c = tid % dk; e < dk * dk; e += nt) {
        float val = (hin ? gamma * Hs[e] : 0.0f) + beta * ks[r] * ks[c];
        Hs[e] = val;
        if (hout) hout[e] = val;
        r += nt / dk;
        c += nt % dk;
        if (c >= dk) c -= dk, r++;
    }
    __syncthreads();
    // CG (the same rules as cg_solve: relative tolerance with its floor, exact-convergence stop)
    float diag = own ? Hs[tid * dk + tid] + lam : 1.0f, x = 0, r = qi;
    if (g.init == MN_CG_INIT_GIVEN && x0) x = own ? ld(x0, ti * dk + tid) : 0.0f;
    else if (g.init == MN_CG_INIT_JACOBI) x = qi / diag;
    if ((x0 && g.init == MN_CG_INIT_GIVEN) || g.init == MN_CG_INIT_JACOBI) {
        float unused;
        if (own) ps[tid] = x;
        r = qi - decode_apply(Hs, ps, part, red_op, dk, nt, lam, &unused) - lam * x;
    }
    float z = g.precond ? r / diag : r, qq = qi * qi, rr = r * r, rz = r * z, p = z;
    block_sum2(&qq, &rr, red, 1);
    float none = 0;
    block_sum2(&rz, &none, red, 1);
    float thresh = g.tol2 * qq;
    int steps = 0;
    int active = rr > thresh;
    if (own) ps[tid] = p;  // (the sums' barriers ordered the readers of ps before)
    // three barriers a step: the operator's two, then the residual's sums, whose buffer (red) the
    // operator's (red_op) alternates with, so that neither needs one of its own first
    for (int step = 1; active && step <= g.max_steps; step++) {
        float pap, ap = decode_apply(Hs, ps, part, red_op, dk, nt, lam, &pap) + lam * p;
        if (!(pap > 0) || !(rz > 0)) break;  // converged exactly, or non-finite input
        float alpha = rz / pap;
        x += alpha * p;
        r -= alpha * ap;
        steps = step;
        z = g.precond ? r / diag : r;
        float rr2 = r * r, rzn = r * z;
        block_sum2(&rr2, &rzn, red, 0);
        if (!(rr2 > thresh)) break;
        p = z + (rzn / rz) * p;
        rz = rzn;
        if (own) ps[tid] = p;  // every read of ps in this step came before the sums' barrier
    }
    if (own) st(x_out, ti * dk + tid, x);
    if (steps_out && tid == 0) steps_out[ti] = steps;
    cp_async_wait0();  // a staged G has arrived
    __syncthreads();
    if (own) ps[tid] = x;
    __syncthreads();
    // o = G' x, G' = gamma G + beta v k^T: a warp per row of G, lanes along its
    // columns (Dk <= 128: four per lane), DEC_ROWS rows' loads in flight at once
    const float *gsrc = stage_g ? Gs : gin;
    for (int i0 = warp_id(); i0 < dv; i0 += DEC_ROWS * (nt / 32)) {
        float gv[DEC_ROWS][MAXD / 32];
#pragma unroll
        for (int u = 0; u < DEC_ROWS; u++)
#pragma unroll
            for (int c = 0; c < MAXD / 32; c++) {
                int i = i0 + u * (nt / 32), j = lane_id() + 32 * c;
                gv[u][c] = gin && i < dv && j < dk ? gsrc[(size_t)i * dk + j] : 0.0f;
            }
#pragma unroll
        for (int u = 0; u < DEC_ROWS; u++) {
            int i = i0 + u * (nt / 32);
            if (i >= dv) break;  // the same for the whole warp
            float acc = 0;
#pragma unroll
            for (int c = 0; c < MAXD / 32; c++) {
                int j = lane_id() + 32 * c;
                if (j >= dk) break;
                float val = gamma * gv[u][c] + vs[i] * ks[j];
                if (gout) gout[(size_t)i * dk + j] = val;
                acc += val * ps[j];
            }
            acc = warp_sum(acc);
            if (lane_id() == 0) st(o, ti * dv + i, acc);
        }
    }
}

#define DECODE_ARGS                                                                                                  \
    bf16 *o, bf16 *x_out, int *steps_out, const bf16 *q, const bf16 *k, const bf16 *v, const float *glog,           \
        const float *gbeta, const float *lambda, const float *h0, const float *g0, float *hT, float *gT, const bf16 *x0, \
        Geo g
static __global__ void __launch_bounds__(256, 3) decode_kernel_narrow(DECODE_ARGS) {
    decode_body(o, x_out, steps_out, q, k, v, glog, gbeta, lambda, h0, g0, hT, gT, x0, g, 256, 0);
}
static __global__ void __launch_bounds__(512) decode_kernel_wide(DECODE_ARGS) {
    decode_body(o, x_out, steps_out, q, k, v, glog, gbeta, lambda, h0, g0, hT, gT, x0, g, 512, 1);
}

static size_t decode_smem(const Geo *g, int stage_g) {
    size_t hh = (size_t)g->Dk * g->Dk, gg = (size_t)g->Dv * g->Dk;
    return sizeof(float) * (decode_pad4(hh) + (stage_g ? decode_pad4(gg) : 0) + decode_pad4(g->Dk) + g->Dk + g->Dv +
                            4 * 128 + 64 + 32);
}

