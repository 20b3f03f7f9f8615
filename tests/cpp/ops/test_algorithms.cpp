// C++ API tests of the algorithm ops (PACT, DoReFa, DSQ, TQT, NNIE, AdaRound, QDrop, pot): each
// checked against a formula written here with plain torch ops, and through autograd.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "mqbench/ops/fake_quantize_ops.h"
#include "mqbench/ops/ptq.h"

namespace {

namespace mo = mqbench::ops;

TEST(AlgorithmOps, PactClipsThenQuantizesAndTrainsAlpha) {
  torch::manual_seed(0);
  auto x = (torch::randn({1000}) * 3).requires_grad_();
  auto alpha = torch::tensor({2.0f}).requires_grad_();
  auto s = torch::tensor({4.0f / 255}), z = torch::tensor({0}, torch::kInt);
  auto y = mo::fake_quantize_pact(x, alpha, -alpha, s, z, -128, 127);
  auto expected = torch::fake_quantize_per_tensor_affine(x.detach().clamp(-2, 2), 4.0 / 255, 0, -128, 127);
  EXPECT_TRUE(torch::equal(y, expected));
  y.sum().backward();
  // d alpha = (#x > alpha) - (#x < -alpha): the upper clip adds, the mirrored lower clip subtracts.
  const auto above = (x.detach() > 2).sum().item<float>();
  const auto below = (x.detach() < -2).sum().item<float>();
  EXPECT_FLOAT_EQ(alpha.grad().item<float>(), above - below);
}

TEST(AlgorithmOps, DoReFaNormalizeBoundsWeights) {
  auto w = torch::randn({8, 4, 3, 3});
  auto n = mo::dorefa_normalize(w);
  auto t = torch::tanh(w);
  EXPECT_TRUE(torch::allclose(n, t / (t.abs().max() + 1e-5)));
  EXPECT_LT(n.abs().max().item<float>(), 1.0f);
}

TEST(AlgorithmOps, DsqIsCloseToHardQuantizationForSmallAlpha) {
  auto x = torch::randn({4096});
  auto s = torch::tensor({0.1f}), z = torch::tensor({0}, torch::kInt);
  auto soft = mo::fake_quantize_dsq_per_tensor(x, s, z, -8, 7, 0.01);
  auto hard = torch::fake_quantize_per_tensor_affine(x, 0.1, 0, -8, 7);
  // DSQ rounds phi, which for a small alpha is within a hair of x/s's own rounding.
  EXPECT_GT(soft.eq(hard).to(torch::kFloat).mean().item<float>(), 0.99f);
}

TEST(AlgorithmOps, TqtUsesPowerOfTwoStep) {
  auto x = torch::linspace(-3, 3, 601);
  auto y = mo::fake_quantize_tqt(x, torch::tensor({0.013f}), torch::tensor({0.0f}), -128, 127, 3);
  // s = 0.013 -> e = floor(log2(1/0.013)) = 6 -> step 1/64.
  auto levels = y * 64;
  EXPECT_TRUE(torch::equal(levels, levels.round()));
  EXPECT_FLOAT_EQ(y.max().item<float>(), 127.0f / 64);
}

TEST(AlgorithmOps, NnieLevelsArePowersOfTwoSixteenth) {
  auto x = torch::randn({2048});
  auto y = mo::fake_quantize_nnie(x, x.abs().max());
  auto nz = y.masked_select(y.ne(0)).abs().to(torch::kDouble);
  auto k = 16 * torch::log2(nz);
  EXPECT_LT((k - k.round()).abs().max().item<double>(), 1e-5);
  EXPECT_THROW(mo::fake_quantize_nnie(x, torch::tensor(-1.0f)), c10::Error);
  EXPECT_TRUE(torch::equal(mo::fake_quantize_nnie(x, torch::tensor(0.0f)), torch::zeros_like(x)));
}

TEST(AlgorithmOps, AdaRoundHardEqualsFloorPlusDecision) {
  auto w = torch::randn({4, 9}) * 0.2;
  auto alpha = torch::randn({4, 9});
  auto s = torch::tensor({0.01f, 0.02f, 0.03f, 0.04f});
  auto z = torch::zeros({4}, torch::kInt);
  auto y = mo::fake_quantize_adaround_per_channel(w, s, z, alpha, 0, -128, 127, true);
  auto sv = s.view({4, 1});
  auto expected = (torch::floor(w / sv) + alpha.ge(0).to(torch::kFloat)).clamp(-128, 127) * sv;
  EXPECT_TRUE(torch::allclose(y, expected));
}

TEST(AlgorithmOps, AdaRoundStepFromTheCppApi) {
  // alpha initialised so that the soft weight is the weight; the regularizer trains alpha
  auto w = torch::randn({4, 9}) * 0.2;
  auto s = torch::tensor({0.01f, 0.02f, 0.03f, 0.04f});
  auto z = torch::zeros({4}, torch::kInt);
  auto alpha = mo::adaround_alpha_init(w, s, 0).requires_grad_();
  auto soft = mo::fake_quantize_adaround_per_channel(w, s, z, alpha, 0, -128, 127, false);
  EXPECT_TRUE(torch::allclose(soft, w, 1e-5, 1e-5));
  auto h = mo::adaround_rectified_sigmoid(alpha);
  auto reg = mo::adaround_regularizer(alpha, 2.0);
  EXPECT_NEAR(reg.item<double>(), (1 - (2 * h - 1).abs().pow(2)).sum().item<double>(), 1e-4);
  reg.backward();
  EXPECT_TRUE(alpha.grad().defined());
  EXPECT_THROW(mo::adaround_alpha_init(w, torch::zeros({4}), 0), c10::Error);
}

TEST(AlgorithmOps, DfqScaleEvensTheRangesOfAPair) {
  auto w1 = torch::randn({6, 3, 3, 3});
  w1[0] *= 50;
  auto w2 = torch::randn({8, 6, 1, 1});
  auto scale = mo::dfq_equalization_scale(w1, w2);
  auto w1e = w1 / scale.view({6, 1, 1, 1});
  auto w2e = w2 * scale.view({1, 6, 1, 1});
  auto r1 = w1e.abs().amax({1, 2, 3});
  auto r2 = w2e.abs().amax({0, 2, 3});
  EXPECT_TRUE(torch::allclose(r1, r2, 1e-4, 1e-5));
}

TEST(AlgorithmOps, QDropIsReproducibleUnderManualSeed) {
  auto x = torch::randn({256});
  auto s = torch::tensor({0.05f}), z = torch::tensor({0}, torch::kInt);
  torch::manual_seed(42);
  auto a = mo::fake_quantize_qdrop_per_tensor(x, s, z, -128, 127, 0.5);
  torch::manual_seed(42);
  auto b = mo::fake_quantize_qdrop_per_tensor(x, s, z, -128, 127, 0.5);
  EXPECT_TRUE(torch::equal(a, b));
  const float kept = a.eq(x).to(torch::kFloat).mean().item<float>();
  EXPECT_GT(kept, 0.3f);
  EXPECT_LT(kept, 0.7f);
}

TEST(AlgorithmOps, PotQuantizationRoundsLog2) {
  auto s = torch::tensor({0.013f, 0.25f, 0.3f});
  auto p = mo::pot_quantization(s);
  EXPECT_TRUE(torch::equal(p, torch::tensor({1.0f / 64, 0.25f, 0.25f})));
}

}  // namespace
