// TQT power-of-two fake quantization (per tensor). Kernel: cpu/tqt_kernel.cpp; autograd:
// autograd/tqt_kernel.cpp.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/kernels.h"

namespace mqbench {
namespace ops {
namespace {

constexpr const char* kOp = "fake_quantize_tqt";

std::pair<at::Tensor, at::Tensor> prepare(const at::Tensor& x, const at::Tensor& scale,
                                          const at::Tensor& zero_point, int64_t qmin,
                                          int64_t qmax, int64_t mth) {
  detail::check_input(x, kOp);
  detail::check_quant_range(qmin, qmax, kOp);
  TORCH_CHECK(mth == 2 || mth == 3, kOp, ": mth must be 2 (activations) or 3 (parameters), got ",
              mth, "; TqtFakeQuantize sets it with set_quant_type()");
  return detail::prepare_qparams(x, scale, zero_point, c10::nullopt, kOp);
}

at::Tensor tqt_cpu(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                   int64_t qmin, int64_t qmax, int64_t mth) {
  const auto qp = prepare(x, scale, zero_point, qmin, qmax, mth);
  auto out = detail::empty_output_like(x);
  auto iter = detail::make_qparam_iter({out}, {x}, qp.first, qp.second, c10::nullopt);
  cpu::tqt_fwd_stub.get()(iter, qmin, qmax, mth);
  return out;
}

std::tuple<at::Tensor, at::Tensor> tqt_backward_cpu(const at::Tensor& grad, const at::Tensor& x,
                                                    const at::Tensor& scale,
                                                    const at::Tensor& zero_point, int64_t qmin,
                                                    int64_t qmax, int64_t mth) {
  const auto qp = prepare(x, scale, zero_point, qmin, qmax, mth);
  detail::check_grad(grad, x, kOp);
  auto dx = detail::empty_output_like(x);
  cpu::ChannelAccumulators acc(1);
  auto iter = detail::make_qparam_iter({dx}, {grad, x}, qp.first, qp.second, c10::nullopt);
  cpu::tqt_bwd_stub.get()(iter, qmin, qmax, mth, static_cast<const char*>(qp.first.data_ptr()),
                          &acc);
  double d_scale = 0;
  acc.reduce(&d_scale, nullptr);
  return {dx, detail::sums_like(&d_scale, scale)};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_tqt(Tensor x, Tensor scale, Tensor zero_point, int quant_min, "
        "int quant_max, int mth) -> Tensor");
  m.def("_fake_quantize_tqt_backward(Tensor grad, Tensor x, Tensor scale, Tensor zero_point, "
        "int quant_min, int quant_max, int mth) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("fake_quantize_tqt", TORCH_FN(tqt_cpu));
  m.impl("_fake_quantize_tqt_backward", TORCH_FN(tqt_backward_cpu));
}

at::Tensor fake_quantize_tqt(const at::Tensor& x, const at::Tensor& scale,
                             const at::Tensor& zero_point, int64_t quant_min, int64_t quant_max,
                             int64_t mth) {
  static auto op = detail::op_handle<decltype(fake_quantize_tqt)>("mqbench::fake_quantize_tqt");
  return op.call(x, scale, zero_point, quant_min, quant_max, mth);
}

}  // namespace ops
}  // namespace mqbench
