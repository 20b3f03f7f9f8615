// NNIE logarithmic fake quantization. Kernel: cpu/nnie_kernel.cpp; autograd (identity STE):
// autograd/nnie_kernel.cpp.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"
#include "ops/cpu/nnie_kernel.h"

namespace mqbench {
namespace ops {
namespace {

constexpr const char* kOp = "fake_quantize_nnie";

at::Tensor nnie_cpu(const at::Tensor& x, const at::Tensor& data_max) {
  detail::check_input(x, kOp);
  const double dmax = detail::scalar_param(x, data_max, "data_max", kOp);
  TORCH_CHECK(std::isfinite(dmax) && dmax >= 0.0, kOp,
              ": data_max must be finite and >= 0, got ", dmax,
              "; observe data (enable the observer) before enabling fake quantization");
  // calibrated on all-zero data (a zero-initialised layer): the range is {0}
  if (dmax == 0.0) return at::zeros_like(x);
  auto out = detail::empty_output_like(x);
  auto iter = at::TensorIteratorConfig().add_output(out).add_input(x).build();
  cpu::nnie_fwd_kernel(iter, dmax);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("fake_quantize_nnie(Tensor x, Tensor data_max) -> Tensor");
}

TORCH_LIBRARY_IMPL(mqbench, CPU, m) { m.impl("fake_quantize_nnie", TORCH_FN(nnie_cpu)); }

at::Tensor fake_quantize_nnie(const at::Tensor& x, const at::Tensor& data_max) {
  static auto op = detail::op_handle<decltype(fake_quantize_nnie)>("mqbench::fake_quantize_nnie");
  return op.call(x, data_max);
}

}  // namespace ops
}  // namespace mqbench
