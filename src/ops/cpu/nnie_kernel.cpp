// NNIE fake quantization (HiSilicon NNIE's logarithmic 8-bit format), computed in double as
// MQBench does, then cast back to the input dtype. data_max is the running max |x|:
//   z  = round(16 * log2(data_max)) - 127
//   T+ = 2^((z - 16) / 16),  T- = 2^((z + 1 - 16) / 16)
//   x >  T+ :  2^((clamp(round(16 * log2(x))  - z, 0, 127) + z) / 16)
//   x < -T- : -2^((clamp(round(16 * log2(-x)) - z, 1, 127) + z) / 16)
//   else    :  0
// Rounding is half to even. The gradient is the identity (autograd/nnie_kernel.cpp).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>

#include <cmath>

#include "ops/cpu/nnie_kernel.h"

namespace mqbench {
namespace cpu {

void nnie_fwd_kernel(at::TensorIteratorBase& iter, double data_max) {
  const double z = std::nearbyint(16.0 * std::log2(data_max)) - 127.0;
  const double t_pos = std::exp2((z - 16.0) / 16.0);
  const double t_neg = std::exp2((z + 1.0 - 16.0) / 16.0);
  auto level = [z](double v, double lo) {
    const double e = std::min(std::max(std::nearbyint(16.0 * std::log2(v)) - z, lo), 127.0);
    return std::exp2((e + z) / 16.0);
  };
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(0), "mqbench_nnie_fwd", [&] {
    iter.for_each([&](char** data, const int64_t* strides, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const double x = *reinterpret_cast<const scalar_t*>(data[1] + i * strides[1]);
        double y;
        if (x > t_pos) {
          y = level(x, 0.0);
        } else if (x < -t_neg) {
          y = -level(-x, 1.0);
        } else {
          y = std::isnan(x) ? x : 0.0;
        }
        *reinterpret_cast<scalar_t*>(data[0] + i * strides[0]) = static_cast<scalar_t>(y);
      }
    });
  });
}

}  // namespace cpu
}  // namespace mqbench
