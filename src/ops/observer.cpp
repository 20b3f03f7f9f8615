// Observer ops: schemas, validation and CPU implementations of the statistics, range searches
// and qparam formulas of MQBench's observers (docs/observers.md). Kernels:
// cpu/observer_kernel.cpp (vectorized statistics and MSE search), cpu/observer_search.cpp
// (histogram, power-of-two search). The ops carry no gradient: observers see x.detach().

#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "mqbench/ops/observer.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"
#include "ops/common/qparams.h"
#include "ops/cpu/observer_kernels.h"

namespace mqbench {
namespace ops {
namespace {

using cpu::ChannelStats;
using cpu::Layout;
using detail::check_input;
using detail::check_quant_range;

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

double eps_value(const at::Tensor& eps, const char* op) {
  TORCH_CHECK(eps.defined() && eps.numel() == 1 && at::isFloatingType(eps.scalar_type()), op,
              ": eps must be a one-element floating-point tensor");
  const double e = eps.item<double>();
  TORCH_CHECK(std::isfinite(e) && e > 0, op, ": eps must be positive and finite, got ", e);
  return e;
}

void check_range_pair(const at::Tensor& a, const at::Tensor& b, const char* na, const char* nb,
                      const char* op) {
  TORCH_CHECK(a.defined() && b.defined(), op, ": ", na, " and ", nb, " must be defined");
  TORCH_CHECK(at::isFloatingType(a.scalar_type()) && at::isFloatingType(b.scalar_type()), op,
              ": ", na, " and ", nb, " must be floating-point tensors, got ", a.scalar_type(),
              " and ", b.scalar_type());
  TORCH_CHECK(a.numel() == b.numel(), op, ": ", na, " has ", a.numel(), " elements but ", nb,
              " has ", b.numel());
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

// ---- state updates -----------------------------------------------------------------------------

// The state as `cur`'s dtype and shape: a one-element state broadcasts to cur's channels.
at::Tensor state_like(const at::Tensor& state, const at::Tensor& cur, const char* name,
                      const char* op) {
  TORCH_CHECK(state.numel() == 1 || state.numel() == cur.numel(), op, ": the observer state ",
              name, " has ", state.numel(), " channels but the batch has ", cur.numel(),
              "; a per-channel observer must see the same channel count in every batch");
  return state.to(cur.scalar_type()).expand_as(cur.reshape({cur.numel()}))
      .reshape(cur.sizes()).contiguous();
}

std::tuple<at::Tensor, at::Tensor> running_min_max_impl(const at::Tensor& min_val,
                                                        const at::Tensor& max_val,
                                                        const at::Tensor& cur_min,
                                                        const at::Tensor& cur_max) {
  const char* op = "observer_running_min_max";
  check_range_pair(min_val, max_val, "min_val", "max_val", op);
  check_range_pair(cur_min, cur_max, "cur_min", "cur_max", op);
  const auto mn = state_like(min_val, cur_min, "min_val", op);
  const auto mx = state_like(max_val, cur_max, "max_val", op);
  // cur is +inf/-inf where the batch had no data, so min/max keep the state there.
  return {at::minimum(mn, cur_min), at::maximum(mx, cur_max)};
}

std::tuple<at::Tensor, at::Tensor> ema_min_max_impl(const at::Tensor& min_val,
                                                    const at::Tensor& max_val,
                                                    const at::Tensor& cur_min,
                                                    const at::Tensor& cur_max, double ratio) {
  const char* op = "observer_ema_min_max";
  check_range_pair(min_val, max_val, "min_val", "max_val", op);
  check_range_pair(cur_min, cur_max, "cur_min", "cur_max", op);
  TORCH_CHECK(ratio >= 0.0 && ratio <= 1.0, op, ": ema_ratio must be in [0, 1], got ", ratio);
  // MQBench: the first batch is taken as is when the state is the initial single -inf. On a
  // device the test is a select, not a host read (no synchronisation per calibration batch).
  const bool single = max_val.numel() <= 1;
  if (single && max_val.is_cpu() && std::isinf(max_val.item<double>())) {
    return {cur_min.clone(), cur_max.clone()};
  }
  const auto mn = state_like(min_val, cur_min, "min_val", op);
  const auto mx = state_like(max_val, cur_max, "max_val", op);
  // v * r + cur * (1 - r), in the observer's dtype, as torch evaluates MQBench's expression.
  const auto upd_min = mn * ratio + cur_min * (1.0 - ratio);
  const auto upd_max = mx * ratio + cur_max * (1.0 - ratio);
  auto new_min = at::where(at::isfinite(cur_min), upd_min, mn);
  auto new_max = at::where(at::isfinite(cur_max), upd_max, mx);
  if (single && !max_val.is_cpu()) {
    const auto first = at::isinf(max_val.reshape({}));
    new_min = at::where(first, cur_min, new_min);
    new_max = at::where(first, cur_max, new_max);
  }
  return {new_min, new_max};
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
// bin(v) = min(floor(v * bins / R), bins - 1), monotone in v, that bin is exactly bin(v*) for
// v* the k-th smallest |x|, k = ceil(t): every value <= v* has a bin <= bin(v*), so
// cum(bin(v*)) >= k; and a bin i < bin(v*) holds only values < v*, of which there are fewer
// than k. v* is the (n - k + 1)-th largest |x|, and for the usual thresholds (0.99999: 42 of
// 4M elements) the largest few values are found in one pass at memory speed with per-thread
// heaps (cpu::top_abs), instead of a histogram pass with a scatter per element. Very low
// thresholds (many values to keep) use the histogram.
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
        const double scaled = is_double ? vstar * bins / range
                                        : static_cast<double>(static_cast<float>(vstar) *
                                                              static_cast<float>(bins) /
                                                              static_cast<float>(range));
        bin = std::min<int64_t>(static_cast<int64_t>(scaled), bins - 1);
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
  TORCH_CHECK(range_n >= 1, op, ": range_n must be >= 1, got ", range_n);
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

// LSQ / LSQ+ initial qparams (Esser et al. 2020, "Learned Step Size Quantization"; Bhalgat et
// al. 2020, "LSQ+"): the scale from a statistic, rounded to a power of two when asked, then with
// an asymmetric scheme the zero point quant_min - round(min_val / scale):
//   * LSQ: from min_val per channel (or per tensor), clamped to [quant_min, quant_max] (MQBench
//     leaves it unclamped; its learnable fake-quantize clamps it in the forward anyway);
//   * LSQ+: from the global min_val, and only when min_val >= 0 (MQBench's), unclamped.
// Deliberate difference: the scale is clamped to eps, so a constant-zero tensor gives no zero
// scale (docs/compatibility.md).
enum class LsqKind { kLsq, kLsqPlus };

std::tuple<at::Tensor, at::Tensor> lsq_finish(at::Tensor scale, const at::Tensor& min_val,
                                              int64_t quant_min, int64_t quant_max,
                                              bool symmetric, bool pot_scale,
                                              const at::Tensor& eps, LsqKind kind,
                                              const char* op) {
  const double e = eps_value(eps, op);
  scale = at::clamp_min(scale, e);
  if (pot_scale) scale = at::exp2(at::round(at::log2(scale)));
  auto zp = at::zeros_like(scale);
  if (!symmetric && kind == LsqKind::kLsq) {
    TORCH_CHECK(min_val.numel() == 1 || min_val.numel() == scale.numel(), op,
                ": min_val must have one element or one per channel (", scale.numel(),
                "), got ", min_val.numel());
    const auto m = min_val.to(scale.scalar_type()).reshape(min_val.numel() == 1
                                                              ? at::IntArrayRef{}
                                                              : scale.sizes());
    const auto offset = at::clamp(quant_min - at::round(m / scale), quant_min, quant_max);
    zp = at::where(at::isfinite(m), offset, at::zeros_like(offset)).expand_as(scale).clone();
  } else if (!symmetric) {
    TORCH_CHECK(min_val.numel() == 1, op, ": min_val must be the tensor's global minimum (one "
                "element), got ", min_val.numel(), " elements");
    const double m = min_val.item<double>();
    if (std::isfinite(m) && m >= 0.0) {  // no data (+inf) gives no offset
      zp = quant_min - at::round(min_val.to(scale.scalar_type()) / scale);
    }
  }
  if (scale.dim() == 0) {
    scale = scale.reshape({1});
    zp = zp.reshape({1});
  }
  return {scale, zp};
}

std::tuple<at::Tensor, at::Tensor> lsq_qparams_impl(const at::Tensor& tensor_norm,
                                                    const at::Tensor& min_val, int64_t quant_min,
                                                    int64_t quant_max, bool symmetric,
                                                    bool pot_scale, const at::Tensor& eps) {
  const char* op = "observer_lsq_qparams";
  check_quant_range(quant_min, quant_max, op);
  TORCH_CHECK(quant_max > 0, op, ": quant_max must be positive, got ", quant_max);
  TORCH_CHECK(tensor_norm.defined() && at::isFloatingType(tensor_norm.scalar_type()), op,
              ": tensor_norm must be a floating-point tensor");
  const auto scale = 2 * tensor_norm / std::sqrt(static_cast<double>(quant_max));
  return lsq_finish(scale, min_val, quant_min, quant_max, symmetric, pot_scale, eps,
                    LsqKind::kLsq, op);
}

std::tuple<at::Tensor, at::Tensor> lsq_plus_qparams_impl(const at::Tensor& mean,
                                                         const at::Tensor& std,
                                                         const at::Tensor& min_val,
                                                         int64_t quant_min, int64_t quant_max,
                                                         bool symmetric, bool pot_scale,
                                                         const at::Tensor& eps) {
  const char* op = "observer_lsq_plus_qparams";
  check_quant_range(quant_min, quant_max, op);
  check_range_pair(mean, std, "mean", "std", op);
  const auto scale = at::maximum((mean - 3 * std).abs(), (mean + 3 * std).abs()) /
                     static_cast<double>(quant_max - quant_min + 1);
  return lsq_finish(scale, min_val, quant_min, quant_max, symmetric, pot_scale, eps,
                    LsqKind::kLsqPlus, op);
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("observer_min_max(Tensor x, int ch_axis) -> (Tensor, Tensor)");
  m.def("observer_moments(Tensor x, int ch_axis) -> (Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("observer_running_min_max(Tensor min_val, Tensor max_val, Tensor cur_min, "
        "Tensor cur_max) -> (Tensor, Tensor)");
  m.def("observer_ema_min_max(Tensor min_val, Tensor max_val, Tensor cur_min, Tensor cur_max, "
        "float ema_ratio) -> (Tensor, Tensor)");
  m.def("observer_calculate_qparams(Tensor min_val, Tensor max_val, int quant_min, "
        "int quant_max, bool symmetric, int symmetric_zero_point, Tensor eps) -> (Tensor, Tensor)");
  m.def("observer_quantile_range(Tensor x, float threshold, int bins) -> (Tensor, Tensor)");
  m.def("observer_clip_std_range(Tensor x, int ch_axis, float std_scale) -> (Tensor, Tensor)");
  m.def("observer_mse_range(Tensor x, int ch_axis, int quant_min, int quant_max, bool symmetric, "
        "int symmetric_zero_point, Tensor eps, float p, int iters) -> (Tensor, Tensor)");
  m.def("observer_pot_exponent(Tensor x, Tensor min_val, Tensor max_val, int quant_min, "
        "int quant_max, int range_n, int mth) -> int");
  m.def("observer_lsq_qparams(Tensor tensor_norm, Tensor min_val, int quant_min, int quant_max, "
        "bool symmetric, bool pot_scale, Tensor eps) -> (Tensor, Tensor)");
  m.def("observer_lsq_plus_qparams(Tensor mean, Tensor std, Tensor min_val, int quant_min, "
        "int quant_max, bool symmetric, bool pot_scale, Tensor eps) -> (Tensor, Tensor)");
}

// CompositeExplicitAutograd: one kernel for every backend key, no autograd formula (observers
// take detached input; a gradient through them is an error, not a silent zero).
TORCH_LIBRARY_IMPL(mqbench, CompositeExplicitAutograd, m) {
  m.impl("observer_min_max", TORCH_FN(min_max_impl));
  m.impl("observer_moments", TORCH_FN(moments_impl));
  m.impl("observer_running_min_max", TORCH_FN(running_min_max_impl));
  m.impl("observer_ema_min_max", TORCH_FN(ema_min_max_impl));
  m.impl("observer_calculate_qparams", TORCH_FN(calculate_qparams_impl));
  m.impl("observer_quantile_range", TORCH_FN(quantile_range_impl));
  m.impl("observer_clip_std_range", TORCH_FN(clip_std_range_impl));
  m.impl("observer_mse_range", TORCH_FN(mse_range_impl));
  m.impl("observer_pot_exponent", TORCH_FN(pot_exponent_impl));
  m.impl("observer_lsq_qparams", TORCH_FN(lsq_qparams_impl));
  m.impl("observer_lsq_plus_qparams", TORCH_FN(lsq_plus_qparams_impl));
}

// ---- C++ entry points ----------------------------------------------------------------------

#define MQBENCH_OP(name, sig) \
  static auto op = detail::op_handle<sig>("mqbench::" name)

using TT = std::tuple<at::Tensor, at::Tensor>;

TT observer_min_max(const at::Tensor& x, int64_t ch_axis) {
  MQBENCH_OP("observer_min_max", TT(const at::Tensor&, int64_t));
  return op.call(x, ch_axis);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> observer_moments(
    const at::Tensor& x, int64_t ch_axis) {
  using T5 = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
  MQBENCH_OP("observer_moments", T5(const at::Tensor&, int64_t));
  return op.call(x, ch_axis);
}

TT observer_running_min_max(const at::Tensor& min_val, const at::Tensor& max_val,
                            const at::Tensor& cur_min, const at::Tensor& cur_max) {
  MQBENCH_OP("observer_running_min_max",
             TT(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&));
  return op.call(min_val, max_val, cur_min, cur_max);
}

TT observer_ema_min_max(const at::Tensor& min_val, const at::Tensor& max_val,
                        const at::Tensor& cur_min, const at::Tensor& cur_max, double ema_ratio) {
  MQBENCH_OP("observer_ema_min_max", TT(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                        const at::Tensor&, double));
  return op.call(min_val, max_val, cur_min, cur_max, ema_ratio);
}

TT observer_calculate_qparams(const at::Tensor& min_val, const at::Tensor& max_val,
                              int64_t quant_min, int64_t quant_max, bool symmetric,
                              int64_t symmetric_zero_point, const at::Tensor& eps) {
  MQBENCH_OP("observer_calculate_qparams", TT(const at::Tensor&, const at::Tensor&, int64_t,
                                              int64_t, bool, int64_t, const at::Tensor&));
  return op.call(min_val, max_val, quant_min, quant_max, symmetric, symmetric_zero_point, eps);
}

TT observer_quantile_range(const at::Tensor& x, double threshold, int64_t bins) {
  MQBENCH_OP("observer_quantile_range", TT(const at::Tensor&, double, int64_t));
  return op.call(x, threshold, bins);
}

TT observer_clip_std_range(const at::Tensor& x, int64_t ch_axis, double std_scale) {
  MQBENCH_OP("observer_clip_std_range", TT(const at::Tensor&, int64_t, double));
  return op.call(x, ch_axis, std_scale);
}

TT observer_mse_range(const at::Tensor& x, int64_t ch_axis, int64_t quant_min, int64_t quant_max,
                      bool symmetric, int64_t symmetric_zero_point, const at::Tensor& eps,
                      double p, int64_t iters) {
  MQBENCH_OP("observer_mse_range", TT(const at::Tensor&, int64_t, int64_t, int64_t, bool, int64_t,
                                      const at::Tensor&, double, int64_t));
  return op.call(x, ch_axis, quant_min, quant_max, symmetric, symmetric_zero_point, eps, p,
                 iters);
}

int64_t observer_pot_exponent(const at::Tensor& x, const at::Tensor& min_val,
                              const at::Tensor& max_val, int64_t quant_min, int64_t quant_max,
                              int64_t range_n, int64_t mth) {
  MQBENCH_OP("observer_pot_exponent", int64_t(const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, int64_t, int64_t, int64_t,
                                               int64_t));
  return op.call(x, min_val, max_val, quant_min, quant_max, range_n, mth);
}

TT observer_lsq_qparams(const at::Tensor& tensor_norm, const at::Tensor& min_val,
                        int64_t quant_min, int64_t quant_max, bool symmetric, bool pot_scale,
                        const at::Tensor& eps) {
  MQBENCH_OP("observer_lsq_qparams", TT(const at::Tensor&, const at::Tensor&, int64_t, int64_t,
                                        bool, bool, const at::Tensor&));
  return op.call(tensor_norm, min_val, quant_min, quant_max, symmetric, pot_scale, eps);
}

TT observer_lsq_plus_qparams(const at::Tensor& mean, const at::Tensor& std,
                             const at::Tensor& min_val, int64_t quant_min, int64_t quant_max,
                             bool symmetric, bool pot_scale, const at::Tensor& eps) {
  MQBENCH_OP("observer_lsq_plus_qparams",
             TT(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, bool,
                bool, const at::Tensor&));
  return op.call(mean, std, min_val, quant_min, quant_max, symmetric, pot_scale, eps);
}

#undef MQBENCH_OP

}  // namespace ops
}  // namespace mqbench
