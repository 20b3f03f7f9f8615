// Autograd for fake_quantize_nnie: identity straight-through gradient to x; none to data_max.

#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "ops/common/checks.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;
using T = const at::Tensor&;

class Nnie : public torch::autograd::Function<Nnie> {
 public:
  static at::Tensor forward(AutogradContext* ctx, T x, T data_max) {
    static auto op = detail::op_handle<at::Tensor(T, T)>("mqbench::fake_quantize_nnie");
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, data_max);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {grads[0], at::Tensor()};
  }
};

at::Tensor nnie_autograd(T x, T data_max) {
  detail::check_devices("fake_quantize_nnie", x, {{data_max, "data_max"}});
  return Nnie::apply(x, data_max);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) { m.impl("fake_quantize_nnie", TORCH_FN(nnie_autograd)); }

}  // namespace ops
}  // namespace mqbench
