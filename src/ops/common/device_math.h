#pragma once
// Math functions overloaded for float and double that compile for the host and for CUDA
// devices; the formula headers in ops/common use them. On the host they are the C library's
// functions; on the device CUDA's, which are correctly rounded for rint/floor/ceil/division and
// within CUDA's documented ulp bounds for the transcendental ones (tanh, exp, log, log2, exp2).
//
// Note [One formula for scalar, vector and device]
// Each formula in ops/common/*_formula.h is written once, as a template on its value type V,
// with only the operations below: arithmetic, comparisons combined with & and |, and the dmath
// functions (rint, floor, ceil, tanh, clamp, select, ...). V is float or double in the CUDA
// kernels and the CPU kernels' scalar loops, and at::vec::Vectorized<float/double> in the CPU
// kernels' vector loops: the per-capability kernel files (MQBENCH_VEC_KERNEL_SOURCES, built
// with MQBENCH_CPU_CAPABILITY defined) get the Vectorized overloads from ops/cpu/vec_math.h,
// included at the end of this header. So a formula is branch-free: a condition picks between
// values with select(), which is a ternary for scalars and a blend for vectors.
//
// In those per-capability files the formulas and these functions live in an inline namespace
// named after the capability (MQBENCH_FORMULA_NS_BEGIN), like the rest of their code: the
// -mavx2 copy of an inline function must not be the one the linker keeps for the baseline copy.
#include <cmath>

#if defined(__CUDACC__)
#define MQBENCH_HOST_DEVICE __host__ __device__ __forceinline__
#else
// Always inlined, as CUDA's __forceinline__: on a Vectorized of the baseline build (arrays, not
// registers) GCC would otherwise call the vector formulas out of line, once per vector.
#define MQBENCH_HOST_DEVICE inline __attribute__((always_inline))
#endif

#if defined(MQBENCH_CPU_CAPABILITY) && !defined(__CUDACC__)
#define MQBENCH_FORMULA_NS_BEGIN inline namespace MQBENCH_CPU_CAPABILITY {
#define MQBENCH_FORMULA_NS_END }
#else
#define MQBENCH_FORMULA_NS_BEGIN
#define MQBENCH_FORMULA_NS_END
#endif

namespace mqbench {
namespace ops {
namespace dmath {
MQBENCH_FORMULA_NS_BEGIN

#define MQBENCH_DMATH_1(name, fname, dname) \
  MQBENCH_HOST_DEVICE float name(float v) { return ::fname(v); } \
  MQBENCH_HOST_DEVICE double name(double v) { return ::dname(v); }

MQBENCH_DMATH_1(rint, nearbyintf, nearbyint)
MQBENCH_DMATH_1(floor, floorf, floor)
MQBENCH_DMATH_1(ceil, ceilf, ceil)
MQBENCH_DMATH_1(tanh, tanhf, tanh)
MQBENCH_DMATH_1(exp, expf, exp)
MQBENCH_DMATH_1(log, logf, log)
MQBENCH_DMATH_1(log2, log2f, log2)
MQBENCH_DMATH_1(exp2, exp2f, exp2)
MQBENCH_DMATH_1(abs, fabsf, fabs)

#undef MQBENCH_DMATH_1

MQBENCH_HOST_DEVICE bool isnan(float v) { return v != v; }
MQBENCH_HOST_DEVICE bool isnan(double v) { return v != v; }
MQBENCH_HOST_DEVICE bool isfinite(float v) { return v - v == 0.0f; }
MQBENCH_HOST_DEVICE bool isfinite(double v) { return v - v == 0.0; }

/// std::max / std::min exactly (the first argument when the comparison fails, e.g. on NaN), as
/// the CPU kernels' scalar paths call them.
template <typename T>
MQBENCH_HOST_DEVICE T std_max(const T& a, const T& b) {
  return a < b ? b : a;
}
template <typename T>
MQBENCH_HOST_DEVICE T std_min(const T& a, const T& b) {
  return b < a ? b : a;
}

/// min(max(v, lo), hi) that keeps a NaN v (a NaN fails both comparisons).
template <typename T>
MQBENCH_HOST_DEVICE T clamp(const T& v, const T& lo, const T& hi) {
  return std_min(std_max(v, lo), hi);
}

/// c ? a : b. The condition of a scalar formula is a bool (or the int of bool & bool); the
/// vector overload in ops/cpu/vec_math.h takes a lane mask.
template <typename T>
MQBENCH_HOST_DEVICE T select(bool c, const T& a, const T& b) {
  return c ? a : b;
}

MQBENCH_FORMULA_NS_END
}  // namespace dmath
}  // namespace ops
}  // namespace mqbench

#if defined(MQBENCH_CPU_CAPABILITY) && !defined(__CUDACC__)
#include "ops/cpu/vec_math.h"
#endif
