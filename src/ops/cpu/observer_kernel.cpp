// Observer kernels (Note [Observer layout] in observer_kernels.h), compiled once per CPU
// capability (Note [CPU capability dispatch]).
//
// channel_stats: per channel, over the finite elements: count, min, max, sum, sum of squares,
// sum of absolute values. Vector lanes accumulate in the data's precision for kFlushEvery
// elements, then flush into double (Note [Qparam iterators] in loops.h explains why that keeps
// about double accuracy).
//
// mse_scores: MQBench's MSEObserver scores each candidate clipping range by running a full
// fake-quantize pass and an Lp loss over the tensor (95 passes per tensor, 80 per channel, each
// with host syncs). Here a cache-sized block of the data is loaded once and every candidate is
// scored on it while it is in L1: one pass over memory for the whole search. Each candidate's
// fake quantization is torch's fixed per-tensor op, q = round(x * inv) + z (half to even),
// out = (clamp(q, qmin, qmax) - z) * s, so the scores equal MQBench's up to summation order.

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "ops/cpu/loops.h"
#include "ops/cpu/observer_kernels.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

constexpr int64_t kChunk = 16384;  // elements per work item
constexpr int64_t kBlock = 1024;   // elements per L1 block of the MSE search

// Calls fn(channel, pointer, n) for every chunk of the [outer, C, inner] layout, in parallel,
// with fn also receiving the thread index for per-thread accumulators.
template <typename T, typename Fn>
void for_each_chunk(const T* data, const Layout& l, const Fn& fn) {
  if (l.inner == 0 || l.outer == 0 || l.channels == 0) return;
  const int64_t per_row = (l.inner + kChunk - 1) / kChunk;
  const int64_t items = l.outer * l.channels * per_row;
  const int64_t chunk_len = std::min(l.inner, kChunk);
  const int64_t grain = std::max<int64_t>(1, kGrainSize / chunk_len);
  at::parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    const int tid = at::get_thread_num();
    for (int64_t it = begin; it < end; ++it) {
      const int64_t row = it / per_row;
      const int64_t part = it % per_row;
      const int64_t c = row % l.channels;
      const int64_t off = part * kChunk;
      const int64_t n = std::min(kChunk, l.inner - off);
      fn(tid, c, data + row * l.inner + off, n);
    }
  });
}

template <typename T>
inline Vec<T> finite_mask(const Vec<T>& x) {
  // x - x is 0 for finite x and NaN for NaN/inf; the comparison yields an all-ones lane mask.
  return (x - x) == Vec<T>(T(0));
}

template <typename T>
void chunk_stats(const T* p, int64_t n, bool moments, ChannelStats& st) {
  using V = Vec<T>;
  constexpr T kInf = std::numeric_limits<T>::infinity();
  const V zero(T(0)), one(T(1)), pinf(kInf), ninf(-kInf);
  V vmin = pinf, vmax = ninf;
  int64_t i = 0;
  while (i + V::size() <= n) {
    V vs = zero, vss = zero, vsa = zero, vc = zero;
    const int64_t stop = std::min(n - (n - i) % V::size(), i + kFlushEvery);
    for (; i < stop; i += V::size()) {
      const V x = V::loadu(p + i);
      const V fin = finite_mask(x);
      vmin = at::vec::minimum(vmin, V::blendv(pinf, x, fin));
      vmax = at::vec::maximum(vmax, V::blendv(ninf, x, fin));
      if (moments) {
        const V xf = V::blendv(zero, x, fin);
        vs = vs + xf;
        vss = vss + xf * xf;
        vsa = vsa + xf.abs();
      }
      vc = vc + V::blendv(zero, one, fin);
    }
    st.count += static_cast<int64_t>(hsum(vc));
    if (moments) {
      st.sum += hsum(vs);
      st.sum_sq += hsum(vss);
      st.sum_abs += hsum(vsa);
    }
  }
  alignas(64) T buf[V::size()];
  vmin.store(buf);
  for (int64_t k = 0; k < V::size(); ++k) st.min = std::min<double>(st.min, buf[k]);
  vmax.store(buf);
  for (int64_t k = 0; k < V::size(); ++k) st.max = std::max<double>(st.max, buf[k]);
  for (; i < n; ++i) {
    const T x = p[i];
    if (!std::isfinite(x)) continue;
    st.count += 1;
    st.min = std::min<double>(st.min, x);
    st.max = std::max<double>(st.max, x);
    if (moments) {
      st.sum += x;
      st.sum_sq += static_cast<double>(x) * x;
      st.sum_abs += std::abs(static_cast<double>(x));
    }
  }
}

template <typename T>
void channel_stats_typed(const T* data, const Layout& l, bool moments, ChannelStats* out) {
  const int threads = at::get_num_threads();
  std::vector<ChannelStats> acc(static_cast<size_t>(threads) * l.channels);
  for_each_chunk(data, l, [&](int tid, int64_t c, const T* p, int64_t n) {
    chunk_stats(p, n, moments, acc[static_cast<size_t>(tid) * l.channels + c]);
  });
  for (int64_t c = 0; c < l.channels; ++c) {
    out[c] = ChannelStats();
    for (int t = 0; t < threads; ++t) out[c].merge(acc[static_cast<size_t>(t) * l.channels + c]);
  }
}

void channel_stats_kernel(const void* data, bool is_double, const Layout& layout, bool moments,
                          ChannelStats* out) {
  if (is_double) {
    channel_stats_typed(static_cast<const double*>(data), layout, moments, out);
  } else {
    channel_stats_typed(static_cast<const float*>(data), layout, moments, out);
  }
}

template <typename T>
inline T lp(T d, double p) {
  return p == 2.0 ? d * d : static_cast<T>(std::pow(std::abs(static_cast<double>(d)), p));
}

// Adds to scores[k] the Lp error of candidate k over p[0, n). Each block is first copied to an
// L1-resident buffer with non-finite elements replaced by 0: a 0 quantizes to exactly 0 under
// every candidate (z is an integer in [qmin, qmax]), so it adds nothing, and the candidates'
// inner loop needs no mask.
template <typename T>
void chunk_mse(const T* p, int64_t n, const Candidate* cands, int64_t num_cands, T lo, T hi,
               double pw, double* scores) {
  using V = Vec<T>;
  const V zero(T(0)), vlo(lo), vhi(hi), vp(static_cast<T>(pw));
  const bool square = pw == 2.0;
  alignas(64) T buf[kBlock];
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t m = std::min(kBlock, n - b);
    const int64_t mv = m - m % V::size();
    for (int64_t i = 0; i < mv; i += V::size()) {
      const V x = V::loadu(p + b + i);
      V::blendv(zero, x, finite_mask(x)).store(buf + i);
    }
    for (int64_t i = mv; i < m; ++i) buf[i] = std::isfinite(p[b + i]) ? p[b + i] : T(0);
    for (int64_t k = 0; k < num_cands; ++k) {
      const T s = static_cast<T>(cands[k].scale), inv = static_cast<T>(cands[k].inv),
              z = static_cast<T>(cands[k].zero_point);
      const V vs(s), vinv(inv), vz(z);
      V a0 = zero, a1 = zero;
      int64_t i = 0;
      for (; i + 2 * V::size() <= mv; i += 2 * V::size()) {
        const V x0 = V::loadu(buf + i), x1 = V::loadu(buf + i + V::size());
        const V d0 = (at::vec::clamp((x0 * vinv).round() + vz, vlo, vhi) - vz) * vs - x0;
        const V d1 = (at::vec::clamp((x1 * vinv).round() + vz, vlo, vhi) - vz) * vs - x1;
        a0 = a0 + (square ? d0 * d0 : d0.abs().pow(vp));
        a1 = a1 + (square ? d1 * d1 : d1.abs().pow(vp));
      }
      for (; i < mv; i += V::size()) {
        const V x = V::loadu(buf + i);
        const V d = (at::vec::clamp((x * vinv).round() + vz, vlo, vhi) - vz) * vs - x;
        a0 = a0 + (square ? d * d : d.abs().pow(vp));
      }
      double sc = hsum(a0 + a1);
      for (int64_t j = mv; j < m; ++j) {
        const T x = buf[j];
        const T q = std::min(std::max(std::nearbyint(x * inv) + z, lo), hi);
        sc += lp<T>((q - z) * s - x, pw);
      }
      scores[k] += sc;
    }
  }
}

template <typename T>
void mse_scores_typed(const T* data, const Layout& l, const Candidate* cands, int64_t num_cands,
                      int64_t qmin, int64_t qmax, double pw, double* out) {
  const int threads = at::get_num_threads();
  const int64_t width = l.channels * num_cands;
  std::vector<double> acc(static_cast<size_t>(threads) * width, 0.0);
  for_each_chunk(data, l, [&](int tid, int64_t c, const T* p, int64_t n) {
    chunk_mse(p, n, cands + c * num_cands, num_cands, static_cast<T>(qmin), static_cast<T>(qmax),
              pw, acc.data() + static_cast<size_t>(tid) * width + c * num_cands);
  });
  for (int64_t j = 0; j < width; ++j) {
    double s = 0;
    for (int t = 0; t < threads; ++t) s += acc[static_cast<size_t>(t) * width + j];
    out[j] = s;
  }
}

void mse_scores_kernel(const void* data, bool is_double, const Layout& layout,
                       const Candidate* candidates, int64_t num_candidates, int64_t quant_min,
                       int64_t quant_max, double p, double* out) {
  if (is_double) {
    mse_scores_typed(static_cast<const double*>(data), layout, candidates, num_candidates,
                     quant_min, quant_max, p, out);
  } else {
    mse_scores_typed(static_cast<const float*>(data), layout, candidates, num_candidates,
                     quant_min, quant_max, p, out);
  }
}

// top_abs: the m largest |x| in one pass, for EMAQuantileObserver (Note [Quantile by selection]
// in cpu/observer_cpu.cpp). Each thread keeps a min-heap of its m largest values; a vector of
// elements is only looked at lane by lane when one of them beats the heap's smallest, which
// after the first few thousand elements almost never happens, so the pass runs at memory speed.
template <typename T>
void top_abs_typed(const T* data, int64_t numel, int64_t m, TopAbs* out) {
  using V = Vec<T>;
  const int threads = at::get_num_threads();
  struct Local {
    std::vector<T> heap;  // min-heap of the thread's largest |x|
    ChannelStats st;
  };
  std::vector<Local> local(threads);
  const Layout l{1, 1, numel};
  for_each_chunk(data, l, [&](int tid, int64_t, const T* p, int64_t n) {
    Local& loc = local[tid];
    chunk_stats(p, n, /*moments=*/false, loc.st);
    auto push = [&](T a) {
      if (static_cast<int64_t>(loc.heap.size()) < m) {
        loc.heap.push_back(a);
        std::push_heap(loc.heap.begin(), loc.heap.end(), std::greater<T>());
      } else if (a > loc.heap.front()) {
        std::pop_heap(loc.heap.begin(), loc.heap.end(), std::greater<T>());
        loc.heap.back() = a;
        std::push_heap(loc.heap.begin(), loc.heap.end(), std::greater<T>());
      }
    };
    const T kInf = std::numeric_limits<T>::infinity();
    int64_t i = 0;
    for (; i + V::size() <= n; i += V::size()) {
      const T bar = static_cast<int64_t>(loc.heap.size()) < m ? T(-1) : loc.heap.front();
      const V a = V::loadu(p + i).abs();
      // NaN compares false; +inf is excluded explicitly.
      const V hit = (a > V(bar)) & (a < V(kInf));
      if (hit.zero_mask() == (1 << V::size()) - 1) continue;  // no lane beats the bar
      for (int64_t k = 0; k < V::size(); ++k) {
        const T v = std::abs(p[i + k]);
        if (v < kInf) push(v);
      }
    }
    for (; i < n; ++i) {
      const T v = std::abs(p[i]);
      if (v < kInf) push(v);
    }
  });
  *out = TopAbs();
  for (const auto& loc : local) {
    out->count += loc.st.count;
    out->min = std::min(out->min, loc.st.min);
    out->max = std::max(out->max, loc.st.max);
    out->values.insert(out->values.end(), loc.heap.begin(), loc.heap.end());
  }
}

void top_abs_kernel(const void* data, bool is_double, int64_t numel, int64_t m, TopAbs* out) {
  if (is_double) {
    top_abs_typed(static_cast<const double*>(data), numel, m, out);
  } else {
    top_abs_typed(static_cast<const float*>(data), numel, m, out);
  }
}

}  // namespace
}  // namespace MQBENCH_CPU_CAPABILITY

MQBENCH_REGISTER_STUB(channel_stats_stub, MQBENCH_CPU_CAPABILITY::channel_stats_kernel);
MQBENCH_REGISTER_STUB(mse_scores_stub, MQBENCH_CPU_CAPABILITY::mse_scores_kernel);
MQBENCH_REGISTER_STUB(top_abs_stub, MQBENCH_CPU_CAPABILITY::top_abs_kernel);

}  // namespace cpu
}  // namespace mqbench
