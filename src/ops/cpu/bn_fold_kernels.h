#pragma once
// Kernels of the fused BatchNorm-folding op (ops/bn_fold.cpp), per CPU capability.

#include <cstdint>

#include "ops/cpu/dispatch.h"
#include "ops/cpu/observer_kernels.h"

namespace mqbench {
namespace cpu {

/// Per-channel parameters of the training-mode fold: z = x / s + b, y = gamma * zhat + beta.
struct FoldParams {
  const float* s;        // scale factor per channel
  const float* b;        // conv bias per channel, or null
  const float* gamma;    // BN weight (null: 1)
  const float* beta;     // BN bias (null: 0)
  double eps;
  bool relu;
};

// Forward: writes out; fills mean_x[c] (mean of x) and rstd[c] (1 / sqrt(var_z + eps)), var_x[c]
// (biased variance of x). x / out: contiguous float [outer, C, inner].
using bn_fold_fwd_fn = void (*)(const float* x, float* out, const Layout& l, const FoldParams& p,
                                double* mean_x, double* var_x, double* rstd);
// Backward: writes dx; fills d_s, d_b, d_gamma, d_beta (per channel, double).
using bn_fold_bwd_fn = void (*)(const float* dout, const float* x, float* dx, const Layout& l,
                                const FoldParams& p, const double* mean_x, const double* rstd,
                                double* d_s, double* d_b, double* d_gamma, double* d_beta);

MQBENCH_DECLARE_STUB(bn_fold_fwd_stub, bn_fold_fwd_fn);
MQBENCH_DECLARE_STUB(bn_fold_bwd_stub, bn_fold_bwd_fn);

}  // namespace cpu
}  // namespace mqbench
