// Autograd for fake_quantize_nnie: identity straight-through gradient to x; none to data_max.

#include <torch/library.h>

#include "ops/autograd/op_function.h"
#include "ops/common/checks.h"

namespace mqbench {
namespace ops {
namespace {

using T = const at::Tensor&;

constexpr char kNnie[] = "mqbench::fake_quantize_nnie";

// (x, data_max) -> dx = dy: no backward op, nothing saved.
using Nnie = detail::OpFunction<detail::OpPair<kNnie, nullptr, at::Tensor>, T, T>;

at::Tensor nnie_autograd(T x, T data_max) {
  detail::check_devices("fake_quantize_nnie", x, {{data_max, "data_max"}});
  return Nnie::apply(x, data_max);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) { m.impl("fake_quantize_nnie", TORCH_FN(nnie_autograd)); }

}  // namespace ops
}  // namespace mqbench
