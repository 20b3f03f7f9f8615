// DSQ kernels (Gong et al. 2019, "Differentiable Soft Quantization"), per tensor and per
// channel. Compiled once per CPU capability (Note [CPU capability dispatch]).
//
// With k_s = 1 / (1 - alpha) and k = ln((k_s + 1) / (k_s - 1)) (MQBench's parameterisation):
//   u   = clamp(x / s + z, qmin, qmax)
//   phi = floor(u) + 0.5 * k_s * tanh(k * (u - floor(u) - 0.5)) + 0.5
//   out = (round(phi) - z) * s          round: half to even, straight-through
// Gradient (scale and zero point are buffers in MQBench: no gradient):
//   dx = dy * 0.5 * k_s * k * (1 - tanh^2(k * (u - floor(u) - 0.5)))   if qmin <= x/s + z <= qmax
//   dx = 0                                                             otherwise

#include <ATen/Dispatch.h>

#include <cmath>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

template <typename T>
struct DsqParams {
  T s, z, lo, hi, ks, k;
  Vec<T> vs, vz, vlo, vhi, vks, vk;
};

template <typename T>
struct DsqOp {
  int64_t qmin, qmax;
  double alpha;
  using Params = DsqParams<T>;

  Params params(float s, float z) const {
    Params p;
    const double ks = 1.0 / (1.0 - alpha);
    p.s = s;
    p.z = z;
    p.lo = static_cast<T>(qmin);
    p.hi = static_cast<T>(qmax);
    p.ks = static_cast<T>(ks);
    p.k = static_cast<T>(std::log((ks + 1.0) / (ks - 1.0)));
    p.vs = Vec<T>(p.s);
    p.vz = Vec<T>(p.z);
    p.vlo = Vec<T>(p.lo);
    p.vhi = Vec<T>(p.hi);
    p.vks = Vec<T>(p.ks);
    p.vk = Vec<T>(p.k);
    return p;
  }

  // Forward.
  T scalar(T x, const Params& p) const {
    const T u = std::min(std::max(x / p.s + p.z, p.lo), p.hi);
    const T f = std::floor(u);
    const T phi = f + T(0.5) * p.ks * std::tanh(p.k * (u - f - T(0.5))) + T(0.5);
    return (std::nearbyint(phi) - p.z) * p.s;
  }
  Vec<T> vec(const Vec<T>& x, const Params& p) const {
    const Vec<T> half(T(0.5));
    const auto u = at::vec::clamp(x / p.vs + p.vz, p.vlo, p.vhi);
    const auto f = u.floor();
    const auto phi = f + half * p.vks * (p.vk * (u - f - half)).tanh() + half;
    return (phi.round() - p.vz) * p.vs;
  }

  // Backward: dx only.
  T grad(T dy, T x, const Params& p, T& ga, T& gb) const {
    ga = gb = T(0);
    const T v = x / p.s + p.z;
    if (!(v >= p.lo && v <= p.hi)) return T(0);
    const T th = std::tanh(p.k * (v - std::floor(v) - T(0.5)));
    return dy * T(0.5) * p.ks * p.k * (T(1) - th * th);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& p, Vec<T>& ga, Vec<T>& gb) const {
    const Vec<T> half(T(0.5)), one(T(1)), zero(T(0));
    ga = gb = zero;
    const auto v = x / p.vs + p.vz;
    const auto th = (p.vk * (v - v.floor() - half)).tanh();
    const auto d = dy * half * p.vks * p.vk * (one - th * th);
    return Vec<T>::blendv(zero, d, (v >= p.vlo) & (v <= p.vhi));
  }
};

void dsq_fwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax, double alpha) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(0), "mqbench_dsq_fwd", [&] {
    qparam_map<scalar_t>(iter, DsqOp<scalar_t>{qmin, qmax, alpha});
  });
}

void dsq_bwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax, double alpha) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(1), "mqbench_dsq_bwd", [&] {
    qparam_grad<scalar_t, false>(iter, DsqOp<scalar_t>{qmin, qmax, alpha}, nullptr, nullptr);
  });
}

}  // namespace

MQBENCH_REGISTER_STUB(dsq_fwd_stub, dsq_fwd_kernel);
MQBENCH_REGISTER_STUB(dsq_bwd_stub, dsq_bwd_kernel);

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
