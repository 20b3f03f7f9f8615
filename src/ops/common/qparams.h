#pragma once
// Scalar quantization-parameter formulas shared by the observer ops and the MSE search
// (the search scores candidate ranges with exactly the qparams the observer would return).
//
// Note [Observer qparams]
// torch's UniformQuantizationObserverBase._calculate_qparams, which MQBench's ObserverBase
// runs, in the observer's dtype T (float32 unless the module was converted with .double()):
//   mn = min(min_val, 0), mx = max(max_val, 0)
//   symmetric: s = max(max(-mn, mx) / ((qmax - qmin) / 2), eps);  z = symmetric_zero_point
//              (0, or the middle of an unsigned range: MQBench's quint8 case)
//   affine:    s = max((mx - mn) / (qmax - qmin), eps);  z = clamp(qmin - round(mn / s), qmin, qmax)
// round is half to even. A range with no data (min > max: the +inf/-inf initial state, or a
// channel that saw only NaN/inf) gives s = 1, z = 0 as torch's "no data" default, per channel.
// Deliberate difference: a finite range too wide for T (max - min overflows) gives the largest
// finite scale instead of inf (docs/compatibility.md).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace mqbench {
namespace ops {
namespace detail {

template <typename T>
struct ScalarQParams {
  T scale;
  int64_t zero_point;
};

template <typename T>
inline ScalarQParams<T> observer_qparams(T min_val, T max_val, int64_t quant_min,
                                         int64_t quant_max, bool symmetric,
                                         int64_t symmetric_zero_point, T eps) {
  if (!(min_val <= max_val)) return {T(1), 0};
  const T mn = std::min(min_val, T(0));
  const T mx = std::max(max_val, T(0));
  ScalarQParams<T> r;
  if (symmetric) {
    const T half_range = static_cast<T>(static_cast<double>(quant_max - quant_min) / 2.0);
    r.scale = std::max(std::max(-mn, mx) / half_range, eps);
    r.zero_point = symmetric_zero_point;
  } else {
    r.scale = std::max((mx - mn) / static_cast<T>(quant_max - quant_min), eps);
    if (!std::isfinite(r.scale)) r.scale = std::numeric_limits<T>::max();
    const T q = std::nearbyint(mn / r.scale);
    r.zero_point = std::min(std::max(quant_min - static_cast<int64_t>(q), quant_min), quant_max);
  }
  if (!std::isfinite(r.scale)) r.scale = std::numeric_limits<T>::max();
  return r;
}

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
