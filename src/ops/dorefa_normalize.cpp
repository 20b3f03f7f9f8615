// DoReFa weight transform (Zhou et al. 2016, "DoReFa-Net"):
//   out = tanh(x) / (max|tanh(x)| + 1e-5)
// MQBench's DoReFaFakeQuantize applies it before observing and fake-quantizing. A composite op
// of ATen ops, so autograd gives exactly MQBench's gradient (including the max's, which torch
// spreads evenly over ties).

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

at::Tensor dorefa_normalize_impl(const at::Tensor& x) {
  detail::check_input(x, "dorefa_normalize");
  if (x.numel() == 0) return x.clone();
  const auto t = at::tanh(x);
  return t / (t.abs().max() + 1e-5);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) { m.def("dorefa_normalize(Tensor x) -> Tensor"); }

TORCH_LIBRARY_IMPL(mqbench, CompositeImplicitAutograd, m) {
  m.impl("dorefa_normalize", TORCH_FN(dorefa_normalize_impl));
}

at::Tensor dorefa_normalize(const at::Tensor& x) {
  static auto op = detail::op_handle<decltype(dorefa_normalize)>("mqbench::dorefa_normalize");
  return op.call(x);
}

}  // namespace ops
}  // namespace mqbench
