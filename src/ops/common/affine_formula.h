#pragma once
// The per-element formulas of affine fake quantization (fixed and LSQ / LSQ+), written once for
// the CPU kernels' scalar and vector loops and the CUDA kernels (Note [One formula for scalar,
// vector and device] in device_math.h). V is the value type: float, double, or a Vectorized of
// them.
//
// Note [Zero point modes]
//   inv = 1.0f / s                       (float32 reciprocal, also for float64 input)
//   integer zero point:  q = nearbyint(x * inv) + z
//   floating zero point: q = nearbyint(x * inv + z)   (torch's float-zp formula; the output
//                                                       is computed in float64)
//   learnable:           z' = clamp(nearbyint(z), qmin, qmax), then as the integer formula
//   out = (clamp(q, qmin, qmax) - z) * s  (NaN stays NaN; +-inf saturate)
//   mask = qmin <= q <= qmax              (straight-through gradient: dx = dy * mask)
// These are torch's CPU fake-quant formulas, so results match torch's ops bit for bit on finite
// input. The learnable ops round the zero point the same way in forward and backward (torch's
// per-tensor backward uses trunc(z + 0.5): docs/compatibility.md). nearbyint rounds half to
// even. Deliberate difference from torch: a NaN input gives NaN and +-inf saturate to the
// qmax/qmin level (torch casts them to int64, which sends all three to qmin); see
// docs/compatibility.md.

#include "ops/common/device_math.h"

namespace mqbench {
namespace ops {
namespace detail {
MQBENCH_FORMULA_NS_BEGIN

template <typename V>
struct AffineScalars {
  V s, inv, z, lo, hi;
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

/// The same parameters in another value type (a vector register of them, on the CPU).
template <typename V, typename T>
MQBENCH_HOST_DEVICE AffineScalars<V> broadcast(const AffineScalars<T>& p) {
  return {V(p.s), V(p.inv), V(p.z), V(p.lo), V(p.hi)};
}

/// The unclamped quantized value q.
template <typename V, bool kFloatZp = false>
MQBENCH_HOST_DEVICE V affine_quant(const V& x, const AffineScalars<V>& p) {
  return kFloatZp ? dmath::rint(x * p.inv + p.z) : dmath::rint(x * p.inv) + p.z;
}

template <typename V, bool kFloatZp = false>
MQBENCH_HOST_DEVICE V affine_fake_quant(const V& x, const AffineScalars<V>& p) {
  const V q = dmath::clamp(affine_quant<V, kFloatZp>(x, p), p.lo, p.hi);
  if constexpr (kFloatZp) {
    // torch's float-zero-point kernel computes (q - z) * s in double: with a fractional z,
    // q - z is not exact in float. Scalars only (the CPU vector loop runs it lane by lane).
    return static_cast<V>((static_cast<double>(q) - static_cast<double>(p.z)) *
                          static_cast<double>(p.s));
  } else {
    return (q - p.z) * p.s;
  }
}

/// The straight-through mask qmin <= q <= qmax (a bool, or a lane mask for a vector).
template <typename V, bool kFloatZp = false>
MQBENCH_HOST_DEVICE auto affine_in_range(const V& x, const AffineScalars<V>& p) {
  const V q = affine_quant<V, kFloatZp>(x, p);
  return (q >= p.lo) & (q <= p.hi);
}

/// dx of the fixed ops: dy where q is in range, else 0.
template <typename V, bool kFloatZp = false>
MQBENCH_HOST_DEVICE V affine_grad(const V& dy, const V& x, const AffineScalars<V>& p) {
  return dmath::select(affine_in_range<V, kFloatZp>(x, p), dy, V(0));
}

// LSQ / LSQ+ gradients (Esser et al. 2020, "Learned Step Size Quantization"; Bhalgat et al.
// 2020, "LSQ+"), with g = grad_factor and z' the rounded zero point:
//   qmin <= q <= qmax:  dx = dy   d_scale = dy * (xfq - x) / s * g    d_zp = 0
//   q < qmin:           dx = 0    d_scale = dy * (qmin - z') * g      d_zp = -dy * s * g
//   q > qmax:           dx = 0    d_scale = dy * (qmax - z') * g      d_zp = -dy * s * g
// where xfq = (clamp(q) - z') * s is the forward output. A NaN input takes the in-range case
// and propagates into d_scale, as in torch. The kernels sum d_scale / d_zp over all elements
// (per tensor) or all but the channel axis (per channel). Returns dx; ds, dz are the element's
// shares (docs/ops.md's table).
template <typename V>
MQBENCH_HOST_DEVICE V learnable_grad(const V& dy, const V& x, const AffineScalars<V>& p, const V& g,
                                     V& ds, V& dz) {
  const V q = affine_quant(x, p);
  const auto below = q < p.lo;
  const auto above = q > p.hi;
  const V xfq = (dmath::clamp(q, p.lo, p.hi) - p.z) * p.s;
  ds = dmath::select(below, dy * (p.lo - p.z) * g,
                     dmath::select(above, dy * (p.hi - p.z) * g, dy * (xfq - x) * p.inv * g));
  dz = dmath::select(below | above, V(0) - dy * p.s * g, V(0));
  return dmath::select((q >= p.lo) & (q <= p.hi), dy, V(0));
}

MQBENCH_FORMULA_NS_END
}  // namespace detail
}  // namespace ops
}  // namespace mqbench
