#pragma once
// The formulas of fake_quantize_per_token (ops/fake_quantize_per_token.cpp), written once for
// the CPU kernel's scalar and vector loops and the CUDA kernels (Note [One formula for scalar,
// vector and device] in device_math.h). They are compositions of the formulas every other op
// uses: the observers' qparams (qparams.h), affine fake quantization (affine_formula.h) and FP8
// rounding (fp8_formula.h).
//
// Note [Per-token fake quantization]
// Dynamic quantization of activations, one scale (and zero point) per row of the last axis,
// computed from that row at every call: what an observer followed by a per-channel fake
// quantizer would compute for a tensor whose channels are its rows.
//   mn, mx = min and max of the row, NaN skipped (a row of NaN only: no range)
//   int:     (s, z) = observer_qparams<float>(mn, mx, qmin, qmax, symmetric, zs, eps)
//            (Note [Observer qparams]: mn = min(mn, 0), mx = max(mx, 0); symmetric
//            s = max(max(-mn, mx) / ((qmax - qmin) / 2), eps), z = zs; affine
//            s = max((mx - mn) / (qmax - qmin), eps), z = clamp(qmin - rint(mn / s), qmin, qmax);
//            eps = float32's epsilon; a row with no range: s = 1, z = 0), with
//            zs = 0 for a signed range (qmin < 0) and (qmin + qmax + 1) / 2 for an unsigned one
//            (MQBench's symmetric quint8: 128 for [0, 255]);
//            y = (clamp(rint(x * inv) + z, qmin, qmax) - z) * s, inv = 1.0f / s
//            (Note [Zero point modes], integer zero point: the per-channel affine kernels');
//   fp8:     s = observer_qparams<float>(mn, mx, -max, max, true, 0, eps).scale
//            = max(amax / max, eps), max = 448 (E4M3FN) or 57344 (E5M2): the FP8 observers';
//            y = fp8_round(sat(x / s)) * s (Note [FP8 rounding]: a division, as the FP8 ops).
// The qparams are float32 whatever x's dtype (the observers' buffers); the element formula runs
// in the compute type: float32 for float32 / float16 / bfloat16 input, float64 for float64
// (x * double(inv), as the affine ops on float64). min and max of float64 data are rounded to
// float32 (the observers cast the data; rounding is monotonic, so the same values).
// A row of zeros gives zeros (s = eps). NaN elements give NaN and do not enter the range; a row
// of NaN only gives NaN. +-inf enter the range as +-FLT_MAX (the largest float32): the row gets
// a huge finite scale, its finite elements round to the zero point's level (0) and the
// infinities to the outermost levels (E5M2 keeps them infinite).
// Gradient: straight-through, dx = dy: every element lies inside its row's range by
// construction, so no clamp is active (with a symmetric range, an element at -amax of a signed
// grid may sit just outside the grid's lowest level: still passed through). The scale's
// dependence on x is not differentiated, as in every dynamic quantizer.

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <cstdint>
#include <limits>

#include "ops/common/affine_formula.h"
#include "ops/common/fp8_formula.h"
#include "ops/common/qparams.h"

namespace mqbench {
namespace ops {
namespace detail {

/// The element format of fake_quantize_per_token.
enum class TokenFormat : int { kInt = 0, kE4M3 = 1, kE5M2 = 2 };

/// The op's arguments, resolved once on the host (plain data: it crosses from the schema file
/// to the per-capability kernels and to the device).
struct TokenConfig {
  TokenFormat format = TokenFormat::kInt;
  int64_t quant_min = 0, quant_max = 0;
  bool symmetric = false;
  int64_t symmetric_zero_point = 0;
};

/// Checks x (float32 / float64 / float16 / bfloat16, at least one dimension), the format
/// ("int", "fp8_e4m3", "fp8_e5m2") and, for "int", the range (quant_min < quant_max, within
/// +-2^24); returns the resolved arguments or raises naming `op` and the offending value
/// (ops/fake_quantize_per_token.cpp).
TokenConfig per_token_config(const at::Tensor& x, int64_t quant_min, int64_t quant_max,
                             bool symmetric, c10::string_view format, const char* op);

MQBENCH_FORMULA_NS_BEGIN

/// The arguments with the FP8 format's constants.
struct TokenRule {
  TokenConfig c;
  Fp8Params fp8;
};

MQBENCH_HOST_DEVICE TokenRule token_rule(const TokenConfig& c) {
  return {c, fp8_params(c.format == TokenFormat::kE5M2 ? Fp8Format::kE5M2 : Fp8Format::kE4M3)};
}

/// The float32 scale and zero point of a row.
struct TokenQParams {
  float scale;
  float zero_point;
};

/// The qparams of a row whose min and max (NaN skipped) are mn and mx.
MQBENCH_HOST_DEVICE TokenQParams token_qparams(float mn, float mx, const TokenRule& r) {
  const float eps = 1.1920928955078125e-07f;  // torch.finfo(torch.float32).eps
  const float big = std::numeric_limits<float>::max();
  if (mn <= mx) {  // +-inf count as +-big: a finite range (a row with no number keeps none)
    mn = dmath::clamp(mn, -big, big);
    mx = dmath::clamp(mx, -big, big);
  }
  if (r.c.format == TokenFormat::kInt) {
    const auto q = observer_qparams<float>(mn, mx, r.c.quant_min, r.c.quant_max, r.c.symmetric,
                                           r.c.symmetric_zero_point, eps);
    return {q.scale, static_cast<float>(q.zero_point)};
  }
  const auto lim = static_cast<int64_t>(r.fp8.max_finite);
  return {observer_qparams<float>(mn, mx, -lim, lim, true, 0, eps).scale, 0.0f};
}

/// The range accumulation of a row: NaN never replaces the running min / max.
template <typename T>
MQBENCH_HOST_DEVICE T token_min(const T& running, const T& v) {
  return v < running ? v : running;
}
template <typename T>
MQBENCH_HOST_DEVICE T token_max(const T& running, const T& v) {
  return v > running ? v : running;
}

/// One element in the compute type C (float or double) with the row's qparams.
template <typename C>
MQBENCH_HOST_DEVICE C token_fake_quant(C x, const TokenQParams& q, const TokenRule& r) {
  if (r.c.format == TokenFormat::kInt) {
    return affine_fake_quant<C>(
        x, affine_scalars<C>(q.scale, q.zero_point, r.c.quant_min, r.c.quant_max));
  }
  // FP8: v = x / s rounded to float32 (torch's double -> float8 cast rounds to float32 first)
  const float v = static_cast<float>(x / static_cast<C>(q.scale));
  return static_cast<C>(fp8_round(fp8_scaled(v, r.fp8), r.fp8)) * static_cast<C>(q.scale);
}

MQBENCH_FORMULA_NS_END
}  // namespace detail
}  // namespace ops
}  // namespace mqbench
