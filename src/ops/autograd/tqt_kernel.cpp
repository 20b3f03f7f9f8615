// Autograd for fake_quantize_tqt: gradients to x and scale (formulas: cpu/tqt_kernel.cpp).

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

class Tqt : public torch::autograd::Function<Tqt> {
 public:
  static at::Tensor forward(AutogradContext* ctx, T x, T scale, T zero_point, int64_t qmin,
                            int64_t qmax, int64_t mth) {
    static auto op = detail::op_handle<at::Tensor(T, T, T, int64_t, int64_t, int64_t)>(
        "mqbench::fake_quantize_tqt");
    ctx->save_for_backward({x, scale, zero_point});
    ctx->saved_data["qmin"] = qmin;
    ctx->saved_data["qmax"] = qmax;
    ctx->saved_data["mth"] = mth;
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, scale, zero_point, qmin, qmax, mth);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto op = detail::op_handle<std::tuple<at::Tensor, at::Tensor>(
        T, T, T, T, int64_t, int64_t, int64_t)>("mqbench::_fake_quantize_tqt_backward");
    const auto s = ctx->get_saved_variables();
    auto g = op.call(grads[0], s[0], s[1], s[2], ctx->saved_data["qmin"].toInt(),
                     ctx->saved_data["qmax"].toInt(), ctx->saved_data["mth"].toInt());
    return {std::get<0>(g), std::get<1>(g), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

at::Tensor tqt_autograd(T x, T scale, T zero_point, int64_t qmin, int64_t qmax, int64_t mth) {
  detail::check_devices("fake_quantize_tqt", x, {{scale, "scale"}, {zero_point, "zero_point"}});
  return Tqt::apply(x, scale, zero_point, qmin, qmax, mth);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) { m.impl("fake_quantize_tqt", TORCH_FN(tqt_autograd)); }

}  // namespace ops
}  // namespace mqbench
