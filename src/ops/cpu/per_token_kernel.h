#pragma once
// The CPU kernel of fake_quantize_per_token, dispatched by CPU capability (Note [CPU capability
// dispatch]). Formulas: Note [Per-token fake quantization] in ops/common/per_token_formula.h.

#include <ATen/core/Tensor.h>

#include "ops/common/per_token_formula.h"
#include "ops/cpu/dispatch.h"

namespace mqbench {
namespace cpu {

/// out = the per-token fake quantization of the rows of x ([rows, n], contiguous, float32 /
/// float64 / float16 / bfloat16); out is contiguous in x's dtype.
using per_token_fn = void (*)(const at::Tensor& x, at::Tensor& out,
                              const ops::detail::TokenConfig& config);
MQBENCH_DECLARE_STUB(per_token_stub, per_token_fn);

}  // namespace cpu
}  // namespace mqbench
