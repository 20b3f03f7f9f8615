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

#include "ops/common/device_math.h"

namespace mqbench {
namespace ops {
namespace detail {
MQBENCH_FORMULA_NS_BEGIN

template <typename T>
struct ScalarQParams {
  T scale;
  int64_t zero_point;
};

/// Host and device (the CUDA observers compute qparams on the device).
template <typename T>
MQBENCH_HOST_DEVICE ScalarQParams<T> observer_qparams(T min_val, T max_val, int64_t quant_min,
                                                      int64_t quant_max, bool symmetric,
                                                      int64_t symmetric_zero_point, T eps) {
  using dmath::std_max;
  using dmath::std_min;
  if (!(min_val <= max_val)) return {T(1), 0};
  const T mn = std_min(min_val, T(0));
  const T mx = std_max(max_val, T(0));
  const T largest = std::numeric_limits<T>::max();
  ScalarQParams<T> r;
  if (symmetric) {
    const T half_range = static_cast<T>(static_cast<double>(quant_max - quant_min) / 2.0);
    r.scale = std_max(std_max(-mn, mx) / half_range, eps);
    r.zero_point = symmetric_zero_point;
  } else {
    r.scale = std_max((mx - mn) / static_cast<T>(quant_max - quant_min), eps);
    if (!dmath::isfinite(r.scale)) r.scale = largest;
    const T q = dmath::rint(mn / r.scale);
    const int64_t zp = quant_min - static_cast<int64_t>(q);
    r.zero_point = zp < quant_min ? quant_min : (zp > quant_max ? quant_max : zp);
  }
  if (!dmath::isfinite(r.scale)) r.scale = largest;
  return r;
}

/// observer_pot_exponent's first candidate exponent (host): floor(log2(1 / s0)) with
/// s0 = max(min / qmin, max / qmax) in the observer's dtype (a zero bound contributes nothing);
/// 0 when s0 is not finite or below 2^-15.
inline int64_t pot_start_exponent(double mn, double mx, int64_t quant_min, int64_t quant_max,
                                  bool is_double) {
  const double inf = std::numeric_limits<double>::infinity();
  auto ratio = [&](double a, int64_t q) {
    if (q == 0) return -inf;
    return is_double ? a / q : static_cast<double>(static_cast<float>(a) / static_cast<float>(q));
  };
  const double s0 = std::max(ratio(mn, quant_min), ratio(mx, quant_max));
  if (!std::isfinite(s0) || s0 < std::ldexp(1.0, -15)) return 0;
  return is_double ? static_cast<int64_t>(std::floor(std::log2(1.0 / s0)))
                   : static_cast<int64_t>(std::floor(std::log2(1.0f / static_cast<float>(s0))));
}

/// The bin of a (0 <= a <= r, r > 0) in the |x| histogram of EMAQuantileObserver over `bins`
/// bins, in T (host and device): floor(a * bins / r), or floor(a / r * bins) where a * bins
/// overflows (a above max / bins); bins - 1 at most, and for NaN (no undefined conversion).
template <typename T>
MQBENCH_HOST_DEVICE int64_t quantile_bin(T a, T r, int64_t bins) {
  const T nb = static_cast<T>(bins);
  T q = a * nb / r;
  if (!(q <= nb)) q = a / r * nb;
  return q < nb ? static_cast<int64_t>(q) : bins - 1;
}

/// The exponent e0 + k of the smallest loss[k] (the first on ties), at most 12 (MQBench's cap).
inline int64_t pot_best_exponent(const double* loss, int64_t n, int64_t e0) {
  int64_t best_e = e0;
  double best = std::numeric_limits<double>::infinity();
  for (int64_t k = 0; k < n; ++k) {
    if (loss[k] < best) {
      best = loss[k];
      best_e = e0 + k;
    }
  }
  return std::min<int64_t>(best_e, 12);
}

MQBENCH_FORMULA_NS_END
}  // namespace detail
}  // namespace ops
}  // namespace mqbench
