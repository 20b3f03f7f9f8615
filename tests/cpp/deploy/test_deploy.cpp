// The deploy library on small hand-built ONNX graphs: recognition of fake-quantize nodes,
// removal, the Tensorrt and QDQ translators, the registry, atomic writes and bad input.

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <thread>

#include "mqbench/backend.h"
#include "mqbench/deploy/check_model.h"
#include "mqbench/deploy/translator.h"
#include "onnx_builders.h"

namespace fs = std::filesystem;
using namespace mqbench::deploy;
using namespace deploy_test;

TEST(Deploy, FindsFakeQuantizeGroupsWithTheirParameters) {
  const auto g = sample();
  const auto fqs = find_fake_quants(g);
  ASSERT_EQ(fqs.size(), 3u);
  EXPECT_EQ(fqs[0].input, "x");
  EXPECT_FALSE(fqs[0].q.per_channel());
  EXPECT_EQ(classify(g, fqs[0]), Role::kActivation);
  EXPECT_EQ(fqs[1].q.axis, 0);
  EXPECT_EQ(fqs[1].q.scale, (std::vector<double>{0.01f, 0.02f}));
  EXPECT_EQ(classify(g, fqs[1]), Role::kWeight);
  EXPECT_EQ(fqs[2].q.zero_point, std::vector<int64_t>{0});  // round(0.4)
  EXPECT_EQ(fqs[2].q.quant_min, -127);
  EXPECT_DOUBLE_EQ(fqs[2].q.min_value(), -127 * static_cast<double>(0.1f));
}

// A Linear on a 3-d input exports as W -> fake quant -> Transpose -> MatMul: its per-channel
// quantizer is the MatMul's weight quantizer; a Transpose feeding anything else is refused.
TEST(Deploy, WeightsThroughATransposeIntoMatMulAreWeights) {
  for (const bool into_matmul : {true, false}) {
    auto m = empty_model("linear3d");
    auto* g = m.mutable_graph();
    typed(g->add_input(), "x", 3);
    typed(g->add_output(), "y", 3);
    *g->add_initializer() = make_tensor("W", onnx::TensorProto::FLOAT, {2, 3}, {1, -2, 3, 4, 5, -6});
    *g->add_initializer() = make_tensor("s_w", onnx::TensorProto::FLOAT, {2}, {0.5, 0.25});
    *g->add_initializer() = make_tensor("z_w", onnx::TensorProto::FLOAT, {2}, {0, 0});
    auto* w = add_node(g, "FakeQuantizeLearnablePerchannelAffine", "fq_w", {"W", "s_w", "z_w"},
                       {"Wq"}, "mqbench");
    add_int_attr(w, "quant_min", -8);
    add_int_attr(w, "quant_max", 7);
    add_node(g, "Transpose", "t", {"Wq"}, {"Wt"});
    add_node(g, into_matmul ? "MatMul" : "Add", "mm", {"x", "Wt"}, {"y"});
    OnnxGraph graph(std::move(m));
    const auto fqs = find_fake_quants(graph);
    ASSERT_EQ(fqs.size(), 1u);
    if (!into_matmul) {
      EXPECT_THROW(classify(graph, fqs[0]), DeployError);
      continue;
    }
    std::string consumer, op;
    EXPECT_EQ(classify(graph, fqs[0], &consumer, &op), Role::kWeight);
    EXPECT_EQ(consumer, "mm");
    EXPECT_EQ(op, "MatMul");
  }
}

TEST(Deploy, TensorrtRemovesFakeQuantizationAndWritesClipRanges) {
  DeployOptions o;
  o.model_name = "m";
  const auto out = get_translator("tensorrt")(sample(), o);
  ASSERT_EQ(out.files.size(), 3u);
  EXPECT_TRUE(out.notes.empty());
  EXPECT_EQ(out.files[0].file_name, "m_clip_ranges.json");
  EXPECT_EQ(out.files[2].file_name, "m_calib.cache");
  EXPECT_EQ(out.files[2].contents, "TRT-8601-EntropyCalibration2\nx: 3d4ccccd\nr: 3dcccccd\n");
  const auto j = nlohmann::json::parse(out.files[0].contents);
  const auto& ranges = j.at("tensorrt").at("blob_range");
  EXPECT_NEAR(ranges.at("x").get<double>(), 127 * 0.05, 1e-6);
  EXPECT_NEAR(ranges.at("r").get<double>(), 127 * 0.1, 1e-6);
  const auto deployed = OnnxGraph::parse(out.files[1].contents);
  EXPECT_EQ(deployed.graph().node_size(), 2);  // Conv, Relu
  EXPECT_EQ(deployed.graph().output(0).name(), "r");  // the graph output keeps the float name
  ConstTensor w;
  ASSERT_TRUE(deployed.constant("W", &w));
  EXPECT_FLOAT_EQ(static_cast<float>(w.values[1]), static_cast<float>(-127 * static_cast<double>(0.02f)));  // clipped
  EXPECT_DOUBLE_EQ(w.values[0], 0.5);
  EXPECT_EQ(deployed.opset("mqbench"), -1);
}

// The calibration cache holds each range r of blob_range as float32(r / 127), TensorRT's scale
// for the dynamic range r, as the 8 hex digits of its bits (most significant first, zero-padded).
TEST(Deploy, TensorrtCalibrationCacheHoldsEachScaleAsFloat32Bits) {
  DeployOptions o;
  o.model_name = "m";
  const auto cache_line_of_x = [&](double s_x) {
    auto g = sample();
    g.set_initializer(make_tensor("s_x", onnx::TensorProto::FLOAT, {}, {s_x}));
    const auto out = get_translator("tensorrt")(std::move(g), o);
    const std::string& text = out.files.at(2).contents;
    const size_t at = text.find("\nx: ");
    return at == std::string::npos ? text : text.substr(at + 1, text.find('\n', at + 1) - at - 1);
  };
  EXPECT_EQ(cache_line_of_x(1.0), "x: 3f800000");
  EXPECT_EQ(cache_line_of_x(0.5), "x: 3f000000");
  EXPECT_EQ(cache_line_of_x(0x1p-126), "x: 00800000");  // the leading zeros are kept
  EXPECT_EQ(cache_line_of_x(3.0), "x: 40400000");
  // A replaced post_process_clip_ranges: the cache holds the table it returned, in its order.
  o.post_process_clip_ranges = [](const std::string& ranges, std::string*) {
    auto j = nlohmann::ordered_json::parse(ranges);
    j["extra"] = 127.0;
    j.erase("r");
    return j.dump();
  };
  const auto out = get_translator("tensorrt")(sample(), o);
  EXPECT_EQ(out.files.at(2).contents, "TRT-8601-EntropyCalibration2\nx: 3d4ccccd\nextra: 3f800000\n");
  o.post_process_clip_ranges = [](const std::string& ranges, std::string*) {
    auto j = nlohmann::ordered_json::parse(ranges);
    j["extra"] = {1.0, 2.0};
    return j.dump();
  };
  try {
    get_translator("tensorrt")(sample(), o);
    ADD_FAILURE() << "a list became a scale";
  } catch (const DeployError& e) {
    EXPECT_NE(std::string(e.what()).find("range of tensor 'extra' is [1.0,2.0]"), std::string::npos)
        << e.what();
  }
}

// Note [Float layers]: a layer whose weight is quantized but whose input is not runs in float in
// TensorRT; Tensorrt refuses it by name, or deploys it with a warning note when allowed; the other
// backends deploy it as they did. (Tensorrt_NLP refuses such Gemm / MatMul layers only, its
// scheme never quantizing a convolution's input: test_tensorrt_float_layers.py.)
TEST(Deploy, TensorrtRefusesLayersWithAQuantizedWeightAndAFloatInput) {
  const auto float_conv = [] {
    auto g = sample();
    g.set_input(2, 0, "x");  // the Conv reads x, not fq_x's output
    g.remove_nodes({0});     // and fq_x goes
    return g;
  };
  DeployOptions o;
  o.model_name = "m";
  for (const char* backend : {"Tensorrt"}) {
    try {
      translate(float_conv(), backend, o);
      ADD_FAILURE() << backend << " deployed a float layer without a word";
    } catch (const DeployError& e) {
      const std::string why = e.what();
      EXPECT_EQ(why.rfind(std::string(backend) + ": 1 layer has a quantized weight but no "
                          "quantizer on its input", 0), 0u) << why;
      EXPECT_NE(why.find("'conv' (Conv, weight 'W')"), std::string::npos) << why;
      EXPECT_NE(why.find("allow_float_layers=True"), std::string::npos) << why;
      EXPECT_NE(why.find("exclude_module_name"), std::string::npos) << why;
    }
  }
  for (const char* backend : {"Academic", "Academic_NLP", "Tensorrt_NLP", "QDQ", "SNPE"}) {
    EXPECT_NO_THROW(translate(float_conv(), backend, o)) << backend;
  }
  EXPECT_EQ(find_float_layers(float_conv(), /*convolutions=*/false).size(), 0u);
  o.allow_float_layers = true;
  const auto out = translate(float_conv(), "Tensorrt", o);
  EXPECT_EQ(out.files.size(), 3u);
  ASSERT_EQ(out.notes.size(), 1u);
  EXPECT_EQ(out.notes[0].rfind("warning: 1 layer has a quantized weight", 0), 0u) << out.notes[0];
  EXPECT_NE(out.notes[0].find("'conv' (Conv, weight 'W')"), std::string::npos) << out.notes[0];
  // A quantized input deploys with no note, allowed or not.
  EXPECT_TRUE(translate(sample(), "Tensorrt", o).notes.empty());
  EXPECT_TRUE(translate(sample(), "Tensorrt_NLP", o).notes.empty());
}

// DeployOptions::post_process_clip_ranges replaces the step of that name (Python's
// LinearQuantizer_process subclasses): it sees the table and the deploy model, and what it
// returns is what the files hold; a reply that is not a table is a DeployError.
TEST(Deploy, PostProcessClipRangesCanBeReplaced) {
  DeployOptions o;
  o.model_name = "m";
  std::string seen_ranges;
  o.post_process_clip_ranges = [&](const std::string& ranges, std::string* model) {
    seen_ranges = ranges;
    auto g = OnnxGraph::parse(*model);
    g.graph().set_name("edited");
    *model = g.serialize();
    auto j = nlohmann::ordered_json::parse(ranges);
    j["extra"] = 1.5;
    return j.dump();
  };
  auto out = get_translator("tensorrt")(sample(), o);
  EXPECT_EQ(nlohmann::ordered_json::parse(seen_ranges).size(), 2u);  // x, r
  auto j = nlohmann::json::parse(out.files[0].contents);
  EXPECT_DOUBLE_EQ(j.at("tensorrt").at("blob_range").at("extra").get<double>(), 1.5);
  EXPECT_EQ(OnnxGraph::parse(out.files[1].contents).graph().name(), "edited");

  EXPECT_THROW(get_translator("tengine_u8")(sample(), o), DeployError) << "1.5 is not [s, z]";
  o.post_process_clip_ranges = [](const std::string& ranges, std::string*) {
    auto j = nlohmann::ordered_json::parse(ranges);
    j["extra"] = {0.5, 3};
    return j.dump();
  };
  out = get_translator("tengine_u8")(sample(), o);  // [scale, zero_point] entries, text lines
  EXPECT_NE(out.files[0].contents.find("\nextra 0.5 3\n"), std::string::npos) << out.files[0].contents;

  o.post_process_clip_ranges = [](const std::string&, std::string*) { return std::string("[1]"); };
  for (const char* t : {"tensorrt", "snpe", "pplw8a16", "pplcuda", "tengine_u8"}) {
    EXPECT_THROW(get_translator(t)(sample(), o), DeployError) << t;
  }
}

TEST(Deploy, QdqRewriteSaturatesNarrowRangesAndRefusesWideOnes) {
  auto g = sample(0, 15);
  to_qdq(g, QdqOptions{});
  EXPECT_EQ(count(g, "QuantizeLinear"), 3);
  EXPECT_EQ(count(g, "DequantizeLinear"), 3);
  EXPECT_EQ(count(g, "Clip"), 3);  // 4-bit activations and the [-127, 127] weight
  EXPECT_EQ(g.graph().node(g.graph().node_size() - 1).output(0), "y");
  auto wide = sample(0, 65535);
  try {
    to_qdq(wide, QdqOptions{});
    FAIL() << "a 16-bit range has no QDQ form";
  } catch (const DeployError& e) {
    EXPECT_NE(std::string(e.what()).find("fq_x"), std::string::npos) << e.what();
  }
  auto trt = sample(0, 15);
  QdqOptions o;
  o.tensorrt = true;
  EXPECT_THROW(to_qdq(trt, o), DeployError);  // 4-bit is not TensorRT's
}

TEST(Deploy, CorruptInputIsADeployError) {
  const std::string bytes = sample().serialize();
  EXPECT_THROW(OnnxGraph::parse(""), DeployError);
  EXPECT_THROW(OnnxGraph::parse(bytes.substr(0, bytes.size() / 2)), DeployError);
  EXPECT_THROW(OnnxGraph::parse(std::string(100, '\xff')), DeployError);
  EXPECT_THROW(OnnxGraph::load("/nonexistent/model.onnx"), DeployError);
  // A scale that is not a constant
  auto g = sample();
  g.graph().mutable_node(0)->set_input(1, "computed_somewhere");
  g.reindex();
  EXPECT_THROW(find_fake_quants(g), DeployError);
}

TEST(Deploy, WritesAtomicallyAndRefusesBadOutputPaths) {
  const fs::path dir = fs::temp_directory_path() / ("mqbench_deploy_test_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  EXPECT_EQ(write_atomically(dir.string(), {{"a.txt", "A"}, {"b.txt", "B"}}).size(), 2u);
  EXPECT_THROW(write_atomically(dir.string(), {{"c.txt", "C"}, {"bad/name", "D"}}), DeployError);
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(dir)) left.push_back(e.path().filename().string());
  std::sort(left.begin(), left.end());
  EXPECT_EQ(left, (std::vector<std::string>{"a.txt", "b.txt"}));  // no c.txt, no temporaries
  EXPECT_THROW(check_output_dir((dir / "a.txt").string()), DeployError);
  EXPECT_THROW(check_output_dir((dir / "a.txt" / "sub").string()), DeployError);
  fs::remove_all(dir);
}

namespace {
std::string read_all(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}
std::vector<std::string> listing(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}
}  // namespace

// The second rename fails (a folder holds that name): the first name gets its old file back.
TEST(Deploy, AFailedCommitLeavesTheOldSetWhole) {
  const fs::path dir = fs::temp_directory_path() / ("mqbench_commit_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  write_atomically(dir.string(), {{"a.json", "old a"}});
  fs::create_directories(dir / "b.onnx" / "keep");
  EXPECT_THROW(write_atomically(dir.string(),
                               {{"a.json", "new a"}, {"b.onnx", "new b"}, {"c.txt", "new c"}}),
               DeployError);
  EXPECT_EQ(read_all(dir / "a.json"), "old a");
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"a.json", "b.onnx"}));  // no c.txt, no temporaries
  fs::remove_all(dir / "b.onnx");
  EXPECT_THROW(write_atomically(dir.string(), {{"x", "1"}, {"x", "2"}}), DeployError);  // one name twice
  EXPECT_EQ(write_atomically(dir.string(), {{"a.json", "new a"}, {"b.onnx", "new b"}}).size(), 2u);
  EXPECT_EQ(read_all(dir / "a.json"), "new a");
  EXPECT_EQ(listing(dir), (std::vector<std::string>{"a.json", "b.onnx"}));  // the old a's link is gone
  fs::remove_all(dir);
}

// Threads deploying different sets into one folder: after each round, one whole set is there.
TEST(Deploy, ConcurrentDeploysLeaveOneCompleteSet) {
  const fs::path dir = fs::temp_directory_path() / ("mqbench_race_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  constexpr int kThreads = 6, kFiles = 8;
  int mixed = 0;
  for (int round = 0; round < 40; ++round) {
    std::atomic<int> ready{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        const std::string id = std::to_string(round) + "/" + std::to_string(t);
        std::vector<Artifact> set;
        for (int f = 0; f < kFiles; ++f) set.push_back({"m" + std::to_string(f), id});
        for (++ready; ready < kThreads;) std::this_thread::yield();  // start together
        write_atomically(dir.string(), set);
      });
    }
    for (auto& th : threads) th.join();
    const std::string first = read_all(dir / "m0");
    for (int f = 1; f < kFiles; ++f) mixed += read_all(dir / ("m" + std::to_string(f))) != first;
  }
  EXPECT_EQ(mixed, 0);
  EXPECT_EQ(listing(dir).size(), static_cast<size_t>(kFiles));
  fs::remove_all(dir);
}

// ---- Hardening (issue "Hardening"): indices from the file, recursion, files ------------------

namespace {
// A graph whose only fake-quantize node takes its scale through `chain` (built by the caller).
OnnxGraph with_scale_chain(const std::function<void(onnx::GraphProto*)>& chain) {
  auto g = sample();
  auto m = g.model();
  chain(m.mutable_graph());
  m.mutable_graph()->mutable_node(0)->set_input(1, "s_chain");
  return OnnxGraph(std::move(m));
}
}  // namespace

TEST(Deploy, AxesAndShapesReadFromTheModelAreChecked) {
  // s_x is a scalar: Unsqueeze gives rank 1, whose only axes are 0 and -1.
  for (int64_t axis : {-100, -2, 1, 100}) {
    auto g = with_scale_chain([&](onnx::GraphProto* gp) {
      auto* n = add_node(gp, "Unsqueeze", "unsq", {"s_x"}, {"s_chain"});
      auto* a = n->add_attribute();
      a->set_name("axes");
      a->set_type(onnx::AttributeProto::INTS);
      a->add_ints(axis);
    });
    ConstTensor c;
    EXPECT_THROW(g.constant("s_chain", &c), DeployError) << axis;
  }
  auto ok = with_scale_chain([&](onnx::GraphProto* gp) {
    auto* n = add_node(gp, "Unsqueeze", "unsq", {"s_x"}, {"s_chain"});
    auto* a = n->add_attribute();
    a->set_name("axes");
    a->set_type(onnx::AttributeProto::INTS);
    a->add_ints(-1);
  });
  ConstTensor c;
  ASSERT_TRUE(ok.constant("s_chain", &c));
  EXPECT_EQ(c.dims, std::vector<int64_t>{1});
  // Reshape to a shape that does not hold the values, or with two -1s.
  for (std::vector<double> shape : {std::vector<double>{4}, {-1, -1}, {-5}}) {
    auto g = with_scale_chain([&](onnx::GraphProto* gp) {
      *gp->add_initializer() = make_tensor("shape", onnx::TensorProto::INT64,
                                           {static_cast<int64_t>(shape.size())}, shape);
      add_node(gp, "Reshape", "resh", {"s_x", "shape"}, {"s_chain"});
    });
    EXPECT_THROW(g.constant("s_chain", &c), DeployError);
  }
  // A tensor whose dims overflow or are negative.
  onnx::TensorProto t = make_tensor("t", onnx::TensorProto::FLOAT, {1}, {1.0});
  t.clear_dims();
  t.add_dims(-1);
  EXPECT_THROW(to_const(t), DeployError);
  t.clear_dims();
  for (int i = 0; i < 3; ++i) t.add_dims(int64_t(1) << 40);
  EXPECT_THROW(to_const(t), DeployError);
}

// Found by tests/fuzz (UBSan): numbers from the file converted to integers without a check, and
// shapes that disagree with the data they describe.
TEST(Deploy, NumbersAndShapesFromTheFileAreCheckedBeforeUse) {
  auto refused = [](OnnxGraph g, const std::string& needle) {
    for (const char* backend : {"Tensorrt", "QDQ", "OPENVINO"}) {
      try {
        translate(g, backend, DeployOptions{});
        ADD_FAILURE() << backend << " deployed a model with '" << needle << "'";
      } catch (const DeployError& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
    }
  };
  auto set_init = [](OnnxGraph* g, const std::string& name, onnx::TensorProto t) {
    for (auto& i : *g->graph().mutable_initializer()) {
      if (i.name() == name) i = std::move(t);
    }
    g->reindex();
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double zp : {nan, std::numeric_limits<double>::infinity(), 1e300}) {
    auto g = sample();  // a float zero point NaN / inf / beyond int64: was a UB cast
    set_init(&g, "z_y", make_tensor("z_y", onnx::TensorProto::FLOAT, {1}, {zp}));
    refused(std::move(g), "zero point: ");
  }
  auto wide = sample();  // quant_max near INT64_MAX: quant_max - quant_min overflowed (ONNX_QNN)
  set_init(&wide, "qmax", make_tensor("qmax", onnx::TensorProto::INT64, {}, {9.2e18}));
  refused(std::move(wide), "exceeds +-2^32");
  // ONNX_QNN's integer bias (bias / (input scale * weight scale)) was -5.5e40 for a fuzzed model
  // and converted to int32 regardless (tests/fuzz/corpus/regression__onnx_qnn_*): every integer
  // tensor the passes write checks its values.
  EXPECT_THROW(make_tensor("b", onnx::TensorProto::INT32, {1}, {-5.5e40}), DeployError);
  EXPECT_THROW(make_tensor("w", onnx::TensorProto::UINT8, {1}, {nan}), DeployError);
  EXPECT_THROW(make_tensor("w", onnx::TensorProto::INT8, {1}, {128.0}), DeployError);
  EXPECT_NO_THROW(make_tensor("w", onnx::TensorProto::INT8, {2}, {-128.0, 127.0}));
  EXPECT_NO_THROW(make_tensor("i", onnx::TensorProto::INT64, {1}, {-9223372036854775808.0}));
  auto short_weight = sample();  // dims say 2x1x1x1, data holds one float
  auto w = make_tensor("W", onnx::TensorProto::FLOAT, {2, 1, 1, 1}, {0.5, -3.0});
  w.set_raw_data(w.raw_data().substr(0, 4));
  set_init(&short_weight, "W", w);
  refused(std::move(short_weight), "initializer 'W' has a shape of 2 elements but holds 1");
  for (int64_t axis : {int64_t(-5), int64_t(4), int64_t(1) << 40}) {
    auto g = sample();  // the weight quantizer's ch_axis outside the weight's rank 4
    for (auto& a : *g.graph().mutable_node(1)->mutable_attribute()) {
      if (a.name() == "ch_axis") a.set_i(axis);
    }
    if (!find_attribute(g.graph().node(1), "ch_axis")) add_int_attr(g.graph().mutable_node(1), "ch_axis", axis);
    g.reindex();
    refused(std::move(g), "channel axis " + std::to_string(axis) + " is out of range");
  }
}

TEST(Deploy, CyclesAndLongChainsAreErrorsNotStackOverflows) {
  auto cycle = with_scale_chain([](onnx::GraphProto* gp) {
    add_node(gp, "Identity", "id_a", {"s_b"}, {"s_chain"});
    add_node(gp, "Identity", "id_b", {"s_chain"}, {"s_b"});
  });
  ConstTensor c;
  EXPECT_THROW(cycle.constant("s_chain", &c), DeployError);
  EXPECT_THROW(get_translator("tensorrt")(std::move(cycle), DeployOptions{}), DeployError);
  auto chain = with_scale_chain([](onnx::GraphProto* gp) {
    std::string prev = "s_x";
    for (int i = 0; i < 100000; ++i) {
      const std::string out = i + 1 == 100000 ? "s_chain" : "c" + std::to_string(i);
      add_node(gp, "Identity", "id" + std::to_string(i), {prev}, {out});
      prev = out;
    }
  });
  EXPECT_THROW(chain.constant("s_chain", &c), DeployError);
}

// x -> fq_x -> 100k alternating Flatten / Reshape -> fq_y -> y, or x -> fq_x -> 100k Relu -> Concat
// -> fq_y -> y (a 100k fan-out). Range propagation walked the chain once per node (recursively:
// 20k nodes took 68 s, 100k overflowed the stack), and rewiring a fan-out was quadratic.
OnnxGraph large_graph(bool fan_out, int n) {
  OnnxGraph g = sample();
  auto& m = g.model();
  auto* gp = m.mutable_graph();
  gp->clear_node();
  gp->clear_output();
  typed(gp->add_output(), "y", fan_out ? 4 : 2);
  *gp->add_initializer() = make_tensor("shape", onnx::TensorProto::INT64, {2}, {1, -1});
  add_node(gp, "FixedPerTensorAffine", "fq_x", {"x", "s_x", "z_x", "qmin", "qmax"}, {"t0"}, "mqbench");
  std::vector<std::string> cat;
  std::string prev = "t0";
  for (int i = 0; i < n; ++i) {
    const std::string out = "t" + std::to_string(i + 1);
    if (fan_out) {
      add_node(gp, "Relu", "n" + std::to_string(i), {"t0"}, {out});
      cat.push_back(out);
    } else if (i % 2) {
      add_node(gp, "Reshape", "n" + std::to_string(i), {prev, "shape"}, {out});
    } else {
      add_node(gp, "Flatten", "n" + std::to_string(i), {prev}, {out});
    }
    prev = out;
  }
  if (fan_out) add_int_attr(add_node(gp, "Concat", "cat", cat, {prev = "c"}), "axis", 0);
  add_node(gp, "FixedPerTensorAffine", "fq_y", {prev, "s_x", "z_x", "qmin", "qmax"}, {"y"}, "mqbench");
  g.reindex();
  return g;
}

TEST(Deploy, PassesAreLinearOnLongChainsAndWideFanOuts) {
  for (bool fan_out : {false, true}) {
    const auto g = large_graph(fan_out, 100000);
    for (const char* t : {"tensorrt", "stpu", "nnie"}) {
      const auto start = std::chrono::steady_clock::now();
      DeployOptions o;
      o.model_name = "m";
      const auto out = get_translator(t)(g, o);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      // About 2 s each here (2 cores); the quadratic passes needed tens of minutes.
      EXPECT_LT(seconds, 60.0) << t << (fan_out ? " fan-out" : " chain");
      if (std::string(t) == "tensorrt") {
        const auto ranges = nlohmann::json::parse(out.files[0].contents).at("tensorrt").at("blob_range");
        // the chain: every Flatten / Reshape input gets the range found downstream (fq_y's)
        EXPECT_EQ(ranges.size(), fan_out ? 2u : 100001u);
        if (!fan_out) EXPECT_EQ(ranges.at("t1"), ranges.at("t100000"));
      }
    }
  }
}

TEST(Deploy, OnlyRegularFilesOfBoundedSizeAreRead) {
  EXPECT_THROW(OnnxGraph::load("/dev/zero"), DeployError);
  EXPECT_THROW(OnnxGraph::load(fs::temp_directory_path().string()), DeployError);
}

TEST(Deploy, NamesStayInsideTheOutputFolder) {
  const fs::path dir = fs::temp_directory_path() / ("mqbench_names_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  DeployOptions o;
  o.output_dir = (dir / "out").string();
  const std::vector<std::string> bad_names{"../x", "/tmp/x", std::string("a\0b", 3), ".", "..",
                                           "", std::string(201, 'n')};
  for (const auto& bad : bad_names) {
    o.model_name = bad;
    EXPECT_THROW(deploy(sample().serialize(), "Tensorrt", o), DeployError) << bad;
    EXPECT_THROW(write_atomically(o.output_dir, {{bad, "x"}}), DeployError) << bad;
  }
  EXPECT_FALSE(fs::exists(dir / "x"));
  EXPECT_FALSE(fs::exists(dir / "x_clip_ranges.json"));
  fs::remove_all(dir);
}

TEST(Deploy, TemporariesAreExclusiveAndSymlinksAreReplacedNotFollowed) {
  const fs::path dir = fs::temp_directory_path() / ("mqbench_links_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir / "out");
  {
    std::ofstream victim(dir / "victim.txt");
    victim << "precious";
  }
  // The old predictable temporary name, and the final name, both planted as symlinks.
  fs::create_symlink(dir / "victim.txt", dir / "out" / (".m.onnx.tmp" + std::to_string(::getpid())));
  fs::create_symlink(dir / "victim.txt", dir / "out" / "m.onnx");
  const auto written = write_atomically((dir / "out").string(), {{"m.onnx", "new"}});
  ASSERT_EQ(written.size(), 1u);
  EXPECT_FALSE(fs::is_symlink(dir / "out" / "m.onnx"));
  std::ifstream victim(dir / "victim.txt");
  std::string content((std::istreambuf_iterator<char>(victim)), std::istreambuf_iterator<char>());
  EXPECT_EQ(content, "precious");
  std::ifstream out(dir / "out" / "m.onnx");
  std::string got((std::istreambuf_iterator<char>(out)), std::istreambuf_iterator<char>());
  EXPECT_EQ(got, "new");
  // Readable artifacts (mkstemp creates 0600): 0644 less the umask.
  const auto perms = fs::status(dir / "out" / "m.onnx").permissions();
  EXPECT_NE(perms & fs::perms::owner_read, fs::perms::none);
  fs::remove_all(dir);
}

TEST(Deploy, DeployFileNeverOverwritesItsInput) {
  const fs::path dir = fs::temp_directory_path() / ("mqbench_input_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string bytes = sample(-128, 127).serialize();
  {
    std::ofstream f(dir / "net.onnx", std::ios::binary);
    f << bytes;
  }
  DeployOptions o;
  o.output_dir = dir.string();
  o.model_name = "net";  // QDQ writes <name>.onnx: the input itself
  EXPECT_THROW(deploy_file((dir / "net.onnx").string(), "QDQ", o), DeployError);
  std::ifstream f(dir / "net.onnx", std::ios::binary);
  std::string after((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  EXPECT_EQ(after, bytes);
  o.model_name = "net_qdq";
  EXPECT_EQ(deploy_file((dir / "net.onnx").string(), "QDQ", o).size(), 1u);
  fs::remove_all(dir);
}

// x -> NNIE's quantizer -> Conv(W via NNIE's quantizer) -> y, in MQBench 1.10's custom-node form
// or MQBench main's QuantizeLinear form (data_max attribute), as the NNIE backend prepares it.
OnnxGraph nnie_sample(bool qdq_form) {
  auto m = empty_model("nnie");
  auto* g = m.mutable_graph();
  typed(g->add_input(), "x", 4);
  typed(g->add_output(), "y", 4);
  *g->add_initializer() = make_tensor("W", onnx::TensorProto::FLOAT, {2, 1, 1, 1}, {0.5, -3.0});
  for (const char* t : {"x", "W"}) {
    const std::string in = t, out = in + "q";
    if (qdq_form) {
      *g->add_initializer() = make_tensor("s_" + in, onnx::TensorProto::FLOAT, {}, {1.0});
      *g->add_initializer() = make_tensor("z_" + in, onnx::TensorProto::UINT8, {}, {0});
      auto* q = add_node(g, "QuantizeLinear", "fq_" + in, {in, "s_" + in, "z_" + in}, {in + "_i"});
      auto* a = q->add_attribute();
      a->set_name("data_max");
      a->set_type(onnx::AttributeProto::FLOAT);
      a->set_f(2.5f);
      add_node(g, "DequantizeLinear", "dq_" + in, {in + "_i", "s_" + in, "z_" + in}, {out});
    } else {
      *g->add_initializer() = make_tensor("dm_" + in, onnx::TensorProto::FLOAT, {1}, {2.5});
      add_node(g, "NNIEQuantize", "fq_" + in, {in, "dm_" + in}, {out}, "mqbench");
    }
  }
  add_node(g, "Conv", "conv", {"xq", "Wq"}, {"y"});
  return OnnxGraph(std::move(m));
}

// NNIE's quantizer has data_max only (no scale, no zero point): the NNIE translator deploys it and
// every other backend refuses it by name (Academic keeps the fake-quant model and warns); before,
// seven of them indexed an empty scale list.
TEST(Deploy, NnieQuantizersDeployOnNnieAndAreRefusedElsewhere) {
  for (bool qdq_form : {false, true}) {
    DeployOptions o;
    o.model_name = "m";
    const auto out = get_translator("nnie")(nnie_sample(qdq_form), o);
    EXPECT_FALSE(out.files.empty());
    for (const auto& backend : mqbench::backend_names()) {
      const std::string t = translator_of_backend(backend);
      if (t == "nnie") continue;
      // Tensorrt_NLP's translator is Academic's, after its float-layer check
      const bool academic = t == "academic" || t == "tensorrt_nlp";
      if (academic && qdq_form) {
        // MQBench main's form: a QuantizeLinear with a data_max attribute, which onnx's checker
        // (and so any runtime) refuses; Academic would keep it as it is, so it refuses instead.
        try {
          get_translator(t)(nnie_sample(qdq_form), o);
          ADD_FAILURE() << "Academic kept a QuantizeLinear with a data_max attribute";
        } catch (const DeployError& e) {
          EXPECT_NE(std::string(e.what()).find("data_max for operator QuantizeLinear"),
                    std::string::npos) << e.what();
          EXPECT_NE(std::string(e.what()).find("fq_x"), std::string::npos) << e.what();
        }
        continue;
      }
      if (academic) {  // keeps the fake-quant model when a range has no QDQ form, and says so
        const auto kept = get_translator(t)(nnie_sample(qdq_form), o);
        ASSERT_EQ(kept.files.size(), 1u);
        ASSERT_EQ(kept.notes.size(), 1u);
        EXPECT_NE(kept.notes[0].find("fq_x"), std::string::npos) << kept.notes[0];
        continue;
      }
      try {
        get_translator(t)(nnie_sample(qdq_form), o);
        ADD_FAILURE() << backend << " deployed NNIE's quantizer";
      } catch (const DeployError& e) {
        EXPECT_NE(std::string(e.what()).find("fq_x"), std::string::npos) << backend << ": " << e.what();
        EXPECT_NE(std::string(e.what()).find("NNIE"), std::string::npos) << backend << ": " << e.what();
      }
    }
  }
  // A data_max that is NaN, infinite or negative would be written as the clip value.
  for (double bad : {std::nan(""), std::numeric_limits<double>::infinity(), -1.0}) {
    auto g = nnie_sample(false);
    *g.mutable_initializer("dm_x") = make_tensor("dm_x", onnx::TensorProto::FLOAT, {1}, {bad});
    try {
      get_translator("nnie")(g, DeployOptions{});
      ADD_FAILURE() << "data_max " << bad << " deployed";
    } catch (const DeployError& e) {
      EXPECT_NE(std::string(e.what()).find("data_max"), std::string::npos) << e.what();
    }
  }
  // Zero is a quantizer calibrated on all-zero data (a zero-initialised layer): its range is
  // {0}, deployed as such, with a note naming it.
  auto g = nnie_sample(false);
  *g.mutable_initializer("dm_x") = make_tensor("dm_x", onnx::TensorProto::FLOAT, {1}, {0.0});
  const auto out = get_translator("nnie")(g, DeployOptions{});
  ASSERT_EQ(out.notes.size(), 1u);
  EXPECT_NE(out.notes[0].find("fq_x"), std::string::npos) << out.notes[0];
  EXPECT_NE(out.notes[0].find("quantizes to 0"), std::string::npos) << out.notes[0];
}

// A broken model (a dangling input, a tensor produced twice, an output nobody produces) is an
// error naming the tensor; before, Tensorrt deployed it (exit 0) and wrote a broken model.
TEST(Deploy, BrokenGraphStructureIsRefused) {
  auto expect_refused = [](OnnxGraph g, const std::string& needle,
                           const std::string& backend = "Tensorrt") {
    try {
      translate(std::move(g), backend, DeployOptions{});
      ADD_FAILURE() << "deployed a graph with '" << needle << "'";
    } catch (const DeployError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  auto dangling = sample();
  dangling.graph().mutable_node(3)->set_input(0, "nowhere");  // relu reads a missing tensor
  dangling.reindex();
  expect_refused(std::move(dangling), "reads 'nowhere'");
  auto twice = sample();
  twice.graph().mutable_node(3)->set_output(0, "c");  // relu's output is conv's too
  twice.reindex();
  expect_refused(std::move(twice), "tensor 'c'");
  auto no_output = sample();
  no_output.graph().mutable_output(0)->set_name("ghost");
  no_output.reindex();
  expect_refused(std::move(no_output), "graph output 'ghost'");
  auto init_twice = sample();
  *init_twice.graph().add_initializer() = make_tensor("W", onnx::TensorProto::FLOAT, {1}, {1.0});
  init_twice.reindex();
  expect_refused(std::move(init_twice), "initializer 'W'");
  // Found by tests/fuzz: Tengine read the input of a Relu that had none (UBSan: null Rep).
  auto no_input = sample();
  no_input.graph().mutable_node(3)->clear_input();
  no_input.reindex();
  expect_refused(std::move(no_input), "'relu' (Relu) has 0 input(s); ONNX requires at least 1",
                 "Tengine_u8");
  auto no_node_output = sample();
  no_node_output.graph().mutable_node(2)->clear_output();
  no_node_output.reindex();
  expect_refused(std::move(no_node_output), "'conv' (Conv) has no output");
  EXPECT_NO_THROW(sample().check_structure("sample"));
}

// Found by the deploy fuzzer (CI, PPLCUDA): a tensor name holding a '\n' ended its line of the
// PPL CUDA clip-ranges file early and forged another ("x\nforged: 1"). ONNX names are any
// string; the line-based text files (PPLCUDA's, Tengine's space-separated one, Tensorrt's
// calibration cache) refuse what they cannot hold, and the JSON files escape it.
TEST(Deploy, TextArtifactsRefuseTensorNamesTheirLinesCannotHold) {
  const auto renamed = [](const std::string& to) {
    auto g = sample();
    for (auto& v : *g.graph().mutable_input()) {
      if (v.name() == "x") v.set_name(to);
    }
    for (auto& n : *g.graph().mutable_node()) {
      for (auto& in : *n.mutable_input()) {
        if (in == "x") in = to;
      }
    }
    g.reindex();
    return g;
  };
  const auto refused = [&](const std::string& name, const char* backend, const std::string& needle) {
    try {
      translate(renamed(name), backend, DeployOptions{});
      ADD_FAILURE() << backend << " deployed a tensor named '" << name << "'";
    } catch (const DeployError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused("x\nforged: 1", "PPLCUDA", "tensor name 'x\\x0aforged: 1' holds a control character");
  refused("x\rcr", "PPLCUDA", "x\\x0dcr");
  refused("x\nforged 1 0", "Tengine_u8", "holds a space or a control character");
  refused("x y", "Tengine_u8", "tensor name 'x\\x20y'");
  refused("x\nforged: 3f800000", "Tensorrt", "tensor name 'x\\x0aforged: 3f800000' holds a control");
  // JSON escapes any name: the key reads back whole.
  for (const char* backend : {"SNPE"}) {
    const auto out = translate(renamed("x y\n"), backend, DeployOptions{});
    bool found = false;
    for (const auto& f : out.files) {
      if (f.file_name.size() < 5 || f.file_name.substr(f.file_name.size() - 5) != ".json") continue;
      const auto j = nlohmann::json::parse(f.contents);
      found = found || j.dump().find("\"x y\\n\"") != std::string::npos;
    }
    EXPECT_TRUE(found) << backend;
  }
  // A space is one more character of a name in PPL CUDA's "<tensor>: <clip>" lines, and in
  // the calibration cache's "<tensor>: <scale>" ones; a ": " in a name too (the scale follows
  // the last one).
  const auto ppl = translate(renamed("x y"), "PPLCUDA", DeployOptions{});
  EXPECT_NE(ppl.files.at(0).contents.find("x y: "), std::string::npos) << ppl.files.at(0).contents;
  const auto trt = translate(renamed("x: y"), "Tensorrt", DeployOptions{});
  EXPECT_NE(trt.files.at(2).contents.find("\nx: y: 3d4ccccd\n"), std::string::npos)
      << trt.files.at(2).contents;
  EXPECT_NE(trt.files.at(0).contents.find("\"x: y\""), std::string::npos);  // the JSON's key
}

// Found by a fuzz campaign (STPU): a Conv followed by a Mul by a one-element constant of rank 5
// had the constant absorbed into its weight, which dropped the rank the Mul's broadcast had added;
// a later Resize's scales then no longer matched its input and onnxruntime refused the file. A
// factor that broadcasts to the Conv's own shape (a scalar, [1], [1,1,1,1]) is absorbed; a wider
// one stays a Mul.
TEST(Deploy, StpuAbsorbsOnlyAMulThatKeepsTheConvsShape) {
  for (const std::vector<int64_t>& dims :
       {std::vector<int64_t>{}, {1}, {1, 1, 1, 1}, {1, 1, 1, 1, 1}}) {
    auto g = sample();
    auto* graph = &g.graph();
    *graph->add_initializer() = make_tensor("k", onnx::TensorProto::FLOAT, dims, {2.0});
    for (auto& n : *graph->mutable_node()) {
      if (n.name() == "relu") n.set_input(0, "m");
      if (n.name() == "fq_w") {  // STPU quantizes weights per tensor
        n = onnx::NodeProto();
        n.set_name("fq_w");
      }
    }
    for (auto& n : *graph->mutable_node()) {
      if (n.name() != "fq_w") continue;
      n.set_op_type("FixedPerTensorAffine");
      n.set_domain("mqbench");
      for (const char* in : {"W", "s_x", "z_x", "qmin", "qmax"}) n.add_input(in);
      n.add_output("Wq");
    }
    add_node(graph, "Mul", "mul", {"c", "k"}, {"m"});
    auto* shape = graph->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape();
    shape->clear_dim();  // the output's rank is the Mul's: 5 for the widest constant
    for (size_t d = 0; d < std::max<size_t>(4, dims.size()); ++d) shape->add_dim();
    g.reindex();
    const auto out = translate(std::move(g), "STPU", DeployOptions{});
    onnx::ModelProto written;
    ASSERT_TRUE(written.ParseFromString(out.files.at(1).contents)) << out.files.at(1).file_name;
    int muls = 0;
    for (const auto& n : written.graph().node()) muls += n.op_type() == "Mul";
    EXPECT_EQ(muls, dims.size() > 4 ? 1 : 0) << "constant of rank " << dims.size();
  }
}

TEST(Deploy, TranslatorRegistryAndBackendSpecs) {
  for (const char* name : {"Academic", "Tensorrt", "SNPE", "PPLW8A16", "NNIE", "Vitis", "ONNX_QNN",
                           "PPLCUDA", "OPENVINO", "Tengine_u8", "Tensorrt_NLP", "Academic_NLP",
                           "STPU", "QDQ"}) {
    EXPECT_NO_THROW(get_translator(translator_of_backend(name))) << name;
  }
  try {
    get_translator("nope");
    FAIL();
  } catch (const DeployError& e) {
    EXPECT_NE(std::string(e.what()).find("tensorrt"), std::string::npos);
  }
  EXPECT_THROW(register_translator("tensorrt", get_translator("qdq")), DeployError);
}

// An application's own backend and translator, registered the documented way.
MQBENCH_REGISTER_DEPLOY_TRANSLATOR(test_chip, "test_chip", [](const OnnxGraph& fakeq, const DeployOptions& o) {
  OnnxGraph g = fakeq;
  const auto removed = remove_fake_quant(g, RemoveOptions{});
  return DeployOutput{{{o.model_name + ".count", std::to_string(removed.size())}}, {}};
});

TEST(Deploy, AnOutsideBackendDeploysThroughItsTranslator) {
  mqbench::BackendSpec s;
  s.name = "DeployTestChip";
  s.deploy_translator = "test_chip";
  mqbench::register_backend(s);
  const fs::path dir = fs::temp_directory_path() / ("mqbench_chip_" + std::to_string(::getpid()));
  DeployOptions o;
  o.model_name = "m";
  o.output_dir = dir.string();
  const auto written = deploy(sample().serialize(), "DeployTestChip", o);
  ASSERT_EQ(written.size(), 1u);
  std::ifstream f(written[0]);
  std::string text;
  f >> text;
  EXPECT_EQ(text, "3");
  fs::remove_all(dir);
}

// ---- Input checked against the ONNX standard ----------------------------------------------

namespace {
// sample() with 8-bit ranges everywhere ([-128, 127]), which every 8-bit translator deploys.
OnnxGraph sample8() {
  auto g = sample(-128, 127);
  for (auto& a : *g.graph().mutable_node(1)->mutable_attribute()) {
    if (a.name() == "quant_min") a.set_i(-128);
  }
  return g;
}

std::string refusal(OnnxGraph g, const std::string& backend = "Tensorrt") {
  try {
    translate(std::move(g), backend, DeployOptions{});
  } catch (const DeployError& e) {
    return e.what();
  }
  return "";
}
}  // namespace

// Found by a fuzz campaign (two SIGSEGVs in to_const): a fake quantizer retyped "QuantizeLinear"
// but left in the mqbench domain, after a Relu. to_qdq left it alone (no group), and ONNX_QNN's
// ReLU merge took it for one of its own quantizers and read a zero point initializer that was not
// there. The translator alone (no input check) must now leave such a node as it is; the deploy
// refuses the model up front, naming the node.
TEST(Deploy, OnnxQnnLeavesForeignQuantizeLinearNodesAlone) {
  for (const char* file : {"regression__onnx_qnn_retyped_quantize_linear_a.onnx",
                           "regression__onnx_qnn_retyped_quantize_linear_b.onnx"}) {
    const std::string path = std::string(MQBENCH_FUZZ_CORPUS) + "/" + file;
    try {
      get_translator("onnx_qnn")(OnnxGraph::load(path), DeployOptions{});
    } catch (const DeployError&) {
      // an error with a message is the contract; the crash was not
    }
    const std::string why = refusal(OnnxGraph::load(path), "ONNX_QNN");
    EXPECT_NE(why.find("the mqbench domain has no op 'QuantizeLinear'"), std::string::npos) << why;
    EXPECT_NE(why.find("/c2_post_act_fake_quantizer/"), std::string::npos) << why;
  }
  // The same shape built by hand: Relu -> QuantizeLinear without a zero point initializer.
  auto g = sample8();
  auto* q = g.graph().mutable_node(4);  // fq_y, after the Relu
  q->set_op_type("QuantizeLinear");
  q->clear_input();
  for (const char* in : {"r", "s_y", "computed_zp"}) q->add_input(in);
  add_node(&g.graph(), "Identity", "zp", {"z_y"}, {"computed_zp"});
  g.optimize();
  try {
    get_translator("onnx_qnn")(g, DeployOptions{});
  } catch (const DeployError&) {
    // an error with a message is the contract
  }
}

// Each node against its schema (libonnx's checker), opset imports, the mqbench domain's ops and
// strict shape inference: a model a runtime would refuse is refused before any pass runs.
TEST(Deploy, InputIsCheckedAgainstTheOnnxStandard) {
  // An Unsqueeze whose axes lie far outside the rank (-100 on a rank-1 constant), feeding a
  // graph output: deployed with exit code 0 before, and onnxruntime refused the written model.
  auto unsq = sample();
  *unsq.graph().add_initializer() = make_tensor("c1", onnx::TensorProto::FLOAT, {2}, {1, 2});
  *unsq.graph().add_initializer() = make_tensor("axes", onnx::TensorProto::INT64, {1}, {-100});
  add_node(&unsq.graph(), "Unsqueeze", "far_unsqueeze", {"c1", "axes"}, {"u"});
  typed(unsq.graph().add_output(), "u", 2);
  unsq.reindex();
  auto why = refusal(unsq);
  EXPECT_NE(why.find("far_unsqueeze"), std::string::npos) << why;
  EXPECT_NE(why.find("shape inference"), std::string::npos) << why;
  // Too many inputs for the schema (a Relu with two).
  auto relu2 = sample();
  relu2.graph().mutable_node(3)->add_input("s_x");
  relu2.reindex();
  why = refusal(relu2);
  EXPECT_NE(why.find("relu"), std::string::npos) << why;
  EXPECT_NE(why.find("onnx's checker"), std::string::npos) << why;
  // An attribute the op does not have.
  auto attr = sample();
  add_int_attr(attr.graph().mutable_node(3), "alpha", 1);
  why = refusal(attr);
  EXPECT_NE(why.find("alpha"), std::string::npos) << why;
  // A node in a domain the model does not import.
  auto domain = sample();
  domain.graph().mutable_node(3)->set_domain("com.example");
  why = refusal(domain);
  EXPECT_NE(why.find("node 'relu' (com.example:Relu) is in domain 'com.example', which the model "
                     "does not import"), std::string::npos) << why;
  // An op the mqbench domain does not have.
  auto foreign = sample();
  foreign.graph().mutable_node(0)->set_op_type("Conv");
  why = refusal(foreign);
  EXPECT_NE(why.find("node 'fq_x' (mqbench:Conv): the mqbench domain has no op 'Conv'"),
            std::string::npos) << why;
  // A domain imported twice, and no IR version.
  auto twice = sample();
  twice.model().add_opset_import()->set_version(11);
  why = refusal(twice);
  EXPECT_NE(why.find("imported twice"), std::string::npos) << why;
  auto no_ir = sample();
  no_ir.model().clear_ir_version();
  why = refusal(no_ir);
  EXPECT_NE(why.find("IR version 0"), std::string::npos) << why;
  // The forms MQBench writes stay accepted: 1.10's nodes in the default domain, main's
  // QuantizeLinear with quant_min / quant_max; and an unsorted (acyclic) graph.
  auto legacy = sample();
  for (auto& n : *legacy.graph().mutable_node()) {
    if (n.domain() == "mqbench") n.set_domain("");
  }
  legacy.drop_opset("mqbench");
  EXPECT_EQ(refusal(legacy), "");
  auto unsorted = sample();
  std::swap(*unsorted.graph().mutable_node(2), *unsorted.graph().mutable_node(3));
  unsorted.reindex();
  EXPECT_EQ(refusal(unsorted), "");
  EXPECT_EQ(refusal(nnie_sample(true), "NNIE"), "");
  for (const char* backend : {"Academic", "Tensorrt", "SNPE", "PPLW8A16", "Vitis", "ONNX_QNN",
                              "PPLCUDA", "OPENVINO", "Tengine_u8", "STPU", "QDQ"}) {
    // (Vitis and STPU refuse the per-channel weight quantizer: a translator's rule, not the check.)
    EXPECT_EQ(refusal(sample8(), backend).find("input model"), std::string::npos) << backend;
  }
}

// Every ONNX file a translator writes passes the same checks (NNIE's Upsample excepted, as its
// toolchain reads it): a translator that would write a model a runtime refuses raises instead.
TEST(Deploy, WrittenModelsPassOnnxsChecker) {
  auto g = sample8();
  DeployOptions o;
  o.model_name = "m";
  for (const char* backend : {"Academic", "Tensorrt", "ONNX_QNN", "QDQ", "OPENVINO", "NNIE"}) {
    if (std::string(backend) == "NNIE") g = nnie_sample(false);
    const auto out = translate(g, backend, o);
    for (const auto& f : out.files) {
      if (f.file_name.size() < 5 || f.file_name.substr(f.file_name.size() - 5) != ".onnx") continue;
      ModelCheckOptions check;
      if (std::string(backend) == "NNIE") check.deprecated_ops_allowed = {"Upsample"};
      EXPECT_NO_THROW(check_model(OnnxGraph::parse(f.contents), f.file_name, check)) << backend;
    }
  }
  // MQBench 1.10's nodes, kept by Academic where a range has no QDQ form, are written in the
  // mqbench domain (which the file imports), where onnx's checker accepts them.
  auto legacy = sample(0, 65535);
  for (auto& n : *legacy.graph().mutable_node()) {
    if (n.domain() == "mqbench") n.set_domain("");
  }
  legacy.drop_opset("mqbench");
  const auto out = translate(legacy, "Academic", o);
  const auto written = OnnxGraph::parse(out.files.at(0).contents);
  EXPECT_EQ(written.opset("mqbench"), 1);
  EXPECT_EQ(written.graph().node(0).domain(), "mqbench");
}

// Found by tests/fuzz/campaign.py: models libonnx 1.12 passes (or crashes on: a zero
// stride divides by zero in its shape inference, a short attribute list is read past) and
// onnx 1.13+ or onnxruntime refuse. Each is refused naming the node.
TEST(Deploy, CampaignFindingsAreRefusedNamingTheNode) {
  const auto with_extra = [](const std::function<void(onnx::GraphProto*)>& add, int rank) {
    auto g = sample();
    add(&g.graph());
    typed(g.graph().add_output(), "extra", rank);
    g.reindex();
    return g;
  };
  const auto resize = [&](std::vector<std::string> inputs, const char* nearest_mode) {
    return with_extra([&](onnx::GraphProto* gp) {
      *gp->add_initializer() = make_tensor("scales", onnx::TensorProto::FLOAT, {4}, {1, 1, 2, 2});
      auto* n = add_node(gp, "Resize", "up", inputs, {"extra"});
      if (nearest_mode) {
        auto* a = n->add_attribute();
        a->set_name("nearest_mode");
        a->set_type(onnx::AttributeProto::STRING);
        a->set_s(nearest_mode);
      }
    }, 4);
  };
  auto why = refusal(resize({"r", ""}, nullptr));
  // (onnx 1.23's shape inference refuses it first; check_inferred's own message stays behind it.)
  EXPECT_NE(why.find("node name: up"), std::string::npos) << why;
  EXPECT_NE(why.find("Either `sizes` or `scales` must be provided"), std::string::npos) << why;
  why = refusal(resize({"r", "", "scales"}, "linear"));
  EXPECT_NE(why.find("node 'up' (Resize): nearest_mode 'linear' is not one ONNX defines"),
            std::string::npos) << why;
  EXPECT_EQ(refusal(resize({"r", "", "scales"}, "floor")), "");
  const auto conv = [&](const char* op, std::vector<int64_t> w_dims, std::vector<int64_t> strides) {
    return with_extra([&](onnx::GraphProto* gp) {
      int64_t n = 1;
      for (auto d : w_dims) n *= d;
      *gp->add_initializer() = make_tensor("w2", onnx::TensorProto::FLOAT, w_dims,
                                           std::vector<double>(static_cast<size_t>(n), 0.5));
      auto* c = add_node(gp, op, "conv2", {"r", "w2"}, {"extra"});
      auto* a = c->add_attribute();
      a->set_name("strides");
      a->set_type(onnx::AttributeProto::INTS);
      for (auto s : strides) a->add_ints(s);
    }, 4);
  };
  why = refusal(conv("Conv", {2, 2, 1, 1}, {0, 1}));
  EXPECT_NE(why.find("node 'conv2' (Conv): strides holds 0"), std::string::npos) << why;
  why = refusal(conv("Conv", {2, 2, 1, 1}, {1}));
  EXPECT_NE(why.find("strides has 1 values for a 2-d kernel"), std::string::npos) << why;
  why = refusal(conv("ConvTranspose", {2}, {1, 1}));
  EXPECT_NE(why.find("node 'conv2' (ConvTranspose): its weight has rank 1"), std::string::npos) << why;
  EXPECT_EQ(refusal(conv("Conv", {2, 2, 1, 1}, {1, 1})), "");
  // The campaign's one crash (SIGSEGV in libonnx's ConvTranspose inference): the weight rewired
  // to a quantizer's zero point, whose rank only inference knows.
  const std::string path =
      std::string(MQBENCH_FUZZ_CORPUS) + "/regression__convtranspose_weight_of_rank_1.onnx";
  why = refusal(OnnxGraph::load(path));
  EXPECT_NE(why.find("node '/deconv/ConvTranspose' (ConvTranspose): its weight has rank 1"),
            std::string::npos) << why;
}

// Found by tests/fuzz/campaign.py: libonnx's Resize inference casts floor(dim * scale)
// to int64 unchecked; a constant scale of 3.9e25 was undefined behaviour under UBSan. Constant
// scales (an initializer or a Constant node) outside (0, 2^24] are refused naming the node
// (Note [Resize scales before shape inference]).
TEST(Deploy, ResizeScalesOutOfRangeAreRefusedBeforeShapeInference) {
  const auto resize = [](std::vector<double> scales, bool as_constant) {
    auto g = sample();
    auto* gp = &g.graph();
    auto t = make_tensor("scales", onnx::TensorProto::FLOAT, {4}, scales);
    if (as_constant) {
      auto* c = add_node(gp, "Constant", "k", {}, {"scales"});
      auto* a = c->add_attribute();
      a->set_name("value");
      a->set_type(onnx::AttributeProto::TENSOR);
      *a->mutable_t() = t;
    } else {
      *gp->add_initializer() = t;
    }
    add_node(gp, "Resize", "up", {"r", "", "scales"}, {"extra"});
    typed(gp->add_output(), "extra", 4);
    g.reindex();
    return g;
  };
  for (const bool as_constant : {false, true}) {
    for (const double bad : {3.9e25, 0.0, -2.0, std::numeric_limits<double>::quiet_NaN(),
                             std::numeric_limits<double>::infinity()}) {
      const auto why = refusal(resize({1, 1, bad, 2}, as_constant));
      EXPECT_NE(why.find("node 'up' (Resize): scale "), std::string::npos) << why;
      EXPECT_NE(why.find("is not a finite factor in (0, 2^24]"), std::string::npos) << why;
    }
    EXPECT_EQ(refusal(resize({1, 1, 2, 2}, as_constant)), "");
  }
  const std::string path =
      std::string(MQBENCH_FUZZ_CORPUS) + "/regression__resize_scale_of_3.9e25.onnx";
  const auto why = refusal(OnnxGraph::load(path));
  EXPECT_NE(why.find("(Resize): scale "), std::string::npos) << why;
}

// Found by the deploy fuzzer (CI, Vitis): a Conv's group of 2^63 - 1 overflowed the product
// weight channels x group that check_inferred compared with the input's channels (UBSan: signed
// overflow). The comparison divides instead; such a group is refused as a channel mismatch.
TEST(Deploy, ConvGroupWhoseProductOverflowsIsRefused) {
  const auto grouped = [](int64_t group) {
    auto g = sample();  // r: [?, 2, ?, ?]
    auto* gp = &g.graph();
    *gp->add_initializer() =
        make_tensor("w2", onnx::TensorProto::FLOAT, {2, 2, 1, 1}, {1, 1, 1, 1});
    auto* c = add_node(gp, "Conv", "conv2", {"r", "w2"}, {"extra"});
    add_int_attr(c, "group", group);
    typed(gp->add_output(), "extra", 4);
    g.reindex();
    return g;
  };
  EXPECT_EQ(refusal(grouped(1)), "");
  for (const int64_t group : {int64_t{2}, std::numeric_limits<int64_t>::max(),
                              int64_t{1} << 62, (int64_t{1} << 62) + 1}) {
    const auto why = refusal(grouped(group));
    EXPECT_NE(why.find("node 'conv2' (Conv)"), std::string::npos) << group << ": " << why;
  }
  const std::string path =
      std::string(MQBENCH_FUZZ_CORPUS) + "/regression__conv_group_int64_max.onnx";
  const auto why = refusal(OnnxGraph::load(path), "Vitis");
  EXPECT_NE(why.find("node '/conv1/Conv' (Conv)"), std::string::npos) << why;
}

// Found by the fuzz campaign (Academic, which keeps an NVFP4 model as it is): a
// ReduceMax with keepdims 127. onnx's shape inference (and onnxruntime) keep a dimension only for
// 1, onnx's reference evaluator for any non-zero value, so there the block scale had a rank the
// checks never saw and the file failed. ONNX's 0 / 1 flags must be 0 or 1.
TEST(Deploy, FlagAttributesOutsideZeroAndOneAreRefused) {
  const auto reduce = [](int64_t keepdims) {
    auto g = sample();
    auto* gp = &g.graph();
    auto* n = add_node(gp, "ReduceMax", "rmax", {"r"}, {"extra"});
    add_int_attr(n, "keepdims", keepdims);
    typed(gp->add_output(), "extra", keepdims ? 4 : 0);
    g.reindex();
    return g;
  };
  EXPECT_EQ(refusal(reduce(1)), "");
  EXPECT_EQ(refusal(reduce(0)), "");
  for (const int64_t bad : {int64_t{127}, int64_t{-1}, int64_t{2}}) {
    const auto why = refusal(reduce(bad));
    EXPECT_NE(why.find("node 'rmax' (ReduceMax): keepdims " + std::to_string(bad) +
                       " is not 0 or 1"), std::string::npos) << why;
  }
  const std::string path =
      std::string(MQBENCH_FUZZ_CORPUS) + "/regression__reducemax_keepdims_127.onnx";
  const auto why = refusal(OnnxGraph::load(path), "Academic");
  EXPECT_NE(why.find("(ReduceMax): keepdims 127 is not 0 or 1"), std::string::npos) << why;
}

// Found by a review after the finding above: a per-channel weight quantizer reading another
// quantizer's output is checked against nothing at read time (its input is not an initializer,
// so any axis below 64 is taken), but remove_fake_quant clips the float weight behind the chain
// with it. An axis past the weight's rank read past its dims (ASan), a scale count short of the
// axis' size threw std::out_of_range. Now a DeployError naming the weight.
TEST(Deploy, ChainedPerChannelQuantizerMustFitTheWeightItClips) {
  const auto chained = [](int64_t ch_axis, std::vector<double> scales) {
    auto g = sample8();  // int8, Tensorrt's scheme: weights are clipped
    auto* gp = &g.graph();
    // W -> FixedPerTensorAffine -> Wt -> (the per-channel weight quantizer) -> Wq
    onnx::NodeProto pre;
    pre.set_op_type("FixedPerTensorAffine");
    pre.set_domain("mqbench");
    pre.set_name("fq_pre");
    for (const char* in : {"W", "s_x", "z_x", "qmin", "qmax"}) pre.add_input(in);
    pre.add_output("Wt");
    for (auto& n : *gp->mutable_node()) {
      if (n.name() != "fq_w") continue;
      n.set_input(0, "Wt");
      n.set_input(1, "s_w2");
      n.set_input(2, "z_w2");
      add_int_attr(&n, "ch_axis", ch_axis);
    }
    *gp->add_node() = pre;
    for (int k = gp->node_size() - 1; k > 0; --k) gp->mutable_node()->SwapElements(k, k - 1);
    const std::vector<int64_t> dims{static_cast<int64_t>(scales.size())};
    *gp->add_initializer() = make_tensor("s_w2", onnx::TensorProto::FLOAT, dims, scales);
    *gp->add_initializer() = make_tensor("z_w2", onnx::TensorProto::FLOAT, dims,
                                         std::vector<double>(scales.size(), 0.0));
    g.reindex();
    return g;
  };
  EXPECT_EQ(refusal(chained(0, {0.01, 0.02})), "");
  for (const char* backend : {"Tensorrt", "SNPE", "PPLW8A16", "PPLCUDA", "Tengine_u8"}) {
    for (const auto& [axis, scales] : std::vector<std::pair<int64_t, std::vector<double>>>{
             {63, {0.01}}, {4, {0.01}}, {0, {0.01}}, {0, {0.01, 0.02, 0.03}}, {1, {0.01, 0.02}}}) {
      const auto why = refusal(chained(axis, scales), backend);
      EXPECT_NE(why.find("fake quantizer 'fq_w': a per-channel quantizer (axis " +
                         std::to_string(axis) + ", " + std::to_string(scales.size()) +
                         " scales) does not fit weight 'W'"), std::string::npos)
          << backend << " axis " << axis << ": " << why;
    }
  }
}

// Found by the same review: a scale stored as a DOUBLE can be finite and still beyond float
// (1e39), or make scale x range overflow double (1e307): ranges then became inf, which JSON
// writes as null. Scales above 2^64 are refused (no calibrated model comes near), and so are
// scales below float's smallest normal number, which the files' float scales hold as 0.
TEST(Deploy, ScalesBeyondAnyRangeAreRefused) {
  for (const double tiny : {1e-50, 1e-39}) {
    auto g = sample8();
    *g.mutable_initializer("s_x") = make_tensor("s_x", onnx::TensorProto::DOUBLE, {}, {tiny});
    const auto why = refusal(g, "QDQ");
    EXPECT_NE(why.find("is below float32's smallest normal number"), std::string::npos) << why;
  }
  for (const double big : {1e39, 1e307, 3.0e19}) {
    for (const char* backend : {"Tensorrt", "SNPE", "PPLW8A16", "Vitis", "ONNX_QNN",
                                "PPLCUDA", "OPENVINO", "Tengine_u8", "STPU", "QDQ"}) {
      auto g = sample8();
      *g.mutable_initializer("s_x") = make_tensor("s_x", onnx::TensorProto::DOUBLE, {}, {big});
      const auto why = refusal(g, backend);
      EXPECT_NE(why.find("node 'fq_x' (FixedPerTensorAffine): scale "), std::string::npos) << why;
      EXPECT_NE(why.find("is above 2^64"), std::string::npos) << backend << " " << big << ": "
                                                               << why;
    }
  }
  // Just below: deployed, every range a number.
  for (const char* backend : {"Tensorrt", "SNPE", "PPLW8A16", "PPLCUDA"}) {
    auto g = sample8();
    *g.mutable_initializer("s_x") = make_tensor("s_x", onnx::TensorProto::DOUBLE, {}, {1.0e19});
    const auto out = translate(g, backend, DeployOptions{});
    for (const auto& f : out.files) {
      if (f.file_name.size() > 5 && f.file_name.substr(f.file_name.size() - 5) == ".onnx") continue;
      EXPECT_EQ(f.contents.find("null"), std::string::npos) << backend << " " << f.file_name;
      EXPECT_EQ(f.contents.find("inf"), std::string::npos) << backend << " " << f.file_name;
    }
  }
}
