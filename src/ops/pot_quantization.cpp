// Power-of-two scale rounding (MQBench's pot_quantization):
//   out = 2^(round(log2 s))   with a straight-through estimator on the round only,
// so d out / d s = 2^round(log2 s) / s (autograd of 2^(l + (round(l) - l).detach())).
// A composite op of ATen ops; scales are tiny tensors.

#include <ATen/ATen.h>
#include <torch/library.h>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

at::Tensor pot_quantization_impl(const at::Tensor& scale) {
  TORCH_CHECK(scale.defined() && at::isFloatingType(scale.scalar_type()),
              "pot_quantization: scale must be a floating-point tensor");
  const auto l = at::log2(scale);
  return at::exp2(l + (at::round(l) - l).detach());
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) { m.def("pot_quantization(Tensor scale) -> Tensor"); }

TORCH_LIBRARY_IMPL(mqbench, CompositeImplicitAutograd, m) {
  m.impl("pot_quantization", TORCH_FN(pot_quantization_impl));
}

at::Tensor pot_quantization(const at::Tensor& scale) {
  static auto op = detail::op_handle<decltype(pot_quantization)>("mqbench::pot_quantization");
  return op.call(scale);
}

}  // namespace ops
}  // namespace mqbench
