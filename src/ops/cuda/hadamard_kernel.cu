// CUDA kernels of hadamard_transform (Note [Hadamard transform] in
// ops/common/hadamard_formula.h), registered under the CUDA dispatch key of the schema in
// ops/hadamard_transform.cpp. The same operations as the CPU kernel, in the same order, each
// rounded once (--fmad=false), so the two agree bit for bit:
//   * fwht_shared_kernel: a block loads a tile of 32 KiB of the compute type (8192 floats) into
//     shared memory, runs every butterfly stage h < chunk = min(p, tile) of each chunk there,
//     and writes the tile back: scaled and in x's dtype when that finishes the op (no had,
//     p <= tile), else in the compute type to a workspace;
//   * fwht_stage_kernel: one stage h >= chunk (p above the tile) on the workspace in global
//     memory, one thread per butterfly;
//   * hadamard_mix_kernel: the product with had along the m axis (or nothing) and the scale,
//     from the workspace to the output in x's dtype.
// float16 / bfloat16 load as float32 and compute in float32; float64 in float64.

#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <algorithm>

#include "ops/common/hadamard_formula.h"
#include "ops/cuda/launch.cuh"

namespace mqbench {
namespace ops {
namespace {

namespace d = detail;
using gpu::compute_t;
using gpu::kThreads;

constexpr int64_t kTileBytes = 32 * 1024;

template <typename T, typename C, typename O>
__global__ void __launch_bounds__(kThreads)
    fwht_shared_kernel(const T* __restrict__ x, O* __restrict__ out, int64_t total, int64_t tile,
                       int log_chunk, C scale) {
  extern __shared__ __align__(16) unsigned char shared_raw[];
  C* s = reinterpret_cast<C*>(shared_raw);
  for (int64_t base = int64_t(blockIdx.x) * tile; base < total;
       base += int64_t(gridDim.x) * tile) {
    const int64_t len = total - base < tile ? total - base : tile;  // whole chunks
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) s[i] = static_cast<C>(x[base + i]);
    __syncthreads();
    for (int lh = 0; lh < log_chunk; ++lh) {
      const int64_t h = int64_t(1) << lh;
      for (int64_t q = threadIdx.x; q < len / 2; q += blockDim.x) {
        const int64_t j = ((q >> lh) << (lh + 1)) | (q & (h - 1));  // bit h of j clear
        d::hadamard_butterfly(s[j], s[j + h]);
      }
      __syncthreads();
    }
    for (int64_t i = threadIdx.x; i < len; i += blockDim.x) {
      out[base + i] = static_cast<O>(s[i] * scale);
    }
    __syncthreads();  // s is reused by the next tile
  }
}

template <typename C>
__global__ void __launch_bounds__(kThreads)
    fwht_stage_kernel(C* __restrict__ v, int64_t pairs, int log_h) {
  const int64_t h = int64_t(1) << log_h;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t q = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; q < pairs; q += step) {
    const int64_t j = ((q >> log_h) << (log_h + 1)) | (q & (h - 1));
    C a = v[j], b = v[j + h];
    d::hadamard_butterfly(a, b);
    v[j] = a;
    v[j + h] = b;
  }
}

// out[r][a][j] = scale * sum_b had[a][b] z[r][b][j], summed in the order b = 0, 1, ..., m - 1
// (the CPU kernel's); out = scale * z without had.
template <typename C, typename T>
__global__ void __launch_bounds__(kThreads)
    hadamard_mix_kernel(const C* __restrict__ z, const C* __restrict__ had, T* __restrict__ out,
                        int64_t total, int64_t m, int64_t p, C scale) {
  const int64_t n = m * p;
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
    if (had == nullptr) {
      out[e] = static_cast<T>(z[e] * scale);
      continue;
    }
    const int64_t r = e / n;
    const int64_t w = e - r * n;
    const int64_t a = w / p;
    const C* zr = z + r * n + (w - a * p);
    const C* ha = had + a * m;
    C acc = ha[0] * zr[0];
    for (int64_t b = 1; b < m; ++b) acc = acc + ha[b] * zr[b * p];
    out[e] = static_cast<T>(acc * scale);
  }
}

int log2_exact(int64_t v) {
  int l = 0;
  while ((int64_t(1) << l) < v) ++l;
  return l;
}

unsigned int grid_for(int64_t items, int64_t per_block, int64_t cap) {
  const int64_t blocks = (items + per_block - 1) / per_block;
  return static_cast<unsigned int>(std::max<int64_t>(1, std::min<int64_t>(blocks, cap)));
}

at::Tensor hadamard_cuda(const at::Tensor& x, const c10::optional<at::Tensor>& had,
                         double scale) {
  const char* op = "hadamard_transform";
  const at::Tensor h = had.has_value() ? *had : at::Tensor();
  const auto guard = gpu::device_guard(op, x, {{h, "had"}});
  const auto a = d::prepare_hadamard(x, had, op);
  auto out = at::empty(a.x.sizes(), a.x.options());
  if (a.rows == 0) return out;
  const int64_t total = a.x.numel();
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t cap = int64_t(gpu::resident_blocks()) * 4;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, a.x.scalar_type(),
                                  "mqbench_hadamard_transform_cuda", [&] {
    using C = compute_t<scalar_t>;
    const int64_t tile = kTileBytes / int64_t(sizeof(C));
    const int64_t chunk = std::min(a.p, tile);
    const int log_chunk = log2_exact(chunk);
    const size_t shared = static_cast<size_t>(tile) * sizeof(C);
    const auto* xp = a.x.data_ptr<scalar_t>();
    if (!a.had.defined() && a.p <= tile) {  // one pass: the output directly
      fwht_shared_kernel<scalar_t, C, scalar_t>
          <<<grid_for(total, tile, cap), kThreads, shared, stream>>>(
              xp, out.data_ptr<scalar_t>(), total, tile, log_chunk, static_cast<C>(scale));
      C10_CUDA_KERNEL_LAUNCH_CHECK();
      return;
    }
    auto work = at::empty({total}, a.x.options().dtype(c10::CppTypeToScalarType<C>::value));
    C* wp = work.data_ptr<C>();
    fwht_shared_kernel<scalar_t, C, C><<<grid_for(total, tile, cap), kThreads, shared, stream>>>(
        xp, wp, total, tile, log_chunk, C(1));  // * 1: exact
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    for (int lh = log_chunk; (int64_t(1) << lh) < a.p; ++lh) {
      fwht_stage_kernel<C><<<grid_for(total / 2, kThreads, cap), kThreads, 0, stream>>>(
          wp, total / 2, lh);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    hadamard_mix_kernel<C, scalar_t><<<grid_for(total, kThreads, cap), kThreads, 0, stream>>>(
        wp, a.had.defined() ? a.had.data_ptr<C>() : nullptr, out.data_ptr<scalar_t>(), total,
        a.m, a.p, static_cast<C>(scale));
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("hadamard_transform", TORCH_FN(hadamard_cuda));
}

}  // namespace ops
}  // namespace mqbench
