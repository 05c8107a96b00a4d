// src/cuda/mma.cuh on the CPU (with emu.h): ldmatrix and mma.sync m16n8k16 as warp-collective
// operations, each lane's registers exchanged through a per-warp table between two barriers, with
// the fragment layouts of the PTX ISA (mma.cuh's header comment): an element taken from the wrong
// lane or register half gives wrong products, so a kernel's lane mapping is checked as the tensor
// cores would read it. cp.async is a plain copy (its zero fill included); its waits do nothing.
// Addresses are checked for the alignment the hardware needs (16 bytes for ldmatrix rows and
// cp.async, which would otherwise fault).
#pragma once
#include <stdio.h>
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
struct float4 { float x, y, z, w; };

extern uint32_t emu_mx[32][32][6];    // [warp][lane]: a[0..3], b0, b1 of an mma
extern const void *emu_px[32][32];    // [warp][lane]: the row address given to an ldmatrix

static inline void emu_align(const void *p, unsigned n, const char *what) {
    if ((uintptr_t)p % n) {
        fprintf(stderr, "%s: address %p not %u-byte aligned\n", what, p, n);
        abort();
    }
}

static inline uint32_t pack_bf16(float lo, float hi) { return (uint32_t)f32_to_bf16(lo) | (uint32_t)f32_to_bf16(hi) << 16; }

static inline void emu_ldsm(uint32_t r[4], const void *row, int trans) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    emu_align(row, 16, "ldmatrix");
    emu_px[w][lane] = row;
    pthread_barrier_wait(&emu_warp_bar[w]);
    for (int i = 0; i < 4; i++) {
        if (!trans) {  // row lane / 4 of matrix i, columns 2 (lane % 4), +1
            const uint16_t *p = (const uint16_t *)emu_px[w][i * 8 + lane / 4];
            r[i] = (uint32_t)p[2 * (lane % 4)] | (uint32_t)p[2 * (lane % 4) + 1] << 16;
        } else {  // the transpose: rows 2 (lane % 4), +1 of matrix i, column lane / 4
            const uint16_t *p0 = (const uint16_t *)emu_px[w][i * 8 + 2 * (lane % 4)];
            const uint16_t *p1 = (const uint16_t *)emu_px[w][i * 8 + 2 * (lane % 4) + 1];
            r[i] = (uint32_t)p0[lane / 4] | (uint32_t)p1[lane / 4] << 16;
        }
    }
    pthread_barrier_wait(&emu_warp_bar[w]);
}
static inline void ldsm_x4(uint32_t r[4], const void *row) { emu_ldsm(r, row, 0); }
static inline void ldsm_x4_t(uint32_t r[4], const void *row) { emu_ldsm(r, row, 1); }

static inline float emu_half(uint32_t x, int hi) { return bf16_to_f32((uint16_t)(hi ? x >> 16 : x & 0xffff)); }
// A (16 x 16) element (R, K) and B (16 x 8) element (K, N) of warp w's operands, from the lanes
// and registers the PTX ISA puts them in.
static inline float emu_a(int w, int R, int K) { return emu_half(emu_mx[w][(R % 8) * 4 + (K % 8) / 2][(R >= 8) + 2 * (K >= 8)], K & 1); }
static inline float emu_b(int w, int K, int N) { return emu_half(emu_mx[w][N * 4 + (K % 8) / 2][4 + (K >= 8)], K & 1); }

static inline void mma_bf16(float c[4], const uint32_t a[4], const uint32_t b0, const uint32_t b1) {
    int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    for (int i = 0; i < 4; i++) emu_mx[w][lane][i] = a[i];
    emu_mx[w][lane][4] = b0;
    emu_mx[w][lane][5] = b1;
    pthread_barrier_wait(&emu_warp_bar[w]);
    float out[4];
    for (int e = 0; e < 4; e++) {
        int R = lane / 4 + 8 * (e >> 1), N = 2 * (lane % 4) + (e & 1);
        double s = 0;  // bf16 products are exact in fp32; the sum in double (the hardware's order is unspecified)
        for (int K = 0; K < 16; K++) s += (double)emu_a(w, R, K) * emu_b(w, K, N);
        out[e] = (float)(c[e] + s);
    }
    pthread_barrier_wait(&emu_warp_bar[w]);
    for (int e = 0; e < 4; e++) c[e] = out[e];
}

static inline float ex2(float x) { return exp2f(x); }
static inline void red_add2(float *p, float a, float b) {
    emu_align(p, 8, "red_add2");
    atomicAdd(p, a);
    atomicAdd(p + 1, b);
}

static inline void cp_async16(void *dst, const void *src, int bytes) {
    emu_align(dst, 16, "cp.async dst");
    emu_align(src, 16, "cp.async src");
    memcpy(dst, src, (size_t)bytes);
    memset((char *)dst + bytes, 0, (size_t)(16 - bytes));
}
static inline void cp_async_commit(void) {}
static inline void cp_async_wait1(void) {}
static inline void cp_async_wait0(void) {}
static inline void prefetch_l2(const void *) {}
