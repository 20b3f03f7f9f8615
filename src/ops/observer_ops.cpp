// Observer ops: schemas, the device-generic composites (state updates, LSQ / LSQ+ initial
// qparams, written with ATen ops so they run on any device) and the C++ entry points
// (docs/observers.md). The CPU kernels of the statistics, qparams and searches are in
// cpu/observer_cpu.cpp, the CUDA ones in cuda/observer_kernel.cu and cuda/observer_search.cu.
// The ops carry no gradient: observers see x.detach().

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cmath>

#include "mqbench/ops/observer_ops.h"
#include "ops/common/checks.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

using detail::check_quant_range;
using detail::check_range_pair;
using detail::eps_value;

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


// LSQ / LSQ+ initial qparams (Esser et al. 2020, "Learned Step Size Quantization"; Bhalgat et
// al. 2020, "LSQ+"): the scale from a statistic, rounded to a power of two when asked, then with
// an asymmetric scheme the zero point quant_min - round(min_val / scale):
//   * LSQ: from min_val per channel (or per tensor), clamped to [quant_min, quant_max] (MQBench
//     leaves it unclamped; its learnable fake-quantize clamps it in the forward anyway);
//   * LSQ+: from the global min_val, and only when min_val >= 0 (MQBench's), unclamped.
// Deliberate difference: the scale is clamped to eps, so a constant-zero tensor gives no zero
// scale (docs/compatibility.md).
enum class LsqKind { kLsq, kLsqPlus };

// t / c, the same bits on every device. ATen's CUDA kernel divides by a number as a multiply by
// its float reciprocal, which is one bit off the quotient for some values (2 * norm / sqrt(255)
// is one); a 0-dim tensor of t's dtype on t's device divides on the CPU and CUDA alike. float16
// and bfloat16 keep the number: both devices compute them in float32 with its reciprocal, and
// c in t's dtype would round it (65536 is inf in float16).
at::Tensor divide_by(const at::Tensor& t, double c) {
  if (at::isReducedFloatingType(t.scalar_type())) return t / c;
  return t / at::scalar_tensor(c, t.options());
}

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
  const auto scale = divide_by(2 * tensor_norm, std::sqrt(static_cast<double>(quant_max)));
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
  const auto scale = divide_by(at::maximum((mean - 3 * std).abs(), (mean + 3 * std).abs()),
                               static_cast<double>(quant_max - quant_min + 1));
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
// take detached input; a gradient through them is an error, not a silent zero). The other
// observer ops have a CPU kernel (cpu/observer_cpu.cpp) and a CUDA kernel.
TORCH_LIBRARY_IMPL(mqbench, CompositeExplicitAutograd, m) {
  m.impl("observer_running_min_max", TORCH_FN(running_min_max_impl));
  m.impl("observer_ema_min_max", TORCH_FN(ema_min_max_impl));
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
