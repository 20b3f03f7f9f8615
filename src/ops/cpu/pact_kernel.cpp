// PACT kernels (Choi et al. 2018, "PACT: Parameterized Clipping Activation"), per tensor: the
// formulas and gradients are in ops/common/algorithm_formula.h. Compiled once per CPU
// capability (Note [CPU capability dispatch]).

#include <ATen/Dispatch.h>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

namespace d = ::mqbench::ops::detail;

template <typename T>
struct PactOp {
  int64_t qmin, qmax;
  T lower, upper;
  using Params = Lanes<T, d::AffineScalars>;

  Params params(float s, float z) const { return lanes(d::affine_scalars<T>(s, z, qmin, qmax)); }

  T scalar(T x, const Params& p) const { return d::pact_forward(x, lower, upper, p.s); }
  Vec<T> vec(const Vec<T>& x, const Params& p) const {
    return d::pact_forward(x, Vec<T>(lower), Vec<T>(upper), p.v);
  }

  T grad(T dy, T x, const Params& p, T& d_upper, T& d_lower) const {
    return d::pact_grad(dy, x, lower, upper, p.s, d_upper, d_lower);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& p, Vec<T>& d_upper,
              Vec<T>& d_lower) const {
    return d::pact_grad(dy, x, Vec<T>(lower), Vec<T>(upper), p.v, d_upper, d_lower);
  }
};

template <typename T>
PactOp<T> make_op(int64_t qmin, int64_t qmax, double lower, double upper) {
  return {qmin, qmax, static_cast<T>(lower), static_cast<T>(upper)};
}

void pact_fwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax, double lower,
                     double upper) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(0), "mqbench_pact_fwd", [&] {
    qparam_map<scalar_t>(iter, make_op<scalar_t>(qmin, qmax, lower, upper));
  });
}

void pact_bwd_kernel(at::TensorIteratorBase& iter, int64_t qmin, int64_t qmax, double lower,
                     double upper, const char* scale_base, ChannelAccumulators* acc) {
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(1), "mqbench_pact_bwd", [&] {
    qparam_grad<scalar_t, true>(iter, make_op<scalar_t>(qmin, qmax, lower, upper),
                                scale_base, acc);
  });
}

}  // namespace

MQBENCH_REGISTER_STUB(pact_fwd_stub, pact_fwd_kernel);
MQBENCH_REGISTER_STUB(pact_bwd_stub, pact_bwd_kernel);

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
