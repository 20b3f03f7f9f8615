// CUDA kernels of the observer statistics and qparams (schemas and CPU implementations in
// ops/observer_ops.cpp and cpu/observer_cpu.cpp; formulas in docs/observers.md): finite-element
// statistics (min/max, moments, clip-std) and the qparam formula. The range searches are in
// observer_search.cu.
//
// Everything stays on the device: the statistics and the qparams are kernels, so an observer
// running inside a training step does not synchronise. As on the CPU, only finite elements
// count, and ch_axis == -1 means per tensor.

#include <torch/library.h>

#include "ops/common/qparams.h"
#include "ops/cuda/observer_common.cuh"

namespace mqbench {
namespace ops {
namespace {

using namespace observer_cuda;


__device__ __forceinline__ double mean_of(const Stats& s) {
  return s.count > 0 ? s.sum / static_cast<double>(s.count) : 0.0;
}
__device__ __forceinline__ double std_of(const Stats& s) {
  if (s.count < 2) return 0.0;
  const double m = s.sum / static_cast<double>(s.count);
  const double v = s.sq - s.sum * m;
  return ::sqrt((v > 0.0 ? v : 0.0) / static_cast<double>(s.count - 1));
}

template <typename T>
struct MinMaxFin {
  T* mn;
  T* mx;
  __device__ void operator()(int64_t c, const Stats& s) const {
    mn[c] = static_cast<T>(s.min);
    mx[c] = static_cast<T>(s.max);
  }
};

template <typename T>
struct MomentsFin {
  T *mean, *std, *mean_abs, *mn, *mx;
  __device__ void operator()(int64_t c, const Stats& s) const {
    mean[c] = static_cast<T>(mean_of(s));
    std[c] = static_cast<T>(std_of(s));
    mean_abs[c] = static_cast<T>(s.count > 0 ? s.sabs / static_cast<double>(s.count) : 0.0);
    mn[c] = static_cast<T>(s.min);
    mx[c] = static_cast<T>(s.max);
  }
};

template <typename T>
struct ClipStdFin {
  T* lo;
  T* hi;
  double k;
  __device__ void operator()(int64_t c, const Stats& s) const {
    const double m = mean_of(s), sd = std_of(s);
    lo[c] = static_cast<T>(dmath::std_min(m - k * sd, s.min));
    hi[c] = static_cast<T>(dmath::std_max(m + k * sd, s.max));
  }
};

std::tuple<at::Tensor, at::Tensor> min_max_cuda(const at::Tensor& x, int64_t ch_axis) {
  const auto guard = gpu::device_guard("observer_min_max", x);
  const auto v = view_for_observer(x, ch_axis, "observer_min_max");
  auto mn = channel_out(v), mx = channel_out(v);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, v.x.scalar_type(),
                                  "mqbench_observer_min_max_cuda", [&] {
    stats_pass<scalar_t>(v, false,
                         MinMaxFin<scalar_t>{mn.data_ptr<scalar_t>(), mx.data_ptr<scalar_t>()});
  });
  return {mn, mx};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> moments_cuda(
    const at::Tensor& x, int64_t ch_axis) {
  const auto guard = gpu::device_guard("observer_moments", x);
  const auto v = view_for_observer(x, ch_axis, "observer_moments");
  auto mean = channel_out(v), sd = channel_out(v), mean_abs = channel_out(v),
       mn = channel_out(v), mx = channel_out(v);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, v.x.scalar_type(),
                                  "mqbench_observer_moments_cuda", [&] {
    stats_pass<scalar_t>(v, true,
                         MomentsFin<scalar_t>{mean.data_ptr<scalar_t>(), sd.data_ptr<scalar_t>(),
                                    mean_abs.data_ptr<scalar_t>(), mn.data_ptr<scalar_t>(),
                                    mx.data_ptr<scalar_t>()});
  });
  return {mean, sd, mean_abs, mn, mx};
}

std::tuple<at::Tensor, at::Tensor> clip_std_range_cuda(const at::Tensor& x, int64_t ch_axis,
                                                       double std_scale) {
  const auto guard = gpu::device_guard("observer_clip_std_range", x);
  const auto v = view_for_observer(x, ch_axis, "observer_clip_std_range");
  auto lo = channel_out(v), hi = channel_out(v);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, v.x.scalar_type(),
                                  "mqbench_observer_clip_std_cuda", [&] {
    stats_pass<scalar_t>(v, true,
                         ClipStdFin<scalar_t>{lo.data_ptr<scalar_t>(), hi.data_ptr<scalar_t>(), std_scale});
  });
  return {lo, hi};
}

// ---- qparams -------------------------------------------------------------------------------------

template <typename T>
__global__ void qparams_kernel(const double* mn, const double* mx, int64_t n, long long qmin,
                               long long qmax, bool symmetric, long long sym_zp,
                               const double* eps, double* scale, int* zp) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= n) return;
  const auto r = detail::observer_qparams<T>(static_cast<T>(mn[c]), static_cast<T>(mx[c]), qmin,
                                             qmax, symmetric, sym_zp, static_cast<T>(eps[0]));
  scale[c] = static_cast<double>(r.scale);
  zp[c] = static_cast<int>(r.zero_point);
}

std::tuple<at::Tensor, at::Tensor> calculate_qparams_cuda(const at::Tensor& min_val,
                                                          const at::Tensor& max_val,
                                                          int64_t quant_min, int64_t quant_max,
                                                          bool symmetric,
                                                          int64_t symmetric_zero_point,
                                                          const at::Tensor& eps) {
  const char* op = "observer_calculate_qparams";
  TORCH_CHECK(min_val.defined() && max_val.defined(), op, ": min_val and max_val must be defined");
  const auto guard = gpu::device_guard(op, min_val, {{max_val, "max_val"}});
  TORCH_CHECK(at::isFloatingType(min_val.scalar_type()) && at::isFloatingType(max_val.scalar_type()),
              op, ": min_val and max_val must be floating-point tensors");
  TORCH_CHECK(min_val.numel() == max_val.numel(), op, ": min_val has ", min_val.numel(),
              " elements but max_val has ", max_val.numel());
  detail::check_same_device(min_val, max_val, "max_val", op);
  detail::check_quant_range(quant_min, quant_max, op);
  TORCH_CHECK(quant_min < quant_max, op, ": quant_min (", quant_min,
              ") must be < quant_max (", quant_max, ") to compute a scale");
  const auto e = eps_on_device(eps, min_val, op);
  const auto shape = min_val.dim() == 0 ? std::vector<int64_t>{1} : min_val.sizes().vec();
  const int64_t n = min_val.numel();
  const auto mn = min_val.reshape({n}).to(at::kDouble).contiguous();
  const auto mx = max_val.reshape({n}).to(at::kDouble).contiguous();
  auto scale = at::empty({n}, min_val.options().dtype(at::kDouble));
  auto zp = at::empty({n}, min_val.options().dtype(at::kInt));
  if (n > 0) {
    const unsigned int blocks = static_cast<unsigned int>((n + gpu::kThreads - 1) / gpu::kThreads);
    auto stream = c10::cuda::getCurrentCUDAStream();
    if (min_val.scalar_type() == at::kDouble) {
      qparams_kernel<double><<<blocks, gpu::kThreads, 0, stream>>>(
          mn.data_ptr<double>(), mx.data_ptr<double>(), n, quant_min, quant_max, symmetric,
          symmetric_zero_point, e.data_ptr<double>(), scale.data_ptr<double>(),
          zp.data_ptr<int>());
    } else {
      qparams_kernel<float><<<blocks, gpu::kThreads, 0, stream>>>(
          mn.data_ptr<double>(), mx.data_ptr<double>(), n, quant_min, quant_max, symmetric,
          symmetric_zero_point, e.data_ptr<double>(), scale.data_ptr<double>(),
          zp.data_ptr<int>());
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  return {scale.to(min_val.scalar_type()).reshape(shape), zp.reshape(shape)};
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("observer_min_max", TORCH_FN(min_max_cuda));
  m.impl("observer_moments", TORCH_FN(moments_cuda));
  m.impl("observer_clip_std_range", TORCH_FN(clip_std_range_cuda));
  m.impl("observer_calculate_qparams", TORCH_FN(calculate_qparams_cuda));
}

}  // namespace ops
}  // namespace mqbench
