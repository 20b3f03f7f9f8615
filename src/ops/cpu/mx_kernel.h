#pragma once
// The CPU kernels of the block-scaled formats (MXFP8, MXFP6, MXFP4, NVFP4), dispatched by CPU
// capability (Note [CPU capability dispatch]). Formulas: ops/common/mx_formula.h.

#include <cstdint>

#include "ops/common/mx_formula.h"
#include "ops/cpu/dispatch.h"

namespace mqbench {
namespace cpu {

using MxElement = ops::detail::MxElement;

/// The rows x cols float32 matrix `x` (contiguous), blocks of `block` consecutive elements along
/// each row (a shorter last block when cols % block != 0), fake-quantized into `out`.
using mx_fwd_fn = void (*)(const float* x, float* out, int64_t rows, int64_t cols, int64_t block,
                           MxElement elem);
/// The same for NVFP4 (E2M1 elements) with the per-tensor scale g (nvfp4_global_scale).
using nvfp4_fwd_fn = void (*)(const float* x, float* out, int64_t rows, int64_t cols,
                              int64_t block, float global_scale);
MQBENCH_DECLARE_STUB(mx_fwd_stub, mx_fwd_fn);
MQBENCH_DECLARE_STUB(nvfp4_fwd_stub, nvfp4_fwd_fn);

}  // namespace cpu
}  // namespace mqbench
