// PACT kernels (Choi et al. 2018, "PACT: Parameterized Clipping Activation"), per tensor.
// Compiled once per CPU capability (Note [CPU capability dispatch]).
//
//   c   = clamp(x, lower, upper)          (upper = alpha, lower = n_alpha)
//   out = fixed affine fake quantization of c (Note [Zero point modes])
// Gradients, with m(v) = [qmin <= q(v) <= qmax] the straight-through mask at value v:
//   lower <= x <= upper:  dx = dy * m(x)
//   x > upper:            dx = 0,  d_upper += dy * m(upper)
//   x < lower:            dx = 0,  d_lower += dy * m(lower)
// which is what autograd gives for MQBench's where(x > alpha, alpha, x) followed by the lower
// clip and torch's fake quantization.

#include <ATen/Dispatch.h>

#include "ops/cpu/affine_math.h"
#include "ops/cpu/kernels.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

template <typename T, bool kFloatZp>
struct PactOp : AffineBase<T, kFloatZp> {
  using B = AffineBase<T, kFloatZp>;
  using Params = typename B::Params;
  T lower, upper;

  T fq(T v, const Params& p) const { return (std::min(std::max(B::quant(v, p), p.lo), p.hi) - p.z) * p.s; }
  bool in_range(T v, const Params& p) const {
    const T q = B::quant(v, p);
    return q >= p.lo && q <= p.hi;
  }

  T scalar(T x, const Params& p) const {
    // NaN stays NaN: std::max/min return their first argument when it is NaN.
    return fq(std::min(std::max(x, lower), upper), p);
  }
  Vec<T> vec(const Vec<T>& x, const Params& p) const {
    const auto c = at::vec::clamp(x, Vec<T>(lower), Vec<T>(upper));
    return (at::vec::clamp(B::quant(c, p), p.vlo, p.vhi) - p.vz) * p.vs;
  }

  T grad(T dy, T x, const Params& p, T& d_upper, T& d_lower) const {
    d_upper = d_lower = T(0);
    if (x > upper) {
      d_upper = in_range(upper, p) ? dy : T(0);
      return T(0);
    }
    if (x < lower) {
      d_lower = in_range(lower, p) ? dy : T(0);
      return T(0);
    }
    return in_range(x, p) ? dy : T(0);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& p, Vec<T>& d_upper,
              Vec<T>& d_lower) const {
    const Vec<T> zero(T(0));
    const auto above = x > Vec<T>(upper);
    const auto below = x < Vec<T>(lower);
    const T up_pass = in_range(upper, p) ? T(1) : T(0);
    const T low_pass = in_range(lower, p) ? T(1) : T(0);
    d_upper = Vec<T>::blendv(zero, dy * Vec<T>(up_pass), above);
    d_lower = Vec<T>::blendv(zero, dy * Vec<T>(low_pass), below);
    const auto q = B::quant(x, p);
    const auto pass = (q >= p.vlo) & (q <= p.vhi);
    return Vec<T>::blendv(Vec<T>::blendv(zero, dy, pass), zero, above | below);
  }
};

template <typename T, bool kFloatZp>
PactOp<T, kFloatZp> make_op(int64_t qmin, int64_t qmax, double lower, double upper) {
  PactOp<T, kFloatZp> op;
  op.qmin = qmin;
  op.qmax = qmax;
  op.round_z = false;
  op.lower = static_cast<T>(lower);
  op.upper = static_cast<T>(upper);
  return op;
}

void pact_fwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax, double lower,
                     double upper) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(0), "mqbench_pact_fwd", [&] {
    qparam_map<scalar_t>(iter, make_op<scalar_t, false>(qmin, qmax, lower, upper));
  });
}

void pact_bwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax, double lower,
                     double upper, const char* scale_base, ChannelAccumulators* acc) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(1), "mqbench_pact_bwd", [&] {
    qparam_grad<scalar_t, true>(iter, make_op<scalar_t, false>(qmin, qmax, lower, upper),
                                scale_base, acc);
  });
}

}  // namespace

MQBENCH_REGISTER_STUB(pact_fwd_stub, pact_fwd_kernel);
MQBENCH_REGISTER_STUB(pact_bwd_stub, pact_bwd_kernel);

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
