#pragma once
// The AdaRound CPU kernels (scalar loops, compiled once; formulas in
// ops/common/algorithm_formula.h).

#include <ATen/TensorIterator.h>

namespace mqbench {
namespace cpu {

/// AdaRound forward. Iterator operands: (out; x, alpha; scale, zero_point).
void adaround_fwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax, bool hard);

/// Gradient w.r.t. alpha of the soft forward. Operands: (d_alpha; grad, x, alpha; scale, zp).
void adaround_bwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax);

}  // namespace cpu
}  // namespace mqbench
