#pragma once
// Per-element formulas of DSQ, TQT, PACT, NNIE and AdaRound, written once for the CPU kernels
// (ops/cpu/<family>_kernel.cpp) and the CUDA kernels (ops/cuda/<family>_kernel.cu); DSQ, TQT and
// PACT are templates on the value type V, which the CPU's vector loops instantiate with
// at::vec::Vectorized (Note [One formula for scalar, vector and device] in device_math.h).
// NNIE and AdaRound run scalar loops on the CPU. docs/ops.md has the mathematics.

#include "ops/common/affine_formula.h"

namespace mqbench {
namespace ops {
namespace detail {
MQBENCH_FORMULA_NS_BEGIN

using dmath::std_max;
using dmath::std_min;

// ---- DSQ (Gong et al. 2019, "Differentiable Soft Quantization") ----------------------------
// With k_s = 1 / (1 - alpha) and k = ln((k_s + 1) / (k_s - 1)) (MQBench's parameterisation):
//   u   = clamp(x / s + z, qmin, qmax)
//   phi = floor(u) + 0.5 * k_s * tanh(k * (u - floor(u) - 0.5)) + 0.5
//   out = (round(phi) - z) * s          round: half to even, straight-through
// Gradient (scale and zero point are buffers in MQBench: no gradient):
//   dx = dy * 0.5 * k_s * k * (1 - tanh^2(k * (v - floor(v) - 0.5)))   if qmin <= v <= qmax
//   dx = 0 otherwise, with v = x / s + z.

template <typename V>
struct DsqScalars {
  V s, z, lo, hi, ks, k;
};

/// MQBench's k_s = 1 / (1 - alpha) and k = ln((k_s + 1) / (k_s - 1)), in double (computed once
/// per call on the host).
struct DsqConstants {
  double ks, k;
};
MQBENCH_HOST_DEVICE DsqConstants dsq_constants(double alpha) {
  const double ks = 1.0 / (1.0 - alpha);
  return {ks, dmath::log((ks + 1.0) / (ks - 1.0))};
}

template <typename T>
MQBENCH_HOST_DEVICE DsqScalars<T> dsq_scalars(float s, float z, long long qmin, long long qmax,
                                              const DsqConstants& c) {
  return {static_cast<T>(s),    static_cast<T>(z),    static_cast<T>(qmin),
          static_cast<T>(qmax), static_cast<T>(c.ks), static_cast<T>(c.k)};
}

template <typename T>
MQBENCH_HOST_DEVICE DsqScalars<T> dsq_scalars(float s, float z, long long qmin, long long qmax,
                                              double alpha) {
  return dsq_scalars<T>(s, z, qmin, qmax, dsq_constants(alpha));
}

template <typename V, typename T>
MQBENCH_HOST_DEVICE DsqScalars<V> broadcast(const DsqScalars<T>& p) {
  return {V(p.s), V(p.z), V(p.lo), V(p.hi), V(p.ks), V(p.k)};
}

template <typename V>
MQBENCH_HOST_DEVICE V dsq_forward(const V& x, const DsqScalars<V>& p) {
  const V half(0.5);
  const V u = dmath::clamp(x / p.s + p.z, p.lo, p.hi);
  const V f = dmath::floor(u);
  const V phi = f + half * p.ks * dmath::tanh(p.k * (u - f - half)) + half;
  return (dmath::rint(phi) - p.z) * p.s;
}

template <typename V>
MQBENCH_HOST_DEVICE V dsq_grad(const V& dy, const V& x, const DsqScalars<V>& p) {
  const V half(0.5);
  const V v = x / p.s + p.z;
  const V th = dmath::tanh(p.k * (v - dmath::floor(v) - half));
  return dmath::select((v >= p.lo) & (v <= p.hi), dy * half * p.ks * p.k * (V(1) - th * th),
                       V(0));
}

// ---- TQT (Jain et al. 2020, "Trained Quantization Thresholds"; MQBench's Vitis backend) ------
// The step is the power of two at or above the scale:
//   e  = 0 if s < 2^-15 else floor(log2(1 / s)),   s' = 2^-e
//   t  = x / s'
//   mth 3: r = round(t) (half to even);  mth 2: r = ceil(t) for negative ties, else round(t)
//   out = (clamp(r + z, qmin, qmax) - z) * s'
// Gradients:
//   dx      = dy  where qmin <= round(x / s) + z <= qmax (the original s, as MQBench), else 0
//   d_scale = sum dy * (s' / s) * (r - t, qmin - z or qmax - z where clamped)
// d_scale follows the TQT paper's log2-threshold gradient (straight-through on the ceil, so
// ds'/ds = s'/s); MQBench keeps the scale in a buffer, where autograd ignores it.

template <typename V>
struct TqtScalars {
  V s, sp, inv_sp, z, lo, hi, ratio;
};

template <typename T>
MQBENCH_HOST_DEVICE TqtScalars<T> tqt_scalars(float s, float z, long long qmin, long long qmax) {
  const float e = s < 3.0517578125e-05f /* 2^-15 */ ? 0.f : dmath::floor(dmath::log2(1.0f / s));
  const float sp = dmath::exp2(-e);
  return {static_cast<T>(s), static_cast<T>(sp), static_cast<T>(dmath::exp2(e)) /* exact */,
          static_cast<T>(z), static_cast<T>(qmin), static_cast<T>(qmax),
          static_cast<T>(sp) / static_cast<T>(s)};
}

template <typename V, typename T>
MQBENCH_HOST_DEVICE TqtScalars<V> broadcast(const TqtScalars<T>& p) {
  return {V(p.s), V(p.sp), V(p.inv_sp), V(p.z), V(p.lo), V(p.hi), V(p.ratio)};
}

/// mth 3 rounds half to even; mth 2 rounds negative ties up.
template <typename V>
MQBENCH_HOST_DEVICE V tqt_round(const V& t, long long mth) {
  if (mth != 2) return dmath::rint(t);
  return dmath::select((t < V(0)) & ((t - dmath::floor(t)) == V(0.5)), dmath::ceil(t),
                       dmath::rint(t));
}

template <typename V>
MQBENCH_HOST_DEVICE V tqt_forward(const V& x, const TqtScalars<V>& p, long long mth) {
  const V r = tqt_round(x * p.inv_sp, mth) + p.z;
  return (dmath::clamp(r, p.lo, p.hi) - p.z) * p.sp;
}

/// Returns dx; ds is the element's share of the scale gradient.
template <typename V>
MQBENCH_HOST_DEVICE V tqt_grad(const V& dy, const V& x, const TqtScalars<V>& p, long long mth,
                               V& ds) {
  const V t = x * p.inv_sp;
  const V r = tqt_round(t, mth) + p.z;
  ds = dmath::select(r < p.lo, dy * p.ratio * (p.lo - p.z),
                     dmath::select(r > p.hi, dy * p.ratio * (p.hi - p.z),
                                   dy * p.ratio * (r - p.z - t)));
  const V q = dmath::rint(x / p.s) + p.z;
  return dmath::select((q >= p.lo) & (q <= p.hi), dy, V(0));
}

// ---- PACT (Choi et al. 2018, "PACT: Parameterized Clipping Activation") ----------------------
//   c   = clamp(x, lower, upper)          (upper = alpha, lower = n_alpha)
//   out = fixed affine fake quantization of c, integer zero point (Note [Zero point modes])
// Gradients, with m(v) = [qmin <= q(v) <= qmax] the straight-through mask at value v:
//   lower <= x <= upper:  dx = dy * m(x)
//   x > upper:            dx = 0,  d_upper += dy * m(upper)
//   x < lower:            dx = 0,  d_lower += dy * m(lower)
// which is what autograd gives for MQBench's where(x > alpha, alpha, x) followed by the lower
// clip and torch's fake quantization.

template <typename V>
MQBENCH_HOST_DEVICE V pact_forward(const V& x, const V& lower, const V& upper,
                                   const AffineScalars<V>& p) {
  const V c = dmath::clamp(x, lower, upper);
  return (dmath::clamp(affine_quant(c, p), p.lo, p.hi) - p.z) * p.s;
}

/// Returns dx; d_upper / d_lower are the element's shares of the clip gradients.
template <typename V>
MQBENCH_HOST_DEVICE V pact_grad(const V& dy, const V& x, const V& lower, const V& upper,
                                const AffineScalars<V>& p, V& d_upper, V& d_lower) {
  const auto above = x > upper;
  const auto below = x < lower;
  d_upper = dmath::select(above & affine_in_range(upper, p), dy, V(0));
  d_lower = dmath::select(below & affine_in_range(lower, p), dy, V(0));
  return dmath::select(above | below, V(0), dmath::select(affine_in_range(x, p), dy, V(0)));
}

// ---- NNIE (float64 inside) ------------------------------------------------------------------
// HiSilicon NNIE's logarithmic 8-bit format, as MQBench's NNIEFakeQuantize:
//   z  = round(16 * log2(data_max)) - 127
//   T+ = 2^((z - 16) / 16),  T- = 2^((z + 1 - 16) / 16)
//   x >  T+ :  2^((clamp(round(16 * log2(x))  - z, 0, 127) + z) / 16)
//   x < -T- : -2^((clamp(round(16 * log2(-x)) - z, 1, 127) + z) / 16)
//   else    :  0 (NaN stays NaN)

struct NnieScalars {
  double z, t_pos, t_neg;
  bool zero;     // data_max == 0: every output is 0
  bool invalid;  // data_max negative, NaN or inf (the CPU op raises; a device kernel gives NaN)
};

MQBENCH_HOST_DEVICE NnieScalars nnie_scalars(double data_max) {
  NnieScalars p{};
  p.invalid = !(data_max >= 0.0) || !dmath::isfinite(data_max);
  p.zero = data_max == 0.0;
  if (!p.invalid && !p.zero) {
    p.z = dmath::rint(16.0 * dmath::log2(data_max)) - 127.0;
    p.t_pos = dmath::exp2((p.z - 16.0) / 16.0);
    p.t_neg = dmath::exp2((p.z + 1.0 - 16.0) / 16.0);
  }
  return p;
}

MQBENCH_HOST_DEVICE double nnie_level(double v, double lo, double z) {
  const double e = std_min(std_max(dmath::rint(16.0 * dmath::log2(v)) - z, lo), 127.0);
  return dmath::exp2((e + z) / 16.0);
}

MQBENCH_HOST_DEVICE double nnie_forward(double x, const NnieScalars& p) {
  if (p.invalid) return static_cast<double>(NAN);
  if (p.zero) return 0.0;
  if (x > p.t_pos) return nnie_level(x, 0.0, p.z);
  if (x < -p.t_neg) return -nnie_level(-x, 1.0, p.z);
  return dmath::isnan(x) ? x : 0.0;
}

// ---- AdaRound (scalar; cpu/adaround_kernel.cpp has the formula) ------------------------------

constexpr double kAdaRoundGamma = -0.1;
constexpr double kAdaRoundZeta = 1.1;

template <typename T>
MQBENCH_HOST_DEVICE T adaround_sigmoid(T a) {
  return T(1) / (T(1) + dmath::exp(-a));
}

template <typename T>
MQBENCH_HOST_DEVICE T adaround_forward(T x, T a, T s, T z, T lo, T hi, bool hard) {
  T h;
  if (hard) {
    h = T(a >= T(0) ? 1 : 0);
  } else {
    h = std_min(std_max(adaround_sigmoid(a) * T(kAdaRoundZeta - kAdaRoundGamma) +
                            T(kAdaRoundGamma), T(0)),
                T(1));
  }
  const T v = dmath::floor(x / s) + h + z;
  return (std_min(std_max(v, lo), hi) - z) * s;
}

/// d alpha of one element (soft rounding).
template <typename T>
MQBENCH_HOST_DEVICE T adaround_grad(T dy, T x, T a, T s, T z, T lo, T hi) {
  const T sig = adaround_sigmoid(a);
  const T pre = sig * T(kAdaRoundZeta - kAdaRoundGamma) + T(kAdaRoundGamma);
  const T h = std_min(std_max(pre, T(0)), T(1));
  const T v = dmath::floor(x / s) + h + z;
  const bool pass = v >= lo && v <= hi && pre >= T(0) && pre <= T(1);
  return pass ? dy * s * T(kAdaRoundZeta - kAdaRoundGamma) * sig * (T(1) - sig) : T(0);
}

MQBENCH_FORMULA_NS_END
}  // namespace detail
}  // namespace ops
}  // namespace mqbench
