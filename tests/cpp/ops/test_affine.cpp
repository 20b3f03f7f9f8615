// C++ API tests of the affine ops against the spec's formula (bit for bit), torch's built-in
// fake-quant ops (within 1e-6) and through autograd. The Python suite covers the same ops more
// widely; these prove that a C++ application gets the same kernels (mqbench/ops/fake_quantize_ops.h).

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "mqbench/config.h"
#include "mqbench/ops/fake_quantize_ops.h"

namespace {

// The spec's formula (docs/ops.md, Note [Zero point modes]) element by element, in T:
// inv = float32(1 / s); q = nearbyint(x * inv) + z; out = (clamp(q, qmin, qmax) - z) * s.
template <typename T>
torch::Tensor affine_reference(const torch::Tensor& x, float s, int64_t z, int64_t qmin,
                               int64_t qmax) {
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  const T inv = static_cast<T>(1.0f / s), zt = static_cast<T>(z), st = static_cast<T>(s);
  const T* in = xc.data_ptr<T>();
  T* o = out.data_ptr<T>();
  for (int64_t i = 0; i < xc.numel(); ++i) {
    const T q = std::nearbyint(in[i] * inv) + zt;
    o[i] = (std::min(std::max(q, static_cast<T>(qmin)), static_cast<T>(qmax)) - zt) * st;
  }
  return out;
}

TEST(AffineOps, PerTensorMatchesTheFormulaBitForBitAndTorchClosely) {
  torch::manual_seed(0);
  for (auto dtype : {torch::kFloat, torch::kDouble}) {
    auto x = torch::randn({4, 8, 33}, dtype) * 3;
    for (auto [qmin, qmax, zp] : {std::tuple<int64_t, int64_t, int64_t>{-128, 127, 0},
                                  {0, 255, 37}, {0, 15, 3}, {-127, 127, 0}}) {
      const float s = 0.0173f;
      auto out = mqbench::ops::fake_quantize_per_tensor_affine(
          x, torch::tensor({s}, torch::kFloat), torch::tensor({zp}, torch::kInt), qmin, qmax);
      auto ref = dtype == torch::kFloat ? affine_reference<float>(x, s, zp, qmin, qmax)
                                        : affine_reference<double>(x, s, zp, qmin, qmax);
      EXPECT_TRUE(torch::equal(out, ref)) << "dtype " << dtype << " range " << qmin << ".." << qmax;
      // torch's kernel: its float64 rounding moved across releases (tests/python/reference.py).
      auto theirs = torch::fake_quantize_per_tensor_affine(x, s, zp, qmin, qmax);
      EXPECT_TRUE(torch::allclose(out, theirs, /*rtol=*/1e-6, /*atol=*/1e-6))
          << "dtype " << dtype << " range " << qmin << ".." << qmax;
    }
  }
}

TEST(AffineOps, PerChannelMatchesTorchOnStridedInput) {
  torch::manual_seed(1);
  auto base = torch::randn({6, 5, 7}) * 2;
  auto x = base.transpose(0, 2);  // non-contiguous: exercises the strided path
  auto scale = torch::rand({5}) * 0.05 + 0.01;
  auto zp = torch::randint(0, 20, {5}, torch::kInt);
  auto ref = torch::fake_quantize_per_channel_affine(x, scale, zp, 1, 0, 255);
  auto out = mqbench::ops::fake_quantize_per_channel_affine(x, scale, zp, 1, 0, 255);
  EXPECT_TRUE(torch::equal(out, ref));
}

TEST(AffineOps, LearnableGradientsMatchTorch) {
  torch::manual_seed(2);
  auto x = (torch::randn({3, 4, 10}) * 2).requires_grad_();
  auto s = torch::tensor({0.05f}).requires_grad_();
  auto z = torch::tensor({3.f}).requires_grad_();
  auto dy = torch::randn({3, 4, 10});
  const double g = 0.25;
  auto y = mqbench::ops::fake_quantize_learnable_per_tensor_affine(x, s, z, 0, 63, g);
  auto grads = torch::autograd::grad({y}, {x, s, z}, {dy});

  auto x2 = x.detach().clone().requires_grad_();
  auto s2 = s.detach().clone().requires_grad_();
  auto z2 = z.detach().clone().requires_grad_();
  auto y2 = torch::_fake_quantize_learnable_per_tensor_affine(x2, s2, z2, 0, 63, g);
  auto ref = torch::autograd::grad({y2}, {x2, s2, z2}, {dy});

  EXPECT_TRUE(torch::equal(y, y2));
  EXPECT_TRUE(torch::equal(grads[0], ref[0]));
  EXPECT_TRUE(torch::allclose(grads[1], ref[1], 1e-4, 1e-6));
  EXPECT_TRUE(torch::allclose(grads[2], ref[2], 1e-4, 1e-6));
}

TEST(AffineOps, BadInputRaisesNamedErrors) {
  auto x = torch::randn({2, 3});
  auto z = torch::zeros({1}, torch::kInt);
  try {
    mqbench::ops::fake_quantize_per_tensor_affine(x, torch::tensor({-1.f}), z, 0, 255);
    FAIL() << "negative scale accepted";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what()).find("scale must be positive and finite, got scale[0] = -1"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(
      mqbench::ops::fake_quantize_per_channel_affine(x, torch::ones({3}), torch::zeros({3}), 2,
                                                     0, 255),
      c10::Error);
}

TEST(AffineOps, ReportsCapability) {
  const std::string cap = mqbench::cpu_capability();
  EXPECT_TRUE(cap == "avx2" || cap == "default") << cap;
}

}  // namespace
