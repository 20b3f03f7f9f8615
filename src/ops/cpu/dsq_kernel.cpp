// DSQ kernels (Gong et al. 2019, "Differentiable Soft Quantization"), per tensor and per
// channel: the formulas and gradient are in ops/common/algorithm_formula.h. Compiled once per
// CPU capability (Note [CPU capability dispatch]).

#include <ATen/Dispatch.h>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

namespace d = ::mqbench::ops::detail;

template <typename T>
struct DsqOp {
  int64_t qmin, qmax;
  double alpha;
  using Params = Lanes<T, d::DsqScalars>;

  Params params(float s, float z) const {
    return lanes(d::dsq_scalars<T>(s, z, qmin, qmax, alpha));
  }

  T scalar(T x, const Params& p) const { return d::dsq_forward(x, p.s); }
  Vec<T> vec(const Vec<T>& x, const Params& p) const { return d::dsq_forward(x, p.v); }

  // dx only.
  T grad(T dy, T x, const Params& p, T& ga, T& gb) const {
    ga = gb = T(0);
    return d::dsq_grad(dy, x, p.s);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& p, Vec<T>& ga, Vec<T>& gb) const {
    ga = gb = Vec<T>(T(0));
    return d::dsq_grad(dy, x, p.v);
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
