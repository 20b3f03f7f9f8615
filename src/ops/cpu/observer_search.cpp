// Scalar observer kernels: the |x| histogram of EMAQuantileObserver and the power-of-two
// search of MinMaxFloorObserver / PoTModeObserver. Both are parallel single passes with
// per-thread accumulators; they are few operations per element, so they are not compiled per
// CPU capability.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>

#include "ops/common/qparams.h"
#include "ops/cpu/observer_kernels.h"

namespace mqbench {
namespace cpu {
namespace {

constexpr int64_t kGrain = 32768;

// Bins are computed a block at a time, then counted into four interleaved sub-histograms, so
// runs of equal bins (most of a bell-shaped |x| falls in a few bins) do not serialise on one
// counter's store-to-load latency.
template <typename T>
std::vector<int64_t> abs_histogram_typed(const T* x, int64_t numel, double range, int64_t bins) {
  const int threads = at::get_num_threads();
  constexpr int kWays = 4;
  constexpr int64_t kBlock = 512;
  std::vector<int64_t> acc(static_cast<size_t>(threads) * kWays * bins, 0);
  const T r = static_cast<T>(range);
  at::parallel_for(0, numel, kGrain, [&](int64_t begin, int64_t end) {
    int64_t* h = acc.data() + static_cast<size_t>(at::get_thread_num()) * kWays * bins;
    int32_t idx[kBlock];
    for (int64_t b = begin; b < end; b += kBlock) {
      const int64_t m = std::min(kBlock, end - b);
      for (int64_t i = 0; i < m; ++i) {
        const T a = std::abs(x[b + i]);
        // Non-finite values and values above the range get bin -1 (skipped).
        const bool ok = a <= r;
        const int64_t pos = r > T(0) ? ops::detail::quantile_bin(a, r, bins) : bins / 2;
        idx[i] = ok ? static_cast<int32_t>(pos) : -1;
      }
      for (int64_t i = 0; i < m; ++i) {
        if (idx[i] >= 0) h[(i % kWays) * bins + idx[i]] += 1;
      }
    }
  });
  std::vector<int64_t> out(bins, 0);
  for (int64_t row = 0; row < static_cast<int64_t>(threads) * kWays; ++row) {
    for (int64_t b = 0; b < bins; ++b) out[b] += acc[static_cast<size_t>(row) * bins + b];
  }
  return out;
}

// TQT rounding (Jain et al. 2020, "Trained Quantization Thresholds"), as MQBench's PoT search:
//   mth 3: clamp(round(v), qmin, qmax)
//   mth 2: t = clamp(v, qmin, qmax); ceil(t) for negative ties (t - floor(t) == 0.5), else round(t)
template <typename T>
inline T tqt_round(T v, T lo, T hi, int64_t mth) {
  if (mth == 3) return std::min(std::max(std::nearbyint(v), lo), hi);
  const T t = std::min(std::max(v, lo), hi);
  return (t < T(0) && t - std::floor(t) == T(0.5)) ? std::ceil(t) : std::nearbyint(t);
}

template <typename T>
void pot_scores_typed(const T* x, int64_t numel, int64_t e0, int64_t n, int64_t qmin,
                      int64_t qmax, int64_t mth, double* out) {
  const int threads = at::get_num_threads();
  std::vector<double> acc(static_cast<size_t>(threads) * n, 0.0);
  std::vector<T> steps(n);
  for (int64_t k = 0; k < n; ++k) steps[k] = static_cast<T>(std::ldexp(1.0, -(e0 + k)));
  const T lo = static_cast<T>(qmin), hi = static_cast<T>(qmax);
  at::parallel_for(0, numel, kGrain, [&](int64_t begin, int64_t end) {
    double* a = acc.data() + static_cast<size_t>(at::get_thread_num()) * n;
    for (int64_t k = 0; k < n; ++k) {
      const T st = steps[k];
      double s = 0;
      for (int64_t i = begin; i < end; ++i) {
        const T v = x[i];
        if (!std::isfinite(v)) continue;
        const T d = tqt_round(v / st, lo, hi, mth) * st - v;
        s += static_cast<double>(d) * d;
      }
      a[k] += s;
    }
  });
  for (int64_t k = 0; k < n; ++k) {
    out[k] = 0;
    for (int t = 0; t < threads; ++t) out[k] += acc[static_cast<size_t>(t) * n + k];
  }
}

}  // namespace

std::vector<int64_t> abs_histogram(const void* data, bool is_double, int64_t numel, double range,
                                   int64_t bins) {
  return is_double ? abs_histogram_typed(static_cast<const double*>(data), numel, range, bins)
                   : abs_histogram_typed(static_cast<const float*>(data), numel, range, bins);
}

void pot_scores(const void* data, bool is_double, int64_t numel, int64_t e0, int64_t n,
                int64_t quant_min, int64_t quant_max, int64_t mth, double* out) {
  if (is_double) {
    pot_scores_typed(static_cast<const double*>(data), numel, e0, n, quant_min, quant_max, mth, out);
  } else {
    pot_scores_typed(static_cast<const float*>(data), numel, e0, n, quant_min, quant_max, mth, out);
  }
}

}  // namespace cpu
}  // namespace mqbench
