// C++ twins of the observers and fake quantizers: the same names and state as the Python
// classes, and each forward equal to the op it wraps.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cmath>

#include "mqbench/fake_quantize/fake_quantize.h"
#include "mqbench/ops/fake_quantize_ops.h"
#include "mqbench/ops/observer_ops.h"
#include "mqbench/qconfig.h"

namespace {

namespace mo = mqbench::ops;

mqbench::ObserverOptions sym8(bool per_channel = false) {
  return mqbench::QuantizeScheme{true, per_channel, false, 8, true, {}}.to_observer_params();
}

std::vector<std::string> keys(const torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& p : m.named_parameters()) out.push_back(p.key());
  for (const auto& b : m.named_buffers()) out.push_back(b.key());
  std::sort(out.begin(), out.end());
  return out;
}

TEST(QuantizerModules, StateNamesAreMQBench) {
  auto fq = mqbench::make_fake_quantize("LearnableFakeQuantize",
                                        mqbench::make_observer("EMAMinMaxObserver", sym8()));
  const std::vector<std::string> expected{
      "activation_post_process.eps", "activation_post_process.max_val",
      "activation_post_process.min_val", "eps", "fake_quant_enabled", "observer_enabled",
      "scale", "zero_point"};
  EXPECT_EQ(keys(*fq), expected);
  auto fixed = mqbench::make_fake_quantize("FixedFakeQuantize",
                                           mqbench::make_observer("MinMaxObserver", sym8()));
  EXPECT_EQ(keys(*fixed).size(), 7u);
}

TEST(QuantizerModules, MinMaxObserverTracksRunningRangeAndQParams) {
  torch::manual_seed(0);
  auto obs = mqbench::make_observer("MinMaxObserver", sym8(true));
  auto a = torch::randn({8, 16}), b = torch::randn({8, 16}) * 2;
  obs->forward(a);
  obs->forward(b);
  auto both = torch::cat({a, b}, 1);
  EXPECT_TRUE(torch::equal(obs->min_val, std::get<0>(both.min(1))));
  auto qp = obs->calculate_qparams();
  auto expected = torch::maximum(-obs->min_val, obs->max_val) / 127.0;
  EXPECT_TRUE(torch::allclose(std::get<0>(qp), expected));
}

TEST(QuantizerModules, LearnableCalibratesThenTrains) {
  torch::manual_seed(0);
  auto q = mqbench::get_qconfig("Tensorrt");
  auto act = q.activation();
  auto x = torch::randn({4, 8, 6, 6});
  // calibration only: identity output, scale from the observer
  act->disable_fake_quant();
  EXPECT_TRUE(torch::equal(act->forward(x), x));
  auto scale = act->named_parameters()["scale"];
  EXPECT_NEAR(scale.item<double>(), x.abs().max().item<double>() / 127.0, 1e-6);
  // quantization: equals the learnable op, gradients reach the scale
  act->disable_observer();
  act->enable_fake_quant();
  auto xr = x.clone().requires_grad_();
  auto y = act->forward(xr);
  auto ref = mo::fake_quantize_learnable_per_tensor_affine(
      x, scale.detach(), torch::zeros({1}), -127, 127, 1.0 / std::sqrt(x.numel() * 127.0));
  EXPECT_TRUE(torch::equal(y, ref));
  y.sum().backward();
  EXPECT_TRUE(scale.grad().defined());
  EXPECT_TRUE(xr.grad().defined());
}

TEST(QuantizerModules, FixedPerChannelEqualsTorch) {
  torch::manual_seed(0);
  auto fq = mqbench::make_fake_quantize("FixedFakeQuantize",
                                        mqbench::make_observer("MinMaxObserver", sym8(true)));
  auto w = torch::randn({6, 3, 3, 3});
  auto y = fq->forward(w);
  auto s = fq->named_buffers()["scale"];
  auto z = fq->named_buffers()["zero_point"];
  EXPECT_EQ(s.numel(), 6);
  EXPECT_TRUE(torch::equal(y, torch::fake_quantize_per_channel_affine(w, s, z, 0, -127, 127)));
}

TEST(QuantizerModules, SearchingObserversAgreeWithTheirOps) {
  torch::manual_seed(0);
  auto x = torch::randn({4096});
  auto opts = sym8();
  auto mse = mqbench::make_observer("MSEObserver", opts);
  mse->forward(x);
  auto r = mo::observer_mse_range(x, -1, -127, 127, true, 0, mse->eps, 2.0, 95);
  EXPECT_TRUE(torch::equal(mse->max_val, std::get<1>(r)));
  opts.extra["threshold"] = 0.999;
  auto quant = mqbench::make_observer("EMAQuantileObserver", opts);
  quant->forward(x);
  auto qr = mo::observer_quantile_range(x, 0.999, 2048);
  EXPECT_TRUE(torch::equal(quant->max_val, std::get<1>(qr)));
  EXPECT_LT(quant->max_val.item<double>(), x.max().item<double>());
  for (double bins : {0.0, 2.5, 4611686018427387904.0, 1e300}) {  // 1e300: past int64 (a cast is UB)
    auto bad = sym8();
    bad.extra["bins"] = bins;
    EXPECT_THROW(mqbench::make_observer("EMAQuantileObserver", bad), c10::ValueError) << bins;
  }
  auto bad_threshold = sym8();
  bad_threshold.extra["threshold"] = 0.0;
  EXPECT_THROW(mqbench::make_observer("EMAQuantileObserver", bad_threshold), c10::ValueError);
  auto floor_obs = mqbench::make_observer("MinMaxFloorObserver", sym8());
  EXPECT_THROW(floor_obs->calculate_qparams(), c10::Error);
  floor_obs->set_quant_type("param");
  floor_obs->forward(x);
  auto s = std::get<0>(floor_obs->calculate_qparams()).item<double>();
  EXPECT_EQ(s, std::exp2(std::round(std::log2(s))));
}

TEST(QuantizerModules, DegenerateInputGivesFiniteQParams) {
  for (const auto& name : mqbench::cpp_observer_names()) {
    auto obs = mqbench::make_observer(name, sym8());
    obs->set_quant_type("tensor");
    obs->forward(torch::full({10}, std::nan("")));
    obs->forward(torch::empty({0}));
    auto qp = obs->calculate_qparams();
    EXPECT_TRUE(torch::isfinite(std::get<0>(qp)).all().item<bool>()) << name;
    EXPECT_GT(std::get<0>(qp).min().item<double>(), 0) << name;
  }
}

TEST(QuantizerModules, AlgorithmTwinsRunTheirOps) {
  torch::manual_seed(0);
  auto x = torch::randn({2, 4, 5, 5});
  auto pact = mqbench::make_fake_quantize("PACTFakeQuantize",
                                          mqbench::make_observer("MinMaxObserver", sym8()),
                                          {{"alpha", 1.5}});
  auto y = pact->forward(x);
  EXPECT_LE(y.max().item<double>(), 1.5 + 1e-6);
  EXPECT_GE(y.min().item<double>(), -1.5 - 1e-6);
  EXPECT_THROW(mqbench::make_fake_quantize("PACTFakeQuantize",
                                           mqbench::make_observer("MinMaxObserver", sym8()),
                                           {{"beta", 1.0}}),
               c10::Error);
  auto ada = mqbench::make_fake_quantize("AdaRoundFakeQuantize",
                                         mqbench::make_observer("MinMaxObserver", sym8(true)));
  auto w = torch::randn({4, 3, 3, 3});
  auto fixed = ada->forward(w);
  mqbench::adaround_init(*ada, w);
  auto soft = ada->forward(w);
  EXPECT_TRUE(torch::allclose(soft, w, 1e-4, 1e-5));  // h(alpha) = fractional part at init
  soft.sum().backward();
  EXPECT_TRUE(ada->named_parameters()["alpha"].grad().defined());
  EXPECT_THROW(mqbench::set_quant_type(*ada, "param"), c10::Error);
  auto qdrop = mqbench::make_fake_quantize("QDropFakeQuantize",
                                           mqbench::make_observer("MinMaxObserver", sym8()));
  qdrop->forward(x);
  qdrop->disable_observer();
  mqbench::set_qdrop_prob(*qdrop, 0.0);
  EXPECT_TRUE(torch::equal(qdrop->forward(x), x));
  auto nnie = mqbench::make_fake_quantize("NNIEFakeQuantize",
                                          mqbench::make_observer("MinMaxObserver", sym8()));
  auto yn = nnie->forward(x);
  EXPECT_TRUE(torch::equal(yn, mo::fake_quantize_nnie(x, nnie->named_buffers()["data_max"])));
}

}  // namespace
