// DSQ soft quantization, per tensor and per channel. Kernel: cpu/dsq_kernel.cpp; autograd:
// autograd/dsq_kernel.cpp.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/kernels.h"

namespace mqbench {
namespace ops {
namespace {

std::pair<at::Tensor, at::Tensor> prepare(const char* op, const at::Tensor& x,
                                          const at::Tensor& scale, const at::Tensor& zero_point,
                                          c10::optional<int64_t>& ch_axis, int64_t qmin,
                                          int64_t qmax, double alpha) {
  detail::check_input(x, op);
  detail::check_quant_range(qmin, qmax, op);
  TORCH_CHECK(alpha > 0.0 && alpha < 1.0, op, ": alpha must be in (0, 1), got ", alpha);
  if (ch_axis) ch_axis = detail::wrap_channel_axis(*ch_axis, x, op);
  return detail::prepare_qparams(x, scale, zero_point, ch_axis, op);
}

at::Tensor dsq_forward(const char* op, const at::Tensor& x, const at::Tensor& scale,
                       const at::Tensor& zero_point, c10::optional<int64_t> ch_axis,
                       int64_t qmin, int64_t qmax, double alpha) {
  const auto qp = prepare(op, x, scale, zero_point, ch_axis, qmin, qmax, alpha);
  auto out = detail::empty_output_like(x);
  auto iter = detail::make_qparam_iter({out}, {x}, qp.first, qp.second, ch_axis);
  cpu::dsq_fwd_stub.get()(iter, qmin, qmax, alpha);
  return out;
}

at::Tensor dsq_backward(const char* op, const at::Tensor& grad, const at::Tensor& x,
                        const at::Tensor& scale, const at::Tensor& zero_point,
                        c10::optional<int64_t> ch_axis, int64_t qmin, int64_t qmax,
                        double alpha) {
  const auto qp = prepare(op, x, scale, zero_point, ch_axis, qmin, qmax, alpha);
  detail::check_grad(grad, x, op);
  auto dx = detail::empty_output_like(x);
  auto iter = detail::make_qparam_iter({dx}, {grad, x}, qp.first, qp.second, ch_axis);
  cpu::dsq_bwd_stub.get()(iter, qmin, qmax, alpha);
  return dx;
}

at::Tensor per_tensor_cpu(const at::Tensor& x, const at::Tensor& scale,
                          const at::Tensor& zero_point, int64_t qmin, int64_t qmax,
                          double alpha) {
  return dsq_forward("fake_quantize_dsq_per_tensor", x, scale, zero_point, c10::nullopt, qmin,
                     qmax, alpha);
}
at::Tensor per_tensor_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                   const at::Tensor& scale, const at::Tensor& zero_point,
                                   int64_t qmin, int64_t qmax, double alpha) {
  return dsq_backward("_fake_quantize_dsq_per_tensor_backward", grad, x, scale, zero_point,
                      c10::nullopt, qmin, qmax, alpha);
}
at::Tensor per_channel_cpu(const at::Tensor& x, const at::Tensor& scale,
                           const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin,
                           int64_t qmax, double alpha) {
  return dsq_forward("fake_quantize_dsq_per_channel", x, scale, zero_point, ch_axis, qmin, qmax,
                     alpha);
}
at::Tensor per_channel_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                    const at::Tensor& scale, const at::Tensor& zero_point,
                                    int64_t ch_axis, int64_t qmin, int64_t qmax, double alpha) {
  return dsq_backward("_fake_quantize_dsq_per_channel_backward", grad, x, scale, zero_point,
                      ch_axis, qmin, qmax, alpha);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_dsq_per_tensor(Tensor x, Tensor scale, Tensor zero_point, "
        "int quant_min, int quant_max, float alpha) -> Tensor");
  m.def("_fake_quantize_dsq_per_tensor_backward(Tensor grad, Tensor x, Tensor scale, "
        "Tensor zero_point, int quant_min, int quant_max, float alpha) -> Tensor");
  m.def("fake_quantize_dsq_per_channel(Tensor x, Tensor scale, Tensor zero_point, int ch_axis, "
        "int quant_min, int quant_max, float alpha) -> Tensor");
  m.def("_fake_quantize_dsq_per_channel_backward(Tensor grad, Tensor x, Tensor scale, "
        "Tensor zero_point, int ch_axis, int quant_min, int quant_max, float alpha) -> Tensor");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("fake_quantize_dsq_per_tensor", TORCH_FN(per_tensor_cpu));
  m.impl("_fake_quantize_dsq_per_tensor_backward", TORCH_FN(per_tensor_backward_cpu));
  m.impl("fake_quantize_dsq_per_channel", TORCH_FN(per_channel_cpu));
  m.impl("_fake_quantize_dsq_per_channel_backward", TORCH_FN(per_channel_backward_cpu));
}

at::Tensor fake_quantize_dsq_per_tensor(const at::Tensor& x, const at::Tensor& scale,
                                        const at::Tensor& zero_point, int64_t quant_min,
                                        int64_t quant_max, double alpha) {
  static auto op = detail::op_handle<decltype(fake_quantize_dsq_per_tensor)>(
      "mqbench::fake_quantize_dsq_per_tensor");
  return op.call(x, scale, zero_point, quant_min, quant_max, alpha);
}

at::Tensor fake_quantize_dsq_per_channel(const at::Tensor& x, const at::Tensor& scale,
                                         const at::Tensor& zero_point, int64_t ch_axis,
                                         int64_t quant_min, int64_t quant_max, double alpha) {
  static auto op = detail::op_handle<decltype(fake_quantize_dsq_per_channel)>(
      "mqbench::fake_quantize_dsq_per_channel");
  return op.call(x, scale, zero_point, ch_axis, quant_min, quant_max, alpha);
}

}  // namespace ops
}  // namespace mqbench
