#pragma once
// C++ entry points of the LLM post-training ops (src/ops/llm_gptq.cpp, src/ops/llm_awq.cpp,
// src/ops/llm_signround.cpp): GPTQ's Hessian accumulation and column loop, AWQ's scale search,
// SignRound's weight quantizer and its backward. Composite ops in float32:
// they run on any device ATen runs on; not differentiable (calibration-time maths).
// The Python driver is mqbench.llm (docs/llm.md).
//
// Example (GPTQ of one Linear, INT4 with one scale per 128 inputs):
//   auto H = at::zeros({in, in});
//   int64_t n = 0;
//   for (const auto& x : inputs) {
//     H = mqbench::ops::gptq_hessian_update(H, x, n);
//     n += x.size(0);
//   }
//   auto [q, scale, zero, damp] = mqbench::ops::gptq_quantize_weight(w, H, -8, 7, true, true, 128);

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <tuple>

namespace mqbench {
namespace ops {

/// H of n_seen tokens -> H of n_seen + x.size(0) tokens, H = 2/N X^T X; x is [tokens, in].
at::Tensor gptq_hessian_update(const at::Tensor& H, const at::Tensor& x, int64_t n_seen);

/// The same in H's own buffer (float32 and contiguous: no second [in, in] matrix); returns H.
at::Tensor& gptq_hessian_update_(at::Tensor& H, const at::Tensor& x, int64_t n_seen);

/// GPTQ of a [out, in] weight with its [in, in] Hessian on the integer grid [quant_min,
/// quant_max] (symmetric or affine; per tensor, per channel, or group_size > 0 input channels).
/// Returns (dequantized weight [out, in], scale, zero_point ([out or 1, groups]), the relative
/// damping used: damp, raised tenfold with a warning while H is not positive definite).
std::tuple<at::Tensor, at::Tensor, at::Tensor, double> gptq_quantize_weight(
    const at::Tensor& weight, const at::Tensor& hessian, int64_t quant_min, int64_t quant_max,
    bool symmetric, bool per_channel, int64_t group_size, int64_t block_size = 128,
    double damp = 0.01, bool act_order = false, c10::string_view name = "layer");

/// gptq_quantize_weight with `hessian` as its work space, for the caller's last use of it: the
/// same results, one [in, in] buffer fewer on the CPU (a float contiguous Hessian); what
/// `hessian` holds afterwards is unspecified.
std::tuple<at::Tensor, at::Tensor, at::Tensor, double> gptq_quantize_weight_(
    const at::Tensor& weight, at::Tensor& hessian, int64_t quant_min, int64_t quant_max,
    bool symmetric, bool per_channel, int64_t group_size, int64_t block_size = 128,
    double damp = 0.01, bool act_order = false, c10::string_view name = "layer");

/// AWQ's scale search for the Linears `weights` ([out_l, in]) reading x ([tokens, in]).
/// Returns (best scale [in], losses [grid + 1]; the last is "no scaling").
std::tuple<at::Tensor, at::Tensor> awq_search_scale(const at::Tensor& x, at::TensorList weights,
                                                    const at::Tensor& x_mean,
                                                    const at::Tensor& w_mean, int64_t grid,
                                                    int64_t quant_min, int64_t quant_max,
                                                    bool symmetric, bool per_channel,
                                                    int64_t group_size);

/// SignRound's quantized weight [rows, groups, k] from the weight w, its learned offsets v (both
/// [rows, groups, k]) and each group's range factors lo, hi and min / max w_min, w_max ([rows,
/// groups]), on the integer grid [quant_min, quant_max] (src/ops/llm_signround.cpp).
at::Tensor signround_quantize(const at::Tensor& w, const at::Tensor& v, const at::Tensor& lo,
                              const at::Tensor& hi, const at::Tensor& w_min,
                              const at::Tensor& w_max, int64_t quant_min, int64_t quant_max,
                              bool symmetric);

/// The gradients (dL/dv, dL/dlo, dL/dhi) of signround_quantize from grad = dL/dQ, roundings
/// passed straight through (Note [SignRound's backward]).
std::tuple<at::Tensor, at::Tensor, at::Tensor> signround_quantize_backward(
    const at::Tensor& grad, const at::Tensor& w, const at::Tensor& v, const at::Tensor& lo,
    const at::Tensor& hi, const at::Tensor& w_min, const at::Tensor& w_max, int64_t quant_min,
    int64_t quant_max, bool symmetric);

}  // namespace ops
}  // namespace mqbench
