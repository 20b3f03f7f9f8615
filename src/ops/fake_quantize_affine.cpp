// Fixed and learnable (LSQ / LSQ+) affine fake quantization: schemas, CPU implementations and
// the C++ entry points of include/mqbench/ops/fake_quantize_ops.h. Autograd: autograd/affine_kernel.cpp.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/kernels.h"

namespace mqbench {
namespace ops {

namespace detail {
namespace {

cpu::ZeroPointMode fixed_zero_point_mode(const at::Tensor& zero_point) {
  return at::isFloatingType(zero_point.scalar_type()) ? cpu::ZeroPointMode::kFloat
                                                      : cpu::ZeroPointMode::kInteger;
}

at::Tensor affine_forward(const char* op, const at::Tensor& x, const at::Tensor& scale,
                          const at::Tensor& zero_point, c10::optional<int64_t> ch_axis,
                          int64_t quant_min, int64_t quant_max, cpu::ZeroPointMode mode) {
  check_input(x, op);
  check_quant_range(quant_min, quant_max, op);
  if (ch_axis) ch_axis = wrap_channel_axis(*ch_axis, x, op);
  const auto qp = prepare_qparams(x, scale, zero_point, ch_axis, op);
  auto out = empty_output_like(x);
  auto iter = make_qparam_iter({out}, {x}, qp.first, qp.second, ch_axis);
  cpu::affine_fwd_stub.get()(iter, quant_min, quant_max, mode);
  return out;
}

at::Tensor affine_backward(const char* op, const at::Tensor& grad, const at::Tensor& x,
                           const at::Tensor& scale, const at::Tensor& zero_point,
                           c10::optional<int64_t> ch_axis, int64_t quant_min, int64_t quant_max,
                           cpu::ZeroPointMode mode) {
  check_input(x, op);
  check_grad(grad, x, op);
  check_quant_range(quant_min, quant_max, op);
  if (ch_axis) ch_axis = wrap_channel_axis(*ch_axis, x, op);
  const auto qp = prepare_qparams(x, scale, zero_point, ch_axis, op);
  auto dx = empty_output_like(x);
  auto iter = make_qparam_iter({dx}, {grad, x}, qp.first, qp.second, ch_axis);
  cpu::affine_bwd_stub.get()(iter, quant_min, quant_max, mode);
  return dx;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> learnable_backward(
    const char* op, const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale,
    const at::Tensor& zero_point, c10::optional<int64_t> ch_axis, int64_t quant_min,
    int64_t quant_max, double grad_factor) {
  check_input(x, op);
  check_grad(grad, x, op);
  check_quant_range(quant_min, quant_max, op);
  if (ch_axis) ch_axis = wrap_channel_axis(*ch_axis, x, op);
  const auto qp = prepare_qparams(x, scale, zero_point, ch_axis, op);
  const int64_t channels = qp.first.numel();
  auto dx = empty_output_like(x);
  cpu::ChannelAccumulators acc(channels);
  auto iter = make_qparam_iter({dx}, {grad, x}, qp.first, qp.second, ch_axis);
  cpu::learnable_bwd_stub.get()(iter, quant_min, quant_max, grad_factor,
                                static_cast<const char*>(qp.first.data_ptr()), &acc);
  std::vector<double> d_scale(channels), d_zero_point(channels);
  acc.reduce(d_scale.data(), d_zero_point.data());
  return {dx, sums_like(d_scale.data(), scale), sums_like(d_zero_point.data(), zero_point)};
}

}  // namespace
}  // namespace detail

namespace {

using detail::affine_backward;
using detail::affine_forward;
using detail::fixed_zero_point_mode;
using detail::learnable_backward;
using cpu::ZeroPointMode;

at::Tensor per_tensor_cpu(const at::Tensor& x, const at::Tensor& scale,
                          const at::Tensor& zero_point, int64_t qmin, int64_t qmax) {
  return affine_forward("fake_quantize_per_tensor_affine", x, scale, zero_point, c10::nullopt,
                        qmin, qmax, fixed_zero_point_mode(zero_point));
}

at::Tensor per_tensor_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                   const at::Tensor& scale, const at::Tensor& zero_point,
                                   int64_t qmin, int64_t qmax) {
  return affine_backward("_fake_quantize_per_tensor_affine_backward", grad, x, scale,
                         zero_point, c10::nullopt, qmin, qmax, fixed_zero_point_mode(zero_point));
}

at::Tensor per_channel_cpu(const at::Tensor& x, const at::Tensor& scale,
                           const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin,
                           int64_t qmax) {
  return affine_forward("fake_quantize_per_channel_affine", x, scale, zero_point, ch_axis, qmin,
                        qmax, fixed_zero_point_mode(zero_point));
}

at::Tensor per_channel_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                    const at::Tensor& scale, const at::Tensor& zero_point,
                                    int64_t ch_axis, int64_t qmin, int64_t qmax) {
  return affine_backward("_fake_quantize_per_channel_affine_backward", grad, x, scale,
                         zero_point, ch_axis, qmin, qmax, fixed_zero_point_mode(zero_point));
}

at::Tensor learnable_per_tensor_cpu(const at::Tensor& x, const at::Tensor& scale,
                                    const at::Tensor& zero_point, int64_t qmin, int64_t qmax,
                                    double /*grad_factor*/) {
  return affine_forward("fake_quantize_learnable_per_tensor_affine", x, scale, zero_point,
                        c10::nullopt, qmin, qmax, ZeroPointMode::kLearnable);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> learnable_per_tensor_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale,
    const at::Tensor& zero_point, int64_t qmin, int64_t qmax, double grad_factor) {
  return learnable_backward("_fake_quantize_learnable_per_tensor_affine_backward", grad, x,
                            scale, zero_point, c10::nullopt, qmin, qmax, grad_factor);
}

at::Tensor learnable_per_channel_cpu(const at::Tensor& x, const at::Tensor& scale,
                                     const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin,
                                     int64_t qmax, double /*grad_factor*/) {
  return affine_forward("fake_quantize_learnable_per_channel_affine", x, scale, zero_point,
                        ch_axis, qmin, qmax, ZeroPointMode::kLearnable);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> learnable_per_channel_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale,
    const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin, int64_t qmax,
    double grad_factor) {
  return learnable_backward("_fake_quantize_learnable_per_channel_affine_backward", grad, x,
                            scale, zero_point, ch_axis, qmin, qmax, grad_factor);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_per_tensor_affine(Tensor x, Tensor scale, Tensor zero_point, "
        "int quant_min, int quant_max) -> Tensor");
  m.def("_fake_quantize_per_tensor_affine_backward(Tensor grad, Tensor x, Tensor scale, "
        "Tensor zero_point, int quant_min, int quant_max) -> Tensor");
  m.def("fake_quantize_per_channel_affine(Tensor x, Tensor scale, Tensor zero_point, "
        "int ch_axis, int quant_min, int quant_max) -> Tensor");
  m.def("_fake_quantize_per_channel_affine_backward(Tensor grad, Tensor x, Tensor scale, "
        "Tensor zero_point, int ch_axis, int quant_min, int quant_max) -> Tensor");
  m.def("fake_quantize_learnable_per_tensor_affine(Tensor x, Tensor scale, Tensor zero_point, "
        "int quant_min, int quant_max, float grad_factor) -> Tensor");
  m.def("_fake_quantize_learnable_per_tensor_affine_backward(Tensor grad, Tensor x, "
        "Tensor scale, Tensor zero_point, int quant_min, int quant_max, float grad_factor) "
        "-> (Tensor, Tensor, Tensor)");
  m.def("fake_quantize_learnable_per_channel_affine(Tensor x, Tensor scale, Tensor zero_point, "
        "int ch_axis, int quant_min, int quant_max, float grad_factor) -> Tensor");
  m.def("_fake_quantize_learnable_per_channel_affine_backward(Tensor grad, Tensor x, "
        "Tensor scale, Tensor zero_point, int ch_axis, int quant_min, int quant_max, "
        "float grad_factor) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("fake_quantize_per_tensor_affine", TORCH_FN(per_tensor_cpu));
  m.impl("_fake_quantize_per_tensor_affine_backward", TORCH_FN(per_tensor_backward_cpu));
  m.impl("fake_quantize_per_channel_affine", TORCH_FN(per_channel_cpu));
  m.impl("_fake_quantize_per_channel_affine_backward", TORCH_FN(per_channel_backward_cpu));
  m.impl("fake_quantize_learnable_per_tensor_affine", TORCH_FN(learnable_per_tensor_cpu));
  m.impl("_fake_quantize_learnable_per_tensor_affine_backward",
         TORCH_FN(learnable_per_tensor_backward_cpu));
  m.impl("fake_quantize_learnable_per_channel_affine", TORCH_FN(learnable_per_channel_cpu));
  m.impl("_fake_quantize_learnable_per_channel_affine_backward",
         TORCH_FN(learnable_per_channel_backward_cpu));
}

// ---- C++ entry points ------------------------------------------------------------------------

at::Tensor fake_quantize_per_tensor_affine(const at::Tensor& x, const at::Tensor& scale,
                                           const at::Tensor& zero_point, int64_t quant_min,
                                           int64_t quant_max) {
  static auto op = detail::op_handle<decltype(fake_quantize_per_tensor_affine)>("mqbench::fake_quantize_per_tensor_affine");
  return op.call(x, scale, zero_point, quant_min, quant_max);
}

at::Tensor fake_quantize_per_channel_affine(const at::Tensor& x, const at::Tensor& scale,
                                            const at::Tensor& zero_point, int64_t ch_axis,
                                            int64_t quant_min, int64_t quant_max) {
  static auto op = detail::op_handle<decltype(fake_quantize_per_channel_affine)>("mqbench::fake_quantize_per_channel_affine");
  return op.call(x, scale, zero_point, ch_axis, quant_min, quant_max);
}

at::Tensor fake_quantize_learnable_per_tensor_affine(const at::Tensor& x, const at::Tensor& scale,
                                                     const at::Tensor& zero_point,
                                                     int64_t quant_min, int64_t quant_max,
                                                     double grad_factor) {
  static auto op = detail::op_handle<decltype(fake_quantize_learnable_per_tensor_affine)>("mqbench::fake_quantize_learnable_per_tensor_affine");
  return op.call(x, scale, zero_point, quant_min, quant_max, grad_factor);
}

at::Tensor fake_quantize_learnable_per_channel_affine(const at::Tensor& x,
                                                      const at::Tensor& scale,
                                                      const at::Tensor& zero_point,
                                                      int64_t ch_axis, int64_t quant_min,
                                                      int64_t quant_max, double grad_factor) {
  static auto op = detail::op_handle<decltype(fake_quantize_learnable_per_channel_affine)>("mqbench::fake_quantize_learnable_per_channel_affine");
  return op.call(x, scale, zero_point, ch_axis, quant_min, quant_max, grad_factor);
}

}  // namespace ops
}  // namespace mqbench
