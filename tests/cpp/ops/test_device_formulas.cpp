// The formulas of src/ops/common/*_formula.h are written once and instantiated twice: on
// scalars (what the CUDA kernels and the CPU kernels' scalar loops run) and on
// at::vec::Vectorized registers (what the CPU kernels' vector loops run on contiguous input,
// through ops/cpu/vec_math.h: Note [One formula for scalar, vector and device]). This test
// evaluates the scalar instantiation on the host and compares it with the CPU ops on contiguous
// input, element by element: forward outputs and dx exactly, reduced parameter gradients within
// 1e-6 relative. It catches a vector overload that rounds, clamps or selects differently from
// its scalar twin (half-way ties, NaN, +-inf, the range edges), so the GPU computes what the
// CPU computes on every machine; the CUDA kernels' layout and reductions are checked on a GPU
// by tests/python/*/test_cuda_*.py. NNIE, AdaRound and the observers' qparams run the scalar
// formula on the CPU too, so they need no such check.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>
#include <limits>

#include "mqbench/ops/fake_quantize_ops.h"
#include "ops/common/algorithm_formula.h"

namespace {

using mqbench::ops::detail::AffineScalars;
namespace d = mqbench::ops::detail;

// Random values, exact rounding ties of the scale, the range edges, zeros, NaN and +-inf.
template <typename T>
torch::Tensor probe_values(float scale, int64_t n = 4096) {
  auto dtype = std::is_same<T, double>::value ? torch::kDouble : torch::kFloat;
  torch::Tensor x = torch::randn({n}, dtype) * (60 * scale);
  auto ties = (torch::arange(-300, 300, dtype) + 0.5) * scale;
  auto extra = torch::tensor({0.0, -0.0, std::numeric_limits<double>::infinity(),
                              -std::numeric_limits<double>::infinity(),
                              std::numeric_limits<double>::quiet_NaN(), 1e30, -1e30},
                             dtype);
  return torch::cat({x, ties, extra});
}

template <typename T>
bool same(T a, T b, double rtol) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return a == b || std::abs(static_cast<double>(a) - b) <= rtol * std::abs(static_cast<double>(b));
}

// rtol = 0: bit for bit. Transcendental functions (tanh) differ by an ulp between the CPU op's
// vector path (Sleef) and the C library the formula calls on the host (CUDA's on the device).
template <typename T, typename F>
void expect_elementwise(const torch::Tensor& x, const torch::Tensor& got, const F& formula,
                        const char* what, double rtol = 0.0) {
  const auto xc = x.contiguous();
  const auto gc = got.contiguous();
  int64_t bad = 0;
  for (int64_t i = 0; i < xc.numel(); ++i) {
    const T want = formula(xc.data_ptr<T>()[i], i);
    const T have = gc.data_ptr<T>()[i];
    if (!same(want, have, rtol) && bad++ < 5) {
      ADD_FAILURE() << what << ": x = " << xc.data_ptr<T>()[i] << " formula " << want
                    << " op " << have;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

template <typename T>
void check_affine_and_lsq() {
  torch::manual_seed(1);
  const float s = 0.0173f;
  for (auto [qmin, qmax, zp] : {std::tuple<int64_t, int64_t, float>{-128, 127, 0.f},
                                {0, 255, 37.f}, {0, 15, 3.4f}}) {
    torch::Tensor x = probe_values<T>(s).requires_grad_();
    const torch::Tensor st = torch::tensor({s});
    // Fixed op, integer zero point.
    const torch::Tensor zi = torch::tensor({static_cast<int>(std::nearbyint(zp))}, torch::kInt);
    torch::Tensor out = mqbench::ops::fake_quantize_per_tensor_affine(x, st, zi, qmin, qmax);
    const auto pi = d::affine_scalars<T>(s, std::nearbyint(zp), qmin, qmax);
    expect_elementwise<T>(x.detach(), out.detach(),
                          [&](T v, int64_t) { return d::affine_fake_quant(v, pi); }, "fixed");
    // Fixed op, floating zero point (torch's float-zp formula).
    const torch::Tensor zf = torch::tensor({zp});
    out = mqbench::ops::fake_quantize_per_tensor_affine(x, st, zf, qmin, qmax);
    const auto pf = d::affine_scalars<T>(s, zp, qmin, qmax);
    expect_elementwise<T>(x.detach(), out.detach(),
                          [&](T v, int64_t) { return d::affine_fake_quant<T, true>(v, pf); },
                          "fixed, float zero point");
    torch::Tensor dy = torch::randn_like(x.detach());
    x.mutable_grad() = torch::Tensor();
    out.backward(dy);
    expect_elementwise<T>(x.detach(), x.grad(), [&](T v, int64_t i) {
      return d::affine_in_range<T, true>(v, pf) ? dy.data_ptr<T>()[i] : T(0);
    }, "fixed backward, float zero point");
    // LSQ: forward, dx and the reduced scale / zero-point gradients (a NaN element would make
    // the sums NaN: the probe keeps the infinities and drops the NaN).
    torch::Tensor xl = torch::nan_to_num(x.detach(), 0.0, std::numeric_limits<double>::infinity(),
                                -std::numeric_limits<double>::infinity())
                  .requires_grad_();
    torch::Tensor sl = torch::tensor({s}).requires_grad_();
    torch::Tensor zl = torch::tensor({zp}).requires_grad_();
    const double g = 1.0 / std::sqrt(static_cast<double>(xl.numel()) * qmax);
    out = mqbench::ops::fake_quantize_learnable_per_tensor_affine(xl, sl, zl, qmin, qmax, g);
    const auto pl = d::affine_scalars<T>(s, zp, qmin, qmax, /*round_z=*/true);
    expect_elementwise<T>(xl.detach(), out.detach(),
                          [&](T v, int64_t) { return d::affine_fake_quant(v, pl); }, "lsq");
    out.backward(dy);
    double ds = 0, dz = 0;
    expect_elementwise<T>(xl.detach(), xl.grad(), [&](T v, int64_t i) {
      T a, b;
      const T dx = d::learnable_grad<T>(dy.data_ptr<T>()[i], v, pl,
                                        static_cast<T>(static_cast<float>(g)), a, b);
      ds += a;
      dz += b;
      return dx;
    }, "lsq backward");
    EXPECT_NEAR(sl.grad().item<double>(), ds, 1e-6 * (1 + std::abs(ds)));
    EXPECT_NEAR(zl.grad().item<double>(), dz, 1e-6 * (1 + std::abs(dz)));
  }
}

TEST(DeviceFormulas, AffineAndLsqVectorLoopsMatchTheScalarFormulas) {
  check_affine_and_lsq<float>();
  check_affine_and_lsq<double>();
}

template <typename T>
void check_algorithms() {
  torch::manual_seed(2);
  const float s = 0.05f;
  const int64_t qmin = -8, qmax = 7;
  torch::Tensor x = probe_values<T>(s, 2048).requires_grad_();
  const torch::Tensor xd = x.detach();
  torch::Tensor dy = torch::randn_like(xd);
  const torch::Tensor st = torch::tensor({s}), zt = torch::tensor({0.f});
  // DSQ
  {
    const double alpha = 0.3;
    torch::Tensor out = mqbench::ops::fake_quantize_dsq_per_tensor(x, st, zt, qmin, qmax, alpha);
    const auto p = d::dsq_scalars<T>(s, 0.f, qmin, qmax, alpha);
    expect_elementwise<T>(xd, out.detach(), [&](T v, int64_t) { return d::dsq_forward(v, p); },
                          "dsq");
    out.backward(dy);
    expect_elementwise<T>(xd, x.grad(), [&](T v, int64_t i) {
      return d::dsq_grad(dy.data_ptr<T>()[i], v, p);
    }, "dsq backward", 8 * std::numeric_limits<T>::epsilon());
    x.mutable_grad() = torch::Tensor();
  }
  // TQT, both rounding modes, with the scale gradient.
  for (int64_t mth : {2, 3}) {
    torch::Tensor sg = torch::tensor({0.07f}).requires_grad_();
    torch::Tensor out = mqbench::ops::fake_quantize_tqt(x, sg, zt, qmin, qmax, mth);
    const auto p = d::tqt_scalars<T>(0.07f, 0.f, qmin, qmax);
    expect_elementwise<T>(xd, out.detach(),
                          [&](T v, int64_t) { return d::tqt_forward(v, p, mth); }, "tqt");
    out.backward(dy);
    expect_elementwise<T>(xd, x.grad(), [&](T v, int64_t i) {
      T a;
      return d::tqt_grad(dy.data_ptr<T>()[i], v, p, mth, a);
    }, "tqt backward");
    // The scale gradient over a NaN-free input (a NaN element makes the sum NaN).
    torch::Tensor xn = torch::nan_to_num(xd, 0.0, std::numeric_limits<double>::infinity(),
                                -std::numeric_limits<double>::infinity());
    torch::Tensor sn = torch::tensor({0.07f}).requires_grad_();
    mqbench::ops::fake_quantize_tqt(xn, sn, zt, qmin, qmax, mth).backward(dy);
    double ds = 0;
    for (int64_t i = 0; i < xn.numel(); ++i) {
      T a;
      d::tqt_grad(dy.data_ptr<T>()[i], xn.data_ptr<T>()[i], p, mth, a);
      ds += a;
    }
    EXPECT_NEAR(sn.grad().item<double>(), ds, 1e-6 * (1 + std::abs(ds)));
    x.mutable_grad() = torch::Tensor();
  }
  // PACT with both clip gradients.
  {
    torch::Tensor alpha = torch::tensor({0.3f}).requires_grad_();
    torch::Tensor n_alpha = torch::tensor({-0.2f}).requires_grad_();
    torch::Tensor out = mqbench::ops::fake_quantize_pact(x, alpha, n_alpha, st, zt, qmin, qmax);
    const auto p = d::affine_scalars<T>(s, 0.f, qmin, qmax);
    const T up = static_cast<T>(0.3f), lo = static_cast<T>(-0.2f);
    expect_elementwise<T>(xd, out.detach(),
                          [&](T v, int64_t) { return d::pact_forward(v, lo, up, p); }, "pact");
    out.backward(dy);
    double du = 0, dl = 0;
    expect_elementwise<T>(xd, x.grad(), [&](T v, int64_t i) {
      T a, b;
      const T dx = d::pact_grad(dy.data_ptr<T>()[i], v, lo, up, p, a, b);
      du += a;
      dl += b;
      return dx;
    }, "pact backward");
    EXPECT_NEAR(alpha.grad().item<double>(), du, 1e-6 * (1 + std::abs(du)));
    EXPECT_NEAR(n_alpha.grad().item<double>(), dl, 1e-6 * (1 + std::abs(dl)));
    x.mutable_grad() = torch::Tensor();
  }
}

TEST(DeviceFormulas, AlgorithmVectorLoopsMatchTheScalarFormulas) {
  check_algorithms<float>();
  check_algorithms<double>();
}

}  // namespace
