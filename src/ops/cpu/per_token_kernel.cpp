// The CPU kernel of fake_quantize_per_token (Note [Per-token fake quantization] in
// ops/common/per_token_formula.h). Rows run in parallel; each row is read twice (its min and
// max, then its elements, usually from cache) and written once, on vector registers of the
// compute type with a scalar tail: the formulas of ops/common on Vectorized lanes, which give
// the scalar formula's bits (Note [One formula for scalar, vector and device]). Compiled once per
// CPU capability (Note [CPU capability dispatch]).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <limits>

#include "ops/common/per_token_formula.h"
#include "ops/cpu/per_token_kernel.h"
#include "ops/cpu/row_convert.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

namespace d = ::mqbench::ops::detail;
using row::compute_t;

// Elements handed to one task of at::parallel_for (whole rows: at least one).
constexpr int64_t kGrainElements = 32768;

/// min and max of a row, NaN skipped (+inf and -inf for a row with no number).
template <typename T>
void row_range(const T* x, int64_t n, compute_t<T>& mn, compute_t<T>& mx) {
  using C = compute_t<T>;
  using V = at::vec::Vectorized<C>;
  constexpr int64_t kW = V::size();
  const C inf = std::numeric_limits<C>::infinity();
  mn = inf;
  mx = -inf;
  int64_t i = 0;
  if (n >= kW) {
    V vmin(inf), vmax(-inf);
    for (; i + kW <= n; i += kW) {
      const V v = row::load(x + i);
      vmin = V::blendv(vmin, v, v < vmin);  // a NaN lane compares false: kept out
      vmax = V::blendv(vmax, v, v > vmax);
    }
    alignas(64) C lo[kW], hi[kW];
    vmin.store(lo);
    vmax.store(hi);
    for (int64_t k = 0; k < kW; ++k) {
      mn = d::token_min(mn, lo[k]);
      mx = d::token_max(mx, hi[k]);
    }
  }
  for (; i < n; ++i) {
    const C v = static_cast<C>(x[i]);
    mn = d::token_min(mn, v);
    mx = d::token_max(mx, v);
  }
}

template <typename T>
void quantize_row(const T* x, T* out, int64_t n, const d::TokenQParams& q, const d::TokenRule& r) {
  using C = compute_t<T>;
  using V = at::vec::Vectorized<C>;
  constexpr int64_t kW = V::size();
  int64_t i = 0;
  if (r.c.format == d::TokenFormat::kInt) {
    const auto ps = d::affine_scalars<C>(q.scale, q.zero_point, r.c.quant_min, r.c.quant_max);
    const auto pv = d::broadcast<V>(ps);
    for (; i + kW <= n; i += kW) row::store(out + i, d::affine_fake_quant<V>(row::load(x + i), pv));
  } else if constexpr (std::is_same_v<C, float>) {
    const V sv(q.scale);
    for (; i + kW <= n; i += kW) {
      row::store(out + i, d::fp8_fake_quant(row::load(x + i) / sv, sv, r.fp8));
    }
  }
  // the tail, and float64 FP8 (its float32 rounding of x / s, lane by lane)
  for (; i < n; ++i) out[i] = static_cast<T>(d::token_fake_quant<C>(static_cast<C>(x[i]), q, r));
}

template <typename T>
void per_token_rows(const T* x, T* out, int64_t rows, int64_t n, const d::TokenRule& r) {
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(n, 1));
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      compute_t<T> mn, mx;
      row_range(x + row * n, n, mn, mx);
      const auto q = d::token_qparams(static_cast<float>(mn), static_cast<float>(mx), r);
      quantize_row(x + row * n, out + row * n, n, q, r);
    }
  });
}

void per_token_kernel(const at::Tensor& x, at::Tensor& out, const d::TokenConfig& config) {
  const int64_t n = x.dim() == 0 ? 1 : x.size(-1);
  if (x.numel() == 0) return;
  const int64_t rows = x.numel() / n;
  const auto rule = d::token_rule(config);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(),
                                  "mqbench_fake_quantize_per_token", [&] {
    per_token_rows<scalar_t>(x.const_data_ptr<scalar_t>(), out.data_ptr<scalar_t>(), rows, n,
                             rule);
  });
}

}  // namespace

MQBENCH_REGISTER_STUB(per_token_stub, per_token_kernel);

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
