/*
 * 16-bit floats: bfloat16 <-> float32 and IEEE half -> float32.
 *
 * Static inline and free of library dependencies, so that the safetensors
 * reader, the CPU kernels and the CUDA backend (compiled as C++) share one
 * definition.
 *
 * bfloat16 is the top half of a float32 (same 8-bit exponent, 7-bit
 * mantissa), so widening is a shift; narrowing rounds to nearest, ties to
 * even, like PyTorch's and the hardware conversions, and keeps NaN a NaN.
 */
#ifndef MN_HALF_H
#define MN_HALF_H

#include <stdint.h>
#include <string.h>

static inline uint32_t mn_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static inline float mn_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline float bf16_to_f32(uint16_t h) { return mn_bits_f32((uint32_t)h << 16); }

static inline uint16_t f32_to_bf16(float f) {
    uint32_t u = mn_f32_bits(f);
    // A NaN whose payload sits only in the low 16 bits would truncate to
    // infinity: keep sign and high payload and force the quiet bit instead.
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);
    // Round to nearest even: add 0x7fff, plus 1 when the kept part is odd.
    // A carry into the exponent is correct rounding (up to infinity at the top).
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

// IEEE 754 binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Every
// half is exactly representable as a float, so this conversion is exact.
static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return mn_bits_f32(sign | 0x7f800000u | (man << 13));  // inf, NaN (payload kept)
    if (exp != 0) return mn_bits_f32(sign | ((exp + 112) << 23) | (man << 13));  // normal: rebias 15 -> 127
    // Zero or subnormal: man * 2^-24, exact in float arithmetic.
    float v = (float)man * 0x1p-24f;
    return sign ? -v : v;
}

#endif
