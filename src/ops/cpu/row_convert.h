#pragma once
// Loads and stores between a row of x's dtype and vector registers of the compute type (float32
// for float32 / float16 / bfloat16, float64 for float64), for the row kernels of
// hadamard_transform and fake_quantize_per_token. Half types convert with ATen's vector
// conversions (round to nearest even, as torch's .to()).
//
// Only the per-capability kernel files (MQBENCH_VEC_KERNEL_SOURCES) include this header.

#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>

#include <type_traits>

#ifndef MQBENCH_CPU_CAPABILITY
#error "row_convert.h is only for the per-capability kernel files (MQBENCH_VEC_KERNEL_SOURCES)"
#endif

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace row {

/// The compute type of an element type: double for double, float otherwise.
template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, double>, double, float>;

template <typename T>
using CVec = at::vec::Vectorized<compute_t<T>>;

/// Elements per vector register of the compute type.
template <typename T>
constexpr int64_t width() {
  return CVec<T>::size();
}

/// width<T>() elements of x as a register of the compute type.
template <typename T>
inline CVec<T> load(const T* x) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    return CVec<T>::loadu(x);
  } else {
    CVec<T> v;
    at::vec::load_to_float(x, v);
    return v;
  }
}

/// Stores a register of the compute type as width<T>() elements of T.
template <typename T>
inline void store(T* out, const CVec<T>& v) {
  if constexpr (std::is_same_v<T, compute_t<T>>) {
    v.store(out);
  } else {
    at::vec::convert_from_float<T>(v, v).store(out, static_cast<int>(width<T>()));
  }
}

}  // namespace row
}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
