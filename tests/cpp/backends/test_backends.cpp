// The backend registry: every built-in backend file is linked and registered (a dropped file
// fails here), the schemes match MQBench's table, errors list the valid names, and a backend
// registered outside the library (this test binary) is found by get_backend and get_qconfig.

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "mqbench/backend.h"
#include "mqbench/ops/fake_quantize_ops.h"
#include "mqbench/ops/fake_quantize_mx.h"
#include "mqbench/qconfig.h"

namespace {

// Registered by this test binary, i.e. outside libmqbench, exactly as an application would.
MQBENCH_REGISTER_BACKEND(test_chip, [] {
  mqbench::BackendSpec s;
  s.name = "TestChip";
  s.weight_scheme = mqbench::QuantizeScheme{true, true, false, 4, true, {}};
  s.activation_scheme = mqbench::QuantizeScheme{false, false, false, 8, false, {{"ema_ratio", 0.5}}};
  s.weight_fake_quantize = "LearnableFakeQuantize";
  s.activation_fake_quantize = "FixedFakeQuantize";
  s.weight_observer = "MSEObserver";
  s.activation_observer = "EMAMinMaxObserver";
  return s;
}());

TEST(Backends, AllBuiltInsAreRegisteredInMQBenchOrder) {
  const std::vector<std::string> expected{
      "Academic", "Tensorrt", "SNPE", "PPLW8A16", "NNIE", "Vitis", "ONNX_QNN", "PPLCUDA",
      "OPENVINO", "Tengine_u8", "Tensorrt_NLP", "Academic_NLP", "STPU", "QDQ", "TestChip"};
  EXPECT_EQ(mqbench::backend_names(), expected);
}

TEST(Backends, SchemesAndDefaultsFollowMQBench) {
  auto trt = mqbench::get_backend("Tensorrt");
  EXPECT_EQ(trt.weight_scheme->quant_min(), -127);
  EXPECT_EQ(trt.weight_scheme->to_observer_params().ch_axis, 0);
  EXPECT_EQ(trt.activation_scheme->to_observer_params().qscheme, "per_tensor_symmetric");
  EXPECT_EQ(trt.activation_observer, "EMAMinMaxObserver");
  auto nlp = mqbench::get_backend("Tensorrt_NLP");
  EXPECT_EQ(nlp.model_quantizer, "TensorrtNLPQuantizer");
  EXPECT_TRUE(*nlp.weight_scheme == *trt.weight_scheme);
  auto w8a16 = mqbench::get_backend("PPLW8A16");
  EXPECT_EQ(w8a16.activation_scheme->quant_max(), 65535);
  auto vitis = mqbench::get_backend("Vitis");
  EXPECT_EQ(vitis.qtype, "vitis");
  EXPECT_TRUE(vitis.weight_scheme->pot_scale);
  EXPECT_EQ(vitis.activation_observer, "PoTModeObserver");
  EXPECT_TRUE(mqbench::get_backend("Academic").requires_user_qscheme());
  EXPECT_EQ(mqbench::get_backend("STPU").weight_fake_quantize, "FixedFakeQuantize");
  EXPECT_EQ(mqbench::get_backend("ONNX_QNN").activation_observer, "MinMaxObserver");
}

TEST(Backends, SchemeBitWidthsAreChecked) {
  mqbench::QuantizeScheme s;
  s.bit = 1;
  EXPECT_EQ(s.quant_min(), -1);  // one bit: [-1, 0] symmetric, [0, 1] asymmetric
  EXPECT_EQ(s.quant_max(), 0);
  s.symmetric_range = true;  // [0, 0]: a single level
  EXPECT_THROW(s.quant_min(), mqbench::Error);
  EXPECT_THROW(s.quant_max(), mqbench::Error);
  s.symmetric_range = false;
  for (int64_t bit : {0, 25, 64}) {
    s.bit = bit;
    EXPECT_THROW(s.quant_min(), mqbench::Error) << bit;
  }
}

// dtype and group_size. Every invalid combination throws, naming its field.
TEST(Backends, SchemeFormatsAreCheckedNamingTheField) {
  auto message = [](const mqbench::QuantizeScheme& s) -> std::string {
    try {
      s.validate();
    } catch (const mqbench::Error& e) {
      return e.what();
    }
    return "";
  };
  mqbench::QuantizeScheme fp8;
  fp8.dtype = "fp8_e4m3";
  EXPECT_EQ(message(fp8), "");
  EXPECT_EQ(fp8.quant_min(), -448);
  EXPECT_EQ(fp8.quant_max(), 448);
  auto o = fp8.to_observer_params();
  EXPECT_EQ(o.format, "fp8_e4m3");
  EXPECT_EQ(o.ch_axis, -1);
  fp8.dtype = "fp8_e5m2";
  EXPECT_EQ(fp8.quant_max(), 57344);
  fp8.bit = 4;
  EXPECT_NE(message(fp8).find("bit (4)"), std::string::npos) << message(fp8);
  fp8.bit = 8;
  fp8.symmetry = false;
  EXPECT_NE(message(fp8).find("symmetry=False"), std::string::npos) << message(fp8);
  fp8.symmetry = true;
  fp8.group_size = 32;
  EXPECT_NE(message(fp8).find("group_size (32)"), std::string::npos) << message(fp8);
  fp8.group_size = 0;
  fp8.dtype = "fp9";
  EXPECT_NE(message(fp8).find("unknown dtype 'fp9'"), std::string::npos) << message(fp8);
  mqbench::QuantizeScheme mx;
  mx.dtype = "mxfp4";
  mx.bit = 4;
  EXPECT_EQ(message(mx), "");
  EXPECT_EQ(mx.quant_max(), 6);
  mx.per_channel = true;
  EXPECT_NE(message(mx).find("per_channel"), std::string::npos) << message(mx);

  mqbench::QuantizeScheme g{true, true, false, 4, false, {}};
  g.group_size = 128;
  EXPECT_EQ(message(g), "");
  o = g.to_observer_params();
  EXPECT_EQ(o.group_size, 128);
  EXPECT_EQ(o.ch_axis, 1);
  EXPECT_EQ(o.quant_min.value(), -8);
  g.per_channel = false;
  EXPECT_NE(message(g).find("set per_channel=True"), std::string::npos) << message(g);
  g.per_channel = true;
  g.group_size = -2;
  EXPECT_NE(message(g).find("group_size"), std::string::npos) << message(g);
}

TEST(Backends, IntSchemesKeepTheirStrAndEquality) {
  mqbench::QuantizeScheme a{true, true, false, 8, true, {}}, b = a;
  EXPECT_EQ(a.str(), "Symmetric: True / Bitwidth: 8 / Per channel: True / Pot scale: False / "
                     "Extra kwargs: {}");
  EXPECT_TRUE(a == b);
  b.group_size = 64;
  EXPECT_FALSE(a == b);
  EXPECT_EQ(b.str(), a.str() + " / Group size: 64");
  mqbench::QuantizeScheme f;
  f.dtype = "fp8_e5m2";
  EXPECT_EQ(f.str(), "Symmetric: True / Bitwidth: 8 / Per channel: False / Pot scale: False / "
                     "Extra kwargs: {} / Dtype: fp8_e5m2");
  EXPECT_FALSE(f == mqbench::QuantizeScheme{});
}

TEST(Backends, ErrorsNameTheProblemAndListValidChoices) {
  try {
    mqbench::get_backend("TensorRT");
    FAIL() << "expected an error";
  } catch (const mqbench::Error& e) {
    EXPECT_NE(std::string(e.what()).find("registered backends: Academic, Tensorrt"), std::string::npos);
  }
  mqbench::BackendSpec dup;
  dup.name = "SNPE";
  EXPECT_THROW(mqbench::register_backend(dup), mqbench::Error);
  mqbench::BackendSpec bad;
  bad.name = "Bad";
  bad.weight_observer = "NoSuchObserver";
  try {
    mqbench::register_backend(bad);
    FAIL() << "expected an error";
  } catch (const mqbench::Error& e) {
    EXPECT_NE(std::string(e.what()).find("valid names: MinMaxObserver"), std::string::npos);
  }
  EXPECT_THROW(mqbench::make_observer("MaxObserver", {}), c10::Error);
  EXPECT_THROW(mqbench::make_fake_quantize("LSQ", mqbench::make_observer("MinMaxObserver", {})),
               c10::Error);
}

TEST(Backends, CppFactoriesCoverEveryRegistryName) {
  const auto fq = mqbench::cpp_fake_quantize_names();
  const auto obs = mqbench::cpp_observer_names();
  // MQBench's nine, then the format twins (docs/formats.md; the group ones are Python's only)
  EXPECT_EQ(std::vector<std::string>(mqbench::fake_quantize_names().begin(),
                                     mqbench::fake_quantize_names().begin() + 9),
            std::vector<std::string>(fq.begin(), fq.begin() + 9));
  EXPECT_EQ(std::vector<std::string>(fq.begin() + 9, fq.end()),
            (std::vector<std::string>{"FP8FakeQuantize", "LearnableFP8FakeQuantize",
                                      "MXFakeQuantize", "NVFP4FakeQuantize"}));
  EXPECT_EQ(std::vector<std::string>(mqbench::observer_names().begin(),
                                     mqbench::observer_names().begin() + 10), obs);
}

TEST(Backends, QConfigOfEveryBackendBuildsWorkingQuantizers) {
  torch::manual_seed(0);
  const auto x = torch::randn({4, 8, 5, 5});
  for (const auto& name : mqbench::backend_names()) {
    mqbench::ExtraQConfig extra;
    if (mqbench::get_backend(name).requires_user_qscheme()) {
      extra.w_qscheme = mqbench::QuantizeScheme{false, true, false, 4, false, {}};
      extra.a_qscheme = mqbench::QuantizeScheme{true, false, false, 4, false, {}};
      extra.w_fakequantize = extra.a_fakequantize = "LearnableFakeQuantize";
      extra.w_observer = extra.a_observer = "MinMaxObserver";
    }
    auto q = mqbench::get_qconfig(name, extra);
    auto w = q.weight();
    auto a = q.activation();
    if (mqbench::get_backend(name).qtype == "vitis") {
      mqbench::set_quant_type(*w, "param");
      mqbench::set_quant_type(*a, "tensor");
    }
    auto yw = w->forward(x);
    auto ya = a->forward(x);
    EXPECT_TRUE(torch::isfinite(ya).all().item<bool>()) << name;
    EXPECT_LE(std::get<0>(torch::_unique(ya)).numel(), a->quant_max - a->quant_min + 1) << name;
    EXPECT_FALSE(torch::equal(ya, x)) << name;
  }
}

TEST(Backends, QConfigPicksTheFormatTwinsAndTheyRunTheFormatOps) {
  torch::manual_seed(0);
  const auto x = torch::randn({8, 64}) * 3;
  struct Case {
    const char* dtype;
    const char* weight;      // Tensorrt's LearnableFakeQuantize becomes
    int64_t bit;
  };
  for (const Case& c : {Case{"fp8_e4m3", "LearnableFP8FakeQuantize", 8},
                        Case{"mxfp4", "MXFakeQuantize", 4}, Case{"nvfp4", "NVFP4FakeQuantize", 4}}) {
    mqbench::ExtraQConfig extra;
    mqbench::QuantizeScheme s;
    s.dtype = c.dtype;
    s.bit = c.bit;
    extra.w_qscheme = extra.a_qscheme = s;
    extra.a_fakequantize = "FixedFakeQuantize";
    const auto q = mqbench::get_qconfig("Tensorrt", extra);
    EXPECT_EQ(q.weight.fake_quantize, c.weight);
    auto a = q.activation();
    EXPECT_EQ(a->bitwidth, c.bit);
    auto y = a->forward(x);  // observes, then quantizes with the format's op
    torch::Tensor want;
    if (std::string(c.dtype) == "fp8_e4m3") {
      EXPECT_EQ(q.activation.fake_quantize, "FP8FakeQuantize");
      const auto s8 = x.abs().max() / 448;
      want = mqbench::ops::fake_quantize_fp8(x, s8.reshape({1}), {}, "fp8_e4m3");
    } else if (std::string(c.dtype) == "mxfp4") {
      want = mqbench::ops::fake_quantize_mx(x, "mxfp4", 32, -1);
    } else {
      want = mqbench::ops::fake_quantize_nvfp4(x, x.abs().max(), 16, -1);
    }
    EXPECT_TRUE(torch::allclose(y, want, 0, 0)) << c.dtype;
    auto w = q.weight();
    auto wt = torch::randn({4, 64}, torch::requires_grad());
    w->forward(wt).sum().backward();
    EXPECT_TRUE(wt.grad().defined()) << c.dtype;
  }
  mqbench::ExtraQConfig bad;
  mqbench::QuantizeScheme s;
  s.dtype = "mxfp8_e4m3";
  bad.w_qscheme = s;
  bad.w_fakequantize = "DSQFakeQuantize";
  try {
    mqbench::get_qconfig("Tensorrt", bad);
    ADD_FAILURE() << "DSQ with MXFP8 was not refused";
  } catch (const c10::Error& e) {
    EXPECT_NE(std::string(e.what_without_backtrace()).find(
                  "w_fakequantize: DSQFakeQuantize has no variant for dtype 'mxfp8_e4m3'"),
              std::string::npos) << e.what_without_backtrace();
  }
  mqbench::ExtraQConfig group;
  mqbench::QuantizeScheme g;
  g.bit = 4;
  g.per_channel = true;
  g.group_size = 32;
  group.w_qscheme = g;
  EXPECT_THROW(mqbench::get_qconfig("Tensorrt", group), c10::Error);
}

TEST(Backends, ExternalBackendQConfig) {
  auto q = mqbench::get_qconfig("TestChip");
  EXPECT_EQ(q.weight.fake_quantize, "LearnableFakeQuantize");
  EXPECT_EQ(q.weight.observer_options.quant_min, -7);
  EXPECT_EQ(q.activation.observer_options.extra.at("ema_ratio"), 0.5);
  mqbench::ExtraQConfig extra;
  extra.a_observer_extra_args = {{"ema_ratio", 0.25}};
  EXPECT_EQ(mqbench::get_qconfig("TestChip", extra).activation.observer_options.extra.at("ema_ratio"),
            0.25);
  // the registry's scheme is unchanged by the extra arguments
  EXPECT_EQ(mqbench::get_backend("TestChip").activation_scheme->kwargs.at("ema_ratio"), 0.5);
  auto w = q.weight();
  w->forward(torch::randn({6, 3, 3, 3}));
  EXPECT_EQ(w->named_parameters()["scale"].numel(), 6);
}

}  // namespace
