// Autograd for fake_quantize_pact: gradients to x, alpha and n_alpha
// (formulas: cpu/pact_kernel.cpp). Saves x, see Note [Saving the input instead of a mask].

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

class Pact : public torch::autograd::Function<Pact> {
 public:
  static at::Tensor forward(AutogradContext* ctx, T x, T alpha, T n_alpha, T scale, T zero_point,
                            int64_t qmin, int64_t qmax) {
    static auto op = detail::op_handle<at::Tensor(T, T, T, T, T, int64_t, int64_t)>(
        "mqbench::fake_quantize_pact");
    ctx->save_for_backward({x, alpha, n_alpha, scale, zero_point});
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, alpha, n_alpha, scale, zero_point, qmin, qmax);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto op = detail::op_handle<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
        T, T, T, T, T, T, int64_t, int64_t)>("mqbench::_fake_quantize_pact_backward");
    const auto s = ctx->get_saved_variables();
    auto g = op.call(grads[0], s[0], s[1], s[2], s[3], s[4], ctx->saved_data["qmin"].toInt(),
                     ctx->saved_data["qmax"].toInt());
    return {std::get<0>(g), std::get<1>(g), std::get<2>(g), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

at::Tensor pact_autograd(T x, T alpha, T n_alpha, T scale, T zero_point, int64_t qmin,
                         int64_t qmax) {
  detail::check_devices("fake_quantize_pact", x,
                        {{alpha, "alpha"}, {n_alpha, "n_alpha"}, {scale, "scale"},
                         {zero_point, "zero_point"}});
  return Pact::apply(x, alpha, n_alpha, scale, zero_point, qmin, qmax);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) { m.impl("fake_quantize_pact", TORCH_FN(pact_autograd)); }

}  // namespace ops
}  // namespace mqbench
