#pragma once
// What the CUDA observer ops share (ops/cuda/observer_kernel.cu: statistics and qparams;
// ops/cuda/observer_search.cu: the range searches): the finite-element statistics of a channel
// (Stats, reduced by launch.cuh's launch_reduce), the observer's view of x (Note [Observer
// layout] in cpu/observer_kernels.h) and eps as a device scalar.

#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAGuard.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "mqbench/config.h"

#include "ops/common/checks.h"
#include "ops/common/qparams.h"
#include "ops/cuda/launch.cuh"

namespace mqbench {
namespace ops {
namespace observer_cuda {

struct Stats {
  double min = std::numeric_limits<double>::infinity();
  double max = -std::numeric_limits<double>::infinity();
  double sum = 0, sq = 0, sabs = 0;
  long long count = 0;
  __device__ __forceinline__ void combine(const Stats& o) {
    min = o.min < min ? o.min : min;
    max = o.max > max ? o.max : max;
    sum += o.sum;
    sq += o.sq;
    sabs += o.sabs;
    count += o.count;
  }
};

template <typename T, bool kMoments>
struct StatsOp {
  const T* x;
  struct Params {};
  __device__ Params params(int64_t) const { return {}; }
  __device__ void operator()(int64_t i, const Params&, Stats& acc) const {
    const auto v = static_cast<gpu::compute_t<T>>(x[i]);
    if (!dmath::isfinite(v)) return;
    const double d = static_cast<double>(v);
    acc.count += 1;
    acc.min = d < acc.min ? d : acc.min;
    acc.max = d > acc.max ? d : acc.max;
    if (kMoments) {
      acc.sum += d;
      acc.sq += d * d;
      acc.sabs += dmath::abs(d);
    }
  }
};

struct StoreStats {
  Stats* out;
  __device__ void operator()(int64_t c, const Stats& s) const { out[c] = s; }
};

struct Viewed {
  at::Tensor x;  // dense (contiguous when `contiguous` was asked)
  gpu::Layout layout;
  bool per_channel = false;
};

inline Viewed view_for_observer(const at::Tensor& x, int64_t ch_axis, const char* op,
                         bool contiguous = false) {
  detail::check_input_with_half(x, op);
  Viewed v;
  v.x = contiguous ? x.contiguous() : gpu::dense(x);
  if (ch_axis == -1) {
    v.layout = gpu::layout_of(v.x, c10::nullopt);
    return v;
  }
  TORCH_CHECK(x.dim() > 0, op, ": ch_axis (", ch_axis, ") needs an input with at least one "
              "dimension, got a 0-d tensor; use ch_axis=-1 for per-tensor statistics");
  const int64_t axis = detail::wrap_channel_axis(ch_axis, x, op);
  v.per_channel = true;
  v.layout.n = v.x.numel();
  v.layout.channels = v.x.size(axis);
  // A dense tensor's axis stride is the element count inside one channel run; a single channel
  // (or an empty tensor) reduces as one run.
  v.layout.inner = v.layout.channels > 1 ? v.x.stride(axis) : v.layout.n;
  return v;
}

/// A [C] output of x's dtype, or 0-dim per tensor.
inline at::Tensor channel_out(const Viewed& v) {
  auto t = at::empty({v.layout.channels}, v.x.options());
  return v.per_channel ? t : t.view(at::IntArrayRef());
}

template <typename T, typename Fin>
void stats_pass(const Viewed& v, bool moments, const Fin& fin) {
  if (moments) {
    gpu::launch_reduce<Stats>(StatsOp<T, true>{v.x.data_ptr<T>()}, v.layout, v.x, fin);
  } else {
    gpu::launch_reduce<Stats>(StatsOp<T, false>{v.x.data_ptr<T>()}, v.layout, v.x, fin);
  }
}

/// The statistics of every channel in a device array of Stats (bytes).
inline at::Tensor stats_array(const Viewed& v, bool moments) {
  auto out = at::empty({std::max<int64_t>(v.layout.channels, 1) * int64_t(sizeof(Stats))},
                       v.x.options().dtype(at::kByte));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, v.x.scalar_type(),
                                  "mqbench_observer_stats_cuda", [&] {
    stats_pass<scalar_t>(v, moments, StoreStats{reinterpret_cast<Stats*>(out.data_ptr())});
  });
  return out;
}

/// eps as a float64 device scalar (no host read).
inline at::Tensor eps_on_device(const at::Tensor& eps, const at::Tensor& like, const char* op) {
  TORCH_CHECK(eps.defined() && eps.numel() == 1 && at::isFloatingType(eps.scalar_type()), op,
              ": eps must be a one-element floating-point tensor");
  return eps.detach().reshape({1}).to(like.device(), at::kDouble).contiguous();
}

}  // namespace observer_cuda
}  // namespace ops
}  // namespace mqbench
