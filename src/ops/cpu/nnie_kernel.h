#pragma once

#include <ATen/TensorIterator.h>

namespace mqbench {
namespace cpu {

/// out = NNIE(x; data_max). Iterator operands: (out; x).
void nnie_fwd_kernel(at::TensorIteratorBase& iter, double data_max);

}  // namespace cpu
}  // namespace mqbench
