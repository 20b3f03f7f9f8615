#pragma once
// Round-to-nearest on the integer weight grid of the LLM algorithms (src/ops/llm_gptq.cpp,
// src/ops/llm_awq.cpp), with ATen ops in float32, the same op sequence as the Python reference
// (python/mqbench/llm/_weights.py) so the two agree bit for bit on one machine:
//   qparams of a min/max observer (Note [Observer qparams] in ops/common/qparams.h)
//   q = (clamp(round(x * (1 / s)) + z, qmin, qmax) - z) * s          (torch's fake_quantize)

#include <ATen/ATen.h>

#include <limits>
#include <utility>

namespace mqbench {
namespace ops {
namespace llm {

/// The weight grid: [quant_min, quant_max], symmetric or affine, per tensor, per output channel
/// or per group_size input channels (0: no groups).
struct WeightGrid {
  int64_t quant_min;
  int64_t quant_max;
  bool symmetric;
  bool per_channel;
  int64_t group_size;
};

inline void check_grid(const WeightGrid& g, const char* op) {
  TORCH_CHECK(g.quant_min < g.quant_max, op, ": quant_min (", g.quant_min,
              ") must be < quant_max (", g.quant_max, ")");
  TORCH_CHECK(g.group_size >= 0, op, ": group_size must be >= 0 (0: none), got ", g.group_size);
  TORCH_CHECK(g.group_size == 0 || g.per_channel, op, ": group_size (", g.group_size,
              ") needs per_channel=true");
}

/// (scale, zero_point) from min / max of the same shape (float32).
inline std::pair<at::Tensor, at::Tensor> minmax_qparams(const at::Tensor& w_min,
                                                        const at::Tensor& w_max,
                                                        const WeightGrid& g) {
  const double eps = std::numeric_limits<float>::epsilon();
  const auto mn = at::clamp_max(w_min, 0.0);
  const auto mx = at::clamp_min(w_max, 0.0);
  if (g.symmetric) {
    auto scale = at::clamp_min(at::maximum(-mn, mx) / ((g.quant_max - g.quant_min) / 2.0), eps);
    auto zero = at::zeros_like(scale);
    return {scale, zero};
  }
  auto scale = at::clamp_min((mx - mn) / static_cast<double>(g.quant_max - g.quant_min), eps);
  auto zero = at::clamp(g.quant_min - at::round(mn / scale), g.quant_min, g.quant_max);
  return {scale, zero};
}

inline at::Tensor fake_quant(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero,
                             const WeightGrid& g) {
  const auto q =
      at::clamp(at::round(x * (1.0 / scale)) + zero, g.quant_min, g.quant_max);
  return (q - zero) * scale;
}

/// Round-to-nearest of a [out, in] float32 weight with its own min/max qparams.
inline at::Tensor rtn_weight(const at::Tensor& w, const WeightGrid& g) {
  const int64_t out_f = w.size(0), in_f = w.size(1);
  at::Tensor grouped;
  if (g.group_size > 0) {
    grouped = w.reshape({out_f, in_f / g.group_size, g.group_size});
  } else if (g.per_channel) {
    grouped = w.reshape({out_f, 1, in_f});
  } else {
    grouped = w.reshape({1, 1, -1});
  }
  auto qp = minmax_qparams(grouped.amin(-1), grouped.amax(-1), g);
  return fake_quant(grouped, qp.first.unsqueeze(-1), qp.second.unsqueeze(-1), g)
      .reshape({out_f, in_f});
}

}  // namespace llm
}  // namespace ops
}  // namespace mqbench
