#pragma once
// C++ entry points of mqbench's fake-quantize ops. Each function calls the op through torch's
// dispatcher, so autograd, TorchScript and Python (`torch.ops.mqbench.<name>`) all run the same
// registered kernels. Shapes and dtypes: `x` is a float32 or float64 tensor of any shape and
// strides (on CUDA also float16 / bfloat16, computed in float32 and returned in x's dtype; the
// CPU ops reject those with a message to call x.float()); per-tensor `scale` and `zero_point`
// hold one element, per-channel ones x.size(ch_axis) elements. `scale` may have any floating
// dtype and is used in float32; `zero_point` any integer or floating dtype but bool. Formulas
// and gradients: docs/ops.md.
//
// Example:
//   auto x = torch::randn({8, 16, 3, 3}, torch::requires_grad());
//   auto s = torch::full({16}, 0.02), z = torch::zeros({16}, torch::kInt);
//   auto y = mqbench::ops::fake_quantize_per_channel_affine(x, s, z, 1, -128, 127);
//   y.sum().backward();  // straight-through gradient inside [qmin, qmax]

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

#include <string>

namespace mqbench {
namespace ops {

/// Fixed affine fake quantization, one scale/zero point for the whole tensor:
/// out = (clamp(round(x / s) + z, qmin, qmax) - z) * s, half-to-even rounding. STE gradient.
at::Tensor fake_quantize_per_tensor_affine(const at::Tensor& x, const at::Tensor& scale,
                                           const at::Tensor& zero_point, int64_t quant_min,
                                           int64_t quant_max);

/// Fixed affine fake quantization with one scale/zero point per slice along `ch_axis`.
at::Tensor fake_quantize_per_channel_affine(const at::Tensor& x, const at::Tensor& scale,
                                            const at::Tensor& zero_point, int64_t ch_axis,
                                            int64_t quant_min, int64_t quant_max);

/// LSQ / LSQ+ fake quantization: as the fixed op with z rounded and clamped; gradients reach
/// x (STE), scale and zero_point (LSQ formulas), the latter two multiplied by `grad_factor`.
at::Tensor fake_quantize_learnable_per_tensor_affine(const at::Tensor& x, const at::Tensor& scale,
                                                     const at::Tensor& zero_point,
                                                     int64_t quant_min, int64_t quant_max,
                                                     double grad_factor);

/// Per-channel LSQ / LSQ+ fake quantization.
at::Tensor fake_quantize_learnable_per_channel_affine(const at::Tensor& x,
                                                      const at::Tensor& scale,
                                                      const at::Tensor& zero_point,
                                                      int64_t ch_axis, int64_t quant_min,
                                                      int64_t quant_max, double grad_factor);

/// PACT (Choi et al. 2018): clip x to [n_alpha, alpha], then fixed per-tensor fake
/// quantization. Gradients reach x, alpha and n_alpha. Pass n_alpha = -alpha for the symmetric
/// variant, or -inf for no lower clip.
at::Tensor fake_quantize_pact(const at::Tensor& x, const at::Tensor& alpha,
                              const at::Tensor& n_alpha, const at::Tensor& scale,
                              const at::Tensor& zero_point, int64_t quant_min, int64_t quant_max);

/// DoReFa (Zhou et al. 2016) weight transform: tanh(x) / (max|tanh(x)| + 1e-5).
at::Tensor dorefa_normalize(const at::Tensor& x);

/// DSQ (Gong et al. 2019), differentiable soft quantization with temperature `alpha`.
at::Tensor fake_quantize_dsq_per_tensor(const at::Tensor& x, const at::Tensor& scale,
                                        const at::Tensor& zero_point, int64_t quant_min,
                                        int64_t quant_max, double alpha);
at::Tensor fake_quantize_dsq_per_channel(const at::Tensor& x, const at::Tensor& scale,
                                         const at::Tensor& zero_point, int64_t ch_axis,
                                         int64_t quant_min, int64_t quant_max, double alpha);

/// TQT (Jain et al. 2020): power-of-two step 2^ceil(log2 s); `mth` 3 rounds half to even,
/// `mth` 2 rounds negative ties up (Vitis). Gradient to scale through the log2 threshold.
at::Tensor fake_quantize_tqt(const at::Tensor& x, const at::Tensor& scale,
                             const at::Tensor& zero_point, int64_t quant_min, int64_t quant_max,
                             int64_t mth);

/// NNIE logarithmic fake quantization from the running absolute maximum `data_max`.
at::Tensor fake_quantize_nnie(const at::Tensor& x, const at::Tensor& data_max);

/// AdaRound (Nagel et al. 2020): out = (clamp(floor(x/s) + h(alpha) + z, qmin, qmax) - z) * s,
/// h the rectified sigmoid (soft) or alpha >= 0 (`hard`). Gradient reaches alpha only.
at::Tensor fake_quantize_adaround_per_tensor(const at::Tensor& x, const at::Tensor& scale,
                                             const at::Tensor& zero_point,
                                             const at::Tensor& alpha, int64_t quant_min,
                                             int64_t quant_max, bool hard);
at::Tensor fake_quantize_adaround_per_channel(const at::Tensor& x, const at::Tensor& scale,
                                              const at::Tensor& zero_point,
                                              const at::Tensor& alpha, int64_t ch_axis,
                                              int64_t quant_min, int64_t quant_max, bool hard);

/// QDrop (Wei et al. 2022): each element is fake-quantized (LSQ arithmetic, gradient to scale,
/// grad factor 1) with probability `prob` and left as x otherwise. Draws from torch's default
/// generator, so torch::manual_seed makes it reproducible.
at::Tensor fake_quantize_qdrop_per_tensor(const at::Tensor& x, const at::Tensor& scale,
                                          const at::Tensor& zero_point, int64_t quant_min,
                                          int64_t quant_max, double prob);
at::Tensor fake_quantize_qdrop_per_channel(const at::Tensor& x, const at::Tensor& scale,
                                           const at::Tensor& zero_point, int64_t ch_axis,
                                           int64_t quant_min, int64_t quant_max, double prob);

/// FP8 fake quantization (docs/formats.md): out = fp8(x / s) * s with `dtype` "fp8_e4m3"
/// (E4M3FN: saturates at +-448, no infinities) or "fp8_e5m2" (keeps infinities), rounding half
/// to even as torch's float8 casts. `ch_axis` empty: one scale; else x.size(ch_axis) scales.
/// STE gradient where |x / s| <= the format's largest finite value.
///   auto y = mqbench::ops::fake_quantize_fp8(x, torch::full({1}, 0.01), {}, "fp8_e4m3");
at::Tensor fake_quantize_fp8(const at::Tensor& x, const at::Tensor& scale,
                             c10::optional<int64_t> ch_axis, const std::string& dtype);

/// FP8 fake quantization with a learnable scale (LSQ's gradient on the FP8 grid, multiplied by
/// `grad_factor`); same forward as fake_quantize_fp8.
at::Tensor fake_quantize_learnable_fp8(const at::Tensor& x, const at::Tensor& scale,
                                       c10::optional<int64_t> ch_axis, const std::string& dtype,
                                       double grad_factor);

/// Group-wise affine fake quantization: one scale / zero point per `group_size` consecutive
/// elements along `axis` (a weight's input channels: axis 1). scale and zero_point have x's
/// shape with size(axis) / group_size at `axis` (or as many elements, any shape); group_size
/// must divide x.size(axis). Per group, the formula and STE gradient of the per-channel op.
///   auto w = torch::randn({64, 256});                          // Linear weight, INT4, g = 128
///   auto s = torch::full({64, 2}, 0.05), z = torch::zeros({64, 2}, torch::kInt);
///   auto y = mqbench::ops::fake_quantize_per_group_affine(w, s, z, 1, 128, -8, 7);
at::Tensor fake_quantize_per_group_affine(const at::Tensor& x, const at::Tensor& scale,
                                          const at::Tensor& zero_point, int64_t axis,
                                          int64_t group_size, int64_t quant_min,
                                          int64_t quant_max);

/// Group-wise LSQ / LSQ+: the learnable per-channel op per group (gradients reduced per group).
at::Tensor fake_quantize_learnable_per_group_affine(const at::Tensor& x, const at::Tensor& scale,
                                                    const at::Tensor& zero_point, int64_t axis,
                                                    int64_t group_size, int64_t quant_min,
                                                    int64_t quant_max, double grad_factor);

/// Dynamic per-token fake quantization of activations: one scale (and zero point) per row of
/// the last axis, computed from that row at every call (docs/ops.md, "Per-token fake
/// quantization"). x: float32, float64, float16 or bfloat16 (computed in float32, float64 for
/// float64), any shape with at least one dimension, any strides; the output is contiguous, in
/// x's dtype.
///   format "int": the observers' qparams from the row's min / max (symmetric: amax /
///     ((qmax - qmin) / 2), zero point 0 for a signed range, (qmin + qmax + 1) / 2 for an
///     unsigned one; affine: (max - min) / (qmax - qmin)), then the per-channel affine formula
///     (x * (1.0f / s), round half to even); quant_min < quant_max.
///   format "fp8_e4m3" / "fp8_e5m2": s = max(amax / 448 (57344), eps), then the FP8 formula of
///     fake_quantize_fp8 (x / s); quant_min, quant_max and symmetric are ignored.
/// Gradient: straight-through (dx = dy); the scale's dependence on x is not differentiated.
///   auto y = mqbench::ops::fake_quantize_per_token(h, -8, 7, true);             // INT4 sym
///   auto z = mqbench::ops::fake_quantize_per_token(h, 0, 0, true, "fp8_e4m3");  // FP8
at::Tensor fake_quantize_per_token(const at::Tensor& x, int64_t quant_min, int64_t quant_max,
                                   bool symmetric, c10::string_view format = "int");

/// 2^round(log2 scale) with a straight-through gradient (MQBench's pot_quantization).
at::Tensor pot_quantization(const at::Tensor& scale);

}  // namespace ops
}  // namespace mqbench
