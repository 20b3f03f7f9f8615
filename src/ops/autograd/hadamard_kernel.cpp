// Autograd for hadamard_transform (ops/hadamard_transform.cpp). The transform is linear,
// y = x M^T with M = scale * (had kron S), so dx = dy M = hadamard_transform(dy, had^T, scale)
// (Note [Hadamard transform]); the backward calls the op itself through the dispatcher, so
// double backward works too. `had` gets no gradient: it is a fixed rotation, and an `had` that
// requires grad is refused rather than silently left without one.

#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include "mqbench/ops/hadamard.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

class HadamardFunction : public torch::autograd::Function<HadamardFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const c10::optional<at::Tensor>& had, double scale) {
    static auto op = detail::op_handle<at::Tensor(const at::Tensor&,
                                                  const c10::optional<at::Tensor>&, double)>(
        "mqbench::hadamard_transform");
    const bool with_had = had.has_value() && had->defined();
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["with_had"] = with_had;
    if (with_had) ctx->save_for_backward({*had});
    at::AutoDispatchBelowADInplaceOrView guard;
    return op.call(x, had, scale);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const double scale = ctx->saved_data["scale"].toDouble();
    c10::optional<at::Tensor> had_t;
    if (ctx->saved_data["with_had"].toBool()) had_t = ctx->get_saved_variables()[0].t();
    return {hadamard_transform(grads[0], had_t, scale), at::Tensor(), at::Tensor()};
  }
};

at::Tensor hadamard_autograd(const at::Tensor& x, const c10::optional<at::Tensor>& had,
                             double scale) {
  if (had.has_value() && had->defined()) {
    detail::check_devices("hadamard_transform", x, {{*had, "had"}});
    TORCH_CHECK(!(at::GradMode::is_enabled() && had->requires_grad()),
                "hadamard_transform: had requires grad, but the op gives no gradient to had "
                "(a fixed rotation); pass had.detach()");
  }
  return HadamardFunction::apply(x, had, scale);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) {
  m.impl("hadamard_transform", TORCH_FN(hadamard_autograd));
}

}  // namespace ops
}  // namespace mqbench
