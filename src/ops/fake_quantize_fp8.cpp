// FP8 fake quantization (E4M3FN, E5M2), fixed and learnable scale (LSQ), per tensor (ch_axis
// None) or per channel: schemas, CPU implementations and the C++ entry points of
// include/mqbench/ops/fake_quantize_ops.h. Formula: ops/common/fp8_formula.h (Note [FP8 rounding]);
// kernels: cpu/fp8_kernel.cpp, cuda/fp8_kernel.cu; autograd: autograd/fp8_kernel.cpp; fake
// kernels: python/mqbench/_fake_kernels.py.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/checks.h"
#include "ops/common/fp8_formula.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/kernels.h"

namespace mqbench {
namespace ops {

namespace detail {

Fp8Format fp8_format(const std::string& dtype, const char* op) {
  if (dtype == "fp8_e4m3" || dtype == "e4m3") return Fp8Format::kE4M3;
  if (dtype == "fp8_e5m2" || dtype == "e5m2") return Fp8Format::kE5M2;
  TORCH_CHECK(false, op, ": dtype must be 'fp8_e4m3' or 'fp8_e5m2', got '", dtype, "'");
  return Fp8Format::kE4M3;
}

namespace {

struct Fp8Prepared {
  c10::optional<int64_t> axis;
  std::pair<at::Tensor, at::Tensor> qp;
};

Fp8Prepared prepare_fp8(const char* op, const at::Tensor& x, const at::Tensor& scale,
                        c10::optional<int64_t> ch_axis) {
  check_input(x, op);
  Fp8Prepared r;
  if (ch_axis) r.axis = wrap_channel_axis(*ch_axis, x, op);
  r.qp = prepare_qparams(x, scale, at::zeros_like(scale, at::kFloat), r.axis, op);
  return r;
}

at::Tensor fp8_cpu(const at::Tensor& x, const at::Tensor& scale, c10::optional<int64_t> ch_axis,
                   std::string dtype) {
  const char* op = "fake_quantize_fp8";
  const auto f = fp8_format(dtype, op);
  const auto pr = prepare_fp8(op, x, scale, ch_axis);
  auto out = empty_output_like(x);
  auto iter = make_qparam_iter({out}, {x}, pr.qp.first, pr.qp.second, pr.axis);
  cpu::fp8_fwd_stub.get()(iter, static_cast<int64_t>(f));
  return out;
}

at::Tensor fp8_backward_cpu(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale,
                            c10::optional<int64_t> ch_axis, std::string dtype) {
  const char* op = "_fake_quantize_fp8_backward";
  const auto f = fp8_format(dtype, op);
  const auto pr = prepare_fp8(op, x, scale, ch_axis);
  check_grad(grad, x, op);
  auto dx = empty_output_like(x);
  auto iter = make_qparam_iter({dx}, {grad, x}, pr.qp.first, pr.qp.second, pr.axis);
  cpu::fp8_bwd_stub.get()(iter, static_cast<int64_t>(f));
  return dx;
}

at::Tensor learnable_fp8_cpu(const at::Tensor& x, const at::Tensor& scale,
                             c10::optional<int64_t> ch_axis, std::string dtype,
                             double /*grad_factor*/) {
  return fp8_cpu(x, scale, ch_axis, std::move(dtype));
}

std::tuple<at::Tensor, at::Tensor> learnable_fp8_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale,
    c10::optional<int64_t> ch_axis, std::string dtype, double grad_factor) {
  const char* op = "_fake_quantize_learnable_fp8_backward";
  const auto f = fp8_format(dtype, op);
  const auto pr = prepare_fp8(op, x, scale, ch_axis);
  check_grad(grad, x, op);
  const int64_t channels = pr.qp.first.numel();
  auto dx = empty_output_like(x);
  cpu::ChannelAccumulators acc(channels);
  auto iter = make_qparam_iter({dx}, {grad, x}, pr.qp.first, pr.qp.second, pr.axis);
  cpu::fp8_learnable_bwd_stub.get()(iter, static_cast<int64_t>(f), grad_factor,
                                    static_cast<const char*>(pr.qp.first.data_ptr()), &acc);
  std::vector<double> d_scale(channels), unused(channels);
  acc.reduce(d_scale.data(), unused.data());
  return {dx, sums_like(d_scale.data(), scale)};
}

}  // namespace
}  // namespace detail

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_fp8(Tensor x, Tensor scale, int? ch_axis, str dtype) -> Tensor");
  m.def("_fake_quantize_fp8_backward(Tensor grad, Tensor x, Tensor scale, int? ch_axis, "
        "str dtype) -> Tensor");
  m.def("fake_quantize_learnable_fp8(Tensor x, Tensor scale, int? ch_axis, str dtype, "
        "float grad_factor) -> Tensor");
  m.def("_fake_quantize_learnable_fp8_backward(Tensor grad, Tensor x, Tensor scale, "
        "int? ch_axis, str dtype, float grad_factor) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("fake_quantize_fp8", TORCH_FN(detail::fp8_cpu));
  m.impl("_fake_quantize_fp8_backward", TORCH_FN(detail::fp8_backward_cpu));
  m.impl("fake_quantize_learnable_fp8", TORCH_FN(detail::learnable_fp8_cpu));
  m.impl("_fake_quantize_learnable_fp8_backward", TORCH_FN(detail::learnable_fp8_backward_cpu));
}

// ---- C++ entry points ------------------------------------------------------------------------

at::Tensor fake_quantize_fp8(const at::Tensor& x, const at::Tensor& scale,
                             c10::optional<int64_t> ch_axis, const std::string& dtype) {
  static auto op = detail::op_handle<at::Tensor(const at::Tensor&, const at::Tensor&,
                                                c10::optional<int64_t>, std::string)>(
      "mqbench::fake_quantize_fp8");
  return op.call(x, scale, ch_axis, dtype);
}

at::Tensor fake_quantize_learnable_fp8(const at::Tensor& x, const at::Tensor& scale,
                                       c10::optional<int64_t> ch_axis, const std::string& dtype,
                                       double grad_factor) {
  static auto op = detail::op_handle<at::Tensor(const at::Tensor&, const at::Tensor&,
                                                c10::optional<int64_t>, std::string, double)>(
      "mqbench::fake_quantize_learnable_fp8");
  return op.call(x, scale, ch_axis, dtype, grad_factor);
}

}  // namespace ops
}  // namespace mqbench
