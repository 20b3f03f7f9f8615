#pragma once
// Block-scaled floating-point formats: OCP Microscaling MXFP8 (E4M3 elements), MXFP6 (E2M3 or
// E3M2 elements) and MXFP4 (E2M1 elements) with one shared E8M0 power-of-two scale per block,
// and NVIDIA's NVFP4 (E2M1 elements, one FP8 E4M3 scale per block of 16, times one FP32 scale
// per tensor). The per-block maths is written once here, on float, for the CPU kernel
// (ops/cpu/mx_kernel.cpp) and the CUDA kernel (ops/cuda/mx_kernel.cu), so the two cannot drift.
// Everything is computed in float32, as the references do (torchao's to_mx / nvfp4_quantize, the
// OCP spec's pseudo code).
//
// Note [MX and NVFP4 block formulas]
// Elements of a block: x_1..x_k (k = 32 for MX, 16 for NVFP4; a shorter last block behaves as if
// zero-padded). amax = max |x_i| (NaN if any x_i is NaN).
//
// MX (OCP MX spec v1.0, section 6.3, the "floor" scale; torchao ScaleCalculationMode.FLOOR):
//   e     = floor(log2(amax)) - emax_elem        (emax_elem: 8 for E4M3, 4 for E3M2, 2 for E2M3
//           and E2M1), read from amax's exponent field; amax = 0 or a float32 subnormal counts
//           as 2^-127;
//   e     = max(e, -127)                         (the smallest E8M0 scale);
//   X     = 2^e                                  (an E8M0 value; NaN when amax is NaN);
//   out_i = round_elem(clamp(x_i / X, -max_elem, max_elem)) * X
// where max_elem is 448 (E4M3FN), 28 (E3M2), 7.5 (E2M3) or 6 (E2M1) and round_elem rounds to
// the element grid, ties to even (subnormal elements included). An infinite x_i makes
// e = 128 - emax_elem; it saturates to max_elem * X, which overflows float32 to ±inf (for every
// element format), and the block's finite elements go to 0: inf stays inf, as in torchao. A
// NaN anywhere in a block makes the whole block NaN (the E8M0 NaN scale). An all-zero block
// gives zeros.
//
// NVFP4 (NVIDIA's two-level scaling; torchao's nvfp4_quantize with a per-tensor scale): with
// the tensor's amax A from an observer,
//   g     = A / (448 * 6)                        (FP32 per-tensor scale)
//   s     = round_e4m3(clamp((amax / 6) / g, 2^-6, 448))   (the block's E4M3 scale)
//   out_i = round_e2m1(clamp(x_i * ((1 / g) / s), -6, 6)) * (g * s)
// (each operation rounded to float32 in this order). A block whose amax exceeds A saturates at
// ±6 * g * s; an infinite x_i saturates likewise (to 6 * g * 448 = A); NaN makes the block NaN.
// A = 0 (calibrated on zeros) gives zeros (NaN for a NaN or infinite x).
//
// Gradient: straight-through (dx = dy), as torchao's and modelopt's fake quantization.

#include <cstdint>
#include <cstring>

#include "ops/common/device_math.h"

namespace mqbench {
namespace ops {
namespace detail {

/// The element format of fake_quantize_mx (its elem_dtype; parsed by mx_element in
/// ops/common/mx_layout.h): the structs below, by name.
enum class MxElement { kE4M3 = 0, kE2M1 = 1, kE2M3 = 2, kE3M2 = 3 };

MQBENCH_FORMULA_NS_BEGIN

MQBENCH_HOST_DEVICE uint32_t float_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t u;
  std::memcpy(&u, &v, sizeof(u));
  return u;
#endif
}

MQBENCH_HOST_DEVICE float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof(v));
  return v;
#endif
}

/// The element formats. kMbits mantissa bits, kEmin the exponent of the smallest normal value,
/// kEmax the exponent of the largest value, kMax the largest value (saturation bound).
struct E4M3 {
  static constexpr int kMbits = 3;
  static constexpr int kEmin = -6;
  static constexpr int kEmax = 8;
  static constexpr float kMax = 448.0f;
  static constexpr uint32_t kMaxBits = 0x43e00000u;  // 448 = 1.75 * 2^8
};
// FP6 (OCP MX spec v1.0, section 5.3.2): no infinities, no NaN; every code is a number.
struct E2M3 {  // exponent bias 1
  static constexpr int kMbits = 3;
  static constexpr int kEmin = 0;
  static constexpr int kEmax = 2;
  static constexpr float kMax = 7.5f;
  static constexpr uint32_t kMaxBits = 0x40f00000u;  // 7.5 = 1.875 * 2^2
};
struct E3M2 {  // exponent bias 3
  static constexpr int kMbits = 2;
  static constexpr int kEmin = -2;
  static constexpr int kEmax = 4;
  static constexpr float kMax = 28.0f;
  static constexpr uint32_t kMaxBits = 0x41e00000u;  // 28 = 1.75 * 2^4
};
struct E2M1 {
  static constexpr int kMbits = 1;
  static constexpr int kEmin = 0;
  static constexpr int kEmax = 2;
  static constexpr float kMax = 6.0f;
  static constexpr uint32_t kMaxBits = 0x40c00000u;  // 6 = 1.5 * 2^2
};

/// v rounded to the nearest value of format F, ties to even, saturated to ±F::kMax (v is clamped
/// before rounding, as the references clamp before their casts). NaN stays NaN.
///   normal range (|v| >= 2^kEmin): round the float32 mantissa to kMbits bits on the bit pattern
///     (add half an ulp of the target minus one, plus the kept mantissa's last bit: ties to even;
///     a carry moves into the exponent, which is the right answer);
///   subnormal range: (|v| + M) - M with M = 2^(kEmin - kMbits + 23), whose float32 ulp is the
///     target's subnormal step, so the addition itself rounds to that step, ties to even.
/// Both are computed and one is picked by comparing bit patterns (the order of non-negative
/// floats): integer selects, which the compiler vectorises (ops/cpu/mx_kernel.cpp is built with
/// -fno-trapping-math so that GCC if-converts them: CMakeLists.txt).
template <typename F>
MQBENCH_HOST_DEVICE float round_to_format(float v) {
  constexpr uint32_t kInf = 0x7f800000u;
  constexpr int kDrop = 23 - F::kMbits;
  constexpr uint32_t kMinNormal = static_cast<uint32_t>(F::kEmin + 127) << 23;
  constexpr uint32_t kMagic = static_cast<uint32_t>(F::kEmin - F::kMbits + 23 + 127) << 23;
  const uint32_t u = float_bits(v);
  const uint32_t sign = u & 0x80000000u;
  uint32_t a = u ^ sign;
  a = ((a > F::kMaxBits) & (a <= kInf)) ? F::kMaxBits : a;  // saturate (inf too); NaN kept
  uint32_t n = a + ((1u << (kDrop - 1)) - 1u) + ((a >> kDrop) & 1u);
  n &= ~((1u << kDrop) - 1u);
  const float magic = bits_float(kMagic);
  const uint32_t sub = float_bits((bits_float(a) + magic) - magic);
  uint32_t r = a < kMinNormal ? sub : n;
  r = a > kInf ? a : r;
  return bits_float(r | sign);
}

/// The bits of |v| (NaN payloads sort above +inf's 0x7f800000, so an unsigned max of these is
/// amax's bits, NaN included).
MQBENCH_HOST_DEVICE uint32_t abs_bits(float v) { return float_bits(v) & 0x7fffffffu; }

/// MX scale X = 2^e and its reciprocal (Note [MX and NVFP4 block formulas]), from the bits of the
/// block's amax. Both are exact powers of two, so x * inv equals x / X bit for bit.
struct BlockScale {
  float mul;    // what x is multiplied by before rounding
  float scale;  // what the rounded value is multiplied by
};

template <typename F>
MQBENCH_HOST_DEVICE BlockScale mx_block_scale(uint32_t amax_bits) {
  int e = static_cast<int>(amax_bits >> 23) - 127 - F::kEmax;
  e = e < -127 ? -127 : e;
  BlockScale b;
  // 2^-127 is a float32 subnormal (bit 22 set); every other E8M0 value is a normal float.
  b.scale = e == -127 ? bits_float(0x00400000u) : bits_float(static_cast<uint32_t>(e + 127) << 23);
  b.mul = bits_float(static_cast<uint32_t>(127 - e) << 23);
  if (amax_bits > 0x7f800000u) b.scale = bits_float(0x7fc00000u);  // NaN in the block
  return b;
}

/// NVFP4's per-tensor scale g = amax / (448 * 6).
MQBENCH_HOST_DEVICE float nvfp4_global_scale(float tensor_amax) {
  return tensor_amax / (E4M3::kMax * E2M1::kMax);
}

/// NVFP4's E4M3 block scale s from the block's amax and the per-tensor scale g (Note [MX and
/// NVFP4 block formulas]); 0 when g is 0 (calibrated on an all-zero tensor). The deploy passes
/// write it as the E4M3 scale initializer of a weight (src/deploy/block_formats.cpp).
MQBENCH_HOST_DEVICE float nvfp4_block_e4m3(float amax, float g) {
  if (g == 0.0f) return 0.0f;
  const float min_scale = bits_float(static_cast<uint32_t>(E4M3::kEmin + 127) << 23);
  float s = (amax / E2M1::kMax) / g;
  s = s < min_scale ? min_scale : s;  // NaN passes both comparisons unchanged
  return round_to_format<E4M3>(s);    // also saturates at 448
}

/// NVFP4's block multipliers from the block's amax and the per-tensor scale g.
MQBENCH_HOST_DEVICE BlockScale nvfp4_block_scale(float amax, float g) {
  BlockScale b;
  if (g == 0.0f) {  // calibrated on an all-zero tensor
    b.mul = 0.0f;
    b.scale = 0.0f;
    return b;
  }
  const float s = nvfp4_block_e4m3(amax, g);
  b.mul = (1.0f / g) / s;
  b.scale = g * s;
  return b;
}

/// One element: round(clamp(x * mul)) * scale.
template <typename F>
MQBENCH_HOST_DEVICE float block_quantize(float x, const BlockScale& b) {
  return round_to_format<F>(x * b.mul) * b.scale;
}

MQBENCH_FORMULA_NS_END
}  // namespace detail
}  // namespace ops
}  // namespace mqbench
