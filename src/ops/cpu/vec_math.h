#pragma once
// The at::vec::Vectorized overloads of ops/common/device_math.h's functions, so that the
// formulas of ops/common/*_formula.h run on whole vector registers in the CPU kernels' vector
// loops (Note [One formula for scalar, vector and device]). Each is the Vectorized operation the
// kernels used before the formulas were shared: round() (half to even, as nearbyint), floor(),
// ceil(), tanh() (Sleef: within an ulp of the C library's), at::vec::clamp (keeps a NaN input),
// blendv for select.
//
// Included by device_math.h in the per-capability kernel files only (MQBENCH_CPU_CAPABILITY).

#include <ATen/cpu/vec/vec.h>

#ifndef MQBENCH_CPU_CAPABILITY
#error "vec_math.h is only for the per-capability kernel files (MQBENCH_VEC_KERNEL_SOURCES)"
#endif

namespace mqbench {
namespace ops {
namespace dmath {
inline namespace MQBENCH_CPU_CAPABILITY {

template <typename T>
using Vectorized = at::vec::Vectorized<T>;

template <typename T>
inline Vectorized<T> rint(const Vectorized<T>& v) {
  return v.round();
}
template <typename T>
inline Vectorized<T> floor(const Vectorized<T>& v) {
  return v.floor();
}
template <typename T>
inline Vectorized<T> ceil(const Vectorized<T>& v) {
  return v.ceil();
}
template <typename T>
inline Vectorized<T> tanh(const Vectorized<T>& v) {
  return v.tanh();
}
template <typename T>
inline Vectorized<T> clamp(const Vectorized<T>& v, const Vectorized<T>& lo,
                           const Vectorized<T>& hi) {
  return at::vec::clamp(v, lo, hi);
}

/// Lane by lane: mask ? a : b (a mask lane is all ones or all zeros, as comparisons give).
template <typename T>
inline Vectorized<T> select(const Vectorized<T>& mask, const Vectorized<T>& a,
                            const Vectorized<T>& b) {
  return Vectorized<T>::blendv(b, a, mask);
}

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace dmath
}  // namespace ops
}  // namespace mqbench
