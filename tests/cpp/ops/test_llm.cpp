// C++ API tests of the GPTQ op (include/mqbench/ops/llm.h) on the CPU, where its column loop
// runs on raw pointers (Note [GPTQ column loop on the CPU] in src/ops/llm_gptq.cpp); the
// sanitized build runs them under AddressSanitizer. Checked: every output weight lies on the
// grid of its returned qparams, the result does not depend on the weight's memory layout, and
// GPTQ's output error is below round-to-nearest's on correlated inputs. The equality with the
// torch reference is tests/python/test_llm.py's.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <tuple>

#include "mqbench/ops/llm.h"

namespace {

namespace mo = mqbench::ops;

struct Grid {
  int64_t qmin, qmax;
  bool symmetric, per_channel;
  int64_t group;
};

// Tokens with correlated channels (a mixing of a few latent factors), like hidden states.
torch::Tensor correlated(int64_t n, int64_t d, uint64_t seed) {
  torch::manual_seed(seed);
  auto z = torch::randn({n, d / 4});
  return z.matmul(torch::randn({d / 4, d})) + 0.1 * torch::randn({n, d});
}

torch::Tensor random_weight(int64_t out, int64_t in, uint64_t seed) {
  torch::manual_seed(seed);
  return torch::randn({out, in});
}

torch::Tensor hessian(const torch::Tensor& x) {
  return mo::gptq_hessian_update(torch::zeros({x.size(1), x.size(1)}), x, 0);
}

// Q requantized with its own scale / zero point, group by group: equal to Q if Q is on the grid.
torch::Tensor regrid(const torch::Tensor& q, const torch::Tensor& scale, const torch::Tensor& zero,
                     const Grid& g) {
  const int64_t out = q.size(0), in = q.size(1), ng = scale.size(1);
  auto grouped = q.reshape({scale.size(0) == 1 ? 1 : out, ng, -1});
  auto s = scale.unsqueeze(-1), z = zero.unsqueeze(-1);
  auto levels = at::clamp(at::round(grouped * (1.0 / s)) + z, g.qmin, g.qmax);
  return ((levels - z) * s).reshape({out, in});
}

torch::Tensor rtn(const torch::Tensor& w, const Grid& g) {
  auto grouped = w.reshape({w.size(0), w.size(1) / g.group, g.group});
  auto mn = at::clamp_max(grouped.amin(-1, true), 0.0);
  auto mx = at::clamp_min(grouped.amax(-1, true), 0.0);
  auto scale = at::clamp_min((mx - mn) / static_cast<double>(g.qmax - g.qmin), 1e-7);
  auto zero = at::clamp(g.qmin - at::round(mn / scale), g.qmin, g.qmax);
  auto levels = at::clamp(at::round(grouped / scale) + zero, g.qmin, g.qmax);
  return ((levels - zero) * scale).reshape(w.sizes());
}

double output_error(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& q) {
  auto ref = x.matmul(w.t());
  return ((x.matmul(q.t()) - ref).norm() / ref.norm()).item<double>();
}

class GptqGrids : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(GptqGrids, WeightsLieOnTheReturnedGridWhateverTheLayout) {
  static const Grid grids[] = {{-8, 7, true, true, 32},    // MQBench's symmetric INT4 groups
                               {0, 7, false, true, 16},    // asymmetric INT3 groups
                               {0, 15, false, true, 0},    // per channel
                               {-8, 7, true, false, 0}};   // per tensor
  const Grid& g = grids[std::get<0>(GetParam())];
  const bool act_order = std::get<1>(GetParam());
  const auto x = correlated(300, 96, 1);
  auto H = hessian(x);
  const auto w = random_weight(40, 96, 2);
  // block size 24: blocks end inside groups, and the last block is short (96 = 4 * 24)
  auto [q, scale, zero, damp] =
      mo::gptq_quantize_weight(w, H, g.qmin, g.qmax, g.symmetric, g.per_channel, g.group, 24,
                               0.01, act_order, "layer");
  ASSERT_EQ(q.sizes(), w.sizes());
  EXPECT_EQ(damp, 0.01);
  EXPECT_TRUE(at::isfinite(q).all().item<bool>());
  EXPECT_TRUE(torch::equal(regrid(q, scale, zero, g), q));
  // a weight stored transposed (a transformers Conv1D's [in, out], read as [out, in])
  const auto stored = w.t().contiguous();
  auto q_t = std::get<0>(mo::gptq_quantize_weight(stored.t(), H, g.qmin, g.qmax, g.symmetric,
                                                  g.per_channel, g.group, 24, 0.01, act_order,
                                                  "layer"));
  EXPECT_TRUE(torch::equal(q_t, q));
}

INSTANTIATE_TEST_SUITE_P(LlmOps, GptqGrids,
                         ::testing::Combine(::testing::Range(0, 4), ::testing::Bool()));

TEST(LlmOps, GptqErrorBelowRoundToNearest) {
  const Grid g{0, 15, false, true, 32};
  const auto x = correlated(512, 128, 3);
  const auto w = random_weight(64, 128, 4);
  for (const bool act_order : {false, true}) {
    auto q = std::get<0>(mo::gptq_quantize_weight(w, hessian(x), g.qmin, g.qmax, g.symmetric,
                                                  g.per_channel, g.group, 128, 0.01, act_order,
                                                  "layer"));
    EXPECT_LT(output_error(x, w, q), 0.6 * output_error(x, w, rtn(w, g)))
        << "act_order " << act_order;
  }
}

TEST(LlmOps, GptqZeroInputColumnIsZeroedAndStaysFinite) {
  auto x = correlated(200, 64, 5);
  x.select(1, 7).zero_();  // a dead input channel: H[7, 7] = 0
  const auto w = random_weight(16, 64, 6);
  auto q = std::get<0>(mo::gptq_quantize_weight(w, hessian(x), -8, 7, true, true, 32, 128, 0.01,
                                                false, "layer"));
  EXPECT_TRUE(at::isfinite(q).all().item<bool>());
  EXPECT_TRUE(torch::equal(q.select(1, 7), torch::zeros({16})));
}

}  // namespace
