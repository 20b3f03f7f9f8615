// C++ API tests of the GPTQ and SignRound ops (include/mqbench/ops/llm.h) on the CPU, where
// their loops run on raw pointers (Note [GPTQ column loop on the CPU] in src/ops/llm_gptq.cpp,
// src/ops/llm_signround.cpp); the sanitized build runs them under AddressSanitizer. Checked:
// every GPTQ weight lies on the grid of its returned qparams, the results do not depend on the
// inputs' memory layout, GPTQ's output error is below round-to-nearest's on correlated inputs,
// SignRound's quantizer starts at round to nearest with dL/dv = s. The equality with the torch
// references is tests/python/llm/test_llm.py's and test_llm_signround.py's.

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

// The in-place entry points (the caller's H as work space; Note [GPTQ's n x n buffers]) give
// the functional ones' bits, through the C++ API; under AddressSanitizer their raw loops
// (the reordering and the mirrored triangle) stay inside the buffer.
TEST(LlmOps, GptqInPlaceEntryPointsEqualTheFunctionalOnes) {
  auto x = correlated(300, 96, 11);
  auto w = random_weight(24, 96, 12);
  auto H = hessian(x.slice(0, 0, 200));
  auto H_own = torch::zeros({96, 96});
  mo::gptq_hessian_update_(H_own, x.slice(0, 0, 200), 0);
  EXPECT_TRUE(torch::equal(H_own, H));
  H = mo::gptq_hessian_update(H, x.slice(0, 200), 200);
  mo::gptq_hessian_update_(H_own, x.slice(0, 200), 200);
  EXPECT_TRUE(torch::equal(H_own, H));
  for (bool act_order : {false, true}) {
    auto ref = mo::gptq_quantize_weight(w, H, -8, 7, true, true, 32, 16, 0.01, act_order);
    auto work = H.clone();
    auto got = mo::gptq_quantize_weight_(w, work, -8, 7, true, true, 32, 16, 0.01, act_order);
    EXPECT_TRUE(torch::equal(std::get<0>(got), std::get<0>(ref))) << act_order;
    EXPECT_TRUE(torch::equal(std::get<1>(got), std::get<1>(ref))) << act_order;
    EXPECT_EQ(std::get<3>(got), std::get<3>(ref));
  }
}

// SignRound's quantizer at V = 0, lo = hi = 1 is round to nearest; with dL/dQ = 1 every weight
// is inside its grid there, so dL/dv is its group's scale.
TEST(LlmOps, SignRoundStartsAtRoundToNearestWithTheScaleAsGradient) {
  const Grid g{0, 15, false, true, 32};
  const auto w = random_weight(24, 96, 7);
  const auto grouped = w.reshape({24, 3, 32});
  const auto v = torch::zeros_like(grouped);
  const auto ones = torch::ones({24, 3});
  const auto mn = grouped.amin(-1), mx = grouped.amax(-1);
  const auto q = mo::signround_quantize(grouped, v, ones, ones, mn, mx, g.qmin, g.qmax, false);
  EXPECT_TRUE(torch::allclose(q.reshape({24, 96}), rtn(w, g), 0.0, 1e-6));
  const auto [gv, glo, ghi] = mo::signround_quantize_backward(
      torch::ones_like(grouped), grouped, v, ones, ones, mn, mx, g.qmin, g.qmax, false);
  const auto scale = (at::clamp_min(mx, 0.0) - at::clamp_max(mn, 0.0)) / 15.0;
  EXPECT_TRUE(torch::allclose(gv, scale.unsqueeze(-1).expand_as(gv), 1e-6, 0.0));
  EXPECT_EQ(glo.sizes(), ones.sizes());
  EXPECT_EQ(ghi.sizes(), ones.sizes());
  EXPECT_TRUE(at::isfinite(glo).all().item<bool>() && at::isfinite(ghi).all().item<bool>());
}

TEST(LlmOps, SignRoundQuantizerDoesNotDependOnTheLayout) {
  torch::manual_seed(8);
  const auto w = torch::randn({16, 2, 24});
  const auto v = torch::rand({16, 2, 24}) - 0.5;
  const auto lo = 0.5 + 0.5 * torch::rand({16, 2}), hi = 0.5 + 0.5 * torch::rand({16, 2});
  const auto mn = w.amin(-1), mx = w.amax(-1);
  const auto G = torch::randn({16, 2, 24});
  // the same values through transposed (non-contiguous) storage
  auto strided = [](const torch::Tensor& t) {
    return t.transpose(0, 1).contiguous().transpose(0, 1);
  };
  for (const bool symmetric : {false, true}) {
    const int64_t qmin = symmetric ? -8 : 0, qmax = symmetric ? 7 : 15;
    const auto a = mo::signround_quantize(w, v, lo, hi, mn, mx, qmin, qmax, symmetric);
    const auto b = mo::signround_quantize(strided(w), strided(v), strided(lo), strided(hi),
                                          strided(mn), strided(mx), qmin, qmax, symmetric);
    EXPECT_TRUE(torch::equal(a, b));
    const auto da = mo::signround_quantize_backward(G, w, v, lo, hi, mn, mx, qmin, qmax,
                                                    symmetric);
    const auto db = mo::signround_quantize_backward(strided(G), strided(w), strided(v),
                                                    strided(lo), strided(hi), strided(mn),
                                                    strided(mx), qmin, qmax, symmetric);
    EXPECT_TRUE(torch::equal(std::get<0>(da), std::get<0>(db)));
    EXPECT_TRUE(torch::equal(std::get<1>(da), std::get<1>(db)));
    EXPECT_TRUE(torch::equal(std::get<2>(da), std::get<2>(db)));
  }
}

TEST(LlmOps, SignRoundQuantizerRefusesBadInput) {
  const auto w = torch::randn({4, 2, 8});
  const auto ones = torch::ones({4, 2});
  const auto mn = w.amin(-1), mx = w.amax(-1);
  EXPECT_THROW(mo::signround_quantize(w, torch::zeros({4, 2, 7}), ones, ones, mn, mx, 0, 15,
                                      false),
               c10::Error);
  EXPECT_THROW(mo::signround_quantize(w, torch::zeros_like(w), ones, ones, mn, mx, 0, 1 << 20,
                                      false),
               c10::Error);
  EXPECT_THROW(mo::signround_quantize_backward(torch::ones({4, 2, 9}), w, torch::zeros_like(w),
                                               ones, ones, mn, mx, 0, 15, false),
               c10::Error);
}

}  // namespace
