#pragma once
// Kernel entry points, dispatched by CPU capability (Note [CPU capability dispatch]).
// Each takes an iterator built by make_qparam_iter (Note [Qparam iterators]).

#include <ATen/TensorIterator.h>

#include "ops/cpu/accumulators.h"
#include "ops/cpu/dispatch.h"

namespace mqbench {
namespace cpu {

/// How an affine kernel treats the zero point (Note [Zero point modes] in
/// ops/common/affine_formula.h).
enum class ZeroPointMode {
  kInteger,    // q = round(x/s) + z, z an integer value (integer zero_point dtypes)
  kFloat,      // q = round(x/s + z)                     (floating zero_point in the fixed ops)
  kLearnable,  // z' = clamp(round(z), qmin, qmax), then as kInteger (the learnable ops)
};

// Affine fake quantization. Iterators: (out; x; s; z) and (dx; dy, x; s; z).
using affine_fwd_fn = void (*)(at::TensorIteratorBase&, int64_t qmin, int64_t qmax, ZeroPointMode);
using affine_bwd_fn = void (*)(at::TensorIteratorBase&, int64_t qmin, int64_t qmax, ZeroPointMode);
using learnable_bwd_fn = void (*)(at::TensorIteratorBase&, int64_t qmin, int64_t qmax,
                                  double grad_factor, const char* scale_base,
                                  ChannelAccumulators* acc);
MQBENCH_DECLARE_STUB(affine_fwd_stub, affine_fwd_fn);
MQBENCH_DECLARE_STUB(affine_bwd_stub, affine_bwd_fn);
MQBENCH_DECLARE_STUB(learnable_bwd_stub, learnable_bwd_fn);

// DSQ. Iterators: (out; x; s; z) and (dx; dy, x; s; z).
using dsq_fwd_fn = void (*)(at::TensorIteratorBase&, int64_t qmin, int64_t qmax, double alpha);
using dsq_bwd_fn = void (*)(at::TensorIteratorBase&, int64_t qmin, int64_t qmax, double alpha);
MQBENCH_DECLARE_STUB(dsq_fwd_stub, dsq_fwd_fn);
MQBENCH_DECLARE_STUB(dsq_bwd_stub, dsq_bwd_fn);

// TQT (per tensor). Iterators: (out; x; s; z) and (dx; dy, x; s; z); the backward reduces
// d_scale into acc's first slot.
using tqt_fwd_fn = void (*)(at::TensorIteratorBase&, int64_t qmin, int64_t qmax, int64_t mth);
using tqt_bwd_fn = void (*)(at::TensorIteratorBase&, int64_t qmin, int64_t qmax, int64_t mth,
                            const char* scale_base, ChannelAccumulators* acc);
MQBENCH_DECLARE_STUB(tqt_fwd_stub, tqt_fwd_fn);
MQBENCH_DECLARE_STUB(tqt_bwd_stub, tqt_bwd_fn);

// PACT (per tensor): clip to [lower, upper], then fixed affine fake quantization. The backward
// reduces d_upper and d_lower into acc's two slots.
using pact_fwd_fn = void (*)(at::TensorIteratorBase&, int64_t qmin, int64_t qmax, double lower,
                             double upper);
using pact_bwd_fn = void (*)(at::TensorIteratorBase&, int64_t qmin, int64_t qmax, double lower,
                             double upper, const char* scale_base, ChannelAccumulators* acc);
MQBENCH_DECLARE_STUB(pact_fwd_stub, pact_fwd_fn);
MQBENCH_DECLARE_STUB(pact_bwd_stub, pact_bwd_fn);

// FP8 fake quantization (format: ops::detail::Fp8Format). Iterators: (out; x; s; z) and
// (dx; dy, x; s; z), z unused; the learnable backward reduces d_scale into acc's first slot.
using fp8_fwd_fn = void (*)(at::TensorIteratorBase&, int64_t format);
using fp8_bwd_fn = void (*)(at::TensorIteratorBase&, int64_t format);
using fp8_learnable_bwd_fn = void (*)(at::TensorIteratorBase&, int64_t format, double grad_factor,
                                      const char* scale_base, ChannelAccumulators* acc);
MQBENCH_DECLARE_STUB(fp8_fwd_stub, fp8_fwd_fn);
MQBENCH_DECLARE_STUB(fp8_bwd_stub, fp8_bwd_fn);
MQBENCH_DECLARE_STUB(fp8_learnable_bwd_stub, fp8_learnable_bwd_fn);

}  // namespace cpu
}  // namespace mqbench
