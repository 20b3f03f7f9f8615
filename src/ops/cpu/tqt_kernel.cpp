// TQT kernels (Jain et al. 2020, "Trained Quantization Thresholds"), as MQBench's Vitis
// backend runs them: the formulas and gradients are in ops/common/algorithm_formula.h. Compiled
// once per CPU capability (Note [CPU capability dispatch]).

#include <ATen/Dispatch.h>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

namespace d = ::mqbench::ops::detail;

template <typename T>
struct TqtOp {
  int64_t qmin, qmax, mth;
  using Params = Lanes<T, d::TqtScalars>;

  Params params(float s, float z) const { return lanes(d::tqt_scalars<T>(s, z, qmin, qmax)); }

  T scalar(T x, const Params& p) const { return d::tqt_forward(x, p.s, mth); }
  Vec<T> vec(const Vec<T>& x, const Params& p) const { return d::tqt_forward(x, p.v, mth); }

  T grad(T dy, T x, const Params& p, T& ds, T& unused) const {
    unused = T(0);
    return d::tqt_grad(dy, x, p.s, mth, ds);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& p, Vec<T>& ds,
              Vec<T>& unused) const {
    unused = Vec<T>(T(0));
    return d::tqt_grad(dy, x, p.v, mth, ds);
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
