// Autograd for fake_quantize_pact: gradients to x, alpha and n_alpha (formulas:
// common/algorithm_formula.h). Saves x, see Note [Saving the input instead of a mask].

#include <torch/library.h>

#include "ops/autograd/op_function.h"
#include "ops/common/checks.h"

namespace mqbench {
namespace ops {
namespace {

using T = const at::Tensor&;

constexpr char kPact[] = "mqbench::fake_quantize_pact";
constexpr char kPactBackward[] = "mqbench::_fake_quantize_pact_backward";

// (x, alpha, n_alpha, scale, zero_point, qmin, qmax) -> (dx, d_alpha, d_n_alpha)
using Pact = detail::OpFunction<
    detail::OpPair<kPact, kPactBackward, std::tuple<at::Tensor, at::Tensor, at::Tensor>>, T, T, T,
    T, T, int64_t, int64_t>;

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
