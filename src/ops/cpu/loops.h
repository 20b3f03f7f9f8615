#pragma once
// Generic CPU drivers for element-wise quantization kernels with broadcast qparams.
//
// Only the per-capability kernel files (MQBENCH_VEC_KERNEL_SOURCES) include this header. Its
// contents live in namespace mqbench::cpu::MQBENCH_CPU_CAPABILITY so that the "default" and
// "avx2" copies of every template are distinct symbols (no ODR clash between the two copies).
//
// Note [Qparam iterators]
// Every kernel runs over an at::TensorIterator whose operands are
//   (outputs..., per-element inputs..., scale, zero_point)
// where scale/zero_point are float32 views that broadcast: along ch_axis for per-channel ops,
// everywhere for per-tensor ops (see make_qparam_iter in ops/common/checks.h). The
// iterator handles any strides, broadcasting and the split over threads. Inside each 1-d run
// the driver takes one of two paths:
//   * fast path: the per-element operands are contiguous and scale/zero_point have stride 0
//     (true for every per-tensor op on contiguous input, and for per-channel ops whenever the
//     channel axis is not the innermost one): qparams are loaded once per run and the body is
//     written with at::vec::Vectorized, one pass over memory;
//   * strided fallback: a scalar loop that reloads the qparams of each element.
// Both paths call the same Op, whose scalar and vector bodies must agree bit for bit.
//
// Reductions (gradients of scale, zero_point, PACT's alpha, ...) are accumulated inside the
// same pass into per-thread, per-channel double accumulators; within a run, the vector path
// accumulates in registers and flushes to double every kFlushEvery elements, so float sums
// over millions of elements keep about double accuracy without a full-size temporary.

#include <ATen/Parallel.h>
#include <ATen/TensorIterator.h>
#include <ATen/cpu/vec/vec.h>

#include <cstring>
#include <vector>

#include "ops/common/algorithm_formula.h"  // the formulas, and broadcast() for Lanes
#include "ops/cpu/accumulators.h"
#include "ops/cpu/runs.h"

#ifndef MQBENCH_CPU_CAPABILITY
#error "loops.h is only for the per-capability kernel files (MQBENCH_VEC_KERNEL_SOURCES)"
#endif

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {

template <typename T>
using Vec = at::vec::Vectorized<T>;

/// A formula's per-run parameters (ops/common/*_formula.h: AffineScalars, TqtScalars, ...) as
/// scalars for the scalar loop and as vector registers for the vector loop.
template <typename T, template <typename> class Scalars>
struct Lanes {
  Scalars<T> s;
  Scalars<Vec<T>> v;
};

template <typename T, template <typename> class Scalars>
Lanes<T, Scalars> lanes(const Scalars<T>& p) {
  return {p, ops::detail::broadcast<Vec<T>>(p)};
}

constexpr int64_t kGrainSize = 32768;
constexpr int64_t kFlushEvery = 256;

/// Horizontal sum of a vector register, in double.
template <typename T>
inline double hsum(const Vec<T>& v) {
  alignas(64) T buf[Vec<T>::size()];
  v.store(buf);
  double s = 0;
  for (int64_t i = 0; i < Vec<T>::size(); ++i) s += static_cast<double>(buf[i]);
  return s;
}

inline float load_f(const char* p) {
  float v;
  std::memcpy(&v, p, sizeof(float));
  return v;
}

/// out = op(x; scale, zero_point). Operands: 0 out, 1 x, 2 scale (f32), 3 zero_point (f32).
///
/// Op must provide:
///   struct Params;                                      // per-run constants
///   Params params(float scale, float zero_point) const;
///   scalar_t scalar(scalar_t x, const Params&) const;
///   Vec<scalar_t> vec(const Vec<scalar_t>& x, const Params&) const;
template <typename scalar_t, typename Op>
void qparam_map(at::TensorIteratorBase& iter, const Op& op) {
  using V = Vec<scalar_t>;
  constexpr int64_t kStep = V::size();
  ::mqbench::cpu::for_each_run<4>(iter, [&](char** p, const int64_t* st, int64_t n) {
    if (st[0] == sizeof(scalar_t) && st[1] == sizeof(scalar_t) && st[2] == 0 && st[3] == 0) {
      const auto prm = op.params(load_f(p[2]), load_f(p[3]));
      auto* out = reinterpret_cast<scalar_t*>(p[0]);
      const auto* in = reinterpret_cast<const scalar_t*>(p[1]);
      int64_t i = 0;
      for (; i + kStep <= n; i += kStep) op.vec(V::loadu(in + i), prm).store(out + i);
      for (; i < n; ++i) out[i] = op.scalar(in[i], prm);
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const auto prm = op.params(load_f(p[2] + i * st[2]), load_f(p[3] + i * st[3]));
        const auto x = *reinterpret_cast<const scalar_t*>(p[1] + i * st[1]);
        *reinterpret_cast<scalar_t*>(p[0] + i * st[0]) = op.scalar(x, prm);
      }
    }
  }, kGrainSize);
}

/// dx = op.grad(dy, x; scale, zero_point), and, when kReduce, per-channel sums of the two
/// extra gradients the op returns. Operands: 0 dx, 1 dy, 2 x, 3 scale (f32), 4 zero_point (f32).
/// `scale_base` is the data pointer of the scale operand: a run's channel index is the offset
/// of its scale pointer from it (see Note [Qparam iterators]).
///
/// Op must provide Params/params() as for qparam_map, and
///   scalar_t grad(scalar_t dy, scalar_t x, const Params&, scalar_t& ga, scalar_t& gb) const;
///   Vec<scalar_t> grad(const Vec<scalar_t>& dy, const Vec<scalar_t>& x, const Params&,
///                      Vec<scalar_t>& ga, Vec<scalar_t>& gb) const;
/// where ga/gb receive the element's contributions to the two reduced gradients.
template <typename scalar_t, bool kReduce, typename Op>
void qparam_grad(at::TensorIteratorBase& iter, const Op& op, const char* scale_base,
                 ChannelAccumulators* acc) {
  using V = Vec<scalar_t>;
  constexpr int64_t kStep = V::size();
  ::mqbench::cpu::for_each_run<5>(iter, [&](char** p, const int64_t* st, int64_t n) {
    auto* dx = p[0];
    const auto* dy = p[1];
    const auto* x = p[2];
    double* row = kReduce ? acc->row() : nullptr;
    if (st[0] == sizeof(scalar_t) && st[1] == sizeof(scalar_t) && st[2] == sizeof(scalar_t) &&
        st[3] == 0 && st[4] == 0) {
      const auto prm = op.params(load_f(p[3]), load_f(p[4]));
      auto* dxp = reinterpret_cast<scalar_t*>(dx);
      const auto* dyp = reinterpret_cast<const scalar_t*>(dy);
      const auto* xp = reinterpret_cast<const scalar_t*>(x);
      double sum_a = 0, sum_b = 0;
      int64_t i = 0;
      while (i + kStep <= n) {
        V va(0), vb(0);
        const int64_t block_end = std::min(n, i + kFlushEvery);
        for (; i + kStep <= block_end; i += kStep) {
          V ga, gb;
          op.grad(V::loadu(dyp + i), V::loadu(xp + i), prm, ga, gb).store(dxp + i);
          if (kReduce) {
            va += ga;
            vb += gb;
          }
        }
        if (kReduce) {
          sum_a += hsum(va);
          sum_b += hsum(vb);
        }
      }
      for (; i < n; ++i) {
        scalar_t ga, gb;
        dxp[i] = op.grad(dyp[i], xp[i], prm, ga, gb);
        sum_a += static_cast<double>(ga);
        sum_b += static_cast<double>(gb);
      }
      if (kReduce) {
        const int64_t c = (p[3] - scale_base) / static_cast<int64_t>(sizeof(float));
        row[2 * c] += sum_a;
        row[2 * c + 1] += sum_b;
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const char* sp = p[3] + i * st[3];
        const auto prm = op.params(load_f(sp), load_f(p[4] + i * st[4]));
        scalar_t ga, gb;
        *reinterpret_cast<scalar_t*>(dx + i * st[0]) =
            op.grad(*reinterpret_cast<const scalar_t*>(dy + i * st[1]),
                    *reinterpret_cast<const scalar_t*>(x + i * st[2]), prm, ga, gb);
        if (kReduce) {
          const int64_t c = (sp - scale_base) / static_cast<int64_t>(sizeof(float));
          row[2 * c] += static_cast<double>(ga);
          row[2 * c + 1] += static_cast<double>(gb);
        }
      }
    }
  }, kGrainSize);
}

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
