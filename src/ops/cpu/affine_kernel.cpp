// Affine fake quantization kernels: fixed and learnable (LSQ / LSQ+), per tensor and per
// channel. Compiled once per CPU capability (Note [CPU capability dispatch]).

#include <ATen/Dispatch.h>

#include <algorithm>
#include <cmath>

#include "ops/cpu/kernels.h"
#include "ops/cpu/affine_math.h"
#include "ops/cpu/loops.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

// Note [Zero point modes]
// The formulas are torch 1.13's CPU fake-quant kernels, so results match them bit for bit:
//   inv = 1.0f / s              (float32 reciprocal, also for float64 input, as torch does)
//   integer zero point:  q = nearbyint(x * inv) + z
//   floating zero point: q = nearbyint(x * inv + z)   (torch's per-channel float-zp kernel)
//   out  = (clamp(q, qmin, qmax) - z) * s
//   mask = qmin <= q <= qmax    (straight-through gradient: dx = dy * mask)
// The learnable ops first round the zero point, z' = clamp(nearbyint(z), qmin, qmax), and then
// use the integer formula (torch rounds the same way in forward and backward, except that its
// per-tensor backward uses trunc(z + 0.5); we use z' in both: docs/compatibility.md).
// nearbyint rounds half to even. Deliberate difference from torch: a NaN input gives NaN and
// +-inf saturate to the qmax/qmin level (torch casts them to int64, which sends all three to
// qmin); see docs/compatibility.md.

template <typename T, bool kFloatZp>
struct AffineForward : AffineBase<T, kFloatZp> {
  using B = AffineBase<T, kFloatZp>;
  using Params = typename B::Params;
  T scalar(T x, const Params& p) const {
    const T qc = clamp_nan(B::quant(x, p), p.lo, p.hi);
    if (kFloatZp) {
      // torch's float-zero-point kernel computes (q - z) * s in double (std::fmin promotes):
      // with a fractional z, q - z is not exact in float.
      return static_cast<T>((static_cast<double>(qc) - static_cast<double>(p.z)) *
                            static_cast<double>(p.s));
    }
    return (qc - p.z) * p.s;
  }
  Vec<T> vec(const Vec<T>& x, const Params& p) const {
    if (kFloatZp) {
      // Rare path (a fixed op given a floating zero point): lane by lane, as scalar().
      alignas(64) T buf[Vec<T>::size()];
      x.store(buf);
      for (int64_t i = 0; i < Vec<T>::size(); ++i) buf[i] = scalar(buf[i], p);
      return Vec<T>::loadu(buf);
    }
    return (at::vec::clamp(B::quant(x, p), p.vlo, p.vhi) - p.vz) * p.vs;
  }
};

// dx = dy * [qmin <= q <= qmax]; nothing reduced.
template <typename T, bool kFloatZp>
struct AffineBackward : AffineBase<T, kFloatZp> {
  using B = AffineBase<T, kFloatZp>;
  using Params = typename B::Params;
  T grad(T dy, T x, const Params& p, T& ga, T& gb) const {
    const T q = B::quant(x, p);
    ga = gb = T(0);
    return (q >= p.lo && q <= p.hi) ? dy : T(0);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& p, Vec<T>& ga, Vec<T>& gb) const {
    const auto q = B::quant(x, p);
    ga = gb = Vec<T>(T(0));
    return Vec<T>::blendv(Vec<T>(T(0)), dy, (q >= p.vlo) & (q <= p.vhi));
  }
};

// LSQ / LSQ+ gradients (Esser et al. 2020, "Learned Step Size Quantization"; Bhalgat et al.
// 2020, "LSQ+"), with g = grad_factor and z' the rounded zero point:
//   qmin <= q <= qmax:  dx = dy   d_scale = dy * (xfq - x) / s * g    d_zp = 0
//   q < qmin:           dx = 0    d_scale = dy * (qmin - z') * g      d_zp = -dy * s * g
//   q > qmax:           dx = 0    d_scale = dy * (qmax - z') * g      d_zp = -dy * s * g
// where xfq = (clamp(q) - z') * s is the forward output. d_scale/d_zp are summed over all
// elements (per tensor) or all but the channel axis (per channel), inside the kernel.
template <typename T>
struct LearnableBackward : AffineBase<T, false> {
  using B = AffineBase<T, false>;
  using Params = typename B::Params;
  T g;
  T grad(T dy, T x, const Params& p, T& ds, T& dz) const {
    const T q = B::quant(x, p);
    if (q < p.lo) {
      ds = dy * (p.lo - p.z) * g;
      dz = -dy * p.s * g;
      return T(0);
    }
    if (q > p.hi) {
      ds = dy * (p.hi - p.z) * g;
      dz = -dy * p.s * g;
      return T(0);
    }
    // In range (or NaN input, which propagates into d_scale as in torch).
    const T xfq = (clamp_nan(q, p.lo, p.hi) - p.z) * p.s;
    ds = dy * (xfq - x) * p.inv * g;
    dz = T(0);
    return (q >= p.lo && q <= p.hi) ? dy : T(0);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& p, Vec<T>& ds, Vec<T>& dz) const {
    const Vec<T> vg(g), zero(T(0));
    const auto q = B::quant(x, p);
    const auto below = q < p.vlo;
    const auto above = q > p.vhi;
    const auto xfq = (at::vec::clamp(q, p.vlo, p.vhi) - p.vz) * p.vs;
    ds = dy * (xfq - x) * p.vinv * vg;
    ds = Vec<T>::blendv(ds, dy * (p.vlo - p.vz) * vg, below);
    ds = Vec<T>::blendv(ds, dy * (p.vhi - p.vz) * vg, above);
    dz = Vec<T>::blendv(zero, zero - dy * p.vs * vg, below | above);
    return Vec<T>::blendv(zero, dy, (q >= p.vlo) & (q <= p.vhi));
  }
};

void affine_fwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax,
                       ZeroPointMode mode) {
  const bool round_z = mode == ZeroPointMode::kLearnable;
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(0), "mqbench_affine_fwd", [&] {
    if (mode == ZeroPointMode::kFloat) {
      qparam_map<scalar_t>(iter, AffineForward<scalar_t, true>{{qmin, qmax, round_z}});
    } else {
      qparam_map<scalar_t>(iter, AffineForward<scalar_t, false>{{qmin, qmax, round_z}});
    }
  });
}

void affine_bwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax,
                       ZeroPointMode mode) {
  const bool round_z = mode == ZeroPointMode::kLearnable;
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(1), "mqbench_affine_bwd", [&] {
    if (mode == ZeroPointMode::kFloat) {
      qparam_grad<scalar_t, false>(iter, AffineBackward<scalar_t, true>{{qmin, qmax, round_z}},
                                   nullptr, nullptr);
    } else {
      qparam_grad<scalar_t, false>(iter, AffineBackward<scalar_t, false>{{qmin, qmax, round_z}},
                                   nullptr, nullptr);
    }
  });
}

void learnable_bwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax,
                          double grad_factor, const char* scale_base, ChannelAccumulators* acc) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(1), "mqbench_learnable_bwd", [&] {
    LearnableBackward<scalar_t> op;
    op.qmin = qmin;
    op.qmax = qmax;
    op.round_z = true;
    // torch passes grad_factor to its kernel as float.
    op.g = static_cast<scalar_t>(static_cast<float>(grad_factor));
    qparam_grad<scalar_t, true>(iter, op, scale_base, acc);
  });
}

}  // namespace

MQBENCH_REGISTER_STUB(affine_fwd_stub, affine_fwd_kernel);
MQBENCH_REGISTER_STUB(affine_bwd_stub, affine_bwd_kernel);
MQBENCH_REGISTER_STUB(learnable_bwd_stub, learnable_bwd_kernel);

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
