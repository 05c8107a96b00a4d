/*
 * Vectorised expf/tanhf/log1pf/expm1f for the elementwise loops.
 *
 * glibc's libmvec has AVX2 and AVX-512 versions of these (within 4 ulp), but
 * GCC calls them only for functions declared with the simd attribute, and
 * math.h declares them so only under -ffast-math, which would also drop the
 * IEEE handling of NaN and infinities that our checks rely on. Declaring the
 * attribute here (with -fno-math-errno) vectorises the loops and keeps IEEE
 * semantics. Without libmvec (other libcs, clang) this header is a no-op.
 */
#ifndef MN_VMATH_H
#define MN_VMATH_H

#include <math.h>

#if defined(MN_HAVE_LIBMVEC) && defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
float expf(float) __attribute__((simd("notinbranch")));
float tanhf(float) __attribute__((simd("notinbranch")));
float log1pf(float) __attribute__((simd("notinbranch")));
float expm1f(float) __attribute__((simd("notinbranch")));
#endif

#endif
