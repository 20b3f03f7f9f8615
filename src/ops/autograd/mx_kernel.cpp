// Autograd for the block-scaled formats (fake_quantize_mx, fake_quantize_nvfp4): the
// straight-through estimator, dx = dy, as torchao's and modelopt's fake quantization of these
// formats train; no gradient to NVFP4's global_amax (an observer's statistic).

#include <torch/library.h>

#include "ops/autograd/op_function.h"
#include "ops/common/checks.h"

namespace mqbench {
namespace ops {
namespace {

using T = const at::Tensor&;

constexpr char kMx[] = "mqbench::fake_quantize_mx";
constexpr char kNvfp4[] = "mqbench::fake_quantize_nvfp4";

using Mx = detail::OpFunction<detail::OpPair<kMx, nullptr, at::Tensor>, T, c10::string_view,
                              int64_t, int64_t>;
using Nvfp4 =
    detail::OpFunction<detail::OpPair<kNvfp4, nullptr, at::Tensor>, T, T, int64_t, int64_t>;

at::Tensor mx_autograd(T x, c10::string_view elem_dtype, int64_t block_size, int64_t axis) {
  return Mx::apply(x, elem_dtype, block_size, axis);
}

at::Tensor nvfp4_autograd(T x, T global_amax, int64_t block_size, int64_t axis) {
  detail::check_devices("fake_quantize_nvfp4", x, {{global_amax, "global_amax"}});
  return Nvfp4::apply(x, global_amax, block_size, axis);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, Autograd, m) {
  m.impl("fake_quantize_mx", TORCH_FN(mx_autograd));
  m.impl("fake_quantize_nvfp4", TORCH_FN(nvfp4_autograd));
}

}  // namespace ops
}  // namespace mqbench
