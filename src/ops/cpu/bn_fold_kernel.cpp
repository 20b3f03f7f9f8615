// BatchNorm folding for QAT in training mode, fused (Note [Fused BN folding] in ops/bn_fold.cpp).
// Compiled once per CPU capability. Channels are spread over threads; within a channel each
// row of `inner` contiguous elements runs through at::vec bodies. Sums are accumulated in the
// data's precision for kFlushEvery elements and flushed into double.

#include <ATen/Parallel.h>

#include <cmath>
#include <utility>

#include "ops/cpu/bn_fold_kernels.h"
#include "ops/cpu/loops.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

using V = Vec<float>;

struct ChannelCoefs {
  float a, c;  // y = x * a + c
};

ChannelCoefs coefs(const FoldParams& p, int64_t ch, double mean_x, double rstd) {
  const double s = p.s[ch];
  const double g = p.gamma ? p.gamma[ch] : 1.0;
  const double be = p.beta ? p.beta[ch] : 0.0;
  // y = g * ((x / s + b) - (mean_x / s + b)) * rstd + be = x * (g rstd / s) + (be - g rstd mean_x / s)
  return {static_cast<float>(g * rstd / s), static_cast<float>(be - g * rstd * mean_x / s)};
}

// Sweeps channel c of the [outer, C, inner] layout and returns two sums. vbody(xv, j) gets the
// vector of x at flat offset j and returns the two per-lane contributions (it may also store);
// sbody(x, j) does the same for one tail element, in double. Lane sums are flushed to double
// every kFlushEvery elements.
template <typename VBody, typename SBody>
std::pair<double, double> sweep(const float* x, const Layout& l, int64_t c, const VBody& vbody,
                                const SBody& sbody) {
  double s1 = 0, s2 = 0;
  for (int64_t n = 0; n < l.outer; ++n) {
    const int64_t off = (n * l.channels + c) * l.inner;
    int64_t i = 0;
    while (i + V::size() <= l.inner) {
      V a1(0.f), a2(0.f);
      const int64_t stop = std::min(l.inner - (l.inner - i) % V::size(), i + kFlushEvery);
      for (; i < stop; i += V::size()) {
        const auto r = vbody(V::loadu(x + off + i), off + i);
        a1 = a1 + r.first;
        a2 = a2 + r.second;
      }
      s1 += hsum(a1);
      s2 += hsum(a2);
    }
    for (; i < l.inner; ++i) {
      const auto r = sbody(x[off + i], off + i);
      s1 += r.first;
      s2 += r.second;
    }
  }
  return {s1, s2};
}

void fwd_kernel(const float* x, float* out, const Layout& l, const FoldParams& p, double* mean_x,
                double* var_x, double* rstd) {
  const int64_t m = l.outer * l.inner;
  at::parallel_for(0, l.channels, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      // Shifted sums (shift = the channel's first element) keep the variance accurate when the
      // mean is large against the spread.
      const float shift = x[c * l.inner];
      const V vshift(shift);
      const auto sums = sweep(
          x, l, c,
          [&](const V& xv, int64_t) {
            const V d = xv - vshift;
            return std::make_pair(d, d * d);
          },
          [&](float xv, int64_t) {
            const double d = static_cast<double>(xv) - shift;
            return std::make_pair(d, d * d);
          });
      const double sum = sums.first, sq = sums.second;
      const double md = m > 0 ? sum / m : 0.0;
      const double var = m > 0 ? std::max(0.0, sq / m - md * md) : 0.0;
      const double s = p.s[c];
      mean_x[c] = shift + md;
      var_x[c] = var;
      rstd[c] = 1.0 / std::sqrt(var / (s * s) + p.eps);
      const auto k = coefs(p, c, mean_x[c], rstd[c]);
      const V va(k.a), vc(k.c), zero(0.f);
      for (int64_t n = 0; n < l.outer; ++n) {
        const float* row = x + (n * l.channels + c) * l.inner;
        float* orow = out + (n * l.channels + c) * l.inner;
        int64_t i = 0;
        for (; i + V::size() <= l.inner; i += V::size()) {
          V y = V::loadu(row + i) * va + vc;
          if (p.relu) y = at::vec::maximum(y, zero);
          y.store(orow + i);
        }
        for (; i < l.inner; ++i) {
          float y = row[i] * k.a + k.c;
          orow[i] = p.relu ? std::max(y, 0.f) : y;
        }
      }
    }
  });
}

void bwd_kernel(const float* dout, const float* x, float* dx, const Layout& l, const FoldParams& p,
                const double* mean_x, const double* rstd, double* d_s, double* d_b,
                double* d_gamma, double* d_beta) {
  const int64_t m = l.outer * l.inner;
  at::parallel_for(0, l.channels, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      const double s = p.s[c];
      const double g = p.gamma ? p.gamma[c] : 1.0;
      const auto k = coefs(p, c, mean_x[c], rstd[c]);
      // zhat = (x - mean_x) * rstd / s
      const float zr = static_cast<float>(rstd[c] / s), zm = static_cast<float>(mean_x[c]);
      const V va(k.a), vc(k.c), vzr(zr), vzm(zm), zero(0.f);
      // dy after the ReLU's mask (y = x * a + c > 0), vector and scalar
      auto vdy_at = [&](const V& xv, int64_t j) {
        const V d = V::loadu(dout + j);
        return p.relu ? V::blendv(zero, d, (xv * va + vc) > zero) : d;
      };
      auto dy_at = [&](float xv, int64_t j) {
        return (p.relu && !(xv * k.a + k.c > 0.f)) ? 0.f : dout[j];
      };
      const auto s1 = sweep(
          x, l, c,
          [&](const V& xv, int64_t j) {
            const V dy = vdy_at(xv, j);
            return std::make_pair(dy, dy * ((xv - vzm) * vzr));
          },
          [&](float xv, int64_t j) {
            const double dy = dy_at(xv, j);
            return std::make_pair(dy, dy * ((xv - zm) * zr));
          });
      const double sdy = s1.first, sdyz = s1.second;
      d_beta[c] = sdy;
      d_gamma[c] = sdyz;
      // dz = g rstd (dy - sdy / m - zhat * sdyz / m);  dx = dz / s
      const double gr = g * rstd[c];
      const float f_dy = static_cast<float>(gr / s), f_p = static_cast<float>(sdy / m),
                  f_q = static_cast<float>(sdyz / m);
      const V vdy(f_dy), vp(f_p), vq(f_q);
      const auto s2 = sweep(
          x, l, c,
          [&](const V& xv, int64_t j) {
            const V t = vdy_at(xv, j) - vp - ((xv - vzm) * vzr) * vq;  // dz / (g rstd)
            (t * vdy).store(dx + j);
            return std::make_pair(t, t * xv);
          },
          [&](float xv, int64_t j) {
            const float t = dy_at(xv, j) - f_p - ((xv - zm) * zr) * f_q;
            dx[j] = t * f_dy;
            return std::make_pair(static_cast<double>(t), static_cast<double>(t) * xv);
          });
      const double sdz = s2.first, sdzx = s2.second;
      // z = x / s + b:  d_b = sum dz;  d_s = sum dz * (-x / s^2)
      d_b[c] = gr * sdz;
      d_s[c] = -gr * sdzx / (s * s);
    }
  });
}

}  // namespace
}  // namespace MQBENCH_CPU_CAPABILITY

MQBENCH_REGISTER_STUB(bn_fold_fwd_stub, MQBENCH_CPU_CAPABILITY::fwd_kernel);
MQBENCH_REGISTER_STUB(bn_fold_bwd_stub, MQBENCH_CPU_CAPABILITY::bwd_kernel);

}  // namespace cpu
}  // namespace mqbench
