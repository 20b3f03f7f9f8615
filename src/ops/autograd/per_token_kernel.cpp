// Autograd for fake_quantize_per_token (ops/fake_quantize_per_token.cpp): the straight-through
// estimator, dx = dy. Every element lies inside its own row's range, so no clamp is active; the
// scale's dependence on x is not differentiated, as in every dynamic quantizer (Note [Per-token
// fake quantization]).

#include <torch/library.h>

#include "ops/autograd/op_function.h"

namespace mqbench {
namespace ops {
namespace {

using T = const at::Tensor&;

constexpr char kPerToken[] = "mqbench::fake_quantize_per_token";

using PerToken = detail::OpFunction<detail::OpPair<kPerToken, nullptr, at::Tensor>, T, int64_t,
                                    int64_t, bool, c10::string_view>;

at::Tensor per_token_autograd(T x, int64_t quant_min, int64_t quant_max, bool symmetric,
                              c10::string_view format) {
  return PerToken::apply(x, quant_min, quant_max, symmetric, format);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) {
  m.impl("fake_quantize_per_token", TORCH_FN(per_token_autograd));
}

}  // namespace ops
}  // namespace mqbench
