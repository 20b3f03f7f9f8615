// C++ API tests of the LLM activation ops: hadamard_transform against the dense product with
// kron(had, S) (Sylvester's matrix built here by Kronecker products), its gradient and errors;
// fake_quantize_per_token against the observer qparams followed by the per-channel fake
// quantizer on the rows (and the FP8 one), its straight-through gradient and errors.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "mqbench/ops/fake_quantize_ops.h"
#include "mqbench/ops/hadamard.h"
#include "mqbench/ops/observer_ops.h"

namespace {

namespace mo = mqbench::ops;

torch::Tensor sylvester(int64_t p) {
  auto s = torch::ones({1, 1}, torch::kDouble);
  const auto h2 = torch::tensor({1.0, 1.0, 1.0, -1.0}, torch::kDouble).view({2, 2});
  while (s.size(0) < p) s = torch::kron(h2, s);
  return s;
}

torch::Tensor random_signs(int64_t m, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randint(0, 2, {m, m}, torch::kDouble) * 2 - 1;
}

TEST(HadamardTransform, EqualsTheDenseProduct) {
  torch::manual_seed(0);
  for (int64_t n : {1, 2, 64, 4096}) {
    auto x = torch::randn({3, 2, n}, torch::kDouble);
    const double scale = 1.0 / std::sqrt(static_cast<double>(n));
    auto y = mo::hadamard_transform(x, {}, scale);
    auto ref = torch::matmul(x, (sylvester(n) * scale).t());
    EXPECT_TRUE(torch::allclose(y, ref, 1e-12, 1e-12)) << "n = " << n;
  }
  const auto had = random_signs(12, 1);
  auto x = torch::randn({5, 768}, torch::kDouble);
  auto y = mo::hadamard_transform(x, had, 0.25);
  auto ref = torch::matmul(x, (torch::kron(had, sylvester(64)) * 0.25).t());
  EXPECT_TRUE(torch::allclose(y, ref, 1e-12, 1e-12));
  // float32 with a Hadamard had (S_4): orthogonal at 1 / sqrt(n), n = 4 * 256
  auto xf = torch::randn({5, 1024});
  auto yf = mo::hadamard_transform(xf, sylvester(4).to(torch::kFloat), 1.0 / 32.0);
  EXPECT_TRUE(torch::allclose(yf.norm(2, {-1}), xf.norm(2, {-1}), 1e-5, 0.0));
}

TEST(HadamardTransform, GradientIsTheTransformByTheTranspose) {
  const auto had = random_signs(12, 2) + 0.25 * torch::randn({12, 12}, torch::kDouble);
  auto x = torch::randn({4, 768}, torch::dtype(torch::kDouble).requires_grad(true));
  auto dy = torch::randn({4, 768}, torch::kDouble);
  mo::hadamard_transform(x, had, 0.5).backward(dy);
  EXPECT_TRUE(torch::equal(x.grad(), mo::hadamard_transform(dy, had.t(), 0.5)));
}

TEST(HadamardTransform, ErrorsNameTheSizes) {
  auto x = torch::randn({2, 36});
  EXPECT_THROW(
      {
        try {
          mo::hadamard_transform(x);
        } catch (const c10::Error& e) {
          EXPECT_NE(std::string(e.what()).find("x.size(-1) (36) must be a power of two"),
                    std::string::npos)
              << e.what();
          throw;
        }
      },
      c10::Error);
  EXPECT_THROW(mo::hadamard_transform(x, random_signs(12, 3)), c10::Error);  // 3 not 2^k
  EXPECT_THROW(mo::hadamard_transform(x, torch::ones({12, 6})), c10::Error);
  EXPECT_THROW(mo::hadamard_transform(torch::tensor(1.0)), c10::Error);
}

TEST(FakeQuantizePerToken, IsTheObserverThenThePerChannelQuantizer) {
  torch::manual_seed(4);
  auto x = torch::randn({16, 96}) * torch::logspace(-3, 3, 16).unsqueeze(1);
  const auto eps = torch::full({1}, std::numeric_limits<float>::epsilon());
  struct Case {
    int64_t qmin, qmax;
    bool symmetric;
  };
  for (const auto& c : {Case{-8, 7, true}, Case{-128, 127, false}, Case{0, 255, true}}) {
    const int64_t zs = c.qmin < 0 ? 0 : (c.qmin + c.qmax + 1) / 2;
    auto [s, z] = mo::observer_calculate_qparams(std::get<0>(x.min(-1)), std::get<0>(x.max(-1)),
                                                 c.qmin, c.qmax, c.symmetric, zs, eps);
    auto want = mo::fake_quantize_per_channel_affine(x, s, z, 0, c.qmin, c.qmax);
    auto got = mo::fake_quantize_per_token(x, c.qmin, c.qmax, c.symmetric);
    EXPECT_TRUE(torch::equal(got, want)) << c.qmin << " " << c.qmax << " " << c.symmetric;
  }
  auto [s, z] = mo::observer_calculate_qparams(std::get<0>(x.min(-1)), std::get<0>(x.max(-1)),
                                               -448, 448, true, 0, eps);
  EXPECT_TRUE(torch::equal(mo::fake_quantize_per_token(x, 0, 0, true, "fp8_e4m3"),
                           mo::fake_quantize_fp8(x, s, 0, "fp8_e4m3")));
}

TEST(FakeQuantizePerToken, StraightThroughGradientAndErrors) {
  auto x = torch::randn({3, 40}, torch::requires_grad());
  auto dy = torch::randn({3, 40});
  mo::fake_quantize_per_token(x, -8, 7, true).backward(dy);
  EXPECT_TRUE(torch::equal(x.grad(), dy));
  auto z = torch::zeros({2, 8});
  EXPECT_TRUE(torch::equal(mo::fake_quantize_per_token(z, -128, 127, false), z));
  EXPECT_THROW(mo::fake_quantize_per_token(z, 7, 7, true), c10::Error);
  EXPECT_THROW(mo::fake_quantize_per_token(z, -8, 7, true, "int3"), c10::Error);
}

}  // namespace
