// NNIE fake quantization (HiSilicon NNIE's logarithmic 8-bit format), computed in double as
// MQBench does, then cast back to the input dtype. data_max is the running max |x|:
//   z  = round(16 * log2(data_max)) - 127
//   T+ = 2^((z - 16) / 16),  T- = 2^((z + 1 - 16) / 16)
//   x >  T+ :  2^((clamp(round(16 * log2(x))  - z, 0, 127) + z) / 16)
//   x < -T- : -2^((clamp(round(16 * log2(-x)) - z, 1, 127) + z) / 16)
//   else    :  0
// Rounding is half to even. The formula is ops/common/algorithm_formula.h's; the op returns
// zeros for data_max == 0 and rejects a negative or non-finite one. The gradient is the
// identity (autograd/nnie_kernel.cpp).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>

#include "ops/common/algorithm_formula.h"
#include "ops/cpu/nnie_kernel.h"
#include "ops/cpu/runs.h"

namespace mqbench {
namespace cpu {

void nnie_fwd_kernel(at::TensorIteratorBase& iter, double data_max) {
  const auto p = ops::detail::nnie_scalars(data_max);
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(0), "mqbench_nnie_fwd", [&] {
    for_each_run<2>(iter, [&](char** data, const int64_t* strides, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const double x = *reinterpret_cast<const scalar_t*>(data[1] + i * strides[1]);
        *reinterpret_cast<scalar_t*>(data[0] + i * strides[0]) =
            static_cast<scalar_t>(ops::detail::nnie_forward(x, p));
      }
    });
  });
}

}  // namespace cpu
}  // namespace mqbench
