#pragma once
// The per-element formulas of the CUDA kernels, as inline functions that compile for the host
// and for CUDA devices. They restate the CPU kernels' scalar paths (ops/cpu/*_kernel.cpp, the
// verified references) operation for operation, in the same order and precision, so a device
// kernel computes what the CPU kernel computes; tests/cpp/ops/test_device_formulas.cpp checks
// them on the host against the CPU ops. Affine (Note [Zero point modes] in
// ops/cpu/affine_kernel.cpp):
//   inv = 1.0f / s                       (float32 reciprocal, also for float64 input)
//   integer zero point:  q = nearbyint(x * inv) + z
//   floating zero point: q = nearbyint(x * inv + z)   (torch's float-zp formula; the output
//                                                       is computed in float64)
//   learnable:           z' = clamp(nearbyint(z), qmin, qmax), then as the integer formula
//   out = (clamp(q, qmin, qmax) - z) * s  (NaN stays NaN; +-inf saturate)
//   mask = qmin <= q <= qmax              (straight-through gradient: dx = dy * mask)

#include "ops/common/device_math.h"

namespace mqbench {
namespace ops {
namespace detail {

template <typename T>
struct AffineScalars {
  T s, inv, z, lo, hi;
};

/// Parameters in the compute type T from the float32 scale and zero point; `round_z` rounds and
/// clamps the zero point (the learnable ops).
template <typename T>
MQBENCH_HOST_DEVICE AffineScalars<T> affine_scalars(float s, float z, long long qmin,
                                                    long long qmax, bool round_z = false) {
  if (round_z) {
    z = dmath::rint(z);
    z = z < static_cast<float>(qmin) ? static_cast<float>(qmin) : z;
    z = z > static_cast<float>(qmax) ? static_cast<float>(qmax) : z;
  }
  return {static_cast<T>(s), static_cast<T>(1.0f / s), static_cast<T>(z), static_cast<T>(qmin),
          static_cast<T>(qmax)};
}

template <typename T>
MQBENCH_HOST_DEVICE T clamp_nan(T q, T lo, T hi) {
  // fmin/fmax would drop a NaN; comparisons keep it (a NaN q fails both tests).
  q = q < lo ? lo : q;
  return q > hi ? hi : q;
}

template <typename T, bool kFloatZp = false>
MQBENCH_HOST_DEVICE T affine_quant(T x, const AffineScalars<T>& p) {
  return kFloatZp ? dmath::rint(x * p.inv + p.z) : dmath::rint(x * p.inv) + p.z;
}

template <typename T, bool kFloatZp = false>
MQBENCH_HOST_DEVICE T affine_fake_quant(T x, const AffineScalars<T>& p) {
  const T q = clamp_nan(affine_quant<T, kFloatZp>(x, p), p.lo, p.hi);
  if (kFloatZp) {
    return static_cast<T>((static_cast<double>(q) - static_cast<double>(p.z)) *
                          static_cast<double>(p.s));
  }
  return (q - p.z) * p.s;
}

template <typename T, bool kFloatZp = false>
MQBENCH_HOST_DEVICE bool affine_in_range(T x, const AffineScalars<T>& p) {
  const T q = affine_quant<T, kFloatZp>(x, p);
  return q >= p.lo && q <= p.hi;
}

/// LSQ / LSQ+ gradients of one element (docs/ops.md's table); returns dx.
template <typename T>
MQBENCH_HOST_DEVICE T learnable_grad(T dy, T x, const AffineScalars<T>& p, T g, T& ds, T& dz) {
  const T q = affine_quant(x, p);
  if (q < p.lo) {
    ds = dy * (p.lo - p.z) * g;
    dz = -dy * p.s * g;
    return T(0);
  }
  if (q > p.hi) {
    ds = dy * (p.hi - p.z) * g;
    dz = -dy * p.s * g;
    return T(0);
  }
  const T xfq = (clamp_nan(q, p.lo, p.hi) - p.z) * p.s;
  ds = dy * (xfq - x) * p.inv * g;
  dz = T(0);
  return (q >= p.lo && q <= p.hi) ? dy : T(0);
}

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
