#pragma once
// The per-element formula of FP8 fake quantization (E4M3FN and E5M2, OCP FP8 / torch's
// float8_e4m3fn and float8_e5m2), written once for the CPU kernels' scalar and vector loops and
// the CUDA kernels (Note [One formula for scalar, vector and device] in device_math.h). V is
// float or at::vec::Vectorized<float>: the rounding is done in float32, as torch's casts do
// (a float64 x / s is first rounded to float32, as torch's double -> float8 cast does).
//
// Note [FP8 rounding]
//   v = x / s                                            (the element in FP8 units)
//   E4M3FN: v = clamp(v, -448, 448)                      (saturate; +-inf -> +-448; NaN stays)
//   a = |v|, e = max(floor(log2 a), emin)                (emin = -6 E4M3, -14 E5M2)
//   step = 2^(e - m)                                     (m = 3 E4M3, 2 E5M2 mantissa bits)
//   q = sign(v) * rint(a / step) * step                  (round half to even; subnormals
//                                                         share emin's step)
//   E5M2: a >= 61440 (57344 + half a step) -> q = +-inf  (no saturation: it keeps infinities)
//   out = q * s
// This is torch's cast x/s -> .to(float8_*) -> float, bit for bit, except that E4M3FN
// saturates (torch's cast gives NaN at |v| >= 464; ONNX QuantizeLinear's saturate=1 and
// TensorRT saturate). The sign is kept on zero (-0 stays -0). 2^floor(log2 a) is a's exponent
// bits (a & 0x7f800000): 0 for float32 subnormals (then emin wins), inf for inf/NaN.
// a / step is exact (a power of two), and rint of a value below 2^23 is (r + 2^23) - 2^23 in
// round-to-nearest-even arithmetic, so every step is branch-free with &, |, +, *, / and select.
//
// Straight-through gradient: dx = dy where |v| <= max (the clamp's pass-through region; the
// same threshold for E5M2, whose larger values round to 57344 or overflow), else 0 (NaN: 0).
// Learnable scale (LSQ, Esser et al. 2020, with the FP8 grid in place of the integer one):
//   ds = dy * g * (q - v)        where |v| <= max
//   ds = dy * g * sign(v) * max  where |v| >  max (saturated)
//   ds = 0                       where v is NaN
// g is LSQ's grad_factor (1 / sqrt(numel * max) in MQBench's LSQ use).

#include <cstdint>
#include <cstring>
#include <string>

#include "ops/common/device_math.h"
#if defined(MQBENCH_CPU_CAPABILITY) && !defined(__CUDACC__)
#include <ATen/cpu/vec/vec.h>
#endif

namespace mqbench {
namespace ops {
namespace detail {

/// The two FP8 element formats; the value is the schema's `dtype` string's index.
enum class Fp8Format : int { kE4M3 = 0, kE5M2 = 1 };

/// "fp8_e4m3" / "fp8_e5m2" (QuantizeScheme's dtype names; "e4m3" / "e5m2" also) or raises
/// naming `op` (ops/fake_quantize_fp8.cpp).
Fp8Format fp8_format(const std::string& dtype, const char* op);

MQBENCH_FORMULA_NS_BEGIN

/// Bit helpers on float (host and device); the CPU's vector overloads follow below.
MQBENCH_HOST_DEVICE uint32_t fp8_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}
MQBENCH_HOST_DEVICE float fp8_from_bits(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}
/// 2^floor(log2 |a|) for normal a; 0 for zero and subnormals; inf for inf and NaN.
MQBENCH_HOST_DEVICE float fp8_exponent_part(float a) {
  return fp8_from_bits(fp8_bits(a) & 0x7f800000u);
}
/// |a| with the sign bit of s.
MQBENCH_HOST_DEVICE float fp8_with_sign(float a, float s) {
  return fp8_from_bits(fp8_bits(a) | (fp8_bits(s) & 0x80000000u));
}
MQBENCH_HOST_DEVICE float fp8_abs(float a) { return fp8_from_bits(fp8_bits(a) & 0x7fffffffu); }

struct Fp8Params {
  float max_finite;   // 448 or 57344
  float min_normal;   // 2^emin
  float inv_mant;     // 2^-m
  float overflow;     // E5M2: 61440 (|v| at or above rounds to inf); E4M3: inf (never)
  bool saturate;      // E4M3
};

MQBENCH_HOST_DEVICE Fp8Params fp8_params(Fp8Format f) {
  if (f == Fp8Format::kE4M3) return {448.0f, 0.015625f, 0.125f, fp8_from_bits(0x7f800000u), true};
  return {57344.0f, 6.103515625e-05f, 0.25f, 61440.0f, false};
}

#if defined(MQBENCH_CPU_CAPABILITY) && !defined(__CUDACC__)
// The vector overloads of the bit helpers, declared before the formulas that call them: the very
// bitwise operations on the lanes.
using VecF = at::vec::Vectorized<float>;
inline VecF fp8_lane_mask(uint32_t bits) { return VecF(fp8_from_bits(bits)); }
inline VecF fp8_exponent_part(const VecF& a) { return a & fp8_lane_mask(0x7f800000u); }
inline VecF fp8_with_sign(const VecF& a, const VecF& s) {
  return a | (s & fp8_lane_mask(0x80000000u));
}
inline VecF fp8_abs(const VecF& a) { return a & fp8_lane_mask(0x7fffffffu); }
#endif

/// The element v (in FP8 units, after saturation for E4M3) rounded to the FP8 grid.
template <typename V>
MQBENCH_HOST_DEVICE V fp8_round(const V& v, const Fp8Params& p) {
  const V a = fp8_abs(v);
  const V e = fp8_exponent_part(a);
  const V pow2 = dmath::select(e < V(p.min_normal), V(p.min_normal), e);
  const V step = pow2 * V(p.inv_mant);
  const V magic(8388608.0f);  // 2^23
  const V r = a / step;
  const V q = ((r + magic) - magic) * step;
  const V big(fp8_from_bits(0x7f800000u));
  return fp8_with_sign(dmath::select(a >= V(p.overflow), big, q), v);
}

/// v = x / s, saturated for E4M3 (NaN kept).
template <typename V>
MQBENCH_HOST_DEVICE V fp8_scaled(const V& x_over_s, const Fp8Params& p) {
  if (!p.saturate) return x_over_s;
  return dmath::clamp(x_over_s, V(-p.max_finite), V(p.max_finite));
}

/// out = fp8_round(sat(x / s)) * s, in float32.
template <typename V>
MQBENCH_HOST_DEVICE V fp8_fake_quant(const V& x_over_s, const V& s, const Fp8Params& p) {
  return fp8_round(fp8_scaled(x_over_s, p), p) * s;
}

/// The straight-through mask |v| <= max (false for NaN).
template <typename V>
MQBENCH_HOST_DEVICE auto fp8_in_range(const V& x_over_s, const Fp8Params& p) {
  return fp8_abs(x_over_s) <= V(p.max_finite);
}

/// LSQ's per-element contribution to d_scale (before the sum), see Note [FP8 rounding].
template <typename V>
MQBENCH_HOST_DEVICE V fp8_scale_grad(const V& dy, const V& x_over_s, const Fp8Params& p,
                                     const V& g) {
  const V q = fp8_round(fp8_scaled(x_over_s, p), p);
  const V sat = fp8_with_sign(V(p.max_finite), x_over_s);
  const V inside = q - x_over_s;
  const V zero(0.0f);
  const V d = dmath::select(fp8_in_range(x_over_s, p), inside,
                            dmath::select(x_over_s != x_over_s, zero, sat));
  return dy * g * d;
}

MQBENCH_FORMULA_NS_END
}  // namespace detail
}  // namespace ops
}  // namespace mqbench

