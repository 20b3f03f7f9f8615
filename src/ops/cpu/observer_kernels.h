#pragma once
// Observer kernels: one-pass statistics and the one-pass MSE range search, dispatched by CPU
// capability (Note [CPU capability dispatch]).
//
// Note [Observer layout]
// Observers reduce "per tensor" or "per channel along ch_axis". Both kernels take a contiguous
// tensor viewed as [outer, C, inner] (C = 1 and outer = 1 per tensor) and reduce each channel
// c over outer and inner. Work is split into rows of `inner` elements, each cut into chunks, and
// spread over threads; every thread keeps its own per-channel accumulators (no atomics, no
// full-size temporaries). Only finite elements are counted: NaN and +-inf never reach the
// statistics (docs/compatibility.md), so a NaN or inf in a batch cannot poison the range.

#include <cstdint>
#include <limits>
#include <vector>

#include "ops/cpu/dispatch.h"

namespace mqbench {
namespace cpu {

struct Layout {
  int64_t outer = 1, channels = 1, inner = 0;
};

/// Per-channel statistics of the finite elements, in double.
struct ChannelStats {
  int64_t count = 0;
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0, sum_sq = 0, sum_abs = 0;

  void merge(const ChannelStats& o) {
    count += o.count;
    min = o.min < min ? o.min : min;
    max = o.max > max ? o.max : max;
    sum += o.sum;
    sum_sq += o.sum_sq;
    sum_abs += o.sum_abs;
  }
};

/// One affine fake-quantization candidate of the MSE search: inv = 1/scale in the data's
/// precision (torch multiplies by the float reciprocal), zero point as a float value.
struct Candidate {
  double scale, inv, zero_point;
};

// data: float* or double* (is_double), contiguous [outer, C, inner]. moments: also the sums.
// out: C entries.
using channel_stats_fn = void (*)(const void* data, bool is_double, const Layout& layout,
                                  bool moments, ChannelStats* out);
// Sum over the finite elements of channel c of |fq_k(x) - x|^p for each of the K candidates
// of that channel (candidates[c * K + k]); out[c * K + k]. p == 2 takes a squared fast path.
using mse_scores_fn = void (*)(const void* data, bool is_double, const Layout& layout,
                               const Candidate* candidates, int64_t num_candidates,
                               int64_t quant_min, int64_t quant_max, double p, double* out);

/// The largest |x| values of a tensor and its finite statistics, in one pass.
struct TopAbs {
  std::vector<double> values;  // the `m` largest finite |x| (fewer if there are fewer), unsorted
  int64_t count = 0;           // finite elements
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
};
using top_abs_fn = void (*)(const void* data, bool is_double, int64_t numel, int64_t m,
                            TopAbs* out);

MQBENCH_DECLARE_STUB(channel_stats_stub, channel_stats_fn);
MQBENCH_DECLARE_STUB(top_abs_stub, top_abs_fn);
MQBENCH_DECLARE_STUB(mse_scores_stub, mse_scores_fn);

}  // namespace cpu
}  // namespace mqbench

namespace mqbench {
namespace cpu {

/// Histogram of |x| over [0, range] with `bins` equal bins (torch.histc's binning; the value
/// `range` itself falls in the last bin), over the finite elements of a contiguous tensor.
std::vector<int64_t> abs_histogram(const void* data, bool is_double, int64_t numel, double range,
                                   int64_t bins);

/// Sum over the finite elements of (tqt_k(x) - x)^2 for the power-of-two steps 2^-e,
/// e = e0 .. e0 + n - 1, where tqt is the TQT rounding of `mth` (3: half to even; 2: half to
/// even but negative ties round up) of clamp(x / step, qmin, qmax) (mth 2) or of x / step then
/// clamped (mth 3). out has n entries.
void pot_scores(const void* data, bool is_double, int64_t numel, int64_t e0, int64_t n,
                int64_t quant_min, int64_t quant_max, int64_t mth, double* out);

}  // namespace cpu
}  // namespace mqbench
