// FP8 (E4M3FN / E5M2) fake quantization kernels: forward, straight-through backward and the
// learnable-scale (LSQ) backward, per tensor and per channel. Compiled once per CPU capability
// (Note [CPU capability dispatch]). The formula: ops/common/fp8_formula.h (Note [FP8 rounding]);
// these adaptors give it to the loops of loops.h (the zero point operand is unused: zeros).

#include <ATen/Dispatch.h>

#include "ops/common/fp8_formula.h"
#include "ops/cpu/kernels.h"
#include "ops/cpu/loops.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

namespace d = ::mqbench::ops::detail;
using VF = Vec<float>;

struct Fp8Lanes {
  float s;
  VF sv;
  d::Fp8Params p;
};

struct Fp8Op {
  d::Fp8Params p;
  using Params = Fp8Lanes;
  Params params(float s, float /*z*/) const { return {s, VF(s), p}; }
};

// float32: the formula on whole registers; float64: v = float(x / s) per lane (torch's double
// -> float8 cast rounds to float32 first), out = double(q) * s.
template <typename T>
struct Fp8Forward : Fp8Op {
  T scalar(T x, const Params& q) const {
    if constexpr (std::is_same_v<T, float>) {
      return d::fp8_fake_quant(x / q.s, q.s, q.p);
    } else {
      const float v = static_cast<float>(x / static_cast<double>(q.s));
      return static_cast<double>(d::fp8_round(d::fp8_scaled(v, q.p), q.p)) *
             static_cast<double>(q.s);
    }
  }
  Vec<T> vec(const Vec<T>& x, const Params& q) const {
    if constexpr (std::is_same_v<T, float>) {
      return d::fp8_fake_quant(x / q.sv, q.sv, q.p);
    } else {
      alignas(64) T buf[Vec<T>::size()];
      x.store(buf);
      for (int64_t i = 0; i < Vec<T>::size(); ++i) buf[i] = scalar(buf[i], q);
      return Vec<T>::loadu(buf);
    }
  }
};

// dx = dy * [|x / s| <= max]; with kLearnable, ga = LSQ's d_scale contribution.
template <typename T, bool kLearnable>
struct Fp8Backward : Fp8Op {
  float g = 1.0f;
  T grad(T dy, T x, const Params& q, T& ga, T& gb) const {
    gb = T(0);
    const T r = x / static_cast<T>(q.s);
    const float v = static_cast<float>(r);
    const bool in = d::fp8_in_range(v, q.p);
    ga = T(0);
    if constexpr (kLearnable) {
      // the formula of d::fp8_scale_grad, with q - r in T (float64: in double)
      const T qv = static_cast<T>(d::fp8_round(d::fp8_scaled(v, q.p), q.p));
      const T sat = v < 0 ? -static_cast<T>(q.p.max_finite) : static_cast<T>(q.p.max_finite);
      ga = dy * static_cast<T>(g) * (in ? qv - r : (v != v ? T(0) : sat));
    }
    return in ? dy : T(0);
  }
  Vec<T> grad(const Vec<T>& dy, const Vec<T>& x, const Params& q, Vec<T>& ga,
              Vec<T>& gb) const {
    if constexpr (std::is_same_v<T, float>) {
      const VF v = x / q.sv;
      gb = VF(0.0f);
      ga = kLearnable ? d::fp8_scale_grad(dy, v, q.p, VF(g)) : VF(0.0f);
      return ops::dmath::select(d::fp8_in_range(v, q.p), dy, VF(0.0f));
    } else {
      alignas(64) T bdy[Vec<T>::size()], bx[Vec<T>::size()], ba[Vec<T>::size()];
      dy.store(bdy);
      x.store(bx);
      for (int64_t i = 0; i < Vec<T>::size(); ++i) {
        T unused;
        bdy[i] = grad(bdy[i], bx[i], q, ba[i], unused);
      }
      ga = Vec<T>::loadu(ba);
      gb = Vec<T>(T(0));
      return Vec<T>::loadu(bdy);
    }
  }
};

void fp8_fwd_kernel(at::TensorIteratorBase& iter, int64_t format) {
  const auto p = d::fp8_params(static_cast<d::Fp8Format>(format));
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(0), "mqbench_fp8_fwd", [&] {
    qparam_map<scalar_t>(iter, Fp8Forward<scalar_t>{{p}});
  });
}

void fp8_bwd_kernel(at::TensorIteratorBase& iter, int64_t format) {
  const auto p = d::fp8_params(static_cast<d::Fp8Format>(format));
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(1), "mqbench_fp8_bwd", [&] {
    qparam_grad<scalar_t, false>(iter, Fp8Backward<scalar_t, false>{{p}}, nullptr, nullptr);
  });
}

void fp8_learnable_bwd_kernel(at::TensorIteratorBase& iter, int64_t format, double grad_factor,
                              const char* scale_base, ChannelAccumulators* acc) {
  const auto p = d::fp8_params(static_cast<d::Fp8Format>(format));
  AT_DISPATCH_FLOATING_TYPES(iter.input_dtype(1), "mqbench_fp8_learnable_bwd", [&] {
    Fp8Backward<scalar_t, true> op{{p}};
    op.g = static_cast<float>(grad_factor);
    qparam_grad<scalar_t, true>(iter, op, scale_base, acc);
  });
}

}  // namespace

MQBENCH_REGISTER_STUB(fp8_fwd_stub, fp8_fwd_kernel);
MQBENCH_REGISTER_STUB(fp8_bwd_stub, fp8_bwd_kernel);
MQBENCH_REGISTER_STUB(fp8_learnable_bwd_stub, fp8_learnable_bwd_kernel);

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
