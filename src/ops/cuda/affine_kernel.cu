// CUDA kernels of the affine fake-quantize ops, fixed and learnable (LSQ / LSQ+), per tensor and
// per channel, forward and backward, registered under the CUDA dispatch key of the schemas in
// ops/fake_quantize_affine.cpp. Per-element formulas: ops/common/affine_formula.h (the CPU
// kernels' scalar paths); layout and reductions: launch.cuh.
//
// The scale and zero point stay in device memory: the kernels read them, nothing is copied to the
// host, so a training step does not synchronise. The price: the values of a CUDA scale are not
// checked (positive, finite) as on the CPU; a bad one gives inf/NaN outputs (docs/ops.md).
// float16 / bfloat16 inputs compute in float32 and return the input dtype.

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/common/affine_formula.h"
#include "ops/common/checks.h"
#include "ops/cuda/prepared.cuh"

namespace mqbench {
namespace ops {
namespace {

using gpu::Layout;

enum class Mode { kInteger, kFloat, kLearnable };

template <typename C, bool kFloatZp>
struct AffineOp {
  const float* scale;
  const float* zero_point;
  long long qmin, qmax;
  bool round_z;
  using Params = detail::AffineScalars<C>;
  __device__ Params params(int64_t c) const {
    return detail::affine_scalars<C>(scale[c], zero_point[c], qmin, qmax, round_z);
  }
  __device__ C operator()(C x, const Params& p) const {
    return detail::affine_fake_quant<C, kFloatZp>(x, p);
  }
  __device__ C operator()(C dy, C x, const Params& p) const {
    return detail::affine_in_range<C, kFloatZp>(x, p) ? dy : C(0);
  }
};

template <typename T>
struct LearnableBackwardOp {
  using C = gpu::compute_t<T>;
  const T* dy;
  const T* x;
  T* dx;
  const float* scale;
  const float* zero_point;
  long long qmin, qmax;
  C g;
  using Params = detail::AffineScalars<C>;
  __device__ Params params(int64_t c) const {
    return detail::affine_scalars<C>(scale[c], zero_point[c], qmin, qmax, true);
  }
  __device__ void operator()(int64_t i, const Params& p, gpu::Sum2& acc) const {
    C ds, dz;
    dx[i] = static_cast<T>(
        detail::learnable_grad<C>(static_cast<C>(dy[i]), static_cast<C>(x[i]), p, g, ds, dz));
    acc.a += static_cast<double>(ds);
    acc.b += static_cast<double>(dz);
  }
};

using gpu::prepare;

Mode fixed_mode(const at::Tensor& zero_point) {
  return at::isFloatingType(zero_point.scalar_type()) ? Mode::kFloat : Mode::kInteger;
}

at::Tensor forward(const char* op, const at::Tensor& x_in, const at::Tensor& scale,
                   const at::Tensor& zero_point, c10::optional<int64_t> ch_axis, int64_t qmin,
                   int64_t qmax, Mode mode) {
  const auto guard = gpu::device_guard(op, x_in, {{scale, "scale"}, {zero_point, "zero_point"}});
  const auto pr = prepare(op, x_in, scale, zero_point, ch_axis, qmin, qmax);
  auto out = at::empty_like(pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pr.x.scalar_type(),
                                  "mqbench_affine_fwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    const float* s = pr.scale();
    const float* z = pr.zero_point();
    const scalar_t* xp = pr.x.data_ptr<scalar_t>();
    if (mode == Mode::kFloat) {
      gpu::launch_map<1>(AffineOp<C, true>{s, z, qmin, qmax, false}, pr.layout, xp,
                         static_cast<const scalar_t*>(nullptr), out.data_ptr<scalar_t>());
    } else {
      gpu::launch_map<1>(AffineOp<C, false>{s, z, qmin, qmax, mode == Mode::kLearnable},
                         pr.layout, xp, static_cast<const scalar_t*>(nullptr),
                         out.data_ptr<scalar_t>());
    }
  });
  return out;
}

at::Tensor fixed_backward(const char* op, const at::Tensor& grad, const at::Tensor& x_in,
                          const at::Tensor& scale, const at::Tensor& zero_point,
                          c10::optional<int64_t> ch_axis, int64_t qmin, int64_t qmax) {
  const auto guard = gpu::device_guard(
      op, x_in, {{grad, "grad"}, {scale, "scale"}, {zero_point, "zero_point"}});
  const auto pr = prepare(op, x_in, scale, zero_point, ch_axis, qmin, qmax);
  const auto dy = gpu::prepare_grad(op, grad, x_in, pr);
  auto dx = at::empty_like(pr.x);
  const Mode mode = fixed_mode(zero_point);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pr.x.scalar_type(),
                                  "mqbench_affine_bwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    const float* s = pr.scale();
    const float* z = pr.zero_point();
    if (mode == Mode::kFloat) {
      gpu::launch_map<2>(AffineOp<C, true>{s, z, qmin, qmax, false}, pr.layout,
                         dy.data_ptr<scalar_t>(), pr.x.data_ptr<scalar_t>(),
                         dx.data_ptr<scalar_t>());
    } else {
      gpu::launch_map<2>(AffineOp<C, false>{s, z, qmin, qmax, false}, pr.layout,
                         dy.data_ptr<scalar_t>(), pr.x.data_ptr<scalar_t>(),
                         dx.data_ptr<scalar_t>());
    }
  });
  return dx;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> learnable_backward(
    const char* op, const at::Tensor& grad, const at::Tensor& x_in, const at::Tensor& scale,
    const at::Tensor& zero_point, c10::optional<int64_t> ch_axis, int64_t qmin, int64_t qmax,
    double grad_factor) {
  const auto guard = gpu::device_guard(
      op, x_in, {{grad, "grad"}, {scale, "scale"}, {zero_point, "zero_point"}});
  const auto pr = prepare(op, x_in, scale, zero_point, ch_axis, qmin, qmax);
  const auto dy = gpu::prepare_grad(op, grad, x_in, pr);
  auto dx = at::empty_like(pr.x);
  const int64_t channels = pr.qp.first.numel();
  auto d_scale = gpu::sum_buffer(channels, pr.x);
  auto d_zero_point = gpu::sum_buffer(channels, pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pr.x.scalar_type(),
                                  "mqbench_learnable_bwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    LearnableBackwardOp<scalar_t> k{dy.data_ptr<scalar_t>(),
                                    pr.x.data_ptr<scalar_t>(),
                                    dx.data_ptr<scalar_t>(),
                                    pr.scale(),
                                    pr.zero_point(),
                                    qmin,
                                    qmax,
                                    static_cast<C>(static_cast<float>(grad_factor))};
    gpu::launch_reduce<gpu::Sum2>(
        k, pr.layout, pr.x,
        gpu::StoreSum2{d_scale.data_ptr<double>(), d_zero_point.data_ptr<double>()});
  });
  return {dx, gpu::sums_as(d_scale, scale), gpu::sums_as(d_zero_point, zero_point)};
}

at::Tensor per_tensor_cuda(const at::Tensor& x, const at::Tensor& scale,
                           const at::Tensor& zero_point, int64_t qmin, int64_t qmax) {
  return forward("fake_quantize_per_tensor_affine", x, scale, zero_point, c10::nullopt, qmin,
                 qmax, fixed_mode(zero_point));
}

at::Tensor per_tensor_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                    const at::Tensor& scale, const at::Tensor& zero_point,
                                    int64_t qmin, int64_t qmax) {
  return fixed_backward("_fake_quantize_per_tensor_affine_backward", grad, x, scale, zero_point,
                        c10::nullopt, qmin, qmax);
}

at::Tensor per_channel_cuda(const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin,
                            int64_t qmax) {
  return forward("fake_quantize_per_channel_affine", x, scale, zero_point, ch_axis, qmin, qmax,
                 fixed_mode(zero_point));
}

at::Tensor per_channel_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                     const at::Tensor& scale, const at::Tensor& zero_point,
                                     int64_t ch_axis, int64_t qmin, int64_t qmax) {
  return fixed_backward("_fake_quantize_per_channel_affine_backward", grad, x, scale,
                        zero_point, ch_axis, qmin, qmax);
}

at::Tensor learnable_per_tensor_cuda(const at::Tensor& x, const at::Tensor& scale,
                                     const at::Tensor& zero_point, int64_t qmin, int64_t qmax,
                                     double /*grad_factor*/) {
  return forward("fake_quantize_learnable_per_tensor_affine", x, scale, zero_point,
                 c10::nullopt, qmin, qmax, Mode::kLearnable);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> learnable_per_tensor_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale,
    const at::Tensor& zero_point, int64_t qmin, int64_t qmax, double grad_factor) {
  return learnable_backward("_fake_quantize_learnable_per_tensor_affine_backward", grad, x,
                            scale, zero_point, c10::nullopt, qmin, qmax, grad_factor);
}

at::Tensor learnable_per_channel_cuda(const at::Tensor& x, const at::Tensor& scale,
                                      const at::Tensor& zero_point, int64_t ch_axis,
                                      int64_t qmin, int64_t qmax, double /*grad_factor*/) {
  return forward("fake_quantize_learnable_per_channel_affine", x, scale, zero_point, ch_axis,
                 qmin, qmax, Mode::kLearnable);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> learnable_per_channel_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& scale,
    const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin, int64_t qmax,
    double grad_factor) {
  return learnable_backward("_fake_quantize_learnable_per_channel_affine_backward", grad, x,
                            scale, zero_point, ch_axis, qmin, qmax, grad_factor);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("fake_quantize_per_tensor_affine", TORCH_FN(per_tensor_cuda));
  m.impl("_fake_quantize_per_tensor_affine_backward", TORCH_FN(per_tensor_backward_cuda));
  m.impl("fake_quantize_per_channel_affine", TORCH_FN(per_channel_cuda));
  m.impl("_fake_quantize_per_channel_affine_backward", TORCH_FN(per_channel_backward_cuda));
  m.impl("fake_quantize_learnable_per_tensor_affine", TORCH_FN(learnable_per_tensor_cuda));
  m.impl("_fake_quantize_learnable_per_tensor_affine_backward",
         TORCH_FN(learnable_per_tensor_backward_cuda));
  m.impl("fake_quantize_learnable_per_channel_affine", TORCH_FN(learnable_per_channel_cuda));
  m.impl("_fake_quantize_learnable_per_channel_affine_backward",
         TORCH_FN(learnable_per_channel_backward_cuda));
}

}  // namespace ops
}  // namespace mqbench
