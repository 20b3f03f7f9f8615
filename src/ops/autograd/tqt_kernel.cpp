// Autograd for fake_quantize_tqt: gradients to x and scale (formulas:
// common/algorithm_formula.h).

#include <torch/library.h>

#include "ops/autograd/op_function.h"
#include "ops/common/checks.h"

namespace mqbench {
namespace ops {
namespace {

using T = const at::Tensor&;

constexpr char kTqt[] = "mqbench::fake_quantize_tqt";
constexpr char kTqtBackward[] = "mqbench::_fake_quantize_tqt_backward";

// (x, scale, zero_point, qmin, qmax, mth) -> (dx, d_scale)
using Tqt = detail::OpFunction<
    detail::OpPair<kTqt, kTqtBackward, std::tuple<at::Tensor, at::Tensor>>, T, T, T, int64_t,
    int64_t, int64_t>;

at::Tensor tqt_autograd(T x, T scale, T zero_point, int64_t qmin, int64_t qmax, int64_t mth) {
  detail::check_devices("fake_quantize_tqt", x, {{scale, "scale"}, {zero_point, "zero_point"}});
  return Tqt::apply(x, scale, zero_point, qmin, qmax, mth);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) { m.impl("fake_quantize_tqt", TORCH_FN(tqt_autograd)); }

}  // namespace ops
}  // namespace mqbench
