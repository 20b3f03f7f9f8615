// Affine fake quantization kernels: fixed and learnable (LSQ / LSQ+), per tensor and per
// channel. Compiled once per CPU capability (Note [CPU capability dispatch]).

#include <ATen/Dispatch.h>

#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

namespace d = ::mqbench::ops::detail;

// The formulas and their gradient cases: ops/common/affine_formula.h (Note [Zero point modes],
// LSQ / LSQ+). These adaptors give them to the loops of loops.h.

template <typename T>
struct AffineOp {
  int64_t qmin, qmax;
  bool round_z;
  using Params = Lanes<T, d::AffineScalars>;
  Params params(float s, float z) const {
    return lanes(d::affine_scalars<T>(s, z, qmin, qmax, round_z));
  }
};

template <typename T, bool kFloatZp>
struct AffineForward : AffineOp<T> {
  using Params = typename AffineOp<T>::Params;
  T scalar(T x, const Params& p) const { return d::affine_fake_quant<T, kFloatZp>(x, p.s); }
  Vec<T> vec(const Vec<T>& x, const Params& p) const {
    if constexpr (kFloatZp) {
      // Rare path (a fixed op given a floating zero point, computed in double): lane by lane.
      alignas(64) T buf[Vec<T>::size()];
      x.store(buf);
      for (int64_t i = 0; i < Vec<T>::size(); ++i) buf[i] = scalar(buf[i], p);
      return Vec<T>::loadu(buf);
    } else {
      return d::affine_fake_quant(x, p.v);
    }
  }
};

// dx = dy * [qmin <= q <= qmax]; nothing reduced.
template <typename T, bool kFloatZp>
struct AffineBackward : AffineOp<T> {
  using Params = typename AffineOp<T>::Params;
  T grad(T dy, T x, const Params& p, T& ga, T& gb) const {
    ga = gb = T(0);
    return d::affine_grad<T, kFloatZp>(dy, x, p.s);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& p, Vec<T>& ga,
              Vec<T>& gb) const {
    ga = gb = Vec<T>(T(0));
    return d::affine_grad<Vec<T>, kFloatZp>(dy, x, p.v);
  }
};

// LSQ / LSQ+: d_scale and d_zp reduced in the loop.
template <typename T>
struct LearnableBackward : AffineOp<T> {
  using Params = typename AffineOp<T>::Params;
  T g;
  T grad(T dy, T x, const Params& p, T& ds, T& dz) const {
    return d::learnable_grad(dy, x, p.s, g, ds, dz);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& p, Vec<T>& ds, Vec<T>& dz) const {
    return d::learnable_grad(dy, x, p.v, Vec<T>(g), ds, dz);
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
