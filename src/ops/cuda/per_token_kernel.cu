// CUDA kernels of fake_quantize_per_token (Note [Per-token fake quantization] in
// ops/common/per_token_formula.h), registered under the CUDA dispatch key of the schema in
// ops/fake_quantize_per_token.cpp. A row's min and max are reduced inside the kernel that
// quantizes it (a warp per row for rows up to kWarpRowMax elements, shuffles; a block per row
// above, cub::BlockReduce), its qparams computed on the device with the shared formula, and its
// elements quantized by the same threads, which read the row a second time (from L2 for any
// row a block holds). min / max are exact in any order, and the element formula is the CPU's
// (--fmad=false), so the kernels agree with the CPU kernel bit for bit. Rows whose length is a
// multiple of 4 with aligned pointers load and store 4 elements at a time. float16 / bfloat16
// load as float32 and compute in float32; float64 in float64.

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>

#include "ops/common/per_token_formula.h"
#include "ops/cuda/launch.cuh"

namespace mqbench {
namespace ops {
namespace {

namespace d = detail;
using gpu::compute_t;
using gpu::kThreads;
using gpu::kVec;
using gpu::VecT;

constexpr int64_t kWarpRowMax = 1024;
constexpr int kWarps = kThreads / 32;

template <typename C>
struct Range {
  C mn, mx;
  __device__ __forceinline__ void add(C v) {
    mn = d::token_min(mn, v);
    mx = d::token_max(mx, v);
  }
};

template <typename C>
__device__ __forceinline__ Range<C> empty_range() {
  return {std::numeric_limits<C>::infinity(), -std::numeric_limits<C>::infinity()};
}

/// The range of the elements [first, n) of row xr stepping by `stride` (in elements, or in
/// groups of kVec elements when vec).
template <typename T, typename C = compute_t<T>>
__device__ __forceinline__ Range<C> thread_range(const T* xr, int64_t n, int64_t first,
                                                 int64_t stride, bool vec) {
  Range<C> r = empty_range<C>();
  if (vec) {
    const auto* v4 = reinterpret_cast<const VecT<T>*>(xr);
    for (int64_t k = first; k < n / kVec; k += stride) {
      const VecT<T> v = v4[k];
#pragma unroll
      for (int e = 0; e < kVec; ++e) r.add(static_cast<C>(v.v[e]));
    }
  } else {
    for (int64_t i = first; i < n; i += stride) r.add(static_cast<C>(xr[i]));
  }
  return r;
}

template <typename T, typename C = compute_t<T>>
__device__ __forceinline__ void quantize_elements(const T* xr, T* yr, int64_t n, int64_t first,
                                                  int64_t stride, bool vec,
                                                  const d::TokenQParams& q,
                                                  const d::TokenRule& rule) {
  if (vec) {
    const auto* x4 = reinterpret_cast<const VecT<T>*>(xr);
    auto* y4 = reinterpret_cast<VecT<T>*>(yr);
    for (int64_t k = first; k < n / kVec; k += stride) {
      const VecT<T> v = x4[k];
      VecT<T> o;
#pragma unroll
      for (int e = 0; e < kVec; ++e) {
        o.v[e] = static_cast<T>(d::token_fake_quant<C>(static_cast<C>(v.v[e]), q, rule));
      }
      y4[k] = o;
    }
  } else {
    for (int64_t i = first; i < n; i += stride) {
      yr[i] = static_cast<T>(d::token_fake_quant<C>(static_cast<C>(xr[i]), q, rule));
    }
  }
}

// One warp per row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    per_token_warp_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t n,
                          bool vec, d::TokenRule rule) {
  using C = compute_t<T>;
  const int lane = threadIdx.x % 32;
  const int64_t step = int64_t(gridDim.x) * kWarps;
  for (int64_t r = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32; r < rows; r += step) {
    const T* xr = x + r * n;
    Range<C> range = thread_range<T>(xr, n, lane, 32, vec);
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
      range.add(__shfl_xor_sync(0xffffffffu, range.mn, off));
      range.add(__shfl_xor_sync(0xffffffffu, range.mx, off));
    }
    const auto q = d::token_qparams(static_cast<float>(range.mn), static_cast<float>(range.mx),
                                    rule);
    quantize_elements<T>(xr, out + r * n, n, lane, 32, vec, q, rule);
  }
}

template <typename C>
struct CombineRange {
  __device__ __forceinline__ Range<C> operator()(const Range<C>& a, const Range<C>& b) const {
    Range<C> r = a;
    r.add(b.mn);
    r.add(b.mx);
    return r;
  }
};

// One block per row.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    per_token_block_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t n,
                           bool vec, d::TokenRule rule) {
  using C = compute_t<T>;
  using BlockReduce = cub::BlockReduce<Range<C>, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  __shared__ d::TokenQParams shared_q;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + r * n;
    const Range<C> mine = thread_range<T>(xr, n, threadIdx.x, kThreads, vec);
    const Range<C> range = BlockReduce(temp).Reduce(mine, CombineRange<C>{});
    if (threadIdx.x == 0) {
      shared_q = d::token_qparams(static_cast<float>(range.mn), static_cast<float>(range.mx),
                                  rule);
    }
    __syncthreads();
    const d::TokenQParams q = shared_q;
    quantize_elements<T>(xr, out + r * n, n, threadIdx.x, kThreads, vec, q, rule);
    __syncthreads();  // temp and shared_q are reused by the next row
  }
}

at::Tensor per_token_cuda(const at::Tensor& x, int64_t quant_min, int64_t quant_max,
                          bool symmetric, c10::string_view format) {
  const char* op = "fake_quantize_per_token";
  const auto guard = gpu::device_guard(op, x);
  const auto config = d::per_token_config(x, quant_min, quant_max, symmetric, format, op);
  const auto xc = x.contiguous();
  auto out = at::empty(xc.sizes(), xc.options());
  if (xc.numel() == 0) return out;
  const int64_t n = xc.size(-1);
  const int64_t rows = xc.numel() / n;
  const auto rule = d::token_rule(config);
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t cap = int64_t(gpu::resident_blocks()) * 4;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, xc.scalar_type(),
                                  "mqbench_fake_quantize_per_token_cuda", [&] {
    const auto* xp = xc.data_ptr<scalar_t>();
    auto* yp = out.data_ptr<scalar_t>();
    const size_t vbytes = sizeof(VecT<scalar_t>);
    const bool vec = n % kVec == 0 && gpu::aligned_for_vec(xp, vbytes) &&
                     gpu::aligned_for_vec(yp, vbytes);
    if (n <= kWarpRowMax) {
      const int64_t blocks = std::min<int64_t>((rows + kWarps - 1) / kWarps, cap);
      per_token_warp_kernel<scalar_t><<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
          xp, yp, rows, n, vec, rule);
    } else {
      const int64_t blocks = std::min<int64_t>(rows, cap);
      per_token_block_kernel<scalar_t>
          <<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(xp, yp, rows, n, vec, rule);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("fake_quantize_per_token", TORCH_FN(per_token_cuda));
}

}  // namespace ops
}  // namespace mqbench
