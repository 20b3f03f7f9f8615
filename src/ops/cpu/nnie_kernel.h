#pragma once
// The NNIE CPU kernel (a scalar loop in double, compiled once; formula in
// ops/common/algorithm_formula.h).

#include <ATen/TensorIterator.h>

namespace mqbench {
namespace cpu {

/// out = NNIE(x; data_max). Iterator operands: (out; x).
void nnie_fwd_kernel(at::TensorIteratorBase& iter, double data_max);

}  // namespace cpu
}  // namespace mqbench
