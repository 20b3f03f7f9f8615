// CUDA kernels of TQT (power-of-two scale with its log-threshold gradient; schema and CPU op in
// ops/fake_quantize_tqt.cpp, CPU kernel cpu/tqt_kernel.cpp). Formulas:
// ops/common/algorithm_formula.h; the scale-gradient reduction is deterministic (launch.cuh).

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/common/algorithm_formula.h"
#include "ops/cuda/prepared.cuh"

namespace mqbench {
namespace ops {
namespace {

constexpr const char* kTqt = "fake_quantize_tqt";

template <typename C>
struct TqtForward {
  const float* scale;
  const float* zero_point;
  long long qmin, qmax, mth;
  using Params = detail::TqtScalars<C>;
  __device__ Params params(int64_t c) const {
    return detail::tqt_scalars<C>(scale[c], zero_point[c], qmin, qmax);
  }
  __device__ C operator()(C x, const Params& p) const { return detail::tqt_forward(x, p, mth); }
};

template <typename T>
struct TqtBackward {
  using C = gpu::compute_t<T>;
  const T* dy;
  const T* x;
  T* dx;
  const float* scale;
  const float* zero_point;
  long long qmin, qmax, mth;
  using Params = detail::TqtScalars<C>;
  __device__ Params params(int64_t c) const {
    return detail::tqt_scalars<C>(scale[c], zero_point[c], qmin, qmax);
  }
  __device__ void operator()(int64_t i, const Params& p, gpu::Sum2& acc) const {
    C ds;
    dx[i] = static_cast<T>(
        detail::tqt_grad(static_cast<C>(dy[i]), static_cast<C>(x[i]), p, mth, ds));
    acc.a += static_cast<double>(ds);
  }
};

gpu::Prepared prepare_tqt(const at::Tensor& x, const at::Tensor& scale,
                          const at::Tensor& zero_point, int64_t qmin, int64_t qmax, int64_t mth) {
  TORCH_CHECK(mth == 2 || mth == 3, kTqt, ": mth must be 2 (activations) or 3 (parameters), got ",
              mth, "; TqtFakeQuantize sets it with set_quant_type()");
  return gpu::prepare(kTqt, x, scale, zero_point, c10::nullopt, qmin, qmax);
}

at::Tensor tqt_cuda(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& zero_point,
                    int64_t qmin, int64_t qmax, int64_t mth) {
  const auto guard = gpu::device_guard(kTqt, x, {{scale, "scale"}, {zero_point, "zero_point"}});
  const auto pr = prepare_tqt(x, scale, zero_point, qmin, qmax, mth);
  auto out = at::empty_like(pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pr.x.scalar_type(),
                                  "mqbench_tqt_fwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    gpu::launch_map<1>(TqtForward<C>{pr.scale(), pr.zero_point(), qmin, qmax, mth}, pr.layout,
                       pr.x.data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr),
                       out.data_ptr<scalar_t>());
  });
  return out;
}

std::tuple<at::Tensor, at::Tensor> tqt_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                                     const at::Tensor& scale,
                                                     const at::Tensor& zero_point, int64_t qmin,
                                                     int64_t qmax, int64_t mth) {
  const auto guard = gpu::device_guard(
      kTqt, x, {{grad, "grad"}, {scale, "scale"}, {zero_point, "zero_point"}});
  const auto pr = prepare_tqt(x, scale, zero_point, qmin, qmax, mth);
  const auto dy = gpu::prepare_grad(kTqt, grad, x, pr);
  auto dx = at::empty_like(pr.x);
  auto d_scale = gpu::sum_buffer(1, pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pr.x.scalar_type(),
                                  "mqbench_tqt_bwd_cuda", [&] {
    TqtBackward<scalar_t> k{dy.data_ptr<scalar_t>(), pr.x.data_ptr<scalar_t>(),
                            dx.data_ptr<scalar_t>(), pr.scale(), pr.zero_point(), qmin, qmax, mth};
    gpu::launch_reduce<gpu::Sum2>(k, pr.layout, pr.x,
                                  gpu::StoreSum2{d_scale.data_ptr<double>(), nullptr});
  });
  return {dx, gpu::sums_as(d_scale, scale)};
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("fake_quantize_tqt", TORCH_FN(tqt_cuda));
  m.impl("_fake_quantize_tqt_backward", TORCH_FN(tqt_backward_cuda));
}

}  // namespace ops
}  // namespace mqbench
