#pragma once
// Math functions overloaded for float and double that compile for the host and for CUDA
// devices (the formula headers in ops/common use them). On the host they are the C library's
// functions, as the CPU kernels' scalar paths call them; on the device CUDA's, which are
// correctly rounded for rint/floor/ceil/division and within CUDA's documented ulp bounds for
// the transcendental ones (tanh, exp, log, log2, exp2).

#include <cmath>

#if defined(__CUDACC__)
#define MQBENCH_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MQBENCH_HOST_DEVICE inline
#endif

namespace mqbench {
namespace ops {
namespace dmath {

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
MQBENCH_HOST_DEVICE T std_max(T a, T b) {
  return a < b ? b : a;
}
template <typename T>
MQBENCH_HOST_DEVICE T std_min(T a, T b) {
  return b < a ? b : a;
}

}  // namespace dmath
}  // namespace ops
}  // namespace mqbench
