#pragma once
// C++ entry points of mqbench's observer ops (torch.ops.mqbench.observer_*): the statistics
// and range searches of every MQBench observer, and the qparam formulas. They call the ops
// through torch's dispatcher. Conventions:
//   * `ch_axis == -1` reduces over the whole tensor and returns 0-dim tensors; any other axis
//     (negative values wrap, except -1) reduces per channel and returns [C] tensors;
//   * only finite elements are counted; a channel with no finite element reports
//     min = +inf, max = -inf ("no data"), which the qparam op turns into scale 1, zero point 0;
//   * results have x's dtype (float32 or float64).
// Formulas: docs/observers.md.
//
// Example:
//   auto [mn, mx] = mqbench::ops::observer_min_max(w, /*ch_axis=*/0);       // [C] each
//   auto eps = torch::tensor({std::numeric_limits<float>::epsilon()});
//   auto [s, z] = mqbench::ops::observer_calculate_qparams(mn, mx, -127, 127, true, 0, eps);

#include <ATen/core/Tensor.h>

#include <tuple>

#include "mqbench/config.h"

namespace mqbench {
namespace ops {

/// Min and max of the finite elements.
std::tuple<at::Tensor, at::Tensor> observer_min_max(const at::Tensor& x, int64_t ch_axis);

/// Mean, standard deviation (unbiased; 0 for fewer than two elements), mean of |x|, min and
/// max of the finite elements, in one pass.
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> observer_moments(
    const at::Tensor& x, int64_t ch_axis);

/// MinMaxObserver's update: elementwise min(min_val, cur_min), max(max_val, cur_max). A
/// one-element state broadcasts to the batch's channel count.
std::tuple<at::Tensor, at::Tensor> observer_running_min_max(const at::Tensor& min_val,
                                                            const at::Tensor& max_val,
                                                            const at::Tensor& cur_min,
                                                            const at::Tensor& cur_max);

/// The EMA update of MQBench's EMA observers: the first batch (state max_val a single +-inf)
/// is taken as is; later v = v * r + cur * (1 - r). Channels where the batch had no data keep
/// their state.
std::tuple<at::Tensor, at::Tensor> observer_ema_min_max(const at::Tensor& min_val,
                                                        const at::Tensor& max_val,
                                                        const at::Tensor& cur_min,
                                                        const at::Tensor& cur_max,
                                                        double ema_ratio);

/// Scale and int32 zero point from a range (Note [Observer qparams] in ops/common/qparams.h).
/// A 0-dim range gives [1]-shaped results.
std::tuple<at::Tensor, at::Tensor> observer_calculate_qparams(
    const at::Tensor& min_val, const at::Tensor& max_val, int64_t quant_min, int64_t quant_max,
    bool symmetric, int64_t symmetric_zero_point, const at::Tensor& eps);

/// EMAQuantileObserver's batch range: the histogram of |x| over [0, R], R = max(-min, max),
/// gives the clip value c of the first bin where the cumulative count reaches threshold * n;
/// returns (max(min, -c), min(max, c)). `bins` must be in [1, kMaxQuantileBins]
/// (mqbench/config.h) and `threshold` in (0, 1] (ValueError otherwise).
std::tuple<at::Tensor, at::Tensor> observer_quantile_range(const at::Tensor& x, double threshold,
                                                           int64_t bins);

/// ClipStdObserver's batch range: (min(mean - k std, min), max(mean + k std, max)).
std::tuple<at::Tensor, at::Tensor> observer_clip_std_range(const at::Tensor& x, int64_t ch_axis,
                                                           double std_scale);

/// MSEObserver's search: the range (min, max) * (1 - 0.01 i), i < iters, whose fixed affine
/// fake quantization minimises mean |fq(x) - x|^p, per tensor or independently per channel.
std::tuple<at::Tensor, at::Tensor> observer_mse_range(const at::Tensor& x, int64_t ch_axis,
                                                      int64_t quant_min, int64_t quant_max,
                                                      bool symmetric,
                                                      int64_t symmetric_zero_point,
                                                      const at::Tensor& eps, double p,
                                                      int64_t iters);

/// MinMaxFloorObserver's power-of-two search: the exponent e (scale 2^-e, at most 12) among
/// e0 .. e0 + range_n - 1 with the smallest squared TQT error on x.
int64_t observer_pot_exponent(const at::Tensor& x, const at::Tensor& min_val,
                              const at::Tensor& max_val, int64_t quant_min, int64_t quant_max,
                              int64_t range_n, int64_t mth);

/// LSQObserver's initialisation: s = 2 mean|x| / sqrt(qmax) (power of two if pot_scale);
/// z = 0, or qmin - round(min / s) when asymmetric and min >= 0.
std::tuple<at::Tensor, at::Tensor> observer_lsq_qparams(const at::Tensor& tensor_norm,
                                                        const at::Tensor& min_val,
                                                        int64_t quant_min, int64_t quant_max,
                                                        bool symmetric, bool pot_scale,
                                                        const at::Tensor& eps);

/// LSQPlusObserver's initialisation: s = max(|mean - 3 std|, |mean + 3 std|) / (qmax - qmin + 1)
/// (power of two if pot_scale); z as in observer_lsq_qparams.
std::tuple<at::Tensor, at::Tensor> observer_lsq_plus_qparams(
    const at::Tensor& mean, const at::Tensor& std, const at::Tensor& min_val, int64_t quant_min,
    int64_t quant_max, bool symmetric, bool pot_scale, const at::Tensor& eps);

}  // namespace ops
}  // namespace mqbench
