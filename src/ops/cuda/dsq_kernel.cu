// CUDA kernels of DSQ soft quantization, per tensor and per channel (schemas in
// ops/fake_quantize_dsq.cpp). Formulas: ops/common/algorithm_formula.h. No gradient to the scale
// or the zero point (buffers in MQBench).

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/common/algorithm_formula.h"
#include "ops/cuda/prepared.cuh"

namespace mqbench {
namespace ops {
namespace {

template <typename C>
struct DsqOp {
  const float* scale;
  const float* zero_point;
  long long qmin, qmax;
  detail::DsqConstants k;  // from alpha, once per call
  using Params = detail::DsqScalars<C>;
  __device__ Params params(int64_t c) const {
    return detail::dsq_scalars<C>(scale[c], zero_point[c], qmin, qmax, k);
  }
  __device__ C operator()(C x, const Params& p) const { return detail::dsq_forward(x, p); }
  __device__ C operator()(C dy, C x, const Params& p) const { return detail::dsq_grad(dy, x, p); }
};

gpu::Prepared prepare(const char* op, const at::Tensor& x, const at::Tensor& scale,
                      const at::Tensor& zero_point, c10::optional<int64_t> ch_axis, int64_t qmin,
                      int64_t qmax, double alpha) {
  TORCH_CHECK(alpha > 0.0 && alpha < 1.0, op, ": alpha must be in (0, 1), got ", alpha);
  return gpu::prepare(op, x, scale, zero_point, ch_axis, qmin, qmax);
}

at::Tensor dsq_forward(const char* op, const at::Tensor& x, const at::Tensor& scale,
                       const at::Tensor& zero_point, c10::optional<int64_t> ch_axis,
                       int64_t qmin, int64_t qmax, double alpha) {
  const auto guard = gpu::device_guard(op, x, {{scale, "scale"}, {zero_point, "zero_point"}});
  const auto pr = prepare(op, x, scale, zero_point, ch_axis, qmin, qmax, alpha);
  auto out = at::empty_like(pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pr.x.scalar_type(),
                                  "mqbench_dsq_fwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    gpu::launch_map<1>(DsqOp<C>{pr.scale(), pr.zero_point(), qmin, qmax, detail::dsq_constants(alpha)}, pr.layout,
                       pr.x.data_ptr<scalar_t>(), static_cast<const scalar_t*>(nullptr),
                       out.data_ptr<scalar_t>());
  });
  return out;
}

at::Tensor dsq_backward(const char* op, const at::Tensor& grad, const at::Tensor& x,
                        const at::Tensor& scale, const at::Tensor& zero_point,
                        c10::optional<int64_t> ch_axis, int64_t qmin, int64_t qmax,
                        double alpha) {
  const auto guard = gpu::device_guard(
      op, x, {{grad, "grad"}, {scale, "scale"}, {zero_point, "zero_point"}});
  const auto pr = prepare(op, x, scale, zero_point, ch_axis, qmin, qmax, alpha);
  const auto dy = gpu::prepare_grad(op, grad, x, pr);
  auto dx = at::empty_like(pr.x);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, pr.x.scalar_type(),
                                  "mqbench_dsq_bwd_cuda", [&] {
    using C = gpu::compute_t<scalar_t>;
    gpu::launch_map<2>(DsqOp<C>{pr.scale(), pr.zero_point(), qmin, qmax, detail::dsq_constants(alpha)}, pr.layout,
                       dy.data_ptr<scalar_t>(), pr.x.data_ptr<scalar_t>(),
                       dx.data_ptr<scalar_t>());
  });
  return dx;
}

at::Tensor per_tensor_cuda(const at::Tensor& x, const at::Tensor& scale,
                           const at::Tensor& zero_point, int64_t qmin, int64_t qmax,
                           double alpha) {
  return dsq_forward("fake_quantize_dsq_per_tensor", x, scale, zero_point, c10::nullopt, qmin,
                     qmax, alpha);
}
at::Tensor per_tensor_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                    const at::Tensor& scale, const at::Tensor& zero_point,
                                    int64_t qmin, int64_t qmax, double alpha) {
  return dsq_backward("_fake_quantize_dsq_per_tensor_backward", grad, x, scale, zero_point,
                      c10::nullopt, qmin, qmax, alpha);
}
at::Tensor per_channel_cuda(const at::Tensor& x, const at::Tensor& scale,
                            const at::Tensor& zero_point, int64_t ch_axis, int64_t qmin,
                            int64_t qmax, double alpha) {
  return dsq_forward("fake_quantize_dsq_per_channel", x, scale, zero_point, ch_axis, qmin, qmax,
                     alpha);
}
at::Tensor per_channel_backward_cuda(const at::Tensor& grad, const at::Tensor& x,
                                     const at::Tensor& scale, const at::Tensor& zero_point,
                                     int64_t ch_axis, int64_t qmin, int64_t qmax, double alpha) {
  return dsq_backward("_fake_quantize_dsq_per_channel_backward", grad, x, scale, zero_point,
                      ch_axis, qmin, qmax, alpha);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("fake_quantize_dsq_per_tensor", TORCH_FN(per_tensor_cuda));
  m.impl("_fake_quantize_dsq_per_tensor_backward", TORCH_FN(per_tensor_backward_cuda));
  m.impl("fake_quantize_dsq_per_channel", TORCH_FN(per_channel_cuda));
  m.impl("_fake_quantize_dsq_per_channel_backward", TORCH_FN(per_channel_backward_cuda));
}

}  // namespace ops
}  // namespace mqbench
