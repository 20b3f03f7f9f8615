// SignRound's weight quantizer (Cheng et al. 2023; python/mqbench/llm/signround.py), forward and
// backward, fused: the learned offset V of each weight and the range factors lo, hi of each
// group, for weights laid out [rows, groups, k]:
//   mn = min(w_min * lo, 0),  mx = max(w_max * hi, 0)            (w_min, w_max: the group's)
//   affine:    s = max((mx - mn) / (qmax - qmin), eps),
//              z = clamp(qmin - round(mn / s), qmin, qmax)
//   symmetric: s = max(max(-mn, mx) / ((qmax - qmin) / 2), eps),  z = 0
//   Q = (clamp(round(w * (1 / s) + v) + z, qmin, qmax) - z) * s
// As ATen ops this is a dozen element-wise passes over the weight forward and as many backward,
// every step of the search: on all-MiniLM-L6-v2 they took more than half of SignRound's time,
// more than the block's matrix products. Here one pass each on the CPU (raw loops, built with
// -ffp-contract=off, the ATen op sequence of the Python reference, so the forward gives the same
// bits); other devices run the same formulas as ATen ops.
//
// Note [SignRound's backward]
// Every rounding passes its gradient straight through; every clamp passes it where its input
// lies within the bounds, bounds included (torch's clamp backward). With G = dL/dQ, per element
// u = round(w / s + v) + z and in = qmin <= u <= qmax:
//   dL/dv = in ? G s : 0
//   dL/ds = sum_k G (q - z) - (1 / s)^2 sum_k (in ? G s : 0) w        (Q = (q - z) s, w * (1 / s))
//   dL/dz = sum_k (in ? 0 : -G s)
// then through z (affine: z_in = the clamp of z passes, d(mn / s) = -z_in dL/dz, which adds
// d(mn / s) / s to dL/dmn and -d(mn / s) mn / s^2 to dL/ds), through s's clamp (s_in), and its
// range: affine dL/dmx = s_in dL/ds / (qmax - qmin), dL/dmn -= the same; symmetric, to the larger
// of -mn and mx (half each on a tie, as torch.maximum's backward), over (qmax - qmin) / 2; and
// dL/dlo = (w_min lo <= 0) dL/dmn w_min, dL/dhi = (w_max hi >= 0) dL/dmx w_max. This is the
// gradient autograd takes through the Python reference (python/mqbench/llm/signround.py,
// ``_Rounding.weight``), which the tests hold it to.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <limits>
#include <tuple>

#include "mqbench/ops/llm.h"
#include "ops/common/op_handle.h"

namespace mqbench {
namespace ops {
namespace {

constexpr const char* kForward = "signround_quantize";
constexpr const char* kBackward = "signround_quantize_backward";

struct Grid {
  double qmin, qmax;
  bool symmetric;
};

// nearbyint (half to even) without a libm call, so the loops stay inline and vectorize on any
// x86-64: below 2^22 in magnitude, adding and subtracting 1.5 * 2^23 rounds to an integer in the
// current (nearest-even) mode; the sign is copied back so -0.3 gives -0.0 as nearbyint does.
// From 2^22 on t is kept as it is: every level there is outside the clamp of any integer grid
// this op takes (|z| <= 2^16), so the clamped level and the clamp's mask are nearbyint's.
inline float round_half_even(float t) {
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  const float r = std::copysign((t + kMagic) - kMagic, t);
  return std::fabs(t) < 4194304.0f ? r : t;
}

void check_inputs(const char* op, const at::Tensor& w, const at::Tensor& v, const at::Tensor& lo,
                  const at::Tensor& hi, const at::Tensor& w_min, const at::Tensor& w_max,
                  int64_t quant_min, int64_t quant_max) {
  TORCH_CHECK(quant_min < quant_max, op, ": quant_min (", quant_min, ") must be < quant_max (",
              quant_max, ")");
  TORCH_CHECK(quant_min >= -65536 && quant_max <= 65536, op, ": the grid [", quant_min, ", ",
              quant_max, "] must lie within [-2^16, 2^16]");
  TORCH_CHECK(w.dim() == 3, op, ": w must be [rows, groups, k], got ", w.sizes());
  TORCH_CHECK(v.sizes() == w.sizes(), op, ": v must have w's shape ", w.sizes(), ", got ",
              v.sizes());
  const auto groups = w.sizes().slice(0, 2);
  for (const auto* t : {&lo, &hi, &w_min, &w_max}) {
    TORCH_CHECK(t->sizes() == groups, op, ": lo, hi, w_min and w_max must be [rows, groups] ",
                groups, ", got ", t->sizes());
  }
  for (const auto* t : {&w, &v, &lo, &hi, &w_min, &w_max}) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, op, ": every input must be float32, got ",
                t->scalar_type());
    TORCH_CHECK(t->device() == w.device(), op, ": every input must be on ", w.device(),
                ", got ", t->device());
  }
}

// The level before the clamp, u = round(w * (1 / s) + v) + z: the reference's op sequence.
inline float level(float w, float v, float inv, float z) {
  return round_half_even(w * inv + v) + z;
}

struct QParams {
  at::Tensor mn, mx, scale, zero, inv;  // [rows, groups]
};

// The Python reference's op sequence (``_Rounding._qparams``), rounding included.
QParams group_qparams(const at::Tensor& lo, const at::Tensor& hi, const at::Tensor& w_min,
                      const at::Tensor& w_max, const Grid& g) {
  const double eps = std::numeric_limits<float>::epsilon();
  QParams p;
  p.mn = at::clamp_max(w_min * lo, 0.0);
  p.mx = at::clamp_min(w_max * hi, 0.0);
  if (g.symmetric) {
    p.scale = at::clamp_min(at::maximum(-p.mn, p.mx) / ((g.qmax - g.qmin) / 2.0), eps);
    p.zero = at::zeros_like(p.scale);
  } else {
    p.scale = at::clamp_min((p.mx - p.mn) / (g.qmax - g.qmin), eps);
    p.zero = at::clamp(g.qmin - at::round(p.mn / p.scale), g.qmin, g.qmax);
  }
  p.inv = at::reciprocal(p.scale);  // Python's 1.0 / s is s.reciprocal() * 1.0
  return p;
}

at::Tensor expand_k(const at::Tensor& t) { return t.unsqueeze(-1); }

// ---------------------------------------------------------------- forward

at::Tensor forward_cpu(const at::Tensor& w, const at::Tensor& v, const QParams& p,
                       const Grid& g) {
  auto wc = w.contiguous(), vc = v.contiguous();
  auto s = p.scale.contiguous(), z = p.zero.contiguous(), inv = p.inv.contiguous();
  auto out = at::empty_like(wc);
  const int64_t n_groups = w.size(0) * w.size(1), k = w.size(2);
  const float* wp = wc.data_ptr<float>();
  const float* vp = vc.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const float* zp = z.data_ptr<float>();
  const float* ip = inv.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float qmin = static_cast<float>(g.qmin), qmax = static_cast<float>(g.qmax);
  at::parallel_for(0, n_groups, std::max<int64_t>(1, 32768 / std::max<int64_t>(k, 1)),
                   [&](int64_t g0, int64_t g1) {
    for (int64_t gi = g0; gi < g1; ++gi) {
      const float sc = sp[gi], zc = zp[gi], ic = ip[gi];
      for (int64_t j = gi * k; j < (gi + 1) * k; ++j) {
        const float q = std::min(std::max(level(wp[j], vp[j], ic, zc), qmin), qmax);
        op[j] = (q - zc) * sc;  // vectorizes: selects only (-fno-trapping-math)
      }
    }
  });
  return out;
}

// ``level`` as ATen ops, for the devices other than the CPU.
at::Tensor levels_aten(const at::Tensor& w, const at::Tensor& v, const QParams& p) {
  return at::round(w * expand_k(p.inv) + v) + expand_k(p.zero);
}

at::Tensor forward_aten(const at::Tensor& w, const at::Tensor& v, const QParams& p,
                        const Grid& g) {
  const auto q = at::clamp(levels_aten(w, v, p), g.qmin, g.qmax);
  return (q - expand_k(p.zero)) * expand_k(p.scale);
}

at::Tensor quantize_impl(const at::Tensor& w, const at::Tensor& v, const at::Tensor& lo,
                         const at::Tensor& hi, const at::Tensor& w_min, const at::Tensor& w_max,
                         int64_t quant_min, int64_t quant_max, bool symmetric) {
  check_inputs(kForward, w, v, lo, hi, w_min, w_max, quant_min, quant_max);
  const Grid g{static_cast<double>(quant_min), static_cast<double>(quant_max), symmetric};
  const auto p = group_qparams(lo.detach(), hi.detach(), w_min, w_max, g);
  return w.device().is_cpu() ? forward_cpu(w.detach(), v.detach(), p, g)
                             : forward_aten(w.detach(), v.detach(), p, g);
}

// ---------------------------------------------------------------- backward

struct Sums {
  at::Tensor gv;                   // [rows, groups, k]
  at::Tensor d_scale, d_inv, d_z;  // [rows, groups]: the sums of Note [SignRound's backward]
};

// One group's part of Note [SignRound's backward]: dL/dv per element, and the three sums, each
// in kLanes partial sums (lane l takes the elements e = l mod kLanes) so the loop runs on vector
// registers without reassociating a sum; the lanes are added at the end.
constexpr int kLanes = 8;

void backward_group(const float* __restrict G, const float* __restrict w,
                    const float* __restrict v, float* __restrict gv, int64_t k, float s, float z,
                    float inv, float qmin, float qmax, float* sums) {
  float sum_s[kLanes] = {}, sum_inv[kLanes] = {}, sum_z[kLanes] = {};
  const int64_t full = k - k % kLanes;
  for (int64_t e0 = 0; e0 < full; e0 += kLanes) {
    float u[kLanes], q[kLanes], gs[kLanes], g_in[kLanes];
    for (int l = 0; l < kLanes; ++l) u[l] = level(w[e0 + l], v[e0 + l], inv, z);
    for (int l = 0; l < kLanes; ++l) q[l] = std::min(std::max(u[l], qmin), qmax);
    for (int l = 0; l < kLanes; ++l) gs[l] = G[e0 + l] * s;
    for (int l = 0; l < kLanes; ++l) g_in[l] = q[l] == u[l] ? gs[l] : 0.0f;
    for (int l = 0; l < kLanes; ++l) gv[e0 + l] = g_in[l];
    for (int l = 0; l < kLanes; ++l) sum_s[l] += G[e0 + l] * (q[l] - z);
    for (int l = 0; l < kLanes; ++l) sum_inv[l] += g_in[l] * w[e0 + l];
    for (int l = 0; l < kLanes; ++l) sum_z[l] += g_in[l] - gs[l];  // in ? 0 : -G s
  }
  for (int64_t e = full; e < k; ++e) {
    const float u = level(w[e], v[e], inv, z);
    const float q = std::min(std::max(u, qmin), qmax);
    const float gs = G[e] * s;
    const float g_in = q == u ? gs : 0.0f;  // u within the bounds (NaN: out)
    gv[e] = g_in;
    sum_s[0] += G[e] * (q - z);
    sum_inv[0] += g_in * w[e];
    sum_z[0] += g_in - gs;
  }
  double total[3] = {0.0, 0.0, 0.0};
  for (int l = 0; l < kLanes; ++l) {
    total[0] += sum_s[l];
    total[1] += sum_inv[l];
    total[2] += sum_z[l];
  }
  for (int i = 0; i < 3; ++i) sums[i] = static_cast<float>(total[i]);
}

Sums backward_sums_cpu(const at::Tensor& grad, const at::Tensor& w, const at::Tensor& v,
                       const QParams& p, const Grid& g) {
  auto gc = grad.contiguous(), wc = w.contiguous(), vc = v.contiguous();
  auto s = p.scale.contiguous(), z = p.zero.contiguous(), inv = p.inv.contiguous();
  Sums r;
  r.gv = at::empty_like(wc);
  r.d_scale = at::empty_like(s);
  r.d_inv = at::empty_like(s);
  r.d_z = at::empty_like(s);
  const int64_t n_groups = w.size(0) * w.size(1), k = w.size(2);
  const float* Gp = gc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  const float* vp = vc.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const float* zp = z.data_ptr<float>();
  const float* ip = inv.data_ptr<float>();
  float* gvp = r.gv.data_ptr<float>();
  float* dsp = r.d_scale.data_ptr<float>();
  float* dip = r.d_inv.data_ptr<float>();
  float* dzp = r.d_z.data_ptr<float>();
  const float qmin = static_cast<float>(g.qmin), qmax = static_cast<float>(g.qmax);
  at::parallel_for(0, n_groups, std::max<int64_t>(1, 32768 / std::max<int64_t>(k, 1)),
                   [&](int64_t g0, int64_t g1) {
    for (int64_t gi = g0; gi < g1; ++gi) {
      float sums[3];
      backward_group(Gp + gi * k, wp + gi * k, vp + gi * k, gvp + gi * k, k, sp[gi], zp[gi],
                     ip[gi], qmin, qmax, sums);
      dsp[gi] = sums[0];
      dip[gi] = sums[1];
      dzp[gi] = sums[2];
    }
  });
  return r;
}

Sums backward_sums_aten(const at::Tensor& grad, const at::Tensor& w, const at::Tensor& v,
                        const QParams& p, const Grid& g) {
  const auto z = expand_k(p.zero);
  const auto u = levels_aten(w, v, p);
  const auto in = at::logical_and(u >= g.qmin, u <= g.qmax);
  const auto q = at::clamp(u, g.qmin, g.qmax);
  const auto gs = grad * expand_k(p.scale);
  Sums r;
  r.gv = at::where(in, gs, at::zeros_like(gs));
  r.d_scale = (grad * (q - z)).sum(-1);
  r.d_inv = (r.gv * w).sum(-1);
  r.d_z = at::where(in, at::zeros_like(gs), -gs).sum(-1);
  return r;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_backward_impl(
    const at::Tensor& grad, const at::Tensor& w, const at::Tensor& v, const at::Tensor& lo,
    const at::Tensor& hi, const at::Tensor& w_min, const at::Tensor& w_max, int64_t quant_min,
    int64_t quant_max, bool symmetric) {
  check_inputs(kBackward, w, v, lo, hi, w_min, w_max, quant_min, quant_max);
  TORCH_CHECK(grad.sizes() == w.sizes() && grad.scalar_type() == at::kFloat &&
                  grad.device() == w.device(),
              kBackward, ": grad must be float32 of w's shape ", w.sizes(), " on ", w.device(),
              ", got ", grad.scalar_type(), " ", grad.sizes(), " on ", grad.device());
  const Grid g{static_cast<double>(quant_min), static_cast<double>(quant_max), symmetric};
  const auto lo_d = lo.detach(), hi_d = hi.detach();
  const auto p = group_qparams(lo_d, hi_d, w_min, w_max, g);
  const auto sums = w.device().is_cpu() ? backward_sums_cpu(grad, w.detach(), v.detach(), p, g)
                                        : backward_sums_aten(grad, w.detach(), v.detach(), p, g);
  // Note [SignRound's backward]: through 1 / s, z, the clamp of s and the range
  auto d_scale = sums.d_scale - sums.d_inv * (p.inv * p.inv);
  auto d_mn = at::zeros_like(p.mn);
  auto d_mx = at::zeros_like(p.mx);
  const double eps = std::numeric_limits<float>::epsilon();
  const double levels = g.qmax - g.qmin;
  if (g.symmetric) {
    const auto m = at::maximum(-p.mn, p.mx);
    const auto s_in = (m / (levels / 2.0)) >= eps;
    const auto d_m = at::where(s_in, d_scale / (levels / 2.0), at::zeros_like(d_scale));
    const auto tie = (-p.mn) == p.mx;
    const auto share = at::where(tie, d_m / 2.0, d_m);
    d_mn = -at::where((-p.mn) < p.mx, at::zeros_like(share), share);
    d_mx = at::where(p.mx < (-p.mn), at::zeros_like(share), share);
  } else {
    const auto ratio = p.mn / p.scale;
    const auto level = g.qmin - at::round(ratio);
    const auto z_in = at::logical_and(level >= g.qmin, level <= g.qmax);
    const auto d_ratio = at::where(z_in, -sums.d_z, at::zeros_like(sums.d_z));
    d_scale = d_scale - d_ratio * p.mn / (p.scale * p.scale);
    const auto s_in = ((p.mx - p.mn) / levels) >= eps;
    const auto d_range = at::where(s_in, d_scale / levels, at::zeros_like(d_scale));
    d_mx = d_range;
    d_mn = d_ratio / p.scale - d_range;
  }
  const auto mn_in = (w_min * lo_d) <= 0.0;
  const auto mx_in = (w_max * hi_d) >= 0.0;
  auto d_lo = at::where(mn_in, d_mn * w_min, at::zeros_like(d_mn));
  auto d_hi = at::where(mx_in, d_mx * w_max, at::zeros_like(d_mx));
  return {sums.gv, d_lo, d_hi};
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(mqbench, m) {
  m.def("signround_quantize(Tensor w, Tensor v, Tensor lo, Tensor hi, Tensor w_min, "
        "Tensor w_max, int quant_min, int quant_max, bool symmetric) -> Tensor");
  m.def("signround_quantize_backward(Tensor grad, Tensor w, Tensor v, Tensor lo, Tensor hi, "
        "Tensor w_min, Tensor w_max, int quant_min, int quant_max, bool symmetric) -> "
        "(Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(mqbench, CompositeImplicitAutograd, m) {
  m.impl("signround_quantize", TORCH_FN(quantize_impl));
  m.impl("signround_quantize_backward", TORCH_FN(quantize_backward_impl));
}

at::Tensor signround_quantize(const at::Tensor& w, const at::Tensor& v, const at::Tensor& lo,
                              const at::Tensor& hi, const at::Tensor& w_min,
                              const at::Tensor& w_max, int64_t quant_min, int64_t quant_max,
                              bool symmetric) {
  static auto op =
      detail::op_handle<decltype(signround_quantize)>("mqbench::signround_quantize");
  return op.call(w, v, lo, hi, w_min, w_max, quant_min, quant_max, symmetric);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> signround_quantize_backward(
    const at::Tensor& grad, const at::Tensor& w, const at::Tensor& v, const at::Tensor& lo,
    const at::Tensor& hi, const at::Tensor& w_min, const at::Tensor& w_max, int64_t quant_min,
    int64_t quant_max, bool symmetric) {
  static auto op = detail::op_handle<decltype(signround_quantize_backward)>(
      "mqbench::signround_quantize_backward");
  return op.call(grad, w, v, lo, hi, w_min, w_max, quant_min, quant_max, symmetric);
}

}  // namespace ops
}  // namespace mqbench
