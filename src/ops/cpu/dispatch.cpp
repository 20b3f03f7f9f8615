// CPU capability detection (AVX2 + FMA + F16C or the baseline; MQBENCH_CPU_CAPABILITY overrides
// it; Note [CPU capability dispatch] in dispatch.h) and the channel accumulators' methods,
// compiled once for the baseline instruction set.

#include "ops/cpu/dispatch.h"

#include <cstdlib>
#include <cstring>

namespace mqbench {
namespace cpu {

namespace {

Capability detect() {
  Capability best = Capability::kDefault;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    best = Capability::kAvx2;
  }
#endif
  if (const char* env = std::getenv("MQBENCH_CPU_CAPABILITY")) {
    if (std::strcmp(env, "default") == 0) {
      best = Capability::kDefault;
    } else if (std::strcmp(env, "avx2") == 0) {
      TORCH_CHECK(best == Capability::kAvx2,
                  "MQBENCH_CPU_CAPABILITY=avx2 but this CPU does not support AVX2+FMA+F16C");
    } else {
      TORCH_CHECK(false, "MQBENCH_CPU_CAPABILITY must be 'default' or 'avx2', got '", env, "'");
    }
  }
  return best;
}

}  // namespace

Capability active_capability() {
  static const Capability c = detect();
  return c;
}

const char* capability_name(Capability c) {
  switch (c) {
    case Capability::kAvx2:
      return "avx2";
    case Capability::kDefault:
      return "default";
  }
  return "unknown";
}

}  // namespace cpu
}  // namespace mqbench

// ---- ChannelAccumulators (see accumulators.h) -----------------------------------------------

#include <ATen/Parallel.h>

#include "ops/cpu/accumulators.h"

namespace mqbench {
namespace cpu {

ChannelAccumulators::ChannelAccumulators(int64_t channels)
    : channels_(channels),
      // One row per thread, padded to whole cache lines: no false sharing between threads.
      stride_(((2 * channels + 7) / 8) * 8 + 8),
      data_(static_cast<size_t>(at::get_num_threads()) * static_cast<size_t>(stride_), 0.0) {}

double* ChannelAccumulators::row() {
  const int t = at::get_thread_num();
  TORCH_INTERNAL_ASSERT(t >= 0 && static_cast<size_t>(t + 1) * stride_ <= data_.size(),
                        "thread index ", t, " outside the accumulator rows");
  return data_.data() + static_cast<int64_t>(t) * stride_;
}

void ChannelAccumulators::reduce(double* out_a, double* out_b) const {
  const int64_t threads = static_cast<int64_t>(data_.size()) / stride_;
  for (int64_t c = 0; c < channels_; ++c) {
    double a = 0, b = 0;
    for (int64_t t = 0; t < threads; ++t) {
      a += data_[t * stride_ + 2 * c];
      b += data_[t * stride_ + 2 * c + 1];
    }
    if (out_a) out_a[c] = a;
    if (out_b) out_b[c] = b;
  }
}

}  // namespace cpu
}  // namespace mqbench

// ---- Stub definitions (one per kernel entry point of kernels.h) -----------------------------

#include "ops/cpu/kernels.h"
#include "ops/cpu/observer_kernels.h"
#include "ops/cpu/bn_fold_kernels.h"

namespace mqbench {
namespace cpu {

MQBENCH_DEFINE_STUB(affine_fwd_stub, affine_fwd_fn);
MQBENCH_DEFINE_STUB(channel_stats_stub, channel_stats_fn);
MQBENCH_DEFINE_STUB(mse_scores_stub, mse_scores_fn);
MQBENCH_DEFINE_STUB(top_abs_stub, top_abs_fn);
MQBENCH_DEFINE_STUB(bn_fold_fwd_stub, bn_fold_fwd_fn);
MQBENCH_DEFINE_STUB(bn_fold_bwd_stub, bn_fold_bwd_fn);
MQBENCH_DEFINE_STUB(affine_bwd_stub, affine_bwd_fn);
MQBENCH_DEFINE_STUB(learnable_bwd_stub, learnable_bwd_fn);
MQBENCH_DEFINE_STUB(dsq_fwd_stub, dsq_fwd_fn);
MQBENCH_DEFINE_STUB(dsq_bwd_stub, dsq_bwd_fn);
MQBENCH_DEFINE_STUB(tqt_fwd_stub, tqt_fwd_fn);
MQBENCH_DEFINE_STUB(tqt_bwd_stub, tqt_bwd_fn);
MQBENCH_DEFINE_STUB(pact_fwd_stub, pact_fwd_fn);
MQBENCH_DEFINE_STUB(pact_bwd_stub, pact_bwd_fn);
MQBENCH_DEFINE_STUB(fp8_fwd_stub, fp8_fwd_fn);
MQBENCH_DEFINE_STUB(fp8_bwd_stub, fp8_bwd_fn);
MQBENCH_DEFINE_STUB(fp8_learnable_bwd_stub, fp8_learnable_bwd_fn);

}  // namespace cpu
}  // namespace mqbench

// ---- Public query (include/mqbench/config.h) ------------------------------------------------

#include "mqbench/config.h"

namespace mqbench {

const char* cpu_capability() { return cpu::capability_name(cpu::active_capability()); }

}  // namespace mqbench
