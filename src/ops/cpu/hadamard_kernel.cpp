// The CPU kernel of hadamard_transform (Note [Hadamard transform] in
// ops/common/hadamard_formula.h). Rows run in parallel; each row is converted once into a buffer
// of the compute type that stays in cache (n floats), transformed there, mixed with `had` and
// scaled on the way out, so x is read once and out written once. The stages below a register's
// width run inside each register as the row is loaded (AVX2: lane permutes and blends; the
// baseline copy: scalars); the stages from a register's width on work on whole registers, two
// per pass over the buffer (radix 4: the same butterflies, half the passes). Every path performs
// the butterflies' own additions and subtractions, so all agree bit for bit. Compiled once per
// CPU capability (Note [CPU capability dispatch]).

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "ops/common/hadamard_formula.h"
#include "ops/cpu/hadamard_kernel.h"
#include "ops/cpu/row_convert.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

namespace d = ::mqbench::ops::detail;
using row::compute_t;

// Elements handed to one task of at::parallel_for (whole rows: at least one).
constexpr int64_t kGrainElements = 32768;

/// The stages h < kW of a group of kW consecutive elements (kW a power of two, the vector
/// width), unrolled.
template <typename C, int64_t kW>
inline void small_stages(C* g) {
  for (int64_t h = 1; h < kW; h *= 2) {
    for (int64_t j = 0; j < kW; j += 2 * h) {
      for (int64_t k = j; k < j + h; ++k) d::hadamard_butterfly(g[k], g[k + h]);
    }
  }
}

#if defined(CPU_CAPABILITY_AVX2)
// The stages h < kW inside one register: each stage adds the partner lane (lane j ^ h, brought
// by a permute) where bit h of j is clear (a + b) and subtracts the lane from its partner where
// it is set (a - b): the butterflies' very operations, on whole registers.
inline at::vec::Vectorized<float> register_stages(const at::vec::Vectorized<float>& v) {
  __m256 x = v;
  __m256 s = _mm256_permute_ps(x, 0xB1);  // h = 1: lanes 1 0 3 2 ...
  x = _mm256_blend_ps(_mm256_add_ps(x, s), _mm256_sub_ps(s, x), 0xAA);
  s = _mm256_permute_ps(x, 0x4E);  // h = 2: lanes 2 3 0 1 ...
  x = _mm256_blend_ps(_mm256_add_ps(x, s), _mm256_sub_ps(s, x), 0xCC);
  s = _mm256_permute2f128_ps(x, x, 1);  // h = 4: the two halves swapped
  x = _mm256_blend_ps(_mm256_add_ps(x, s), _mm256_sub_ps(s, x), 0xF0);
  return x;
}
inline at::vec::Vectorized<double> register_stages(const at::vec::Vectorized<double>& v) {
  __m256d x = v;
  __m256d s = _mm256_permute_pd(x, 0x5);  // h = 1
  x = _mm256_blend_pd(_mm256_add_pd(x, s), _mm256_sub_pd(s, x), 0xA);
  s = _mm256_permute2f128_pd(x, x, 1);  // h = 2
  x = _mm256_blend_pd(_mm256_add_pd(x, s), _mm256_sub_pd(s, x), 0xC);
  return x;
}
#else
template <typename C>
inline at::vec::Vectorized<C> register_stages(const at::vec::Vectorized<C>& v) {
  using V = at::vec::Vectorized<C>;
  alignas(64) C g[V::size()];
  v.store(g);
  small_stages<C, V::size()>(g);
  return V::loadu(g);
}
#endif

/// The stages h >= kW of the transform of v[0, p) (p a power of two, at least kW), in place.
template <typename C>
void vector_stages(C* v, int64_t p) {
  using V = at::vec::Vectorized<C>;
  constexpr int64_t kW = V::size();
  int64_t h = kW;
  // stages h and 2h in one pass: (k, k+h), (k+2h, k+3h), then (k, k+2h), (k+h, k+3h)
  for (; 4 * h <= p; h *= 4) {
    for (int64_t j = 0; j < p; j += 4 * h) {
      for (int64_t k = j; k < j + h; k += kW) {
        V a = V::loadu(v + k), b = V::loadu(v + k + h);
        V c = V::loadu(v + k + 2 * h), e = V::loadu(v + k + 3 * h);
        d::hadamard_butterfly(a, b);
        d::hadamard_butterfly(c, e);
        d::hadamard_butterfly(a, c);
        d::hadamard_butterfly(b, e);
        a.store(v + k);
        b.store(v + k + h);
        c.store(v + k + 2 * h);
        e.store(v + k + 3 * h);
      }
    }
  }
  if (h < p) {  // one stage left
    for (int64_t j = 0; j < p; j += 2 * h) {
      for (int64_t k = j; k < j + h; k += kW) {
        V a = V::loadu(v + k), b = V::loadu(v + k + h);
        d::hadamard_butterfly(a, b);
        a.store(v + k);
        b.store(v + k + h);
      }
    }
  }
}

/// z = the transforms of the m segments of p elements of the row x (converted to C).
template <typename T>
void transform_row(const T* x, compute_t<T>* z, int64_t m, int64_t p) {
  using C = compute_t<T>;
  constexpr int64_t kW = row::width<T>();
  const int64_t n = m * p;
  if (p >= kW) {  // the stages below a register's width as the row is loaded
    for (int64_t i = 0; i < n; i += kW) register_stages(row::load(x + i)).store(z + i);
    for (int64_t s = 0; s < m; ++s) vector_stages(z + s * p, p);
    return;
  }
  for (int64_t i = 0; i < n; ++i) z[i] = static_cast<C>(x[i]);
  for (int64_t s = 0; s < m; ++s) {
    C* v = z + s * p;
    for (int64_t h = 1; h < p; h *= 2) {
      for (int64_t j = 0; j < p; j += 2 * h) {
        for (int64_t k = j; k < j + h; ++k) d::hadamard_butterfly(v[k], v[k + h]);
      }
    }
  }
}

template <typename T>
void hadamard_rows(const T* x, const compute_t<T>* had, compute_t<T> scale, T* out, int64_t rows,
                   int64_t m, int64_t p) {
  using C = compute_t<T>;
  using V = at::vec::Vectorized<C>;
  constexpr int64_t kW = V::size();
  const int64_t n = m * p;
  const int64_t grain = std::max<int64_t>(1, kGrainElements / n);
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<C> z(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x + r * n;
      T* yr = out + r * n;
      transform_row(xr, z.data(), m, p);
      if (had == nullptr) {
        const V sv(scale);
        int64_t i = 0;
        for (; i + kW <= n; i += kW) row::store(yr + i, V::loadu(z.data() + i) * sv);
        for (; i < n; ++i) yr[i] = static_cast<T>(z[i] * scale);
        continue;
      }
      // y[a][j] = scale * sum_b had[a][b] z[b][j], summed in the order b = 0, 1, ..., m - 1
      for (int64_t a = 0; a < m; ++a) {
        const C* ha = had + a * m;
        T* ya = yr + a * p;
        int64_t j = 0;
        for (; j + kW <= p; j += kW) {
          V acc = V(ha[0]) * V::loadu(z.data() + j);
          for (int64_t b = 1; b < m; ++b) acc = acc + V(ha[b]) * V::loadu(z.data() + b * p + j);
          row::store(ya + j, acc * V(scale));
        }
        for (; j < p; ++j) {
          C acc = ha[0] * z[j];
          for (int64_t b = 1; b < m; ++b) acc = acc + ha[b] * z[b * p + j];
          ya[j] = static_cast<T>(acc * scale);
        }
      }
    }
  });
}

void hadamard_kernel(const at::Tensor& x, const at::Tensor& had, double scale, at::Tensor& out,
                     int64_t m, int64_t p) {
  const int64_t n = m * p;
  const int64_t rows = n == 0 ? 0 : x.numel() / n;
  if (rows == 0) return;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(),
                                  "mqbench_hadamard_transform", [&] {
    using C = compute_t<scalar_t>;
    hadamard_rows<scalar_t>(x.const_data_ptr<scalar_t>(),
                            had.defined() ? had.const_data_ptr<C>() : nullptr,
                            static_cast<C>(scale), out.data_ptr<scalar_t>(), rows, m, p);
  });
}

}  // namespace

MQBENCH_REGISTER_STUB(hadamard_stub, hadamard_kernel);

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
