#pragma once
// The CPU kernel of hadamard_transform, dispatched by CPU capability (Note [CPU capability
// dispatch]). The transform: Note [Hadamard transform] in ops/common/hadamard_formula.h.

#include <ATen/core/Tensor.h>

#include "ops/cpu/dispatch.h"

namespace mqbench {
namespace cpu {

/// out[r] = scale * (had kron S_p) x[r] for the rows of x ([rows, m * p], contiguous, float32 /
/// float64 / float16 / bfloat16); `had` is undefined or an [m, m] contiguous matrix in the
/// compute type (float32, float64 for float64 x); out is contiguous in x's dtype.
using hadamard_fn = void (*)(const at::Tensor& x, const at::Tensor& had, double scale,
                             at::Tensor& out, int64_t m, int64_t p);
MQBENCH_DECLARE_STUB(hadamard_stub, hadamard_fn);

}  // namespace cpu
}  // namespace mqbench
