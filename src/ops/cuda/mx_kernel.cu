// CUDA kernels of the block-scaled formats (fake_quantize_mx: MXFP8 / MXFP6 / MXFP4;
// fake_quantize_nvfp4); schemas and the CPU op in ops/fake_quantize_mx.cpp, formulas in
// ops/common/mx_formula.h (the CPU kernel's, operation for operation).
//
// One thread per block: it reads its block (16 or 32 consecutive elements, float4 loads when the
// block is 16-byte aligned) for the amax, then again (from L1) to write the output. NVFP4's
// global_amax is read on the device (no host synchronisation), so the CPU op's check that it is
// finite and >= 0 is not made here: a negative, NaN or infinite global_amax gives NaN or zero
// outputs. half / bfloat16 are loaded and computed in float32.

#include <ATen/Dispatch.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "ops/common/checks.h"
#include "ops/common/mx_formula.h"
#include "ops/common/mx_layout.h"
#include "ops/cuda/launch.cuh"

namespace mqbench {
namespace ops {
namespace {

constexpr const char* kMx = "fake_quantize_mx";
constexpr const char* kNvfp4 = "fake_quantize_nvfp4";

template <typename T>
__device__ __forceinline__ uint32_t block_amax_bits(const T* x, int64_t len) {
  uint32_t m = 0;
  if constexpr (std::is_same<T, float>::value) {
    if ((len & 3) == 0 && (reinterpret_cast<uintptr_t>(x) & 15) == 0) {
      const float4* x4 = reinterpret_cast<const float4*>(x);
      for (int64_t i = 0; i < len / 4; ++i) {
        const float4 v = x4[i];
        m = max(m, detail::abs_bits(v.x));
        m = max(m, detail::abs_bits(v.y));
        m = max(m, detail::abs_bits(v.z));
        m = max(m, detail::abs_bits(v.w));
      }
      return m;
    }
  }
  for (int64_t i = 0; i < len; ++i) m = max(m, detail::abs_bits(static_cast<float>(x[i])));
  return m;
}

// MX with elements F (kNvfp4 false), or NVFP4 (F = E2M1 with an E4M3 block scale).
template <typename T, typename F, bool kNvfp4>
__global__ void block_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows,
                             int64_t cols, int64_t block, const float* global_amax) {
  const int64_t per_row = cols == 0 ? 0 : (cols - 1) / block + 1;  // no overflow near INT64_MAX
  const int64_t blocks = rows * per_row;
  const float g = kNvfp4 ? detail::nvfp4_global_scale(global_amax[0]) : 0.0f;
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < blocks;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = b / per_row;
    const int64_t c = (b - r * per_row) * block;
    const int64_t len = min(block, cols - c);
    const T* xb = x + r * cols + c;
    T* ob = out + r * cols + c;
    const uint32_t amax = block_amax_bits(xb, len);
    detail::BlockScale s;
    if constexpr (kNvfp4) {
      s = detail::nvfp4_block_scale(detail::bits_float(amax), g);
    } else {
      s = detail::mx_block_scale<F>(amax);
    }
    for (int64_t i = 0; i < len; ++i) {
      ob[i] = static_cast<T>(detail::block_quantize<F>(static_cast<float>(xb[i]), s));
    }
  }
}

template <typename F, bool kNvfp4>
at::Tensor run_blocks_cuda(const at::Tensor& x_in, int64_t block_size, int64_t axis,
                           const char* op, const float* global_amax) {
  detail::check_input_with_half(x_in, op);
  auto l = detail::block_layout(x_in, block_size, axis, op);
  // float64 is computed in float32, as on the CPU
  const auto x = l.x.scalar_type() == at::kDouble ? l.x.to(at::kFloat) : l.x;
  auto out = at::empty_like(x);
  const int64_t blocks = l.cols == 0 ? 0 : l.rows * ((l.cols - 1) / block_size + 1);
  if (blocks > 0) {
    const int64_t want = (blocks + gpu::kThreads - 1) / gpu::kThreads;
    const int grid = static_cast<int>(std::min<int64_t>(want, gpu::resident_blocks()));
    auto stream = c10::cuda::getCurrentCUDAStream();
    AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "mqbench_mx_cuda",
                                    [&] {
      block_kernel<scalar_t, F, kNvfp4><<<grid, gpu::kThreads, 0, stream>>>(
          x.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), l.rows, l.cols, block_size,
          global_amax);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  }
  return detail::from_block_layout(out.to(x_in.scalar_type()), l, x_in);
}

at::Tensor mx_cuda(const at::Tensor& x, c10::string_view elem_dtype, int64_t block_size,
                   int64_t axis) {
  const auto guard = gpu::device_guard(kMx, x);
  switch (detail::mx_element(std::string(elem_dtype), kMx)) {
    case detail::MxElement::kE4M3:
      return run_blocks_cuda<detail::E4M3, false>(x, block_size, axis, kMx, nullptr);
    case detail::MxElement::kE3M2:
      return run_blocks_cuda<detail::E3M2, false>(x, block_size, axis, kMx, nullptr);
    case detail::MxElement::kE2M3:
      return run_blocks_cuda<detail::E2M3, false>(x, block_size, axis, kMx, nullptr);
    case detail::MxElement::kE2M1:
      break;
  }
  return run_blocks_cuda<detail::E2M1, false>(x, block_size, axis, kMx, nullptr);
}

at::Tensor nvfp4_cuda(const at::Tensor& x, const at::Tensor& global_amax, int64_t block_size,
                      int64_t axis) {
  const auto guard = gpu::device_guard(kNvfp4, x, {{global_amax, "global_amax"}});
  const auto amax = gpu::device_scalar_param(x, global_amax, "global_amax", kNvfp4)
                        .to(at::kFloat);
  return run_blocks_cuda<detail::E2M1, true>(x, block_size, axis, kNvfp4,
                                             amax.data_ptr<float>());
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("fake_quantize_mx", TORCH_FN(mx_cuda));
  m.impl("fake_quantize_nvfp4", TORCH_FN(nvfp4_cuda));
}

}  // namespace ops
}  // namespace mqbench
