// AdaRound soft/hard rounding, per tensor and per channel. Kernel: cpu/adaround_kernel.cpp;
// autograd: autograd/adaround_kernel.cpp.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/adaround_kernel.h"

namespace mqbench {
namespace ops {
namespace {

std::pair<at::Tensor, at::Tensor> prepare(const char* op, const at::Tensor& x,
                                          const at::Tensor& scale, const at::Tensor& zero_point,
                                          const at::Tensor& alpha,
                                          c10::optional<int64_t>& ch_axis, int64_t qmin,
                                          int64_t qmax) {
  detail::check_input(x, op);
  detail::check_quant_range(qmin, qmax, op);
  detail::check_like_x(x, alpha, "alpha", op);
  if (ch_axis) ch_axis = detail::wrap_channel_axis(*ch_axis, x, op);
  return detail::prepare_qparams(x, scale, zero_point, ch_axis, op);
}

at::Tensor adaround_forward(const char* op, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, const at::Tensor& alpha,
                            c10::optional<int64_t> ch_axis, int64_t qmin, int64_t qmax,
                            bool hard) {
  const auto qp = prepare(op, x, scale, zero_point, alpha, ch_axis, qmin, qmax);
  auto out = detail::empty_output_like(x);
  auto iter = detail::make_qparam_iter({out}, {x, alpha}, qp.first, qp.second, ch_axis);
  cpu::adaround_fwd_kernel(iter, qmin, qmax, hard);
  return out;
}

at::Tensor adaround_backward(const char* op, const at::Tensor& grad, const at::Tensor& x,
                             const at::Tensor& scale, const at::Tensor& zero_point,
                             const at::Tensor& alpha, c10::optional<int64_t> ch_axis,
                             int64_t qmin, int64_t qmax) {
  const auto qp = prepare(op, x, scale, zero_point, alpha, ch_axis, qmin, qmax);
  detail::check_grad(grad, x, op);
  auto d_alpha = detail::empty_output_like(alpha);
  auto iter = detail::make_qparam_iter({d_alpha}, {grad, x, alpha}, qp.first, qp.second, ch_axis);
  cpu::adaround_bwd_kernel(iter, qmin, qmax);
  return d_alpha;
}

at::Tensor per_tensor_cpu(const at::Tensor& x, const at::Tensor& scale,
                          const at::Tensor& zero_point, const at::Tensor& alpha, int64_t qmin,
                          int64_t qmax, bool hard) {
  return adaround_forward("fake_quantize_adaround_per_tensor", x, scale, zero_point, alpha,
                          c10::nullopt, qmin, qmax, hard);
}
at::Tensor per_tensor_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                   const at::Tensor& scale, const at::Tensor& zero_point,
                                   const at::Tensor& alpha, int64_t qmin, int64_t qmax) {
  return adaround_backward("_fake_quantize_adaround_per_tensor_backward", grad, x, scale,
                           zero_point, alpha, c10::nullopt, qmin, qmax);
}
at::Tensor per_channel_cpu(const at::Tensor& x, const at::Tensor& scale,
                           const at::Tensor& zero_point, const at::Tensor& alpha,
                           int64_t ch_axis, int64_t qmin, int64_t qmax, bool hard) {
  return adaround_forward("fake_quantize_adaround_per_channel", x, scale, zero_point, alpha,
                          ch_axis, qmin, qmax, hard);
}
at::Tensor per_channel_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                    const at::Tensor& scale, const at::Tensor& zero_point,
                                    const at::Tensor& alpha, int64_t ch_axis, int64_t qmin,
                                    int64_t qmax) {
  return adaround_backward("_fake_quantize_adaround_per_channel_backward", grad, x, scale,
                           zero_point, alpha, ch_axis, qmin, qmax);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_adaround_per_tensor(Tensor x, Tensor scale, Tensor zero_point, "
        "Tensor alpha, int quant_min, int quant_max, bool hard=False) -> Tensor");
  m.def("_fake_quantize_adaround_per_tensor_backward(Tensor grad, Tensor x, Tensor scale, "
        "Tensor zero_point, Tensor alpha, int quant_min, int quant_max) -> Tensor");
  m.def("fake_quantize_adaround_per_channel(Tensor x, Tensor scale, Tensor zero_point, "
        "Tensor alpha, int ch_axis, int quant_min, int quant_max, bool hard=False) -> Tensor");
  m.def("_fake_quantize_adaround_per_channel_backward(Tensor grad, Tensor x, Tensor scale, "
        "Tensor zero_point, Tensor alpha, int ch_axis, int quant_min, int quant_max) -> Tensor");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("fake_quantize_adaround_per_tensor", TORCH_FN(per_tensor_cpu));
  m.impl("_fake_quantize_adaround_per_tensor_backward", TORCH_FN(per_tensor_backward_cpu));
  m.impl("fake_quantize_adaround_per_channel", TORCH_FN(per_channel_cpu));
  m.impl("_fake_quantize_adaround_per_channel_backward", TORCH_FN(per_channel_backward_cpu));
}

at::Tensor fake_quantize_adaround_per_tensor(const at::Tensor& x, const at::Tensor& scale,
                                             const at::Tensor& zero_point,
                                             const at::Tensor& alpha, int64_t quant_min,
                                             int64_t quant_max, bool hard) {
  static auto op = detail::op_handle<decltype(fake_quantize_adaround_per_tensor)>(
      "mqbench::fake_quantize_adaround_per_tensor");
  return op.call(x, scale, zero_point, alpha, quant_min, quant_max, hard);
}

at::Tensor fake_quantize_adaround_per_channel(const at::Tensor& x, const at::Tensor& scale,
                                              const at::Tensor& zero_point,
                                              const at::Tensor& alpha, int64_t ch_axis,
                                              int64_t quant_min, int64_t quant_max, bool hard) {
  static auto op = detail::op_handle<decltype(fake_quantize_adaround_per_channel)>(
      "mqbench::fake_quantize_adaround_per_channel");
  return op.call(x, scale, zero_point, alpha, ch_axis, quant_min, quant_max, hard);
}

}  // namespace ops
}  // namespace mqbench
