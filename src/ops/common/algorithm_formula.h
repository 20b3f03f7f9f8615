#pragma once
// Per-element formulas of DSQ, TQT, PACT, NNIE and AdaRound for the CUDA kernels, compiled for
// the host and the device (see ops/common/affine_formula.h for why). Each restates the scalar
// path of the CPU kernel named beside it, in the same order and precision; docs/ops.md has the
// mathematics.

#include "ops/common/affine_formula.h"

namespace mqbench {
namespace ops {
namespace detail {

using dmath::std_max;
using dmath::std_min;

// ---- DSQ (cpu/dsq_kernel.cpp) --------------------------------------------------------------

template <typename T>
struct DsqScalars {
  T s, z, lo, hi, ks, k;
};

/// MQBench's k_s = 1 / (1 - alpha) and k = ln((k_s + 1) / (k_s - 1)), in double (computed once
/// per call on the host by the CUDA op).
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

template <typename T>
MQBENCH_HOST_DEVICE T dsq_forward(T x, const DsqScalars<T>& p) {
  const T u = std_min(std_max(x / p.s + p.z, p.lo), p.hi);
  const T f = dmath::floor(u);
  const T phi = f + T(0.5) * p.ks * dmath::tanh(p.k * (u - f - T(0.5))) + T(0.5);
  return (dmath::rint(phi) - p.z) * p.s;
}

template <typename T>
MQBENCH_HOST_DEVICE T dsq_grad(T dy, T x, const DsqScalars<T>& p) {
  const T v = x / p.s + p.z;
  if (!(v >= p.lo && v <= p.hi)) return T(0);
  const T th = dmath::tanh(p.k * (v - dmath::floor(v) - T(0.5)));
  return dy * T(0.5) * p.ks * p.k * (T(1) - th * th);
}

// ---- TQT (cpu/tqt_kernel.cpp) ----------------------------------------------------------------

template <typename T>
struct TqtScalars {
  T s, sp, inv_sp, z, lo, hi, ratio;
};

template <typename T>
MQBENCH_HOST_DEVICE TqtScalars<T> tqt_scalars(float s, float z, long long qmin, long long qmax) {
  const float e = s < 3.0517578125e-05f /* 2^-15 */ ? 0.f : dmath::floor(dmath::log2(1.0f / s));
  const float sp = dmath::exp2(-e);
  return {static_cast<T>(s), static_cast<T>(sp), static_cast<T>(dmath::exp2(e)),
          static_cast<T>(z), static_cast<T>(qmin), static_cast<T>(qmax),
          static_cast<T>(sp) / static_cast<T>(s)};
}

/// mth 3 rounds half to even; mth 2 rounds negative ties up.
template <typename T>
MQBENCH_HOST_DEVICE T tqt_round(T t, long long mth) {
  if (mth == 2 && t < T(0) && t - dmath::floor(t) == T(0.5)) return dmath::ceil(t);
  return dmath::rint(t);
}

template <typename T>
MQBENCH_HOST_DEVICE T tqt_forward(T x, const TqtScalars<T>& p, long long mth) {
  const T r = tqt_round(x * p.inv_sp, mth) + p.z;
  return (std_min(std_max(r, p.lo), p.hi) - p.z) * p.sp;
}

/// Returns dx; ds is the element's share of the scale gradient.
template <typename T>
MQBENCH_HOST_DEVICE T tqt_grad(T dy, T x, const TqtScalars<T>& p, long long mth, T& ds) {
  const T t = x * p.inv_sp;
  const T r = tqt_round(t, mth) + p.z;
  if (r < p.lo) {
    ds = dy * p.ratio * (p.lo - p.z);
  } else if (r > p.hi) {
    ds = dy * p.ratio * (p.hi - p.z);
  } else {
    ds = dy * p.ratio * (r - p.z - t);
  }
  const T q = dmath::rint(x / p.s) + p.z;
  return (q >= p.lo && q <= p.hi) ? dy : T(0);
}

// ---- PACT (cpu/pact_kernel.cpp; integer zero-point formula) ----------------------------------

template <typename T>
MQBENCH_HOST_DEVICE T pact_forward(T x, T lower, T upper, const AffineScalars<T>& p) {
  const T c = std_min(std_max(x, lower), upper);
  return (std_min(std_max(affine_quant(c, p), p.lo), p.hi) - p.z) * p.s;
}

/// Returns dx; d_upper / d_lower are the element's shares of the clip gradients.
template <typename T>
MQBENCH_HOST_DEVICE T pact_grad(T dy, T x, T lower, T upper, const AffineScalars<T>& p,
                                T& d_upper, T& d_lower) {
  d_upper = d_lower = T(0);
  if (x > upper) {
    d_upper = affine_in_range(upper, p) ? dy : T(0);
    return T(0);
  }
  if (x < lower) {
    d_lower = affine_in_range(lower, p) ? dy : T(0);
    return T(0);
  }
  return affine_in_range(x, p) ? dy : T(0);
}

// ---- NNIE (cpu/nnie_kernel.cpp; float64) -------------------------------------------------------

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

// ---- AdaRound (cpu/adaround_kernel.cpp) ----------------------------------------------------------

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

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
