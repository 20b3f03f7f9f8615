// Autograd for fold_bn_train (Note [Fused BN folding] in ops/bn_fold.cpp): forward re-dispatches
// below autograd; backward calls _fold_bn_train_backward.

#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

using FwdSig = std::tuple<at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, at::Tensor&, at::Tensor&,
    double, double, bool);
using BwdSig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const c10::optional<at::Tensor>&,
    const c10::optional<at::Tensor>&, const c10::optional<at::Tensor>&, const at::Tensor&,
    const at::Tensor&, bool);

c10::optional<at::Tensor> opt(const at::Tensor& t) {
  return t.defined() ? c10::optional<at::Tensor>(t) : c10::nullopt;
}

class FoldBnTrain : public torch::autograd::Function<FoldBnTrain> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& s,
                               const c10::optional<at::Tensor>& bias,
                               const c10::optional<at::Tensor>& weight,
                               const c10::optional<at::Tensor>& bn_bias, at::Tensor running_mean,
                               at::Tensor running_var, double factor, double eps, bool relu) {
    static auto op = detail::op_handle<FwdSig>("mqbench::fold_bn_train");
    at::Tensor y, mean_x, rstd;
    {
      at::AutoDispatchBelowADInplaceOrView guard;
      std::tie(y, mean_x, rstd) =
          op.call(x, s, bias, weight, bn_bias, running_mean, running_var, factor, eps, relu);
    }
    ctx->save_for_backward({x, s, bias.value_or(at::Tensor()), weight.value_or(at::Tensor()),
                            bn_bias.value_or(at::Tensor()), mean_x, rstd});
    ctx->saved_data["relu"] = relu;
    ctx->mark_non_differentiable({mean_x, rstd});
    return {y, mean_x, rstd};
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static auto op = detail::op_handle<BwdSig>("mqbench::_fold_bn_train_backward");
    const auto v = ctx->get_saved_variables();
    auto r = op.call(grads[0], v[0], v[1], opt(v[2]), opt(v[3]), opt(v[4]), v[5], v[6],
                     ctx->saved_data["relu"].toBool());
    auto shaped = [](const at::Tensor& g, const at::Tensor& like) {
      return like.defined() ? g.reshape(like.sizes()).to(like.scalar_type()) : at::Tensor();
    };
    return {std::get<0>(r), shaped(std::get<1>(r), v[1]), shaped(std::get<2>(r), v[2]),
            shaped(std::get<3>(r), v[3]), shaped(std::get<4>(r), v[4]), at::Tensor(),
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor> fold_bn_train_autograd(
    const at::Tensor& x, const at::Tensor& s, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& weight, const c10::optional<at::Tensor>& bn_bias,
    at::Tensor& running_mean, at::Tensor& running_var, double factor, double eps, bool relu) {
  auto out = FoldBnTrain::apply(x, s, bias, weight, bn_bias, running_mean, running_var, factor,
                                eps, relu);
  return {out[0], out[1], out[2]};
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) {
  m.impl("fold_bn_train", TORCH_FN(fold_bn_train_autograd));
}

}  // namespace ops
}  // namespace mqbench
