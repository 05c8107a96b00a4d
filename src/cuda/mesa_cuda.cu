/*
 * The Mesa core on the GPU: the chunkwise algorithm of src/cpu/mesa_chunk.c
 * (spec sections 3-4) as fused CUDA kernels. Inputs arrive in bf16; states H,
 * G, all CG arithmetic and every product stay at float32 accuracy.
 *
 * Products run on the tensor cores with fp32 accumulation. The chunk
 * kernels' products (CG's operator, the output, the backward's right-hand side
 * and gradients) run in fp16 (mma.sync m16n8k16, ldmatrix) on operands scaled
 * by powers of two, split hi + lo where they are fp32 (see tile_mma16). The
 * scans run in bf16 (the same instruction): the right factor is a bf16 input,
 * the weighted left one is split into three bf16 terms (24 bits, fp32's range:
 * no scaling). cuBLAS cannot do these products: they are 64-row blocks inside
 * one kernel, interleaved with CG's per-row scalars.
 *
 * This file is compiled twice: for head sizes up to 128, and (mesa_cuda_d64.cu,
 * MAXD 64, NCG 2) for heads up to 64 with 8-warp blocks, two chunk blocks per
 * multiprocessor; everything here is static but the entry points, whose names
 * MESA_NAME suffixes in the second build.
 *
 * One thread block (16 warps) per (chunk, sequence, head) solves the chunk's
 * C = 64 systems at once. A 64 x N tile lives in registers in the mma
 * accumulator layout: warp w owns rows 16 (w & 3) .. + 15 and the column group
 * w >> 2 of NCG = 4 (see f_row, f_col). Four groups, not two, leave half the
 * registers per thread and twice the warps to hide latency (eight groups
 * spill). Operands of products sit in shared memory with strides chosen so
 * fragment loads hit distinct banks.
 *
 * The chunk-to-chunk recurrences (chunk-entry states forward, the adjoints in
 * reverse) are one sliced scan kernel: a block per (64-row slice of a state,
 * sequence, head) keeps its slice in registers across the chunks.
 *
 * Kernels, forward: scan (states) -> cg_forward. Backward: scan (states) ->
 * cg_backward (the second solve, per-token terms) -> scan (adjoints) -> grads
 * (per chunk) -> dg_scan (reverse cumulative sum of dL/db). Decoding (T = 1):
 * decode_kernel alone, the recurrent form with a block per (sequence, head).
 *
 * The kernels live in the sections included below (mesa_tiles.cuh ..
 * mesa_decode.cuh), which are parts of this translation unit, built with its
 * macros; the host side follows them. docs/cuda.md describes the kernels,
 * their costs and what was tried.
 */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cuda.h>  // CUtensorMap (the scans' TMA copies; the driver's encoder is looked up at run time)
#include <cuda_fp16.h>
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <pthread.h>

#include "cuda_common.cuh"
#include "mma.cuh"  // the PTX wrappers: shared-memory addresses, ldmatrix, cp.async, L2 prefetches

extern "C" {
#include "core/seq_args.h"
}

#define CH 64                 // chunk size on the GPU
#ifndef NCG
#define NCG 4                 // column groups of a 64-row tile: warp w owns rows 16 (w & 3).., columns group w >> 2
#endif
#define NT (128 * NCG)        // threads per block: 4 row blocks x NCG column groups of warps
#ifndef MAXD
#define MAXD 128              // largest head size the fused kernels take (mesa_cuda_d64.cu: 64)
#endif
#ifndef MESA_NAME
#define MESA_NAME(f) f        // the entry points' names (mesa_cuda_d64.cu suffixes its build's)
#endif
// Chunk-kernel blocks per multiprocessor: one at head size 128 (16 warps, 128 registers a thread,
// ~210 KB of smem); two at MAXD 64 (mesa_cuda_d64.cu: 8 warps, 128 registers, ~108 KB).
#define CHUNK_BLOCKS (MAXD <= 64 ? 2 : 1)
#define MAXNT (MAXD / (8 * NCG))  // n-tiles (8 columns) per warp, at most
#define NTILES(n) ((n) / (8 * NCG))  // n-tiles per warp of a tile n columns wide
#define FR 2                  // rows per thread in a tile: groupID and groupID + 8
#define MFN (4 * NTILES(CH))    // elements of a 64 x 64 tile per thread (the precomputed mask)
#define LDT (CH + 8)          // stride of k-major blocks: 8 mod 32, so fragment loads are conflict-free
#define RESIDUAL_FLOOR (4.0f / 16777216.0f)  // as on the CPU (src/cpu/cg.c)

// The chunk kernels' head size: heads (Dk and Dv) are padded with zeros to the build's largest, so
// that every tile's width, stride and loop count is a compile-time constant. (With the padded size
// read from the problem, ptxas kept a bounds test and a branch before every product's n-tiles, in
// the innermost loops.)
#define DP MAXD

// Hopper's warpgroup products (wgmma) for the CG operator's state term, in the sm_90a build: a
// warpgroup's 64 x 32 product reads each operand once from shared memory, where mma.sync has every
// warp load its own fragments (the CG loop is bound by that traffic). Other builds use mma.sync.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define WGMMA 1
#else
#define WGMMA 0
#endif

// wgmma's core-matrix layout without swizzling, of a matrix DP columns wide: 8 x 8 blocks of
// 16-bit values, each 128 contiguous bytes (its row r at byte 16 r), the blocks of a row of blocks
// side by side along the columns, the rows of blocks DP / 8 blocks apart. Passing LD_CORE where a
// row stride is expected selects it.
#define LD_CORE (-1)
static __device__ __forceinline__ int mat_off(int r, int c, int ld) {
    return ld == LD_CORE ? (((r >> 3) * (DP / 8) + (c >> 3)) << 6) + ((r & 7) << 3) + (c & 7) : r * ld + c;
}
// The layout of the CG operator's direction P and state H.
#define LD_OP (WGMMA ? LD_CORE : ldrow(DP))
// Stride of a row-major operand with n columns (n a multiple of 16): 8 or 24 mod 32, conflict-free.
static __host__ __device__ __forceinline__ int ldrow(int n) { return n + 8; }

// Sizes of one problem, passed to every kernel.
typedef struct {
    int B, T, H, Dk, Dv, nchunks;
    int max_steps, precond, init;
    float tol2;  // squared stopping tolerance (at least the rounding floor)
    int pair0;   // the launch's first (b, h) pair: the grid's pair index counts on from it (Part)
    int lam_seqs;  // sequences sharing a ridge row (MnMesaFwd.lambda_seqs; 0: all)
} Geo;

// Where a pair's ridge begins in lambda and dlambda (include/mesanet.h's mn_mesa_lambda_at).
static __device__ __forceinline__ size_t lam_index(const Geo *g, int pair) {
    int b = pair / g->H, h = pair % g->H;
    return ((size_t)(g->lam_seqs > 0 ? b / g->lam_seqs : 0) * g->H + h) * g->Dk;
}

static __device__ __forceinline__ size_t tok_index(const Geo *g, int pair, int t) {
    int b = pair / g->H, h = pair % g->H;
    return ((size_t)b * g->T + t) * g->H + h;
}


// The kernels, by section (each file a part of this translation unit, not a header of its own).
#include "mesa_tiles.cuh"   // tiles in registers, tensor-core products
#include "mesa_load.cuh"    // chunk loading
#include "mesa_cg.cuh"      // the GLA forms, the CG operator and solve
#include "mesa_scan.cuh"    // the chunk scans (mma.sync; wgmma and TMA on Hopper)
#include "mesa_chunk.cuh"   // the chunk kernels
#include "mesa_decode.cuh"  // the decode kernel

// ------------------------------------------------------------------------ the host side

static int make_geo(Geo *g, const MnSeqDims *d, const MnSolver *s) {
    if (d->Dk > MAXD || d->Dv > MAXD)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mesa: head sizes up to %d (got Dk=%d, Dv=%d)", MAXD, d->Dk, d->Dv);
    g->B = d->B;
    g->T = d->T;
    g->H = d->H;
    g->Dk = d->Dk;
    g->Dv = d->Dv;
    g->nchunks = (d->T + CH - 1) / CH;
    // grid y is at most 65535: the CG kernels' grids have the chunks there, the scans' and grads' the pairs
    if (d->T > 1 && (g->nchunks > 65535 || (long)d->B * d->H > 65535))
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mesa: at most 65535 chunks of %d tokens and 65535 (sequence, head) pairs (got T=%d, B*H=%ld)",
                        CH, d->T, (long)d->B * d->H);
    g->max_steps = s->max_steps;
    g->precond = s->precond == MN_PRECOND_JACOBI;
    g->init = s->init;
    float tol = s->tol > RESIDUAL_FLOOR ? s->tol : RESIDUAL_FLOOR;
    g->tol2 = tol * tol;
    return MN_OK;
}

// Raises a kernel's dynamic shared-memory limit to `bytes`, once per kernel, device and size: the
// attribute is the kernel's on a device, so a larger earlier setting serves (and decode steps,
// which may be recorded into a graph, then make no call at all). Threads of one process may drive
// several devices (synth --parallel): the table is under a lock.
static int set_smem(const void *kernel, size_t bytes, const CudaCtx *c) {
    enum { SLOTS = 64 };
    static struct {
        const void *kernel;
        int device;
        size_t bytes;
    } done[SLOTS];
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    if (bytes > c->smem_optin)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mesa: needs %zu bytes of shared memory, the device allows %zu", bytes,
                        c->smem_optin);
    pthread_mutex_lock(&lock);
    int slot = 0;
    while (slot < SLOTS && done[slot].kernel && (done[slot].kernel != kernel || done[slot].device != c->device)) slot++;
    int have = slot < SLOTS && done[slot].kernel == kernel && done[slot].bytes >= bytes;
    cudaError_t e = have ? cudaSuccess : cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (!have && e == cudaSuccess && slot < SLOTS) done[slot].kernel = kernel, done[slot].device = c->device, done[slot].bytes = bytes;
    pthread_mutex_unlock(&lock);
    CU_TRY(e);
    return MN_OK;
}

static size_t states_floats(const Geo *g) {
    return (size_t)g->B * g->H * (g->nchunks + 1) * ((size_t)g->Dk * g->Dk + (size_t)g->Dv * g->Dk);
}

// Whether rows of n elements of `size` bytes from p all start 16-byte aligned.
static int rows_aligned(const void *p, int n, int size) { return !p || ((uintptr_t)p % 16 == 0 && n * size % 16 == 0); }

// A launch's share of the (b, h) pairs and the stream it runs on. A chunked call with more than a
// wave of chunk blocks splits its pairs in two halves, the second on the side stream. In one stream
// each kernel waits for the last block of the one before, and every kernel here ends in a partly
// empty last wave (a chunk kernel holds a multiprocessor a block); the other half's blocks now take
// those multiprocessors (docs/cuda.md, "Two streams"). Every kernel of a call takes its pairs from
// Geo.pair0 on, so a half is the same launch with a smaller grid.
typedef struct {
    cudaStream_t stream;
    Geo g;       // the call's sizes, with g.pair0 this part's first pair
    int npairs;  // the part's pairs: the pair dimension of its grids
} Part;

// Fills part[] and *nparts (1 or 2); two are forked from the compute stream here and joined back
// by join_parts.
static int split_pairs(CudaCtx *c, const Geo *g, Part part[2], int *nparts) {
    int pairs = g->B * g->H;
    int n = *nparts = pairs >= 2 && (long)pairs * g->nchunks > c->sm_count ? 2 : 1;
    part[0].stream = c->stream;
    part[0].g = *g;
    part[0].npairs = n == 2 ? pairs / 2 : pairs;
    part[1].stream = c->side;
    part[1].g = *g;
    part[1].g.pair0 = part[0].npairs;
    part[1].npairs = pairs - part[0].npairs;
    if (n == 2) {
        CU_TRY(cudaEventRecord(c->side_fork, c->stream));
        CU_TRY(cudaStreamWaitEvent(c->side, c->side_fork, 0));
    }
    return MN_OK;
}

static int join_parts(CudaCtx *c, int nparts) {
    if (nparts < 2) return MN_OK;
    CU_TRY(cudaEventRecord(c->side_join, c->side));
    CU_TRY(cudaStreamWaitEvent(c->stream, c->side_join, 0));
    return MN_OK;
}

// Joins the parts whatever the launches between split_pairs and here returned (rc), so that a
// failed launch never leaves the side stream forked: later work on the compute stream would not
// wait for what the side stream had already been given. Returns rc, or the join's own error.
static int join_parts_after(CudaCtx *c, int nparts, int rc) {
    int rj = join_parts(c, nparts);
    return rc ? rc : rj;
}

static int run_scan(const Backend *be, const Part *p, const Scan *scan, const float *glog, const float *beta) {
    CudaCtx *c = cuda_ctx(be);
    const Geo *g = &p->g;
    Scan s = *scan, *sc = &s;
    s.vec = rows_aligned(s.r, g->Dk, 2);
    for (int m = 0; m < 2; m++) s.vec &= rows_aligned(s.l16[m], s.d[m], 2) && rows_aligned(s.l32[m], s.d[m], 4);
    unsigned slices = (unsigned)((sc->d[0] + CH - 1) / CH + (sc->d[1] + CH - 1) / CH);
    CUtensorMap rmap, omap;
    Launch l;
    if (scan_wg_ok(c, sc, g) && scan_right_map(&rmap, sc->r, g) && scan_out_map(&omap, sc, g)) {
        MN_TRY(set_smem((const void *)scan_wg_kernel, SW_SMEM, c));
        dim3 grid((slices + SW_WGS - 1) / SW_WGS, (unsigned)p->npairs);  // SW_WGS slices a block
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, grid, SW_WGS * SW_NT, SW_SMEM, p->stream), scan_wg_kernel, *sc, glog, beta, *g,
                                  rmap, omap));
    } else {
        size_t smem = scan_smem(g);
        MN_TRY(set_smem((const void *)scan_kernel, smem, c));
        dim3 grid(slices, (unsigned)p->npairs);
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, grid, NT, smem, p->stream), scan_kernel, *sc, glog, beta, *g));
    }
    return MN_OK;
}

// The states entering every chunk, and the final ones: states[pair][c] = (H [Dk*Dk], G [Dv*Dk]), c = 0 .. nchunks.
static int run_states(const Backend *be, const Part *p, float *states, const bf16 *k, const bf16 *v, const float *glog,
                      const float *beta, const float *h0, const float *g0) {
    const Geo *g = &p->g;
    Scan sc = {{k, v}, {NULL, NULL}, {g->Dk, g->Dv}, k, {h0, g0}, {1, 1}, states, g->nchunks + 1, {NULL, NULL}, {1, 1}, 0};
    return run_scan(be, p, &sc, glog, beta);
}

// Copies the final states (the last entry of the states workspace) out.
static __global__ void final_states_kernel(float *hT, float *gT, const float *states, Geo g) {
    size_t hh = (size_t)g.Dk * g.Dk, hg = hh + (size_t)g.Dv * g.Dk;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (size_t)g.B * g.H * hg; e += (size_t)gridDim.x * blockDim.x) {
        size_t pair = e / hg, i = e % hg;
        float val = states[(pair * (g.nchunks + 1) + g.nchunks) * hg + i];
        if (i < hh) {
            if (hT) hT[pair * hh + i] = val;
        } else if (gT) {
            gT[pair * (hg - hh) + i - hh] = val;
        }
    }
}

// The forward's launches for each part: the states, then CG and the output per chunk.
static int forward_parts(const Backend *be, const Part *part, int np, float *states, const MnMesaFwd *io, const bf16 *x0,
                         size_t smem, int vec) {
    CudaCtx *c = cuda_ctx(be);
    for (const Part *p = part; p < part + np; p++)
        MN_TRY(run_states(be, p, states, (const bf16 *)io->k, (const bf16 *)io->v, io->g, io->beta, io->h0, io->g0));
    for (const Part *p = part; p < part + np; p++) {
        Launch l;
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3((unsigned)p->npairs, (unsigned)p->g.nchunks), NT, smem, p->stream),
                                  cg_forward_kernel, (bf16 *)io->o, (bf16 *)io->x, io->steps, (const bf16 *)io->q,
                                  (const bf16 *)io->k, (const bf16 *)io->v, io->g, io->beta, io->lambda, states, x0, vec, p->g));
    }
    return MN_OK;
}

// The backward's workspace (cuda_scratch), carved in cuda_mesa_bwd.
typedef struct {
    float *states;    // states_floats: the recomputed states
    float *adj;       // [pair][chunk] (Gbar, Hn) at every chunk's end
    float *y;         // [B,T,H,Dk] the second solve
    float *terms;     // [B,T,H] y.(lambda (.) x)
    float *db;        // [B,T,H] dL/db per token
    float *db_final;  // [pair] the final states' term of dL/db, or NULL (then 0)
} BwdWork;

// The backward's launches for each part: the states again, the second solve, the adjoints'
// reverse scan, the intra-chunk gradients and dg's reverse sums.
static int backward_parts(const Backend *be, const Part *part, int np, const MnMesaBwd *io, const BwdWork *w, size_t smem,
                          size_t gsmem, int vec) {
    CudaCtx *c = cuda_ctx(be);
    const Part *end = part + np;
    const Geo *g = &part[0].g;
    // the adjoints at every chunk's end (Gbar [Dv*Dk], Hn = -Hbar [Dk*Dk]), from (dgT, -dhT) in reverse
    Scan adjoints = {{(const bf16 *)io->dout, NULL}, {NULL, w->y}, {g->Dv, g->Dk}, (const bf16 *)io->x, {io->dgT, io->dhT}, {1, -1},
                     w->adj, g->nchunks, {io->dg0, io->dh0}, {1, -1}, 1};
    for (const Part *p = part; p < end; p++)
        MN_TRY(run_states(be, p, w->states, (const bf16 *)io->k, (const bf16 *)io->v, io->g, io->beta, io->h0, io->g0));
    for (const Part *p = part; p < end; p++) {
        Launch l;
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3((unsigned)p->npairs, (unsigned)g->nchunks), NT, smem, p->stream),
                                  cg_backward_kernel, (bf16 *)io->dq, w->y, w->terms, io->dlambda, io->steps, (const bf16 *)io->k,
                                  (const bf16 *)io->v, (const bf16 *)io->x, (const bf16 *)io->dout, io->g, io->beta,
                                  io->lambda, w->states, vec, p->g));
        if (w->db_final)
            CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3((unsigned)p->npairs), 256, 0, p->stream), final_dot_kernel,
                                      w->db_final, w->states, io->dhT, io->dgT, p->g));
    }
    for (const Part *p = part; p < end; p++) MN_TRY(run_scan(be, p, &adjoints, io->g, io->beta));
    for (const Part *p = part; p < end; p++) {
        Launch l;
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3((unsigned)g->nchunks, (unsigned)p->npairs), NT, gsmem, p->stream),
                                  grads_kernel, (bf16 *)io->dk, (bf16 *)io->dv, io->dbeta, w->db, (const bf16 *)io->k,
                                  (const bf16 *)io->v, (const bf16 *)io->x, (const bf16 *)io->dout, (const float *)w->y,
                                  (const float *)w->terms, io->g, io->beta, (const float *)w->adj, vec, p->g));
        CU_TRY(cudaLaunchKernelEx(launch_after(&l, c, dim3((unsigned)p->npairs), DG_THREADS, 0, p->stream), dg_scan_kernel,
                                  io->dg, (const float *)w->db, (const float *)w->db_final, p->g));
    }
    return MN_OK;
}

#if MAXD > 64
extern "C" int cuda_mesa_fwd_d64(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaFwd *io);
extern "C" int cuda_mesa_bwd_d64(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaBwd *io);

// Whether the build for head sizes up to 64 (mesa_cuda_d64.cu) takes the problem: chunked, and
// both head sizes padded to at most 64.
static int narrow_heads(const MnSeqDims *d) { return d->T > 1 && d->Dk <= 64 && d->Dv <= 64; }

// The shapes the kernels take (MesaOps.supports): heads up to MAXD.
extern "C" int cuda_mesa_supports(const Backend *be, const MnSeqDims *d) {
    if (d->Dk > MAXD || d->Dv > MAXD)
        return mn_error(MN_ERR_UNSUPPORTED, "cuda mesa: head sizes up to %d (got Dk=%d, Dv=%d)", MAXD, d->Dk, d->Dv);
    return MN_OK;
}
#endif

extern "C" int MESA_NAME(cuda_mesa_fwd)(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaFwd *io) {
    MN_TRY(seq_check_dims(d));
    MN_TRY(seq_check_solver(s));
#if MAXD > 64
    if (narrow_heads(d)) return cuda_mesa_fwd_d64(be, d, s, io);
#endif
    if (!io || !io->q || !io->k || !io->v || !io->g || !io->beta || !io->lambda || !io->o || !io->x)
        return mn_error(MN_ERR_ARG, "cuda mesa forward: a required tensor is NULL");
    Geo g = {0};
    MN_TRY(make_geo(&g, d, s));
    MN_TRY(seq_check_groups(d, io->lambda_seqs, "cuda mesa: lambda_seqs"));
    g.lam_seqs = io->lambda_seqs;
    CudaCtx *c = cuda_ctx(be);
    int *steps = io->steps;  // a device buffer (MEM_I32), or NULL
    if (d->T == 1) {  // decoding: the recurrent kernel, wide blocks when they all fit in one wave
        int blocks = d->B * d->H, wide = blocks <= c->sm_count;
        size_t smem = decode_smem(&g, wide);
        const void *kern = wide ? (const void *)decode_kernel_wide : (const void *)decode_kernel_narrow;
        MN_TRY(set_smem(kern, smem, c));
        const bf16 *x0 = s->init == MN_CG_INIT_GIVEN ? (const bf16 *)io->x0 : NULL;
        if (wide)
            decode_kernel_wide<<<(unsigned)blocks, 512, smem, c->stream>>>(
                (bf16 *)io->o, (bf16 *)io->x, steps, (const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v,
                io->g, io->beta, io->lambda, io->h0, io->g0, io->hT, io->gT, x0, g);
        else
            decode_kernel_narrow<<<(unsigned)blocks, 256, smem, c->stream>>>(
                (bf16 *)io->o, (bf16 *)io->x, steps, (const bf16 *)io->q, (const bf16 *)io->k, (const bf16 *)io->v,
                io->g, io->beta, io->lambda, io->h0, io->g0, io->hT, io->gT, x0, g);
        LAUNCH_CHECK();
        return MN_OK;
    }
    float *states = (float *)cuda_scratch(be, states_floats(&g) * sizeof(float));
    if (!states) return MN_ERR_NOMEM;
    size_t smem = sizeof(float) * smem_floats();
    MN_TRY(set_smem((const void *)cg_forward_kernel, smem, c));
    int vec = rows_aligned(io->k, g.Dk, 2) && rows_aligned(io->v, g.Dv, 2) && rows_aligned(states, g.Dk, 4) &&
              rows_aligned(io->q, g.Dk, 2);  // (q is fetched by cp.async with the keys)
    const bf16 *x0 = s->init == MN_CG_INIT_GIVEN ? (const bf16 *)io->x0 : NULL;
    Part part[2];
    int np;
    MN_TRY(split_pairs(c, &g, part, &np));
    MN_TRY(join_parts_after(c, np, forward_parts(be, part, np, states, io, x0, smem, vec)));
    if (io->hT || io->gT) {
        final_states_kernel<<<grid_for((size_t)d->B * d->H * 1024, 256), 256, 0, c->stream>>>(io->hT, io->gT, states, g);
        LAUNCH_CHECK();
    }
    return MN_OK;
}

extern "C" int MESA_NAME(cuda_mesa_bwd)(const Backend *be, const MnSeqDims *d, const MnSolver *s, const MnMesaBwd *io) {
    MN_TRY(seq_check_dims(d));
    MN_TRY(seq_check_solver(s));
#if MAXD > 64
    if (narrow_heads(d)) return cuda_mesa_bwd_d64(be, d, s, io);
#endif
    if (!io || !io->q || !io->k || !io->v || !io->g || !io->beta || !io->lambda || !io->x || !io->o || !io->dout ||
        !io->dq || !io->dk || !io->dv || !io->dg || !io->dbeta || !io->dlambda)
        return mn_error(MN_ERR_ARG, "cuda mesa backward: a required tensor is NULL");
    Geo g = {0};
    MN_TRY(make_geo(&g, d, s));
    MN_TRY(seq_check_groups(d, io->lambda_seqs, "cuda mesa: lambda_seqs"));
    g.lam_seqs = io->lambda_seqs;
    if (g.init == MN_CG_INIT_GIVEN) g.init = MN_CG_INIT_ZERO;  // the given guesses were for the forward
    CudaCtx *c = cuda_ctx(be);
    size_t pairs = (size_t)d->B * d->H, ntok = (size_t)d->B * d->T * d->H;
    size_t nst = states_floats(&g), nadj = pairs * g.nchunks * ((size_t)g.Dv * g.Dk + (size_t)g.Dk * g.Dk);
    size_t ny = ntok * g.Dk, bytes = sizeof(float) * (nst + nadj + ny + ntok + ntok + pairs);
    char *ws = (char *)cuda_scratch(be, bytes);
    if (!ws) return MN_ERR_NOMEM;
    BwdWork w;
    w.states = (float *)ws;
    w.adj = w.states + nst;
    w.y = w.adj + nadj;
    w.terms = w.y + ny;
    w.db = w.terms + ntok;
    w.db_final = io->dhT || io->dgT ? w.db + ntok : NULL;  // (without final-state gradients the term is 0)
    CU_TRY(cudaMemsetAsync(io->dlambda, 0, sizeof(float) * mn_mesa_lambda_len(d, io->lambda_seqs), c->stream));
    size_t smem = sizeof(float) * smem_floats(), gsmem = grads_smem(&g);
    MN_TRY(set_smem((const void *)cg_backward_kernel, smem, c));
    MN_TRY(set_smem((const void *)grads_kernel, gsmem, c));
    // 16-byte loads when every operand's rows start aligned
    int vec = rows_aligned(io->k, g.Dk, 2) && rows_aligned(io->x, g.Dk, 2) && rows_aligned(io->v, g.Dv, 2) &&
              rows_aligned(io->dout, g.Dv, 2) && rows_aligned(w.states, g.Dk, 4) && rows_aligned(w.y, g.Dk, 4) &&
              rows_aligned(w.adj, g.Dk, 4);
    Part part[2];
    int np;
    MN_TRY(split_pairs(c, &g, part, &np));
    return join_parts_after(c, np, backward_parts(be, part, np, io, &w, smem, gsmem, vec));
}
