// CUDA kernels of the observer range searches (schemas and CPU implementations in
// ops/observer_ops.cpp and cpu/observer_cpu.cpp; formulas in docs/observers.md): the MSE / EMAMSE
// range search, the quantile range and the power-of-two search. Statistics and qparams are in
// observer_kernel.cu.
//
// Everything but observer_pot_exponent (which returns a Python int) stays on the device: the
// candidate ranges, their scores and the selection are kernels, so an observer running inside a
// training step does not synchronise.
//
// Note [Device MSE search]
// MQBench scores each candidate range with a separate pass and a host read (.item()) per
// candidate. Here one pass scores all K candidates of a channel: a block takes a tile of one
// row (one channel), keeps the channel's K candidates in shared memory, loads its elements once
// and loops over the candidates; per-warp sums go to shared memory and one partial per (tile,
// candidate) to a workspace, reduced per channel in a fixed order (deterministic). Scores are
// summed in double per element where the CPU kernel sums float lanes, so two candidates whose
// scores agree to ~1e-7 may be ordered differently on the two devices.

#include <torch/library.h>

#include "ops/common/qparams.h"
#include "ops/cuda/observer_common.cuh"

namespace mqbench {
namespace ops {
namespace {

using namespace observer_cuda;

constexpr int64_t kMaxCandidates = 128;  // observer_mse_range: iters <= 100; pot: range_n
constexpr int kTileRows = 8;             // elements per thread in the scoring kernel

// ---- candidate scoring (MSE search, power-of-two search) --------------------------------------------

struct Candidate {
  double a, b, c;  // affine: scale, inv, zero point; power of two: step
};

/// Affine candidate loss (cpu/observer_kernel.cpp's chunk_mse), in T.
template <typename T>
struct AffineLoss {
  long long qmin, qmax;
  double p;
  __device__ double operator()(T x, const Candidate& k) const {
    const T s = static_cast<T>(k.a), inv = static_cast<T>(k.b), z = static_cast<T>(k.c);
    const T q = dmath::std_min(dmath::std_max(dmath::rint(x * inv) + z, static_cast<T>(qmin)),
                               static_cast<T>(qmax));
    const T d = (q - z) * s - x;
    if (p == 2.0) return static_cast<double>(d * d);
    return static_cast<double>(static_cast<T>(::pow(dmath::abs(static_cast<double>(d)), p)));
  }
};

/// Power-of-two candidate loss (cpu/observer_search.cpp's pot_scores), in T.
template <typename T>
struct PotLoss {
  long long qmin, qmax, mth;
  __device__ double operator()(T v, const Candidate& k) const {
    const T st = static_cast<T>(k.a), lo = static_cast<T>(qmin), hi = static_cast<T>(qmax);
    T r;
    if (mth == 3) {
      r = dmath::std_min(dmath::std_max(dmath::rint(v / st), lo), hi);
    } else {
      const T t = dmath::std_min(dmath::std_max(v / st, lo), hi);
      r = (t < T(0) && t - dmath::floor(t) == T(0.5)) ? dmath::ceil(t) : dmath::rint(t);
    }
    const T d = r * st - v;
    return static_cast<double>(d) * static_cast<double>(d);
  }
};

/// One block per tile (row, chunk of kThreads * kTileRows elements); partial[tile * K + k].
/// `finite_only`: non-finite elements are skipped (pot) instead of scored as 0 (MSE, as the CPU).
template <typename T, typename Loss>
__global__ void __launch_bounds__(gpu::kThreads)
    score_kernel(const T* __restrict__ x, int64_t channels, int64_t inner, int64_t chunks,
                 int64_t tiles, const Candidate* __restrict__ cands, int num_cands, Loss loss,
                 bool finite_only, double* __restrict__ partial) {
  constexpr int kWarps = gpu::kThreads / 32;
  constexpr int64_t kChunk = int64_t(gpu::kThreads) * kTileRows;
  __shared__ Candidate sc[kMaxCandidates];
  __shared__ double warp_sums[kWarps][kMaxCandidates];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t row = t / chunks, chunk = t - row * chunks;
    const int64_t c = row % channels;
    for (int k = threadIdx.x; k < num_cands; k += blockDim.x) sc[k] = cands[c * num_cands + k];
    const int64_t begin = row * inner + chunk * kChunk;
    const int64_t rest = inner - chunk * kChunk;
    const int64_t len = rest < kChunk ? rest : kChunk;
    T v[kTileRows];
    bool use[kTileRows];
#pragma unroll
    for (int e = 0; e < kTileRows; ++e) {
      const int64_t j = threadIdx.x + int64_t(e) * blockDim.x;
      use[e] = j < len;
      v[e] = T(0);
      if (use[e]) {
        const T xv = static_cast<T>(static_cast<gpu::compute_t<T>>(x[begin + j]));
        const bool fin = dmath::isfinite(xv);
        if (finite_only && !fin) use[e] = false;
        v[e] = fin ? xv : T(0);
      }
    }
    __syncthreads();  // candidates loaded
    for (int k = 0; k < num_cands; ++k) {
      double s = 0;
#pragma unroll
      for (int e = 0; e < kTileRows; ++e) {
        if (use[e]) s += loss(v[e], sc[k]);
      }
      for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
      if (lane == 0) warp_sums[warp][k] = s;
    }
    __syncthreads();
    for (int k = threadIdx.x; k < num_cands; k += blockDim.x) {
      double s = 0;
      for (int w = 0; w < kWarps; ++w) s += warp_sums[w][k];
      partial[t * num_cands + k] = s;
    }
    __syncthreads();  // sc and warp_sums are reused by the next tile
  }
}

/// scores[c * K + k] = sum of channel c's partials of candidate k, in tile order.
__global__ void score_finish_kernel(const double* __restrict__ partial, int64_t channels,
                                    int64_t per_channel, int64_t chunks, int num_cands,
                                    double* __restrict__ scores) {
  for (int64_t c = blockIdx.x; c < channels; c += gridDim.x) {
    for (int k = threadIdx.x; k < num_cands; k += blockDim.x) {
      double s = 0;
      for (int64_t m = 0; m < per_channel; ++m) {
        const int64_t o = m / chunks, ch = m - o * chunks;
        s += partial[((o * channels + c) * chunks + ch) * num_cands + k];
      }
      scores[c * num_cands + k] = s;
    }
  }
}

/// Scores [channels, K] (float64, device) of the contiguous [outer, channels, inner] tensor x.
template <typename T, typename Loss>
at::Tensor score_candidates(const at::Tensor& x, const gpu::Layout& l, const Candidate* cands,
                            int num_cands, const Loss& loss, bool finite_only) {
  auto scores = at::zeros({l.channels, num_cands}, x.options().dtype(at::kDouble));
  if (l.n == 0) return scores;
  constexpr int64_t kChunk = int64_t(gpu::kThreads) * kTileRows;
  const int64_t outer = l.outer();
  const int64_t chunks = (l.inner + kChunk - 1) / kChunk;
  const int64_t tiles = outer * l.channels * chunks;
  auto partial = at::empty({tiles * num_cands}, x.options().dtype(at::kDouble));
  auto stream = c10::cuda::getCurrentCUDAStream();
  const int64_t blocks = std::max<int64_t>(
      1, std::min<int64_t>(tiles, int64_t(gpu::resident_blocks()) * 4));
  score_kernel<T, Loss><<<static_cast<unsigned int>(blocks), gpu::kThreads, 0, stream>>>(
      x.data_ptr<T>(), l.channels, l.inner, chunks, tiles, cands, num_cands, loss, finite_only,
      partial.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const int64_t fblocks = std::max<int64_t>(1, std::min<int64_t>(l.channels, 65535));
  score_finish_kernel<<<static_cast<unsigned int>(fblocks), 128, 0, stream>>>(
      partial.data_ptr<double>(), l.channels, outer * chunks, chunks, num_cands,
      scores.data_ptr<double>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return scores;
}

// ---- MSE range search ----------------------------------------------------------------------------

/// MQBench's candidates: the range shrunk by 1% per step, qparams in the observer's dtype Q.
template <typename Q>
__global__ void mse_candidates_kernel(const Stats* __restrict__ st, int64_t channels, int iters,
                                      long long qmin, long long qmax, bool sym, long long sym_zp,
                                      const double* eps, Candidate* __restrict__ out) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= channels * iters) return;
  const int64_t c = i / iters;
  const int k = static_cast<int>(i - c * iters);
  const Q f = static_cast<Q>(1.0 - static_cast<double>(k) * 0.01);
  const Q mn = static_cast<Q>(st[c].min) * f, mx = static_cast<Q>(st[c].max) * f;
  const auto q = detail::observer_qparams<Q>(mn, mx, qmin, qmax, sym, sym_zp,
                                             static_cast<Q>(eps[0]));
  out[i] = {static_cast<double>(q.scale), static_cast<double>(Q(1) / q.scale),
            static_cast<double>(q.zero_point)};
}

/// MQBench's selection: the first candidate whose mean score is below the best so far (from
/// 1e10); the unshrunk range when none is.
template <typename Q, typename T>
__global__ void mse_select_kernel(const Stats* __restrict__ st, const double* __restrict__ scores,
                                  int64_t channels, int iters, T* __restrict__ lo,
                                  T* __restrict__ hi) {
  const int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  double best_min = st[c].min, best_max = st[c].max;
  if (st[c].count > 0) {
    double best = 1e10;
    for (int i = 0; i < iters; ++i) {
      const double score = scores[c * iters + i] / static_cast<double>(st[c].count);
      if (score < best) {
        best = score;
        const Q f = static_cast<Q>(1.0 - i * 0.01);
        best_min = static_cast<double>(static_cast<Q>(st[c].min) * f);
        best_max = static_cast<double>(static_cast<Q>(st[c].max) * f);
      }
    }
  }
  lo[c] = static_cast<T>(best_min);
  hi[c] = static_cast<T>(best_max);
}

std::tuple<at::Tensor, at::Tensor> mse_range_cuda(const at::Tensor& x, int64_t ch_axis,
                                                  int64_t quant_min, int64_t quant_max,
                                                  bool symmetric, int64_t symmetric_zero_point,
                                                  const at::Tensor& eps, double p, int64_t iters) {
  const char* op = "observer_mse_range";
  const auto guard = gpu::device_guard(op, x);
  detail::check_quant_range(quant_min, quant_max, op);
  TORCH_CHECK(quant_min < quant_max, op, ": quant_min (", quant_min, ") must be < quant_max (",
              quant_max, ")");
  TORCH_CHECK(iters >= 1 && iters <= 100, op, ": iters must be in [1, 100] (the range shrinks "
              "by 1% per step), got ", iters);
  TORCH_CHECK(std::isfinite(p) && p > 0, op, ": p must be positive, got ", p);
  const auto v = view_for_observer(x, ch_axis, op, /*contiguous=*/true);
  const auto e = eps_on_device(eps, v.x, op);
  const int64_t channels = v.layout.channels;
  const auto stats = stats_array(v, false);
  const auto* st = reinterpret_cast<const Stats*>(stats.data_ptr());
  auto cands = at::empty({std::max<int64_t>(channels * iters, 1) * int64_t(sizeof(Candidate))},
                         v.x.options().dtype(at::kByte));
  auto* cp = reinterpret_cast<Candidate*>(cands.data_ptr());
  auto stream = c10::cuda::getCurrentCUDAStream();
  const bool is_double = v.x.scalar_type() == at::kDouble;
  const int64_t nc = channels * iters;
  if (nc > 0) {
    const unsigned int blocks = static_cast<unsigned int>((nc + gpu::kThreads - 1) / gpu::kThreads);
    if (is_double) {
      mse_candidates_kernel<double><<<blocks, gpu::kThreads, 0, stream>>>(
          st, channels, static_cast<int>(iters), quant_min, quant_max, symmetric,
          symmetric_zero_point, e.data_ptr<double>(), cp);
    } else {
      mse_candidates_kernel<float><<<blocks, gpu::kThreads, 0, stream>>>(
          st, channels, static_cast<int>(iters), quant_min, quant_max, symmetric,
          symmetric_zero_point, e.data_ptr<double>(), cp);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  auto lo = channel_out(v), hi = channel_out(v);
  // The scoring kernel tiles rows of one channel: per channel, score a channel-first copy (one
  // row per channel) unless the channel axis is already the outer one.
  at::Tensor sx = v.x;
  gpu::Layout sl = v.layout;
  if (v.per_channel && channels > 1 && v.layout.outer() != 1) {
    sx = v.x.movedim(detail::wrap_channel_axis(ch_axis, x, op), 0).contiguous();
    sl.inner = channels == 0 ? 0 : sl.n / channels;
  }
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, v.x.scalar_type(),
                                  "mqbench_observer_mse_cuda", [&] {
    using Q = gpu::compute_t<scalar_t>;
    const auto scores = score_candidates<scalar_t>(
        sx, sl, cp, static_cast<int>(iters),
        AffineLoss<Q>{quant_min, quant_max, p}, /*finite_only=*/false);
    if (channels > 0) {
      const unsigned int blocks =
          static_cast<unsigned int>((channels + gpu::kThreads - 1) / gpu::kThreads);
      mse_select_kernel<Q, scalar_t><<<blocks, gpu::kThreads, 0, stream>>>(
          st, scores.data_ptr<double>(), channels, static_cast<int>(iters),
          lo.data_ptr<scalar_t>(), hi.data_ptr<scalar_t>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  return {lo, hi};
}

// ---- quantile range ------------------------------------------------------------------------------

/// Histogram of the finite |x| <= range over `bins` bins (bin(a) = min(a * bins / range, bins - 1)
/// in Q, a / range * bins where a * bins overflows; range == 0: the middle bin), integer
/// atomics: the counts are exact.
template <typename T, typename Q>
__global__ void abs_histogram_kernel(const T* __restrict__ x, int64_t n,
                                     const Stats* __restrict__ st, int64_t bins,
                                     unsigned long long* __restrict__ hist) {
  if (st->count == 0) return;
  const double range_d = dmath::std_max(-st->min, st->max);
  const Q r = static_cast<Q>(range_d);
  const int64_t step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const Q a = dmath::abs(static_cast<Q>(x[i]));
    if (!(a <= r)) continue;  // NaN, inf
    const int64_t pos = r > Q(0) ? detail::quantile_bin(a, r, bins) : bins / 2;
    atomicAdd(hist + pos, 1ull);
  }
}

template <typename T>
__global__ void quantile_select_kernel(const Stats* __restrict__ st,
                                       const unsigned long long* __restrict__ hist, int64_t bins,
                                       double threshold, T* __restrict__ lo, T* __restrict__ hi) {
  double l = st->min, h = st->max;
  if (st->count > 0) {
    const double range = dmath::std_max(-st->min, st->max);
    const double t = ::ceil(threshold * static_cast<double>(st->count));
    const long long k = t < 1.0 ? 1 : static_cast<long long>(t);
    double clip = range;
    unsigned long long cum = 0;
    for (int64_t i = 0; i < bins; ++i) {
      cum += hist[i];
      if (static_cast<long long>(cum) >= k) {
        clip = (static_cast<double>(i) + 0.5) * (range / static_cast<double>(bins));
        break;
      }
    }
    l = dmath::std_max(l, -clip);
    h = dmath::std_min(h, clip);
  }
  *lo = static_cast<T>(l);
  *hi = static_cast<T>(h);
}

std::tuple<at::Tensor, at::Tensor> quantile_range_cuda(const at::Tensor& x, double threshold,
                                                       int64_t bins) {
  const char* op = "observer_quantile_range";
  const auto guard = gpu::device_guard(op, x);
  TORCH_CHECK_VALUE(bins >= 1 && bins <= kMaxQuantileBins, op, ": bins must be in [1, ",
                    kMaxQuantileBins, "], got ", bins);
  TORCH_CHECK_VALUE(threshold > 0.0 && threshold <= 1.0, op,
                    ": threshold must be in (0, 1], got ", threshold);
  const auto v = view_for_observer(x, -1, op);
  const auto stats = stats_array(v, false);
  const auto* st = reinterpret_cast<const Stats*>(stats.data_ptr());
  auto hist = at::zeros({bins}, v.x.options().dtype(at::kLong));
  auto lo = channel_out(v), hi = channel_out(v);
  auto stream = c10::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, v.x.scalar_type(),
                                  "mqbench_observer_quantile_cuda", [&] {
    using Q = gpu::compute_t<scalar_t>;
    auto* h = reinterpret_cast<unsigned long long*>(hist.data_ptr<int64_t>());
    if (v.layout.n > 0) {
      const int64_t blocks = std::max<int64_t>(
          1, std::min<int64_t>((v.layout.n + gpu::kThreads - 1) / gpu::kThreads,
                               int64_t(gpu::resident_blocks()) * 4));
      abs_histogram_kernel<scalar_t, Q><<<static_cast<unsigned int>(blocks), gpu::kThreads, 0,
                                          stream>>>(v.x.data_ptr<scalar_t>(), v.layout.n, st,
                                                    bins, h);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
    quantile_select_kernel<scalar_t><<<1, 1, 0, stream>>>(st, h, bins, threshold,
                                                          lo.data_ptr<scalar_t>(),
                                                          hi.data_ptr<scalar_t>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  });
  return {lo, hi};
}

// ---- power-of-two search -------------------------------------------------------------------------

int64_t pot_exponent_cuda(const at::Tensor& x, const at::Tensor& min_val,
                          const at::Tensor& max_val, int64_t quant_min, int64_t quant_max,
                          int64_t range_n, int64_t mth) {
  const char* op = "observer_pot_exponent";
  const auto guard = gpu::device_guard(op, x);
  detail::check_quant_range(quant_min, quant_max, op);
  TORCH_CHECK(range_n >= 1 && range_n <= kMaxCandidates, op, ": range_n must be in [1, ",
              kMaxCandidates, "], got ", range_n);
  TORCH_CHECK(mth == 2 || mth == 3, op, ": mth must be 2 or 3, got ", mth);
  TORCH_CHECK(min_val.defined() && max_val.defined() && min_val.numel() == 1 &&
                  max_val.numel() == 1,
              op, ": the power-of-two search is per tensor; min_val and max_val must hold one "
              "element each");
  const auto v = view_for_observer(x, -1, op, /*contiguous=*/true);
  const bool is_double = v.x.scalar_type() == at::kDouble;
  // The result is a Python int: the search reads min/max and its scores on the host.
  const int64_t e0 = detail::pot_start_exponent(min_val.item<double>(), max_val.item<double>(),
                                                quant_min, quant_max, is_double);
  std::vector<Candidate> host(range_n);
  for (int64_t k = 0; k < range_n; ++k) host[k] = {std::ldexp(1.0, -(e0 + k)), 0.0, 0.0};
  auto cands = at::empty({range_n * int64_t(sizeof(Candidate))}, at::kByte);
  std::memcpy(cands.data_ptr(), host.data(), host.size() * sizeof(Candidate));
  cands = cands.to(v.x.device());
  at::Tensor scores;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, v.x.scalar_type(),
                                  "mqbench_observer_pot_cuda", [&] {
    using Q = gpu::compute_t<scalar_t>;
    scores = score_candidates<scalar_t>(v.x, v.layout,
                                        reinterpret_cast<const Candidate*>(cands.data_ptr()),
                                        static_cast<int>(range_n),
                                        PotLoss<Q>{quant_min, quant_max, mth},
                                        /*finite_only=*/true)
                 .cpu();
  });
  return detail::pot_best_exponent(scores.data_ptr<double>(), range_n, e0);
}

}  // namespace

TORCH_LIBRARY_IMPL(mqbench, CUDA, m) {
  m.impl("observer_mse_range", TORCH_FN(mse_range_cuda));
  m.impl("observer_quantile_range", TORCH_FN(quantile_range_cuda));
  m.impl("observer_pot_exponent", TORCH_FN(pot_exponent_cuda));
}

}  // namespace ops
}  // namespace mqbench
