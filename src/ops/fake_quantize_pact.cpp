// PACT: clip to [n_alpha, alpha], then fixed per-tensor fake quantization. Kernel:
// cpu/pact_kernel.cpp; autograd: autograd/pact_kernel.cpp.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/kernels.h"

namespace mqbench {
namespace ops {
namespace {

constexpr const char* kOp = "fake_quantize_pact";

struct PactArgs {
  double lower, upper;
  std::pair<at::Tensor, at::Tensor> qp;
};

PactArgs prepare(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& n_alpha,
                 const at::Tensor& scale, const at::Tensor& zero_point, int64_t qmin,
                 int64_t qmax) {
  detail::check_input(x, kOp);
  detail::check_quant_range(qmin, qmax, kOp);
  PactArgs a;
  a.upper = detail::scalar_param(x, alpha, "alpha", kOp);
  a.lower = detail::scalar_param(x, n_alpha, "n_alpha", kOp);
  TORCH_CHECK(a.lower <= a.upper, kOp, ": n_alpha (", a.lower, ") must be <= alpha (", a.upper,
              ")");
  a.qp = detail::prepare_qparams(x, scale, zero_point, c10::nullopt, kOp);
  return a;
}

at::Tensor pact_cpu(const at::Tensor& x, const at::Tensor& alpha, const at::Tensor& n_alpha,
                    const at::Tensor& scale, const at::Tensor& zero_point, int64_t qmin,
                    int64_t qmax) {
  const auto a = prepare(x, alpha, n_alpha, scale, zero_point, qmin, qmax);
  auto out = detail::empty_output_like(x);
  auto iter = detail::make_qparam_iter({out}, {x}, a.qp.first, a.qp.second, c10::nullopt);
  cpu::pact_fwd_stub.get()(iter, qmin, qmax, a.lower, a.upper);
  return out;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> pact_backward_cpu(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& alpha,
    const at::Tensor& n_alpha, const at::Tensor& scale, const at::Tensor& zero_point,
    int64_t qmin, int64_t qmax) {
  const auto a = prepare(x, alpha, n_alpha, scale, zero_point, qmin, qmax);
  detail::check_grad(grad, x, kOp);
  auto dx = detail::empty_output_like(x);
  cpu::ChannelAccumulators acc(1);
  auto iter = detail::make_qparam_iter({dx}, {grad, x}, a.qp.first, a.qp.second, c10::nullopt);
  cpu::pact_bwd_stub.get()(iter, qmin, qmax, a.lower, a.upper,
                           static_cast<const char*>(a.qp.first.data_ptr()), &acc);
  double d_alpha = 0, d_n_alpha = 0;
  acc.reduce(&d_alpha, &d_n_alpha);
  return {dx, detail::sums_like(&d_alpha, alpha), detail::sums_like(&d_n_alpha, n_alpha)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_pact(Tensor x, Tensor alpha, Tensor n_alpha, Tensor scale, "
        "Tensor zero_point, int quant_min, int quant_max) -> Tensor");
  m.def("_fake_quantize_pact_backward(Tensor grad, Tensor x, Tensor alpha, Tensor n_alpha, "
        "Tensor scale, Tensor zero_point, int quant_min, int quant_max) "
        "-> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("fake_quantize_pact", TORCH_FN(pact_cpu));
  m.impl("_fake_quantize_pact_backward", TORCH_FN(pact_backward_cpu));
}

at::Tensor fake_quantize_pact(const at::Tensor& x, const at::Tensor& alpha,
                              const at::Tensor& n_alpha, const at::Tensor& scale,
                              const at::Tensor& zero_point, int64_t quant_min,
                              int64_t quant_max) {
  static auto op = detail::op_handle<decltype(fake_quantize_pact)>("mqbench::fake_quantize_pact");
  return op.call(x, alpha, n_alpha, scale, zero_point, quant_min, quant_max);
}

}  // namespace ops
}  // namespace mqbench
