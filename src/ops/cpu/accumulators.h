#pragma once
// Per-thread, per-channel accumulators for the gradients that CPU kernels reduce in the same
// pass as their element-wise work (scale, zero point, clip values).

#include <cstdint>
#include <vector>

namespace mqbench {
namespace cpu {

/// Per-thread, per-channel double accumulators for two reduced gradients (e.g. d_scale and
/// d_zero_point), filled inside one pass of a kernel (see Note [Qparam iterators]). Its
/// methods are defined out of line in dispatch.cpp, compiled once for the baseline ISA.
class ChannelAccumulators {
 public:
  explicit ChannelAccumulators(int64_t channels);

  /// The calling thread's row: row()[2*c] and row()[2*c+1] are channel c's two sums.
  double* row();

  /// Sums the threads' rows into out_a[c], out_b[c] (either may be null).
  void reduce(double* out_a, double* out_b) const;

 private:
  int64_t channels_;
  int64_t stride_;
  std::vector<double> data_;
};

}  // namespace cpu
}  // namespace mqbench
