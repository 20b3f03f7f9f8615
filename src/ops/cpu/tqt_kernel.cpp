// TQT kernels (Jain et al. 2020, "Trained Quantization Thresholds"), as MQBench's Vitis
// backend runs them. Compiled once per CPU capability (Note [CPU capability dispatch]).
//
// The step is the power of two at or above the scale:
//   e  = 0 if s < 2^-15 else floor(log2(1 / s)),   s' = 2^-e
//   t  = x / s'
//   mth 3: r = round(t) (half to even);  mth 2: r = ceil(t) for negative ties, else round(t)
//   out = (clamp(r + z, qmin, qmax) - z) * s'
// Gradients:
//   dx      = dy  where qmin <= round(x / s) + z <= qmax (the original s, as MQBench), else 0
//   d_scale = sum dy * (s' / s) * (r - t, qmin - z or qmax - z where clamped)
// d_scale follows the TQT paper's log2-threshold gradient (straight-through on the ceil, so
// ds'/ds = s'/s); MQBench keeps the scale in a buffer, where autograd ignores it.

#include <ATen/Dispatch.h>

#include <cmath>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

template <typename T>
struct TqtParams {
  T s, sp, inv_sp, z, lo, hi, ratio;
  Vec<T> vs, vsp, vinv_sp, vz, vlo, vhi, vratio;
};

template <typename T>
struct TqtOp {
  int64_t qmin, qmax, mth;
  using Params = TqtParams<T>;

  Params params(float s, float z) const {
    Params p;
    const float e = s < std::ldexp(1.0f, -15) ? 0.f : std::floor(std::log2(1.0f / s));
    const float sp = std::exp2(-e);
    p.s = s;
    p.sp = sp;
    p.inv_sp = static_cast<T>(std::exp2(e));  // exact: s' is a power of two
    p.z = z;
    p.lo = static_cast<T>(qmin);
    p.hi = static_cast<T>(qmax);
    p.ratio = static_cast<T>(sp) / static_cast<T>(s);
    p.vs = Vec<T>(p.s);
    p.vsp = Vec<T>(p.sp);
    p.vinv_sp = Vec<T>(p.inv_sp);
    p.vz = Vec<T>(p.z);
    p.vlo = Vec<T>(p.lo);
    p.vhi = Vec<T>(p.hi);
    p.vratio = Vec<T>(p.ratio);
    return p;
  }

  T round_t(T t) const {
    if (mth == 2 && t < T(0) && t - std::floor(t) == T(0.5)) return std::ceil(t);
    return std::nearbyint(t);
  }
  Vec<T> round_t(const Vec<T>& t) const {
    if (mth != 2) return t.round();
    const auto tie_neg = (t < Vec<T>(T(0))) & ((t - t.floor()) == Vec<T>(T(0.5)));
    return Vec<T>::blendv(t.round(), t.ceil(), tie_neg);
  }

  T scalar(T x, const Params& p) const {
    const T r = round_t(x * p.inv_sp) + p.z;
    return (std::min(std::max(r, p.lo), p.hi) - p.z) * p.sp;
  }
  Vec<T> vec(const Vec<T>& x, const Params& p) const {
    const auto r = round_t(x * p.vinv_sp) + p.vz;
    return (at::vec::clamp(r, p.vlo, p.vhi) - p.vz) * p.vsp;
  }

  T grad(T dy, T x, const Params& p, T& ds, T& unused) const {
    unused = T(0);
    const T t = x * p.inv_sp;
    const T r = round_t(t) + p.z;
    if (r < p.lo) {
      ds = dy * p.ratio * (p.lo - p.z);
    } else if (r > p.hi) {
      ds = dy * p.ratio * (p.hi - p.z);
    } else {
      ds = dy * p.ratio * (r - p.z - t);
    }
    const T q = std::nearbyint(x / p.s) + p.z;
    return (q >= p.lo && q <= p.hi) ? dy : T(0);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& p, Vec<T>& ds,
              Vec<T>& unused) const {
    const Vec<T> zero(T(0));
    unused = zero;
    const auto t = x * p.vinv_sp;
    const auto r = round_t(t) + p.vz;
    ds = dy * p.vratio * (r - p.vz - t);
    ds = Vec<T>::blendv(ds, dy * p.vratio * (p.vlo - p.vz), r < p.vlo);
    ds = Vec<T>::blendv(ds, dy * p.vratio * (p.vhi - p.vz), r > p.vhi);
    const auto q = (x / p.vs).round() + p.vz;
    return Vec<T>::blendv(zero, dy, (q >= p.vlo) & (q <= p.vhi));
  }
};

void tqt_fwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax, int64_t mth) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(0), "mqbench_tqt_fwd", [&] {
    qparam_map<scalar_t>(iter, TqtOp<scalar_t>{qmin, qmax, mth});
  });
}

void tqt_bwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax, int64_t mth,
                    const char* scale_base, ChannelAccumulators* acc) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(1), "mqbench_tqt_bwd", [&] {
    qparam_grad<scalar_t, true>(iter, TqtOp<scalar_t>{qmin, qmax, mth}, scale_base, acc);
  });
}

}  // namespace

MQBENCH_REGISTER_STUB(tqt_fwd_stub, tqt_fwd_kernel);
MQBENCH_REGISTER_STUB(tqt_bwd_stub, tqt_bwd_kernel);

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
