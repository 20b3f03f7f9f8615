// CUDA kernels of AdaRound's soft / hard rounding (forward and the gradient to alpha; schema and
// CPU op in ops/fake_quantize_adaround.cpp, CPU kernel cpu/adaround_kernel.cpp). Formulas:
// ops/common/algorithm_formula.h.

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/common/algorithm_formula.h"
#include "ops/cuda/prepared.cuh"

namespace mqbench {
namespace ops {
namespace {

template <typename C>
struct AdaRoundParams {
  C s, z;
};

template <typename T>
struct AdaRoundBase {
  using C = gpu::compute_t<T>;
  const float* scale;
  const float* zero_point;
  long long qmin, qmax;
  using Params = AdaRoundParams<C>;
  __device__ Params params(int64_t c) const {
    return {static_cast<C>(scale[c]), static_cast<C>(zero_point[c])};
  }
};

template <typename T>
struct AdaRoundForward : AdaRoundBase<T> {
  using C = gpu::compute_t<T>;
  const T* x;
  const T* alpha;
  T* out;
  bool hard;
  __device__ void operator()(int64_t i, const AdaRoundParams<C>& p) const {
    out[i] = static_cast<T>(detail::adaround_forward(
        static_cast<C>(x[i]), static_cast<C>(alpha[i]), p.s, p.z, static_cast<C>(this->qmin),
        static_cast<C>(this->qmax), hard));
  }
};

template <typename T>
struct AdaRoundBackward : AdaRoundBase<T> {
  using C = gpu::compute_t<T>;
  const T* dy;
  const T* x;
  const T* alpha;
  T* d_alpha;
  __device__ void operator()(int64_t i, const AdaRoundParams<C>& p) const {
    d_alpha[i] = static_cast<T>(detail::adaround_grad(
        static_cast<C>(dy[i]), static_cast<C>(x[i]), static_cast<C>(alpha[i]), p.s, p.z,
        static_cast<C>(this->qmin), static_cast<C>(this->qmax)));
  }
};

struct AdaRoundPrepared {
  gpu::Prepared pr;
  at::Tensor alpha;  // with the dense x's strides
};

AdaRoundPrepared prepare_adaround(const char* op, const at::Tensor& x, const at::Tensor& scale,
                                  const at::Tensor& zero_point, const at::Tensor& alpha,
                                  c10::optional<int64_t> ch_axis, int64_t qmin, int64_t qmax) {
  detail::check_like_x(x, alpha, "alpha", op);
  AdaRoundPrepared r;
  r.pr = gpu::prepare(op, x, scale, zero_point, ch_axis, qmin, qmax);
  r.alpha = gpu::with_strides_of(alpha, r.pr.x);
  return r;
}

at::Tensor adaround_forward(const char* op, const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, const at::Tensor& alpha,
                            c10::optional<int64_t> ch_axis, int64_t qmin, int64_t qmax,
                            bool hard) {
  const auto guard = gpu::device_guard(
      op, x, {{scale, "scale"}, {zero_point, "zero_point"}, {alpha, "alpha"}});
  const auto a = prepare_adaround(op, x, scale, zero_point, alpha, ch_axis, qmin, qmax);
  auto out = at::empty_like(a.pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.pr.x.scalar_type(),
                                  "mqbench_adaround_fwd_cuda", [&] {
    AdaRoundForward<scalar_t> k;
    static_cast<AdaRoundBase<scalar_t>&>(k) = {a.pr.scale(), a.pr.zero_point(), qmin, qmax};
    k.x = a.pr.x.data_ptr<scalar_t>();
    k.alpha = a.alpha.data_ptr<scalar_t>();
    k.out = out.data_ptr<scalar_t>();
    k.hard = hard;
    gpu::launch_index_map(k, a.pr.layout);
  });
  return out;
}

at::Tensor adaround_backward(const char* op, const at::Tensor& grad, const at::Tensor& x,
                             const at::Tensor& scale, const at::Tensor& zero_point,
                             const at::Tensor& alpha, c10::optional<int64_t> ch_axis,
                             int64_t qmin, int64_t qmax) {
  const auto guard = gpu::device_guard(
      op, x, {{grad, "grad"}, {scale, "scale"}, {zero_point, "zero_point"}, {alpha, "alpha"}});
  const auto a = prepare_adaround(op, x, scale, zero_point, alpha, ch_axis, qmin, qmax);
  const auto dy = gpu::prepare_grad(op, grad, x, a.pr);
  auto d_alpha = at::empty_like(a.pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.pr.x.scalar_type(),
                                  "mqbench_adaround_bwd_cuda", [&] {
    AdaRoundBackward<scalar_t> k;
    static_cast<AdaRoundBase<scalar_t>&>(k) = {a.pr.scale(), a.pr.zero_point(), qmin, qmax};
    k.dy = dy.data_ptr<scalar_t>();
    k.x = a.pr.x.data_ptr<scalar_t>();
    k.alpha = a.alpha.data_ptr<scalar_t>();
    k.d_alpha = d_alpha.data_ptr<scalar_t>();
    gpu::launch_index_map(k, a.pr.layout);
  });
  return d_alpha;
}

at::Tensor adaround_per_tensor_cuda(const at::Tensor& x, const at::Tensor& scale,
                                    const at::Tensor& zero_point, const at::Tensor& alpha,
                                    int64_t qmin, int64_t qmax, bool hard) {
  return adaround_forward("fake_quantize_adaround_per_tensor", x, scale, zero_point, alpha,
                          c10::nullopt, qmin, qmax, hard);
}
at::Tensor adaround_per_tensor_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                             const at::Tensor& scale,
                                             const at::Tensor& zero_point,
                                             const at::Tensor& alpha, int64_t qmin,
                                             int64_t qmax) {
  return adaround_backward("_fake_quantize_adaround_per_tensor_backward", grad, x, scale,
                           zero_point, alpha, c10::nullopt, qmin, qmax);
}
at::Tensor adaround_per_channel_cuda(const at::Tensor& x, const at::Tensor& scale,
                                     const at::Tensor& zero_point, const at::Tensor& alpha,
                                     int64_t ch_axis, int64_t qmin, int64_t qmax, bool hard) {
  return adaround_forward("fake_quantize_adaround_per_channel", x, scale, zero_point, alpha,
                          ch_axis, qmin, qmax, hard);
}
at::Tensor adaround_per_channel_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                              const at::Tensor& scale,
                                              const at::Tensor& zero_point,
                                              const at::Tensor& alpha, int64_t ch_axis,
                                              int64_t qmin, int64_t qmax) {
  return adaround_backward("_fake_quantize_adaround_per_channel_backward", grad, x, scale,
                           zero_point, alpha, ch_axis, qmin, qmax);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("fake_quantize_adaround_per_tensor", TORCH_FN(adaround_per_tensor_cuda));
  m.impl("_fake_quantize_adaround_per_tensor_backward",
         TORCH_FN(adaround_per_tensor_backward_cuda));
  m.impl("fake_quantize_adaround_per_channel", TORCH_FN(adaround_per_channel_cuda));
  m.impl("_fake_quantize_adaround_per_channel_backward",
         TORCH_FN(adaround_per_channel_backward_cuda));
}

}  // namespace ops
}  // namespace mqbench
