// CUDA kernels of the fixed per-tensor affine fake quantization
// (mqbench::fake_quantize_per_tensor_affine and its backward), registered under the CUDA
// dispatch key of the schemas in ops/fake_quantize_affine.cpp. The formula is
// ops/common/affine_formula.h, shared with the host reference.
//
// The scale and zero point stay in device memory: the kernel reads them, nothing is copied to
// the host (no synchronisation in a training step). A floating zero point (torch's float-zp
// formula) is not implemented on CUDA yet and raises.

#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include "ops/common/affine_formula.h"
#include "ops/common/checks.h"

namespace mqbench {
namespace ops {
namespace {

constexpr int kThreads = 256;

int64_t blocks_for(int64_t n) {
  // A grid-stride loop covers the rest; 65535 * 8 blocks keep every SM busy on any card.
  return std::max<int64_t>(1, std::min<int64_t>((n + kThreads - 1) / kThreads, 65535 * 8));
}

template <typename T>
__global__ void affine_fwd(const T* __restrict__ x, T* __restrict__ out, int64_t n,
                           const float* __restrict__ scale, const float* __restrict__ zero_point,
                           long long qmin, long long qmax) {
  const auto p = detail::affine_scalars<T>(scale[0], zero_point[0], qmin, qmax);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x) {
    out[i] = detail::affine_fake_quant(x[i], p);
  }
}

template <typename T>
__global__ void affine_bwd(const T* __restrict__ grad, const T* __restrict__ x,
                           T* __restrict__ dx, int64_t n, const float* __restrict__ scale,
                           const float* __restrict__ zero_point, long long qmin, long long qmax) {
  const auto p = detail::affine_scalars<T>(scale[0], zero_point[0], qmin, qmax);
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(blockDim.x) * gridDim.x) {
    dx[i] = detail::affine_in_range(x[i], p) ? grad[i] : T(0);
  }
}

// The checks forward and backward share; returns the float32 scale and zero point, still on
// the device (prepare_qparams reads values only of CPU tensors: no host synchronisation).
std::pair<at::Tensor, at::Tensor> checked_qparams(const char* op, const at::Tensor& x,
                                                  const at::Tensor& scale,
                                                  const at::Tensor& zero_point, int64_t qmin,
                                                  int64_t qmax) {
  detail::check_input(x, op);
  detail::check_quant_range(qmin, qmax, op);
  TORCH_CHECK(!at::isFloatingType(zero_point.scalar_type()), op,
              ": the CUDA kernel takes an integer zero_point, got dtype ",
              zero_point.scalar_type(), "; pass zero_point.round().int()");
  return detail::prepare_qparams(x, scale, zero_point, c10::nullopt, op);
}

at::Tensor per_tensor_cuda(const at::Tensor& x_in, const at::Tensor& scale,
                           const at::Tensor& zero_point, int64_t qmin, int64_t qmax) {
  const auto qp = checked_qparams("fake_quantize_per_tensor_affine", x_in, scale, zero_point,
                                  qmin, qmax);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = x_in.contiguous();
  auto out = at::empty_like(x);
  const int64_t n = x.numel();
  if (n == 0) return out;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "mqbench_affine_fwd_cuda", [&] {
    affine_fwd<scalar_t><<<blocks_for(n), kThreads, 0, stream>>>(
        x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), n, qp.first.data_ptr<float>(),
        qp.second.data_ptr<float>(), qmin, qmax);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

at::Tensor per_tensor_backward_cuda(const at::Tensor& grad_in, const at::Tensor& x_in,
                                    const at::Tensor& scale, const at::Tensor& zero_point,
                                    int64_t qmin, int64_t qmax) {
  constexpr const char* op = "_fake_quantize_per_tensor_affine_backward";
  const auto qp = checked_qparams(op, x_in, scale, zero_point, qmin, qmax);
  detail::check_grad(grad_in, x_in, op);
  const c10::cuda::CUDAGuard guard(x_in.device());
  const auto x = x_in.contiguous();
  const auto grad = grad_in.contiguous();
  auto dx = at::empty_like(x);
  const int64_t n = x.numel();
  if (n == 0) return dx;
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "mqbench_affine_bwd_cuda", [&] {
    affine_bwd<scalar_t><<<blocks_for(n), kThreads, 0, stream>>>(
        grad.data_ptr<scalar_t>(), x.data_ptr<scalar_t>(), dx.data_ptr<scalar_t>(), n,
        qp.first.data_ptr<float>(), qp.second.data_ptr<float>(), qmin, qmax);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return dx;
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("fake_quantize_per_tensor_affine", TORCH_FN(per_tensor_cuda));
  m.impl("_fake_quantize_per_tensor_affine_backward", TORCH_FN(per_tensor_backward_cuda));
}

}  // namespace ops
}  // namespace mqbench
