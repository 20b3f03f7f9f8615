// CUDA kernels of the FP8 fake-quantize ops (E4M3FN / E5M2), fixed and learnable scale, per
// tensor and per channel, registered under the CUDA dispatch key of the schemas in
// ops/fake_quantize_fp8.cpp. Per-element formula: ops/common/fp8_formula.h (the CPU kernels'
// too); layout and reductions: launch.cuh. The scale stays in device memory (no host sync; its
// values are not checked, as for the affine ops: docs/ops.md). float16 / bfloat16 inputs compute
// in float32 and return the input dtype.

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/common/fp8_formula.h"
#include "ops/cuda/prepared.cuh"

namespace mqbench {
namespace ops {
namespace {

namespace d = detail;

// v = x / s in the compute type C, rounded in float32 (as the CPU kernels: a float64 v is first
// rounded to float32, as torch's double -> float8 cast).
template <typename C>
struct Fp8Op {
  const float* scale;
  d::Fp8Params p;
  using Params = C;
  __device__ Params params(int64_t c) const { return static_cast<C>(scale[c]); }
  __device__ C operator()(C x, const Params& s) const {
    const float v = static_cast<float>(x / s);
    return static_cast<C>(d::fp8_round(d::fp8_scaled(v, p), p)) * s;
  }
  __device__ C operator()(C dy, C x, const Params& s) const {
    return d::fp8_in_range(static_cast<float>(x / s), p) ? dy : C(0);
  }
};

template <typename T>
struct LearnableFp8BackwardOp {
  using C = gpu::compute_t<T>;
  const T* dy;
  const T* x;
  T* dx;
  const float* scale;
  d::Fp8Params p;
  C g;
  using Params = C;
  __device__ Params params(int64_t c) const { return static_cast<C>(scale[c]); }
  __device__ void operator()(int64_t i, const Params& s, gpu::Sum2& acc) const {
    const C dyv = static_cast<C>(dy[i]);
    const C r = static_cast<C>(x[i]) / s;
    const float v = static_cast<float>(r);
    const bool in = d::fp8_in_range(v, p);
    const C q = static_cast<C>(d::fp8_round(d::fp8_scaled(v, p), p));
    const C sat = v < 0.0f ? -static_cast<C>(p.max_finite) : static_cast<C>(p.max_finite);
    const C ds = dyv * g * (in ? q - r : (v != v ? C(0) : sat));
    dx[i] = static_cast<T>(in ? dyv : C(0));
    acc.a += static_cast<double>(ds);
  }
};

// The (unused) zero point operand of the shared preparation: zeros, on the scale's device.
at::Tensor zeros_for(const at::Tensor& scale) {
  auto z = at::empty(scale.sizes(), scale.options().dtype(at::kFloat));
  z.zero_();
  return z;
}

at::Tensor fp8_cuda(const at::Tensor& x_in, const at::Tensor& scale,
                    c10::optional<int64_t> ch_axis, std::string dtype) {
  const char* op = "fake_quantize_fp8";
  const auto p = d::fp8_params(d::fp8_format(dtype, op));
  const auto guard = gpu::device_guard(op, x_in, {{scale, "scale"}});
  const auto pr = gpu::prepare(op, x_in, scale, zeros_for(scale), ch_axis, 0, 0);
  auto out = at::empty_like(pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pr.x.scalar_type(),
                                  "mqbench_fp8_fwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    gpu::launch_map<1>(Fp8Op<C>{pr.scale(), p}, pr.layout, pr.x.data_ptr<scalar_t>(),
                       static_cast<const scalar_t*>(nullptr), out.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor fp8_backward_cuda(const at::Tensor& grad, const at::Tensor& x_in,
                             const at::Tensor& scale, c10::optional<int64_t> ch_axis,
                             std::string dtype) {
  const char* op = "_fake_quantize_fp8_backward";
  const auto p = d::fp8_params(d::fp8_format(dtype, op));
  const auto guard = gpu::device_guard(op, x_in, {{grad, "grad"}, {scale, "scale"}});
  const auto pr = gpu::prepare(op, x_in, scale, zeros_for(scale), ch_axis, 0, 0);
  const auto dy = gpu::prepare_grad(op, grad, x_in, pr);
  auto dx = at::empty_like(pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pr.x.scalar_type(),
                                  "mqbench_fp8_bwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    gpu::launch_map<2>(Fp8Op<C>{pr.scale(), p}, pr.layout, dy.data_ptr<scalar_t>(),
                       pr.x.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>());
  });
  return dx;
}

at::Tensor learnable_fp8_cuda(const at::Tensor& x, const at::Tensor& scale,
                              c10::optional<int64_t> ch_axis, std::string dtype,
                              double /*grad_factor*/) {
  return fp8_cuda(x, scale, ch_axis, std::move(dtype));
}

std::tuple<at::Tensor, at::Tensor> learnable_fp8_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x_in, const at::Tensor& scale,
    c10::optional<int64_t> ch_axis, std::string dtype, double grad_factor) {
  const char* op = "_fake_quantize_learnable_fp8_backward";
  const auto p = d::fp8_params(d::fp8_format(dtype, op));
  const auto guard = gpu::device_guard(op, x_in, {{grad, "grad"}, {scale, "scale"}});
  const auto pr = gpu::prepare(op, x_in, scale, zeros_for(scale), ch_axis, 0, 0);
  const auto dy = gpu::prepare_grad(op, grad, x_in, pr);
  auto dx = at::empty_like(pr.x);
  const int64_t channels = pr.qp.first.numel();
  auto d_scale = gpu::sum_buffer(channels, pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pr.x.scalar_type(),
                                  "mqbench_fp8_learnable_bwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    LearnableFp8BackwardOp<scalar_t> k{dy.data_ptr<scalar_t>(), pr.x.data_ptr<scalar_t>(),
                                       dx.data_ptr<scalar_t>(), pr.scale(), p,
                                       static_cast<C>(static_cast<float>(grad_factor))};
    gpu::launch_reduce<gpu::Sum2>(k, pr.layout, pr.x,
                                  gpu::StoreSum2{d_scale.data_ptr<double>(), nullptr});
  });
  return {dx, gpu::sums_as(d_scale, scale)};
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("fake_quantize_fp8", TORCH_FN(fp8_cuda));
  m.impl("_fake_quantize_fp8_backward", TORCH_FN(fp8_backward_cuda));
  m.impl("fake_quantize_learnable_fp8", TORCH_FN(learnable_fp8_cuda));
  m.impl("_fake_quantize_learnable_fp8_backward", TORCH_FN(learnable_fp8_backward_cuda));
}

}  // namespace ops
}  // namespace mqbench
