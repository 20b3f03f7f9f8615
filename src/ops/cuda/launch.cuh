#pragma once
// Launch machinery shared by every CUDA kernel of mqbench (src/ops/cuda/*.cu).
//
// Note [CUDA dense layout]
// A kernel works on a dense view of its input: a tensor that is non-overlapping and dense (any
// memory format, channels_last included) keeps its strides; anything else (a slice, an expanded
// tensor) is copied contiguous first (`dense`). Strides are never negative, so such a tensor
// covers the memory offsets [0, n) from data_ptr(), and outputs made with at::empty_like keep the
// same strides: out[i] belongs to x[i] for every offset i. In memory order the elements form
// [outer, channels, inner] with channels = x.size(axis) and inner = x.stride(axis), so the
// channel of offset i is (i / inner) % channels (Layout, ChannelMap*). Per tensor is
// channels = 1, inner = n.
//
// Note [CUDA reductions]
// Sums over every axis but the channel one (LSQ's d_scale / d_zero_point, TQT's and PACT's
// parameter gradients, observer statistics, BN folding) are fused with the elementwise pass that
// needs the same loads, and are deterministic: the first kernel writes one partial accumulator
// per tile to a workspace, a second kernel combines each channel's partials in a fixed order
// (one block per channel). Two tilings of [outer, channels, inner]:
//   * rows: a tile is a chunk of up to kRowChunk elements of one row (one outer index, one
//     channel); a block reduces it with cub::BlockReduce. Per-tensor tensors, weights, NCHW
//     activations with large feature maps;
//   * columns (inner < kRowChunk / 8 with enough rows, or inner < 32): the tensor as a matrix [outer,
//     channels * inner]; each thread owns one column of a group of rows and accumulates it in
//     registers, so small inner sizes (channels_last: inner = 1; 7x7 feature maps) still read
//     coalesced. A partial per (row group, column).
// Accumulators are per-thread registers of the op's Acc type (doubles for sums, as the CPU
// kernels' ChannelAccumulators).
//
// Compiled with --fmad=false (CMakeLists.txt): x * inv + z must round twice, as on the CPU, for
// the kernels to agree with the CPU kernels bit for bit.

#include <ATen/core/Tensor.h>
#include <ATen/cuda/detail/IntegerDivider.cuh>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace mqbench {
namespace ops {
namespace gpu {

constexpr int kThreads = 256;
constexpr int kVec = 4;               // elements per thread per step of the elementwise kernels
constexpr int64_t kRowChunk = 2048;   // elements per row tile (8 per thread)
constexpr int kColWidth = 32;         // columns per block in the column tiling
constexpr int kColRows = kThreads / kColWidth;

/// The type the kernels compute in: double for double, float otherwise (half, bfloat16).
template <typename T>
using compute_t = std::conditional_t<std::is_same<T, double>::value, double, float>;

/// The number of blocks that keeps every SM of the current device busy (cached per device).
inline int resident_blocks() {
  static std::atomic<int> cache[64];
  int device = 0;
  C10_CUDA_CHECK(cudaGetDevice(&device));
  if (device < 0 || device >= 64) device = 63;
  int v = cache[device].load(std::memory_order_relaxed);
  if (v == 0) {
    int sms = 0, per_sm = 0;
    C10_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    C10_CUDA_CHECK(
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
    v = std::max(1, sms * std::max(1, per_sm / kThreads));
    cache[device].store(v, std::memory_order_relaxed);
  }
  return v;
}

/// Checks that every tensor argument is on x's device and that it is a CUDA device (the CUDA
/// kernel is also chosen when x is on the CPU and another argument on CUDA), then makes x's
/// device current for the op's allocations and launches.
inline c10::cuda::CUDAGuard device_guard(
    const char* op, const at::Tensor& x,
    std::initializer_list<std::pair<at::Tensor, const char*>> others = {}) {
  TORCH_CHECK(x.defined(), op, ": x is an undefined tensor");
  for (const auto& o : others) {
    TORCH_CHECK(!o.first.defined() || o.first.device() == x.device(), op, ": ", o.second,
                " is on ", o.first.device(), " but x is on ", x.device(),
                "; move them to the same device");
  }
  TORCH_CHECK(x.is_cuda(), op, ": x is on ", x.device(),
              " but another argument is on a CUDA device; move them to the same device");
  return c10::cuda::CUDAGuard(x.device());
}

// ---- layout --------------------------------------------------------------------------------

struct Layout {
  int64_t n = 0;
  int64_t channels = 1;
  int64_t inner = 0;
  int64_t outer() const { return channels * inner == 0 ? 0 : n / (channels * inner); }
};

/// x itself when non-overlapping and dense, else a copy dense in x's suggested memory format (as
/// the CPU ops' outputs; Note [CUDA dense layout]).
inline at::Tensor dense(const at::Tensor& x) {
  return x.is_non_overlapping_and_dense() ? x : x.contiguous(x.suggest_memory_format());
}

/// `t` with exactly the strides of the dense tensor `like` (same sizes): itself or a copy.
inline at::Tensor with_strides_of(const at::Tensor& t, const at::Tensor& like) {
  if (t.strides() == like.strides()) return t;
  auto out = at::empty_like(like);
  out.copy_(t);
  return out;
}

/// The layout of a dense tensor for a per-channel axis (already wrapped), or per tensor.
inline Layout layout_of(const at::Tensor& x, c10::optional<int64_t> axis) {
  Layout l;
  l.n = x.numel();
  if (axis && x.size(*axis) != 1) {  // 0 channels: an empty per-channel layout
    l.channels = x.size(*axis);
    l.inner = x.stride(*axis);
  } else {
    l.inner = l.n;
  }
  return l;
}

struct PerTensorMap {
  __device__ __forceinline__ int64_t operator()(int64_t) const { return 0; }
};

struct ChannelMap32 {
  at::cuda::detail::IntDivider<unsigned int> inner, channels;
  __device__ __forceinline__ int64_t operator()(int64_t i) const {
    return channels.mod(inner.div(static_cast<unsigned int>(i)));
  }
};

struct ChannelMap64 {
  int64_t inner, channels;
  __device__ __forceinline__ int64_t operator()(int64_t i) const { return (i / inner) % channels; }
};

/// Calls f(map) with the cheapest channel map valid for the layout.
template <typename F>
void with_channel_map(const Layout& l, const F& f) {
  if (l.channels == 1) {
    f(PerTensorMap{});
  } else if (l.n <= std::numeric_limits<int32_t>::max()) {
    f(ChannelMap32{at::cuda::detail::IntDivider<unsigned int>(static_cast<unsigned int>(l.inner)),
                   at::cuda::detail::IntDivider<unsigned int>(
                       static_cast<unsigned int>(l.channels))});
  } else {
    f(ChannelMap64{l.inner, l.channels});
  }
}

// ---- elementwise -------------------------------------------------------------------------------

template <typename T>
struct alignas(sizeof(T) * kVec) VecT {
  T v[kVec];
};

/// out[i] = op(x[i], p) (kInputs == 1) or op(a[i], b[i], p) (kInputs == 2), with p =
/// op.params(channel of i), in compute_t<T>. `vec`: every pointer is aligned for VecT.
template <int kInputs, typename T, typename Op, typename Map>
__global__ void __launch_bounds__(kThreads)
    map_kernel(Op op, Map map, int64_t n, const T* __restrict__ a, const T* __restrict__ b,
               T* __restrict__ out, bool vec) {
  using C = compute_t<T>;
  int64_t last_c = -1;
  typename Op::Params p{};
  auto at_channel = [&](int64_t i) -> const typename Op::Params& {
    const int64_t c = map(i);
    if (c != last_c) {
      p = op.params(c);
      last_c = c;
    }
    return p;
  };
  auto apply = [&](T va, T vb, int64_t i) -> T {
    if constexpr (kInputs == 1) {
      return static_cast<T>(op(static_cast<C>(va), at_channel(i)));
    } else {
      return static_cast<T>(op(static_cast<C>(va), static_cast<C>(vb), at_channel(i)));
    }
  };
  const int64_t step = int64_t(gridDim.x) * blockDim.x * kVec;
  for (int64_t base = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; base < n;
       base += step) {
    if (vec && base + kVec <= n) {
      const auto va = *reinterpret_cast<const VecT<T>*>(a + base);
      VecT<T> vb{};
      if constexpr (kInputs == 2) vb = *reinterpret_cast<const VecT<T>*>(b + base);
      VecT<T> r;
#pragma unroll
      for (int k = 0; k < kVec; ++k) r.v[k] = apply(va.v[k], vb.v[k], base + k);
      *reinterpret_cast<VecT<T>*>(out + base) = r;
    } else {
      for (int64_t i = base; i < n && i < base + kVec; ++i) {
        out[i] = apply(a[i], kInputs == 2 ? b[i] : T(0), i);
      }
    }
  }
}

inline bool aligned_for_vec(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

/// Launches map_kernel over a dense layout on the current stream.
template <int kInputs, typename T, typename Op>
void launch_map(const Op& op, const Layout& l, const T* a, const T* b, T* out) {
  if (l.n == 0) return;
  const size_t vbytes = sizeof(VecT<T>);
  const bool vec = aligned_for_vec(a, vbytes) && aligned_for_vec(out, vbytes) &&
                   (kInputs == 1 || aligned_for_vec(b, vbytes));
  const int64_t per_block = int64_t(kThreads) * kVec;
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>((l.n + per_block - 1) / per_block, int64_t(resident_blocks()) * 8));
  auto stream = c10::cuda::getCurrentCUDAStream();
  with_channel_map(l, [&](auto map) {
    map_kernel<kInputs, T, Op, decltype(map)>
        <<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(op, map, l.n, a, b, out, vec);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

/// op(i, op.params(channel of i)) for every offset i: for ops with more than two operands, which
/// load and store through their own pointers.
template <typename Op, typename Map>
__global__ void __launch_bounds__(kThreads) index_map_kernel(Op op, Map map, int64_t n) {
  int64_t last_c = -1;
  typename Op::Params p{};
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const int64_t c = map(i);
    if (c != last_c) {
      p = op.params(c);
      last_c = c;
    }
    op(i, p);
  }
}

template <typename Op>
void launch_index_map(const Op& op, const Layout& l) {
  if (l.n == 0) return;
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>((l.n + kThreads - 1) / kThreads, int64_t(resident_blocks()) * 8));
  auto stream = c10::cuda::getCurrentCUDAStream();
  with_channel_map(l, [&](auto map) {
    index_map_kernel<Op, decltype(map)>
        <<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(op, map, l.n);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
}

// ---- per-channel reductions ------------------------------------------------------------------------

template <typename Acc>
struct Combine {
  __device__ __forceinline__ Acc operator()(const Acc& x, const Acc& y) const {
    Acc r = x;
    r.combine(y);
    return r;
  }
};

/// Row tiling: tile t = (row, chunk); `chunks` tiles per row of `inner` elements.
template <typename Op, typename Acc>
__global__ void __launch_bounds__(kThreads)
    reduce_rows_kernel(Op op, int64_t channels, int64_t inner, int64_t chunks, int64_t tiles,
                       Acc* __restrict__ partial) {
  using BlockReduce = cub::BlockReduce<Acc, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row = t / chunks;
    const int64_t chunk = t - row * chunks;
    const int64_t c = row % channels;
    const auto p = op.params(c);
    const int64_t begin = row * inner + chunk * kRowChunk;
    const int64_t rest = inner - chunk * kRowChunk;
    const int64_t len = rest < kRowChunk ? rest : kRowChunk;
    Acc acc{};
    for (int64_t e = threadIdx.x; e < len; e += kThreads) op(begin + e, p, acc);
    const Acc total = BlockReduce(temp).Reduce(acc, Combine<Acc>{});
    if (threadIdx.x == 0) partial[t] = total;
    __syncthreads();  // temp is reused by the next tile
  }
}

/// Column tiling: the tensor as [outer, width = channels * inner]; block (x, y) owns kColWidth
/// columns and the row group y (rows y*kColRows + ty, stepping by groups * kColRows).
template <typename Op, typename Acc>
__global__ void __launch_bounds__(kThreads)
    reduce_columns_kernel(Op op, int64_t outer, int64_t width, int64_t inner, int64_t groups,
                          Acc* __restrict__ partial) {
  __shared__ Acc rows[kColRows][kColWidth];
  const int tx = threadIdx.x % kColWidth, ty = threadIdx.x / kColWidth;
  const int64_t col = int64_t(blockIdx.x) * kColWidth + tx;
  Acc acc{};
  if (col < width) {
    const auto p = op.params(col / inner);
    for (int64_t r = int64_t(blockIdx.y) * kColRows + ty; r < outer; r += groups * kColRows) {
      op(r * width + col, p, acc);
    }
  }
  rows[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && col < width) {
    for (int k = 1; k < kColRows; ++k) acc.combine(rows[k][tx]);
    partial[int64_t(blockIdx.y) * width + col] = acc;
  }
}

/// Combines channel c's `count` partials, item m at (m / group) * stride_outer + c * stride_c +
/// m % group, and calls fin(c, total).
template <typename Acc, typename Fin>
__global__ void __launch_bounds__(kThreads)
    reduce_finish_kernel(const Acc* __restrict__ partial, int64_t channels, int64_t count,
                         int64_t group, int64_t stride_outer, int64_t stride_c, Fin fin) {
  using BlockReduce = cub::BlockReduce<Acc, kThreads>;
  __shared__ typename BlockReduce::TempStorage temp;
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    Acc acc{};
    for (int64_t m = threadIdx.x; m < count; m += kThreads) {
      const int64_t g = m / group;
      acc.combine(partial[g * stride_outer + c * stride_c + (m - g * group)]);
    }
    const Acc total = BlockReduce(temp).Reduce(acc, Combine<Acc>{});
    if (threadIdx.x == 0) fin(c, total);
    __syncthreads();
  }
}

/// For every element i of the dense layout: op(i, op.params(channel of i), acc); then per
/// channel c: fin(c, sum of the accumulators of c's elements). Acc: default-constructed is the
/// identity, acc.combine(other) merges (Note [CUDA reductions]). Runs fin for every channel,
/// with the identity when the tensor is empty.
template <typename Acc, typename Op, typename Fin>
void launch_reduce(const Op& op, const Layout& l, const at::Tensor& like, const Fin& fin) {
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t channels = l.channels;
  const int64_t outer = l.outer();
  const int64_t max_blocks = int64_t(resident_blocks()) * 4;
  int64_t count = 0, group = 1, stride_outer = 0, stride_c = 0;
  at::Tensor workspace;
  auto alloc = [&](int64_t items) {
    workspace = at::empty({std::max<int64_t>(items, 1) * int64_t(sizeof(Acc))},
                          like.options().dtype(at::kByte));
    return reinterpret_cast<Acc*>(workspace.data_ptr());
  };
  Acc* partial = nullptr;
  if (l.n == 0) {
    partial = alloc(0);
  } else if (l.inner * 8 < kRowChunk && (outer >= 4 * kColRows || l.inner < kColWidth)) {
    const int64_t width = channels * l.inner;
    const int64_t col_blocks = (width + kColWidth - 1) / kColWidth;
    const int64_t groups = std::max<int64_t>(
        1, std::min<int64_t>({(outer + kColRows - 1) / kColRows,
                              std::max<int64_t>(1, max_blocks / col_blocks), 65535}));
    partial = alloc(groups * width);
    TORCH_CHECK(col_blocks <= std::numeric_limits<int32_t>::max(),
                "mqbench: tensor too wide for the column reduction");
    const dim3 grid(static_cast<unsigned int>(col_blocks), static_cast<unsigned int>(groups));
    reduce_columns_kernel<Op, Acc><<<grid, kThreads, 0, stream>>>(op, outer, width, l.inner,
                                                                   groups, partial);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    count = groups * l.inner;
    group = l.inner;
    stride_outer = width;
    stride_c = l.inner;
  } else {
    const int64_t chunks = (l.inner + kRowChunk - 1) / kRowChunk;
    const int64_t tiles = outer * channels * chunks;
    partial = alloc(tiles);
    const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(tiles, max_blocks * 2));
    reduce_rows_kernel<Op, Acc><<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
        op, channels, l.inner, chunks, tiles, partial);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    count = outer * chunks;
    group = chunks;
    stride_outer = channels * chunks;
    stride_c = chunks;
  }
  const int64_t blocks = std::max<int64_t>(1, std::min<int64_t>(channels, 65535));
  reduce_finish_kernel<Acc, Fin><<<static_cast<unsigned int>(blocks), kThreads, 0, stream>>>(
      partial, channels, count, group, stride_outer, stride_c, fin);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

/// Accumulator of two double sums (parameter gradients).
struct Sum2 {
  double a = 0, b = 0;
  __device__ __forceinline__ void combine(const Sum2& o) {
    a += o.a;
    b += o.b;
  }
};

/// Writes channel sums into two double device arrays (either may be null).
struct StoreSum2 {
  double* a;
  double* b;
  __device__ __forceinline__ void operator()(int64_t c, const Sum2& s) const {
    if (a != nullptr) a[c] = s.a;
    if (b != nullptr) b[c] = s.b;
  }
};

// ---- tensor helpers --------------------------------------------------------------------------

/// A one-element parameter (PACT's alpha, NNIE's data_max) for a device kernel: checked by its
/// metadata only (reading its value would synchronise) and returned as a float64 device tensor.
inline at::Tensor device_scalar_param(const at::Tensor& x, const at::Tensor& p, const char* name,
                                      const char* op) {
  TORCH_CHECK(p.defined(), op, ": ", name, " is an undefined tensor");
  TORCH_CHECK(p.device() == x.device(), op, ": ", name, " is on ", p.device(), " but x is on ",
              x.device(), "; move them to the same device");
  TORCH_CHECK(at::isFloatingType(p.scalar_type()), op, ": ", name,
              " must be a floating-point tensor, got dtype ", p.scalar_type());
  TORCH_CHECK(p.numel() == 1, op, ": ", name, " must have exactly one element, got ", p.numel());
  return p.detach().reshape({1}).to(at::kDouble).contiguous();
}

/// A [channels] float64 device buffer for StoreSum2.
inline at::Tensor sum_buffer(int64_t channels, const at::Tensor& like) {
  return at::empty({channels}, like.options().dtype(at::kDouble));
}

/// Double sums as a tensor shaped and typed like `like` (a parameter), on its device; an integer
/// parameter gets float sums (autograd ignores them), as detail::sums_like on the CPU.
inline at::Tensor sums_as(const at::Tensor& sums, const at::Tensor& like) {
  const auto dtype = at::isFloatingType(like.scalar_type()) ? like.scalar_type() : at::kFloat;
  return sums.to(dtype).view(like.sizes());
}

}  // namespace gpu
}  // namespace ops
}  // namespace mqbench
