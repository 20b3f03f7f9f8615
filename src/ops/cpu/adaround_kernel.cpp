// AdaRound kernels (Nagel et al. 2020, "Up or Down? Adaptive Rounding for Post-Training
// Quantization"). AdaRound runs on weights during reconstruction, so a scalar loop over the
// TensorIterator is enough; it is compiled once.
//
// With gamma = -0.1, zeta = 1.1 and h the rectified sigmoid
//   h(a) = clamp(sigmoid(a) * (zeta - gamma) + gamma, 0, 1)     (soft)
//   h(a) = [a >= 0]                                             (hard)
//   v    = floor(x / s) + h(alpha) + z
//   out  = (clamp(v, qmin, qmax) - z) * s
// Gradients (MQBench: x is frozen, s and z are buffers): only alpha receives one,
//   d_alpha = dy * s * [qmin <= v <= qmax] * (zeta - gamma) * sig * (1 - sig)
//             * [0 <= sig * (zeta - gamma) + gamma <= 1],   sig = sigmoid(alpha).

#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/TensorIterator.h>

#include <cstring>

#include "ops/common/algorithm_formula.h"
#include "ops/cpu/adaround_kernel.h"
#include "ops/cpu/runs.h"

namespace mqbench {
namespace cpu {
namespace {

inline float load_f(const char* p) {
  float v;
  std::memcpy(&v, p, sizeof(float));
  return v;
}

}  // namespace

void adaround_fwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax, bool hard) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(0), "mqbench_adaround_fwd", [&] {
    using T = scalar_t;
    const T lo = static_cast<T>(qmin), hi = static_cast<T>(qmax);
    for_each_run<5>(iter, [&](char** d, const int64_t* st, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const T x = *reinterpret_cast<const T*>(d[1] + i * st[1]);
        const T a = *reinterpret_cast<const T*>(d[2] + i * st[2]);
        const T s = load_f(d[3] + i * st[3]);
        const T z = load_f(d[4] + i * st[4]);
        *reinterpret_cast<T*>(d[0] + i * st[0]) =
            ops::detail::adaround_forward(x, a, s, z, lo, hi, hard);
      }
    });
  });
}

void adaround_bwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(1), "mqbench_adaround_bwd", [&] {
    using T = scalar_t;
    const T lo = static_cast<T>(qmin), hi = static_cast<T>(qmax);
    for_each_run<6>(iter, [&](char** d, const int64_t* st, int64_t n) {
      for (int64_t i = 0; i < n; ++i) {
        const T dy = *reinterpret_cast<const T*>(d[1] + i * st[1]);
        const T x = *reinterpret_cast<const T*>(d[2] + i * st[2]);
        const T a = *reinterpret_cast<const T*>(d[3] + i * st[3]);
        const T s = load_f(d[4] + i * st[4]);
        const T z = load_f(d[5] + i * st[5]);
        *reinterpret_cast<T*>(d[0] + i * st[0]) =
            ops::detail::adaround_grad(dy, x, a, s, z, lo, hi);
      }
    });
  });
}

}  // namespace cpu
}  // namespace mqbench
