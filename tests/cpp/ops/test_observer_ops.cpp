// C++ API tests of the observer ops against formulas written here with plain torch ops.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "mqbench/ops/observer_ops.h"

namespace {

namespace mo = mqbench::ops;

TEST(ObserverOps, MinMaxPerTensorAndPerChannelIgnoreNonFinite) {
  auto x = torch::randn({3, 5, 7});
  x[0][1][2] = std::nan("");
  x[2][4][0] = INFINITY;
  auto clean = torch::where(torch::isfinite(x), x, torch::zeros_like(x));
  auto r = mo::observer_min_max(x, -1);
  EXPECT_EQ(std::get<0>(r).dim(), 0);
  EXPECT_EQ(std::get<0>(r).item<float>(), torch::where(torch::isfinite(x), x, torch::full_like(x, 1e9)).min().item<float>());
  auto c = mo::observer_min_max(x, 1);
  auto per = torch::where(torch::isfinite(x), x, torch::full_like(x, -1e9)).transpose(0, 1).flatten(1);
  EXPECT_TRUE(torch::equal(std::get<1>(c), std::get<0>(per.max(1))));
  (void)clean;
}

TEST(ObserverOps, MomentsMatchTorch) {
  auto x = torch::randn({4, 6, 9}, torch::kDouble) * 3 + 1;
  auto m = mo::observer_moments(x, 1);
  auto per = x.transpose(0, 1).flatten(1);
  EXPECT_TRUE(torch::allclose(std::get<0>(m), per.mean(1)));
  EXPECT_TRUE(torch::allclose(std::get<1>(m), per.std(1)));
  EXPECT_TRUE(torch::allclose(std::get<2>(m), per.abs().mean(1)));
}

TEST(ObserverOps, QParamsSymmetricAndAffine) {
  auto eps = torch::tensor({1.1920929e-07f});
  auto s = mo::observer_calculate_qparams(torch::tensor(-2.0f), torch::tensor(1.0f), -127, 127,
                                          true, 0, eps);
  EXPECT_FLOAT_EQ(std::get<0>(s).item<float>(), 2.0f / 127.0f);
  auto a = mo::observer_calculate_qparams(torch::tensor(-1.0f), torch::tensor(3.0f), 0, 255,
                                          false, 0, eps);
  EXPECT_FLOAT_EQ(std::get<0>(a).item<float>(), 4.0f / 255.0f);
  EXPECT_EQ(std::get<1>(a).item<int>(), static_cast<int>(std::nearbyint(1.0f / (4.0f / 255.0f))));
  // no data: scale 1, zero point 0
  auto n = mo::observer_calculate_qparams(torch::tensor(INFINITY), torch::tensor(-INFINITY), 0,
                                          255, false, 0, eps);
  EXPECT_EQ(std::get<0>(n).item<float>(), 1.0f);
}

TEST(ObserverOps, EmaUpdate) {
  auto first = mo::observer_ema_min_max(torch::tensor(INFINITY), torch::tensor(-INFINITY),
                                        torch::tensor(-1.0f), torch::tensor(2.0f), 0.9);
  EXPECT_EQ(std::get<1>(first).item<float>(), 2.0f);
  auto next = mo::observer_ema_min_max(std::get<0>(first), std::get<1>(first),
                                       torch::tensor(-3.0f), torch::tensor(4.0f), 0.9);
  EXPECT_FLOAT_EQ(std::get<1>(next).item<float>(), 2.0f * 0.9f + 4.0f * (1.0f - 0.9f));
}

TEST(ObserverOps, MseRangeNeverScoresWorseThanTheFullRange) {
  torch::manual_seed(0);
  auto x = torch::cat({torch::randn({5000}), torch::tensor({30.0f})});
  auto eps = torch::tensor({1.1920929e-07f});
  auto r = mo::observer_mse_range(x, -1, -8, 7, true, 0, eps, 2.0, 95);
  auto score = [&](double mx) {
    const double s = mx / 7.5;
    return (torch::fake_quantize_per_tensor_affine(x, s, 0, -8, 7) - x).pow(2).mean().item<double>();
  };
  EXPECT_LT(std::get<1>(r).item<double>(), 30.0);
  EXPECT_LT(score(std::get<1>(r).item<double>()), score(30.0));
}

}  // namespace
