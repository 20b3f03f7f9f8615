// CUDA kernels of NNIE's logarithmic fake quantization (forward; its autograd is the identity)
// and AdaRound's soft / hard rounding (forward and the gradient to alpha), schemas in
// ops/fake_quantize_nnie.cpp and ops/fake_quantize_adaround.cpp. Formulas:
// ops/common/algorithm_formula.h.
//
// NNIE's data_max is read on the device (no host synchronisation): a negative, NaN or infinite
// data_max, which the CPU op rejects, gives NaN outputs here; 0 gives zeros as on the CPU.

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/common/algorithm_formula.h"
#include "ops/cuda/prepared.cuh"

namespace mqbench {
namespace ops {
namespace {

// ---- NNIE ----------------------------------------------------------------------------------------

constexpr const char* kNnie = "fake_quantize_nnie";

template <typename C>
struct NnieOp {
  const double* data_max;
  using Params = detail::NnieScalars;
  __device__ Params params(int64_t) const { return detail::nnie_scalars(data_max[0]); }
  __device__ C operator()(C x, const Params& p) const {
    return static_cast<C>(detail::nnie_forward(static_cast<double>(x), p));
  }
};

at::Tensor nnie_cuda(const at::Tensor& x_in, const at::Tensor& data_max) {
  const auto guard = gpu::device_guard(kNnie, x_in, {{data_max, "data_max"}});
  detail::check_input_with_half(x_in, kNnie);
  const auto dmax = gpu::device_scalar_param(x_in, data_max, "data_max", kNnie);
  const auto x = gpu::dense(x_in);
  auto out = at::empty_like(x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(),
                                  "mqbench_nnie_fwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    gpu::launch_map<1>(NnieOp<C>{dmax.data_ptr<double>()}, gpu::layout_of(x, c10::nullopt),
                       x.data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr),
                       out.data_ptr<scalar_t>());
  });
  return out;
}

// ---- AdaRound ------------------------------------------------------------------------------------

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
  m.impl("fake_quantize_nnie", TORCH_FN(nnie_cuda));
  m.impl("fake_quantize_adaround_per_tensor", TORCH_FN(adaround_per_tensor_cuda));
  m.impl("_fake_quantize_adaround_per_tensor_backward",
         TORCH_FN(adaround_per_tensor_backward_cuda));
  m.impl("fake_quantize_adaround_per_channel", TORCH_FN(adaround_per_channel_cuda));
  m.impl("_fake_quantize_adaround_per_channel_backward",
         TORCH_FN(adaround_per_channel_backward_cuda));
}

}  // namespace ops
}  // namespace mqbench
