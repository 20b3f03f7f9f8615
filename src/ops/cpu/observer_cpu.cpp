// The CPU kernels of the observer ops (schemas in ops/observer_ops.cpp; formulas in
// docs/observers.md), registered under the CPU key: the finite-element statistics (min/max,
// moments), the qparam formula, and the range searches (quantile, clip-std, MSE, power of two).
// Vectorised inner loops: cpu/observer_kernel.cpp (statistics, MSE scores, top |x|) and
// cpu/observer_search.cpp (histogram, power-of-two scores). The CUDA kernels of the same ops
// are cuda/observer_kernel.cu and cuda/observer_search.cu.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "mqbench/config.h"
#include "ops/common/checks.h"
#include "ops/common/qparams.h"
#include "ops/cpu/observer_kernels.h"

namespace mqbench {
namespace ops {
namespace {

using cpu::ChannelStats;
using cpu::Layout;
using detail::check_input;
using detail::check_quant_range;
using detail::check_range_pair;
using detail::eps_value;

struct Viewed {
  at::Tensor data;  // contiguous
  Layout layout;
  bool per_channel = false;
};

// Note [Observer layout]: ch_axis == -1 is per tensor, other negative axes wrap.
Viewed view_for_observer(const at::Tensor& x, int64_t ch_axis, const char* op) {
  check_input(x, op);
  TORCH_CHECK(x.device().is_cpu(), op, ": x is on ", x.device(),
              "; the observer kernels run on CPU tensors");
  Viewed v;
  v.data = x.contiguous();
  if (ch_axis == -1) {
    v.layout.inner = x.numel();
    return v;
  }
  TORCH_CHECK(x.dim() > 0, op, ": ch_axis (", ch_axis, ") needs an input with at least one "
              "dimension, got a 0-d tensor; use ch_axis=-1 for per-tensor statistics");
  const int64_t axis = detail::wrap_channel_axis(ch_axis, x, op);
  v.per_channel = true;
  v.layout.channels = x.size(axis);
  for (int64_t d = 0; d < axis; ++d) v.layout.outer *= x.size(d);
  v.layout.inner = 1;
  for (int64_t d = axis + 1; d < x.dim(); ++d) v.layout.inner *= x.size(d);
  return v;
}

std::vector<ChannelStats> stats_of(const Viewed& v, bool moments) {
  std::vector<ChannelStats> out(v.layout.channels);
  cpu::channel_stats_stub.get()(v.data.data_ptr(), v.data.scalar_type() == at::kDouble, v.layout,
                                moments, out.data());
  return out;
}

// A [C] tensor (or 0-dim when per tensor) of x's dtype filled by f(c).
template <typename F>
at::Tensor channel_tensor(const Viewed& v, const F& f) {
  auto t = at::empty({v.layout.channels}, v.data.options().dtype(at::kDouble));
  auto* p = t.data_ptr<double>();
  for (int64_t c = 0; c < v.layout.channels; ++c) p[c] = f(c);
  t = t.to(v.data.scalar_type());
  return v.per_channel ? t : t.reshape({});
}

// ---- statistics ------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> min_max_impl(const at::Tensor& x, int64_t ch_axis) {
  const auto v = view_for_observer(x, ch_axis, "observer_min_max");
  const auto st = stats_of(v, /*moments=*/false);
  return {channel_tensor(v, [&](int64_t c) { return st[c].min; }),
          channel_tensor(v, [&](int64_t c) { return st[c].max; })};
}

double mean_of(const ChannelStats& s) { return s.count > 0 ? s.sum / s.count : 0.0; }
double std_of(const ChannelStats& s) {
  if (s.count < 2) return 0.0;
  const double m = s.sum / s.count;
  return std::sqrt(std::max(0.0, s.sum_sq - s.sum * m) / (s.count - 1));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> moments_impl(
    const at::Tensor& x, int64_t ch_axis) {
  const auto v = view_for_observer(x, ch_axis, "observer_moments");
  const auto st = stats_of(v, /*moments=*/true);
  return {channel_tensor(v, [&](int64_t c) { return mean_of(st[c]); }),
          channel_tensor(v, [&](int64_t c) { return std_of(st[c]); }),
          channel_tensor(v, [&](int64_t c) {
            return st[c].count > 0 ? st[c].sum_abs / st[c].count : 0.0;
          }),
          channel_tensor(v, [&](int64_t c) { return st[c].min; }),
          channel_tensor(v, [&](int64_t c) { return st[c].max; })};
}

// ---- qparams -------------------------------------------------------------------------------

std::tuple<at::Tensor, at::Tensor> calculate_qparams_impl(const at::Tensor& min_val,
                                                          const at::Tensor& max_val,
                                                          int64_t quant_min, int64_t quant_max,
                                                          bool symmetric,
                                                          int64_t symmetric_zero_point,
                                                          const at::Tensor& eps) {
  const char* op = "observer_calculate_qparams";
  check_range_pair(min_val, max_val, "min_val", "max_val", op);
  check_quant_range(quant_min, quant_max, op);
  TORCH_CHECK(quant_min < quant_max, op, ": quant_min (", quant_min,
              ") must be < quant_max (", quant_max, ") to compute a scale");
  const double e = eps_value(eps, op);
  const auto shape = min_val.dim() == 0 ? std::vector<int64_t>{1} : min_val.sizes().vec();
  const auto n = min_val.numel();
  const auto mn = min_val.contiguous().to(at::kDouble);
  const auto mx = max_val.contiguous().to(at::kDouble);
  auto scale = at::empty({n}, min_val.options().dtype(at::kDouble));
  auto zp = at::empty({n}, min_val.options().dtype(at::kInt));
  const bool is_double = min_val.scalar_type() == at::kDouble;
  for (int64_t c = 0; c < n; ++c) {
    const double a = mn.data_ptr<double>()[c], b = mx.data_ptr<double>()[c];
    double s;
    int64_t z;
    if (is_double) {
      const auto r = detail::observer_qparams<double>(a, b, quant_min, quant_max, symmetric,
                                                      symmetric_zero_point, e);
      s = r.scale;
      z = r.zero_point;
    } else {
      const auto r = detail::observer_qparams<float>(
          static_cast<float>(a), static_cast<float>(b), quant_min, quant_max, symmetric,
          symmetric_zero_point, static_cast<float>(e));
      s = r.scale;
      z = r.zero_point;
    }
    scale.data_ptr<double>()[c] = s;
    zp.data_ptr<int32_t>()[c] = static_cast<int32_t>(z);
  }
  return {scale.to(min_val.scalar_type()).reshape(shape), zp.reshape(shape)};
}

// ---- searches ------------------------------------------------------------------------------

// Note [Quantile by selection]
// EMAQuantileObserver's clip value is c = (i + 0.5) * R / bins for the first bin i of the |x|
// histogram over [0, R] (R = max|x|) whose cumulative count reaches t = threshold * n. With
// bin(v) = min(floor(v * bins / R), bins - 1) (floor(v / R * bins) where v * bins overflows: the
// same value when bins is a power of two, as the default 2048), monotone in v, that bin is
// exactly bin(v*) for v* the k-th smallest |x|, k = ceil(t): every value <= v* has a bin <=
// bin(v*), so cum(bin(v*)) >= k; and a bin i < bin(v*) holds only values < v*, of which there
// are fewer than k. v* is the (n - k + 1)-th largest |x|, and for the usual thresholds (0.99999:
// 42 of 4M elements) the largest few values are found in one pass at memory speed with
// per-thread heaps (cpu::top_abs), instead of a histogram pass with a scatter per element. Very
// low thresholds (many values to keep) use the histogram.
constexpr int64_t kMaxSelected = int64_t(1) << 16;

std::tuple<at::Tensor, at::Tensor> quantile_range_impl(const at::Tensor& x, double threshold,
                                                       int64_t bins) {
  const char* op = "observer_quantile_range";
  TORCH_CHECK_VALUE(bins >= 1 && bins <= kMaxQuantileBins, op, ": bins must be in [1, ",
                    kMaxQuantileBins, "], got ", bins);
  TORCH_CHECK_VALUE(threshold > 0.0 && threshold <= 1.0, op, ": threshold must be in (0, 1], got ",
                    threshold);
  const auto v = view_for_observer(x, -1, op);
  const bool is_double = v.data.scalar_type() == at::kDouble;
  const int64_t numel = v.data.numel();
  auto kth = [threshold](int64_t n) {  // cum >= threshold * n  <=>  cum >= k
    return std::max<int64_t>(1, static_cast<int64_t>(std::ceil(threshold * static_cast<double>(n))));
  };
  const int64_t keep = numel - kth(numel) + 1;  // enough when every element is finite
  double lo, hi, range = 0, clip = 0;
  int64_t count = 0;
  if (keep <= kMaxSelected) {
    cpu::TopAbs top;
    cpu::top_abs_stub.get()(v.data.data_ptr(), is_double, numel, keep, &top);
    count = top.count;
    lo = top.min;
    hi = top.max;
    if (count > 0) {
      range = std::max(-top.min, top.max);
      // With NaN/inf present fewer values are needed: count - k + 1 <= keep.
      const int64_t m = count - kth(count) + 1;
      auto& vals = top.values;
      std::nth_element(vals.begin(), vals.begin() + (m - 1), vals.end(), std::greater<double>());
      const double vstar = vals[m - 1];
      int64_t bin = bins / 2;  // R = 0: torch.histc widens the range, zeros fall mid-way
      if (range > 0) {
        // the histogram's bin of vstar (cpu/observer_search.cpp), in x's dtype
        bin = is_double ? detail::quantile_bin(vstar, range, bins)
                        : detail::quantile_bin(static_cast<float>(vstar),
                                               static_cast<float>(range), bins);
      }
      clip = (static_cast<double>(bin) + 0.5) * (range / static_cast<double>(bins));
    }
  } else {
    const auto st = stats_of(v, false)[0];
    count = st.count;
    lo = st.min;
    hi = st.max;
    if (count > 0) {
      range = std::max(-st.min, st.max);
      const auto hist = cpu::abs_histogram(v.data.data_ptr(), is_double, numel, range, bins);
      const int64_t k = kth(count);
      clip = range;
      int64_t cum = 0;
      for (int64_t i = 0; i < bins; ++i) {
        cum += hist[i];
        if (cum >= k) {
          clip = (static_cast<double>(i) + 0.5) * (range / static_cast<double>(bins));
          break;
        }
      }
    }
  }
  if (count > 0) {
    lo = std::max(lo, -clip);
    hi = std::min(hi, clip);
  }
  return {channel_tensor(v, [&](int64_t) { return lo; }),
          channel_tensor(v, [&](int64_t) { return hi; })};
}

std::tuple<at::Tensor, at::Tensor> clip_std_range_impl(const at::Tensor& x, int64_t ch_axis,
                                                       double std_scale) {
  const auto v = view_for_observer(x, ch_axis, "observer_clip_std_range");
  const auto st = stats_of(v, true);
  return {channel_tensor(v, [&](int64_t c) {
            return std::min(mean_of(st[c]) - std_scale * std_of(st[c]), st[c].min);
          }),
          channel_tensor(v, [&](int64_t c) {
            return std::max(mean_of(st[c]) + std_scale * std_of(st[c]), st[c].max);
          })};
}

template <typename T>
void mse_candidates(const ChannelStats& st, int64_t iters, int64_t qmin, int64_t qmax, bool sym,
                    int64_t sym_zp, double eps, cpu::Candidate* out) {
  for (int64_t i = 0; i < iters; ++i) {
    // MQBench: new_min = x_min * (1.0 - i * 0.01), the factor rounded to the observer's dtype.
    const T f = static_cast<T>(1.0 - static_cast<double>(i) * 0.01);
    const T mn = static_cast<T>(st.min) * f, mx = static_cast<T>(st.max) * f;
    const auto q = detail::observer_qparams<T>(mn, mx, qmin, qmax, sym, sym_zp, static_cast<T>(eps));
    out[i] = {static_cast<double>(q.scale), static_cast<double>(T(1) / q.scale),
              static_cast<double>(q.zero_point)};
  }
}

std::tuple<at::Tensor, at::Tensor> mse_range_impl(const at::Tensor& x, int64_t ch_axis,
                                                  int64_t quant_min, int64_t quant_max,
                                                  bool symmetric, int64_t symmetric_zero_point,
                                                  const at::Tensor& eps, double p, int64_t iters) {
  const char* op = "observer_mse_range";
  check_quant_range(quant_min, quant_max, op);
  TORCH_CHECK(quant_min < quant_max, op, ": quant_min (", quant_min, ") must be < quant_max (",
              quant_max, ")");
  TORCH_CHECK(iters >= 1 && iters <= 100, op, ": iters must be in [1, 100] (the range shrinks "
              "by 1% per step), got ", iters);
  TORCH_CHECK(std::isfinite(p) && p > 0, op, ": p must be positive, got ", p);
  const double e = eps_value(eps, op);
  const auto v = view_for_observer(x, ch_axis, op);
  const bool is_double = v.data.scalar_type() == at::kDouble;
  const auto st = stats_of(v, false);
  const int64_t channels = v.layout.channels;
  std::vector<cpu::Candidate> cands(static_cast<size_t>(channels) * iters);
  for (int64_t c = 0; c < channels; ++c) {
    if (is_double) {
      mse_candidates<double>(st[c], iters, quant_min, quant_max, symmetric, symmetric_zero_point,
                             e, cands.data() + c * iters);
    } else {
      mse_candidates<float>(st[c], iters, quant_min, quant_max, symmetric, symmetric_zero_point,
                            e, cands.data() + c * iters);
    }
  }
  std::vector<double> scores(static_cast<size_t>(channels) * iters, 0.0);
  cpu::mse_scores_stub.get()(v.data.data_ptr(), is_double, v.layout, cands.data(), iters,
                             quant_min, quant_max, p, scores.data());
  // MQBench keeps the first candidate whose score is below the best so far, starting from 1e10;
  // when none is, the unshrunk range stays.
  std::vector<double> best_min(channels), best_max(channels);
  for (int64_t c = 0; c < channels; ++c) {
    best_min[c] = st[c].min;
    best_max[c] = st[c].max;
    if (st[c].count == 0) continue;
    double best = 1e10;
    for (int64_t i = 0; i < iters; ++i) {
      const double score = scores[c * iters + i] / static_cast<double>(st[c].count);
      if (score < best) {
        best = score;
        const double f = is_double ? 1.0 - i * 0.01 : static_cast<float>(1.0 - i * 0.01);
        if (is_double) {
          best_min[c] = st[c].min * f;
          best_max[c] = st[c].max * f;
        } else {
          best_min[c] = static_cast<float>(st[c].min) * static_cast<float>(f);
          best_max[c] = static_cast<float>(st[c].max) * static_cast<float>(f);
        }
      }
    }
  }
  return {channel_tensor(v, [&](int64_t c) { return best_min[c]; }),
          channel_tensor(v, [&](int64_t c) { return best_max[c]; })};
}

int64_t pot_exponent_impl(const at::Tensor& x, const at::Tensor& min_val,
                          const at::Tensor& max_val, int64_t quant_min, int64_t quant_max,
                          int64_t range_n, int64_t mth) {
  const char* op = "observer_pot_exponent";
  check_quant_range(quant_min, quant_max, op);
  // At most 128 exponents, as the CUDA kernel (observer_search.cu): a float's exponents span
  // 277, MQBench asks for 1 or 5, and a larger count only sized a score buffer from the caller.
  constexpr int64_t kMaxExponents = 128;
  TORCH_CHECK(range_n >= 1 && range_n <= kMaxExponents, op, ": range_n must be in [1, ",
              kMaxExponents, "], got ", range_n);
  TORCH_CHECK(mth == 2 || mth == 3, op, ": mth must be 2 or 3, got ", mth);
  check_range_pair(min_val, max_val, "min_val", "max_val", op);
  TORCH_CHECK(min_val.numel() == 1, op, ": the power-of-two search is per tensor; min_val has ",
              min_val.numel(), " elements");
  const auto v = view_for_observer(x, -1, op);
  const bool is_double = v.data.scalar_type() == at::kDouble;
  const int64_t e0 = detail::pot_start_exponent(min_val.item<double>(), max_val.item<double>(),
                                                quant_min, quant_max, is_double);
  std::vector<double> loss(range_n);
  cpu::pot_scores(v.data.data_ptr(), is_double, v.data.numel(), e0, range_n, quant_min, quant_max,
                  mth, loss.data());
  return detail::pot_best_exponent(loss.data(), range_n, e0);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CPU, m) {
  m.impl("observer_min_max", TORCH_FN(min_max_impl));
  m.impl("observer_moments", TORCH_FN(moments_impl));
  m.impl("observer_calculate_qparams", TORCH_FN(calculate_qparams_impl));
  m.impl("observer_quantile_range", TORCH_FN(quantile_range_impl));
  m.impl("observer_clip_std_range", TORCH_FN(clip_std_range_impl));
  m.impl("observer_mse_range", TORCH_FN(mse_range_impl));
  m.impl("observer_pot_exponent", TORCH_FN(pot_exponent_impl));
}

}  // namespace ops
}  // namespace mqbench
