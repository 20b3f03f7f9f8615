// The formats of docs/formats.md in the deploy passes: FP8 Q/DQ (float8 zero points, opset 19)
// and blocked integer Q/DQ (block_size, opset 21) are read with their parameters, written back
// by to_qdq (QDQ, Academic, Tensorrt's QDQ model), and refused by name by every backend that
// removes its quantizers. Also the float8 and 4-bit tensor codecs they need.

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "mqbench/backend.h"
#include "mqbench/deploy/check_model.h"
#include "mqbench/deploy/fake_quant.h"
#include "mqbench/deploy/translator.h"
#include "onnx_builders.h"

using namespace mqbench::deploy;
using namespace deploy_test;

namespace {

onnx::ModelProto model_at(int64_t opset, const std::string& name) {
  auto m = empty_model(name);
  m.set_ir_version(10);
  m.mutable_opset_import(0)->set_version(opset);
  return m;
}

// x [2, 8] -> QuantizeLinear(float8, per tensor) -> DequantizeLinear -> Gemm(transB) with the
// weight W [3, 8] through a per-channel (axis 0) FP8 pair -> y.
OnnxGraph fp8_sample(int32_t type = onnx::TensorProto::FLOAT8E4M3FN) {
  auto m = model_at(19, "fp8");
  auto* g = m.mutable_graph();
  set_shape(g->add_input(), "x", {2, 8});
  set_shape(g->add_output(), "y", {2, 3});
  std::vector<double> w(24);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<double>(i)) * 3;
  *g->add_initializer() = make_tensor("W", onnx::TensorProto::FLOAT, {3, 8}, w);
  *g->add_initializer() = make_tensor("s_x", onnx::TensorProto::FLOAT, {}, {0.01});
  *g->add_initializer() = make_tensor("z_x", type, {}, {0});
  *g->add_initializer() = make_tensor("s_w", onnx::TensorProto::FLOAT, {3}, {0.005, 0.006, 0.007});
  *g->add_initializer() = make_tensor("z_w", type, {3}, {0, 0, 0});
  auto* qx = add_node(g, "QuantizeLinear", "fq_x", {"x", "s_x", "z_x"}, {"x8"});
  add_int_attr(qx, "saturate", type == onnx::TensorProto::FLOAT8E4M3FN ? 1 : 0);
  add_node(g, "DequantizeLinear", "dq_x", {"x8", "s_x", "z_x"}, {"xq"});
  auto* qw = add_node(g, "QuantizeLinear", "fq_w", {"W", "s_w", "z_w"}, {"w8"});
  add_int_attr(qw, "axis", 0);
  add_int_attr(add_node(g, "DequantizeLinear", "dq_w", {"w8", "s_w", "z_w"}, {"wq"}), "axis", 0);
  add_int_attr(add_node(g, "Gemm", "gemm", {"xq", "wq"}, {"y"}), "transB", 1);
  return OnnxGraph(std::move(m));
}

// x [2, 64] -> int8 per-tensor Q/DQ -> Gemm(transB) with W [4, 64] through blocked INT4 Q/DQ
// (blocks of 32 on axis 1, Clip to [-8, 7]) -> y.
OnnxGraph blocked_sample(int64_t block = 32, bool zero_zp = false) {
  auto m = model_at(21, "blocked");
  auto* g = m.mutable_graph();
  set_shape(g->add_input(), "x", {2, 64});
  set_shape(g->add_output(), "y", {2, 4});
  std::vector<double> w(256), s(4 * 64 / block), z(s.size(), 0.0);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::cos(static_cast<double>(i)) * 0.3;
  for (size_t i = 0; i < s.size(); ++i) s[i] = 0.01 + 0.001 * static_cast<double>(i);
  if (!zero_zp) z[1] = -1;
  *g->add_initializer() = make_tensor("W", onnx::TensorProto::FLOAT, {4, 64}, w);
  *g->add_initializer() = make_tensor("s_x", onnx::TensorProto::FLOAT, {}, {0.02});
  *g->add_initializer() = make_tensor("z_x", onnx::TensorProto::INT8, {}, {0});
  *g->add_initializer() = make_tensor("s_w", onnx::TensorProto::FLOAT, {4, 64 / block}, s);
  *g->add_initializer() = make_tensor("z_w", onnx::TensorProto::INT8, {4, 64 / block}, z);
  *g->add_initializer() = make_tensor("lo", onnx::TensorProto::INT8, {}, {-8});
  *g->add_initializer() = make_tensor("hi", onnx::TensorProto::INT8, {}, {7});
  add_node(g, "QuantizeLinear", "fq_x", {"x", "s_x", "z_x"}, {"x8"});
  add_node(g, "DequantizeLinear", "dq_x", {"x8", "s_x", "z_x"}, {"xq"});
  auto* qw = add_node(g, "QuantizeLinear", "fq_w", {"W", "s_w", "z_w"}, {"w8"});
  add_int_attr(qw, "axis", 1);
  add_int_attr(qw, "block_size", block);
  add_node(g, "Clip", "clip_w", {"w8", "lo", "hi"}, {"w4"});
  auto* dw = add_node(g, "DequantizeLinear", "dq_w", {"w4", "s_w", "z_w"}, {"wq"});
  add_int_attr(dw, "axis", 1);
  add_int_attr(dw, "block_size", block);
  add_int_attr(add_node(g, "Gemm", "gemm", {"xq", "wq"}, {"y"}), "transB", 1);
  return OnnxGraph(std::move(m));
}

const onnx::NodeProto* node_of(const OnnxGraph& g, const std::string& op, const std::string& input) {
  for (const auto& n : g.graph().node()) {
    if (n.op_type() == op && n.input_size() > 0 && n.input(0) == input) return &n;
  }
  return nullptr;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DeployError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(Formats, Float8AndInt4TensorsDecodeAsTheOnnxSpecSaysAndZerosEncode) {
  auto bytes = [](int32_t type, std::string raw) {
    onnx::TensorProto t;
    t.set_name("t");
    t.set_data_type(type);
    t.add_dims(static_cast<int64_t>(raw.size()));
    t.set_raw_data(raw);
    return to_const(t).values;
  };
  // E4M3FN: 0x7E = 448 (its largest), 0x7F NaN (no infinities), 0x01 = 2^-9 (smallest
  // subnormal), 0x38 = 1, 0xB8 = -1.
  auto e4 = bytes(onnx::TensorProto::FLOAT8E4M3FN, std::string("\x7e\x7f\x01\x38\xb8\x08", 6));
  EXPECT_EQ(e4[0], 448.0);
  EXPECT_TRUE(std::isnan(e4[1]));
  EXPECT_EQ(e4[2], std::ldexp(1.0, -9));
  EXPECT_EQ(e4[3], 1.0);
  EXPECT_EQ(e4[4], -1.0);
  EXPECT_EQ(e4[5], std::ldexp(1.0, -6));  // smallest normal
  // E5M2: 0x7B = 57344, 0x7C = inf, 0xFC = -inf, 0x7D NaN, 0x01 = 2^-16, 0x3C = 1.
  auto e5 = bytes(onnx::TensorProto::FLOAT8E5M2, std::string("\x7b\x7c\xfc\x7d\x01\x3c", 6));
  EXPECT_EQ(e5[0], 57344.0);
  EXPECT_EQ(e5[1], std::numeric_limits<double>::infinity());
  EXPECT_EQ(e5[2], -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(e5[3]));
  EXPECT_EQ(e5[4], std::ldexp(1.0, -16));
  EXPECT_EQ(e5[5], 1.0);
  // Every finite float8 value encodes to the byte it came from (0 and -0 both read as 0).
  for (int32_t type : {onnx::TensorProto::FLOAT8E4M3FN, onnx::TensorProto::FLOAT8E5M2}) {
    std::string all;
    for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
    const auto values = bytes(type, all);
    for (int b = 1; b < 256; ++b) {
      if (!std::isfinite(values[b]) || b == 0x80) continue;
      const auto t = make_tensor("v", type, {}, {values[b]});
      EXPECT_EQ(static_cast<unsigned char>(t.raw_data()[0]), b) << type << " " << values[b];
    }
    EXPECT_THROW(make_tensor("v", type, {}, {0.3}), DeployError);  // no exact encoding
  }
  // INT4 / UINT4: two to a byte, low nibble first; three values in two bytes, read and written.
  onnx::TensorProto i4;
  i4.set_name("i4");
  i4.set_data_type(onnx::TensorProto::INT4);
  i4.add_dims(3);
  i4.set_raw_data(std::string("\x8f\x07", 2));
  EXPECT_EQ(to_const(i4).values, (std::vector<double>{-1, -8, 7}));
  i4.set_data_type(onnx::TensorProto::UINT4);
  EXPECT_EQ(to_const(i4).values, (std::vector<double>{15, 8, 7}));
  EXPECT_EQ(make_tensor("i4", onnx::TensorProto::UINT4, {3}, {15, 8, 7}).raw_data(), i4.raw_data());
  EXPECT_EQ(make_tensor("i4", onnx::TensorProto::INT4, {3}, {-1, -8, 7}).raw_data(), i4.raw_data());
  EXPECT_THROW(make_tensor("i4", onnx::TensorProto::INT4, {1}, {8}), DeployError);
  EXPECT_THROW(make_tensor("i4", onnx::TensorProto::INT4, {1}, {0.5}), DeployError);
  EXPECT_THROW(make_tensor("i4", onnx::TensorProto::INT4, {1}, {std::nan("")}), DeployError);
  i4.add_dims(2);  // 6 values in 2 bytes: corrupt
  EXPECT_THROW(to_const(i4), DeployError);
}

TEST(Formats, Fp8AndBlockedGroupsAreReadWithTheirParameters) {
  for (int32_t type : {onnx::TensorProto::FLOAT8E4M3FN, onnx::TensorProto::FLOAT8E5M2}) {
    const auto g = fp8_sample(type);
    const auto fqs = find_fake_quants(g);
    ASSERT_EQ(fqs.size(), 2u);
    const auto want = type == onnx::TensorProto::FLOAT8E5M2 ? QFormat::kFp8E5M2 : QFormat::kFp8E4M3;
    EXPECT_EQ(fqs[0].q.format, want);
    EXPECT_EQ(fqs[0].q.saturate, type == onnx::TensorProto::FLOAT8E4M3FN);
    EXPECT_FALSE(fqs[0].q.per_channel());
    EXPECT_EQ(fqs[1].q.axis, 0);
    EXPECT_EQ(fqs[1].q.scale, (std::vector<double>{0.005f, 0.006f, 0.007f}));
    EXPECT_EQ(classify(g, fqs[1]), Role::kWeight);
    EXPECT_TRUE(fqs[1].q.is_format());
  }
  const auto g = blocked_sample();
  const auto fqs = find_fake_quants(g);
  ASSERT_EQ(fqs.size(), 2u);
  EXPECT_FALSE(fqs[0].q.is_format());
  const auto& w = fqs[1];
  EXPECT_EQ(w.nodes.size(), 3u);  // Q, Clip, DQ
  EXPECT_EQ(w.q.block_size, 32);
  EXPECT_EQ(w.q.axis, 1);
  EXPECT_EQ(w.q.scale_dims, (std::vector<int64_t>{4, 2}));
  EXPECT_EQ(w.q.quant_min, -8);
  EXPECT_EQ(w.q.quant_max, 7);
  EXPECT_EQ(w.q.zero_point, (std::vector<int64_t>{0, -1, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(w.q.describe(), "group-wise integer [-8, 7], blocks of 32 on axis 1");
  EXPECT_EQ(classify(g, w), Role::kWeight);
}

TEST(Formats, QdqAndAcademicWriteTheFormatsBackAndOnnxsCheckerAcceptsThem) {
  DeployOptions o;
  o.model_name = "m";
  for (const char* backend : {"QDQ", "Academic"}) {
    for (int32_t type : {onnx::TensorProto::FLOAT8E4M3FN, onnx::TensorProto::FLOAT8E5M2}) {
      const auto out = translate(fp8_sample(type), backend, o);
      ASSERT_EQ(out.files.size(), 1u);
      EXPECT_TRUE(out.notes.empty()) << out.notes.at(0);  // Academic kept no fake-quant node
      const auto g = OnnxGraph::parse(out.files[0].contents);
      EXPECT_NO_THROW(check_model(g, "m.onnx", ModelCheckOptions{})) << backend;
      EXPECT_GE(g.opset(""), 19);
      const auto* q = node_of(g, "QuantizeLinear", "W");
      ASSERT_NE(q, nullptr);
      EXPECT_EQ(int_attribute(*q, "axis", -1), 0);
      EXPECT_EQ(int_attribute(*q, "saturate", -1), 1);  // the weight's pair has ONNX's default
      const auto* qx = node_of(g, "QuantizeLinear", "x");
      ASSERT_NE(qx, nullptr);
      EXPECT_EQ(int_attribute(*qx, "saturate", -1), type == onnx::TensorProto::FLOAT8E4M3FN);
      EXPECT_EQ(find_attribute(*qx, "axis"), nullptr);
      EXPECT_EQ(g.initializer(q->input(2))->data_type(), type);
      EXPECT_EQ(g.require_constant(q->input(2), "z").values, (std::vector<double>{0, 0, 0}));
      const auto again = find_fake_quants(g);  // what was written reads back the same
      ASSERT_EQ(again.size(), 2u);
      EXPECT_EQ(again[1].q.scale, find_fake_quants(fp8_sample(type))[1].q.scale);
    }
    const auto out = translate(blocked_sample(), backend, o);
    const auto g = OnnxGraph::parse(out.files.at(0).contents);
    EXPECT_NO_THROW(check_model(g, "m.onnx", ModelCheckOptions{})) << backend;
    EXPECT_GE(g.opset(""), 21);
    const auto* q = node_of(g, "QuantizeLinear", "W");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(int_attribute(*q, "block_size", 0), 32);
    EXPECT_EQ(int_attribute(*q, "axis", 0), 1);
    EXPECT_EQ(count(g, "Clip"), 1);  // INT4's [-8, 7] inside int8
    const auto again = find_fake_quants(g);
    ASSERT_EQ(again.size(), 2u);
    EXPECT_EQ(again[1].q.scale_dims, (std::vector<int64_t>{4, 2}));
    EXPECT_EQ(again[1].q.zero_point, find_fake_quants(blocked_sample())[1].q.zero_point);
    EXPECT_EQ(again[1].q.quant_min, -8);
  }
}

TEST(Formats, TensorrtWritesFp8AsItsQdqModelAloneAndGroupWiseWeightsAsInt4) {
  DeployOptions o;
  o.model_name = "m";
  const auto out = translate(fp8_sample(), "Tensorrt", o);
  ASSERT_EQ(out.files.size(), 1u);
  EXPECT_EQ(out.files[0].file_name, "onnx_quantized_model.onnx");
  ASSERT_EQ(out.notes.size(), 1u);
  EXPECT_NE(out.notes[0].find("FP8 E4M3"), std::string::npos) << out.notes[0];
  const auto g = OnnxGraph::parse(out.files[0].contents);
  EXPECT_NO_THROW(check_model(g, "q.onnx", ModelCheckOptions{}));
  EXPECT_EQ(count(g, "QuantizeLinear"), 2);
  EXPECT_NE(g.node_index("fq_w_quantized"), -1);  // MQBench's ONNXQLinearPass names
  // Group-wise weights: an INT4 initializer read by a DequantizeLinear, no QuantizeLinear; the
  // integers by the fake-quant formula, nearbyint(w * float(1 / s)), clamped to [-8, 7].
  const auto int4 = translate(blocked_sample(32, true), "Tensorrt", o);
  ASSERT_EQ(int4.files.size(), 1u);
  const auto q4 = OnnxGraph::parse(int4.files[0].contents);
  EXPECT_NO_THROW(check_model(q4, "q.onnx", ModelCheckOptions{}));
  EXPECT_GE(q4.opset(""), 21);
  EXPECT_EQ(count(q4, "QuantizeLinear"), 1);  // the activation's
  EXPECT_EQ(count(q4, "Clip"), 0);
  const int di = q4.node_index("fq_w_dequantized");
  ASSERT_NE(di, -1);
  const auto& dq = q4.graph().node(di);
  EXPECT_EQ(int_attribute(dq, "block_size", 0), 32);
  EXPECT_EQ(dq.input_size(), 2);  // no zero point: 0
  const auto* wi = q4.initializer(dq.input(0));
  ASSERT_NE(wi, nullptr);
  EXPECT_EQ(wi->data_type(), onnx::TensorProto::INT4);
  const auto ints = to_const(*wi).values;
  const auto src = blocked_sample(32, true);
  const auto w = to_const(*src.initializer("W")).values;
  const auto s = to_const(*src.initializer("s_w")).values;
  ASSERT_EQ(ints.size(), w.size());
  for (size_t e = 0; e < w.size(); ++e) {
    const size_t k = (e / 64) * 2 + (e % 64) / 32;
    const double want = std::min(7.0, std::max(-8.0, static_cast<double>(std::nearbyint(
        static_cast<float>(w[e]) * (1.0f / static_cast<float>(s[k]))))));
    EXPECT_EQ(ints[e], want) << e;
  }
  EXPECT_EQ(q4.initializer("W"), nullptr);  // the float weight is gone
  // TensorRT's dequantize takes zero points of 0 only.
  const std::string why = error_of([] { translate(blocked_sample(), "Tensorrt", DeployOptions{}); });
  EXPECT_NE(why.find("fq_w"), std::string::npos) << why;
  EXPECT_NE(why.find("zero points of 0"), std::string::npos) << why;
}

TEST(Formats, EveryOtherBackendRefusesTheFormatsByName) {
  for (const auto& backend : mqbench::backend_names()) {
    const std::string t = translator_of_backend(backend);
    if (t == "qdq" || t == "academic" || t == "tensorrt_nlp" || t == "tensorrt") continue;
    for (bool fp8 : {true, false}) {
      DeployOptions o;
      o.model_name = "m";
      const std::string why = error_of([&] {
        // NNIE reads no scale at all: its own refusal comes first, naming the quantizer too
        translate(fp8 ? fp8_sample() : blocked_sample(), backend, o);
      });
      EXPECT_NE(why.find(fp8 ? "fq_" : "fq_w"), std::string::npos) << backend << ": " << why;
      if (t != "nnie") {
        EXPECT_NE(why.find(fp8 ? "FP8" : "group-wise"), std::string::npos) << backend << ": " << why;
      }
    }
  }
}

TEST(Formats, MalformedFormatGroupsAreRefusedNamingTheNode) {
  // A non-zero FP8 zero point (float8 has no offset).
  auto nz = fp8_sample();
  *nz.mutable_initializer("z_x") = make_tensor("z_x", onnx::TensorProto::FLOAT8E4M3FN, {}, {1.0});
  std::string why = error_of([&] { find_fake_quants(nz); });
  EXPECT_NE(why.find("fq_x"), std::string::npos) << why;
  EXPECT_NE(why.find("zero point must be 0"), std::string::npos) << why;
  // FNUZ float8 (no backend reads it).
  auto fnuz = fp8_sample();
  auto* z = fnuz.mutable_initializer("z_x");
  z->set_data_type(onnx::TensorProto::FLOAT8E4M3FNUZ);
  fnuz.reindex();
  why = error_of([&] { find_fake_quants(fnuz); });
  EXPECT_NE(why.find("fq_x"), std::string::npos) << why;
  // A block scale that does not tile the weight: 3 blocks along 64 channels.
  auto tile = blocked_sample();
  *tile.mutable_initializer("s_w") = make_tensor("s_w", onnx::TensorProto::FLOAT, {4, 3},
                                                 std::vector<double>(12, 0.01));
  *tile.mutable_initializer("z_w") = make_tensor("z_w", onnx::TensorProto::INT8, {4, 3},
                                                 std::vector<double>(12, 0));
  why = error_of([&] { find_fake_quants(tile); });
  EXPECT_NE(why.find("does not tile weight 'W'"), std::string::npos) << why;
  // Q and DQ that disagree on the block size.
  auto disagree = blocked_sample();
  for (auto& n : *disagree.graph().mutable_node()) {
    if (n.name() != "dq_w") continue;
    for (auto& a : *n.mutable_attribute()) {
      if (a.name() == "block_size") a.set_i(16);
    }
  }
  why = error_of([&] { find_fake_quants(disagree); });
  EXPECT_NE(why.find("disagree on block_size"), std::string::npos) << why;
  // An axis outside the block scale's rank.
  auto axis = blocked_sample();
  for (auto& n : *axis.graph().mutable_node()) {
    for (auto& a : *n.mutable_attribute()) {
      if (a.name() == "axis") a.set_i(5);
    }
  }
  why = error_of([&] { find_fake_quants(axis); });
  EXPECT_NE(why.find("out of range"), std::string::npos) << why;
}

// An embedding table (Gather's data input) quantized per channel or per block is a weight: the
// LLM case (a Llama's embed_tokens). Before, every per-channel quantizer feeding a Gather was
// refused, so embedding tables had to stay float.
TEST(Formats, EmbeddingTablesFeedingGatherAreWeights) {
  auto g = blocked_sample();
  auto* graph = &g.graph();
  for (auto& n : *graph->mutable_node()) {
    if (n.name() == "gemm") {  // y = Gather(Wq, ids): a [4, 64] table looked up by 2 indices
      n.set_op_type("Gather");
      n.clear_input();
      n.add_input("wq");
      n.add_input("ids");
      n.clear_attribute();
    }
  }
  *graph->add_initializer() = make_tensor("ids", onnx::TensorProto::INT64, {2}, {3, 0});
  graph->mutable_output(0)->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_value(64);
  g.reindex();
  g.optimize();  // the x quantizer no longer reaches an output
  const auto fqs = find_fake_quants(g);
  ASSERT_EQ(fqs.size(), 1u);
  std::string consumer;
  EXPECT_EQ(classify(g, fqs[0], &consumer), Role::kWeight);
  EXPECT_EQ(consumer, "gemm");
  DeployOptions o;
  o.model_name = "m";
  const auto out = translate(g, "QDQ", o);
  const auto written = OnnxGraph::parse(out.files.at(0).contents);
  EXPECT_NO_THROW(check_model(written, "m.onnx", ModelCheckOptions{}));
  EXPECT_EQ(count(written, "Gather"), 1);
  // The indices are not a table: a per-channel quantizer there is still refused.
  auto idx = g;
  for (auto& n : *idx.graph().mutable_node()) {
    if (n.op_type() == "Gather") {
      n.set_input(0, "W");
      n.set_input(1, "wq");
    }
  }
  idx.reindex();
  const std::string why = error_of([&] { classify(idx, find_fake_quants(idx).at(0)); });
  EXPECT_NE(why.find("feeds node 'gemm' (Gather)"), std::string::npos) << why;
}

namespace {

onnx::AttributeProto ints_attr(const std::string& name, const std::vector<int64_t>& v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INTS);
  for (auto d : v) a.add_ints(d);
  return a;
}

// x [2, 64] -> mqbench::FakeQuantizeMXFP8 (blocks of 32 on axis 1) -> Gemm(transB) with W [4, 64]
// through mqbench::<weight_op> (blocks of `block`; NVFP4 reads the tensor amax A = 3) -> y.
OnnxGraph block_sample(const std::string& weight_op, int64_t block = 32) {
  auto m = model_at(23, "mx");
  auto* g = m.mutable_graph();
  set_shape(g->add_input(), "x", {2, 64});
  set_shape(g->add_output(), "y", {2, 4});
  std::vector<double> w(256);
  for (size_t i = 0; i < w.size(); ++i) w[i] = std::sin(static_cast<double>(i) * 0.7) * (i % 7 + 1);
  *g->add_initializer() = make_tensor("W", onnx::TensorProto::FLOAT, {4, 64}, w);
  *g->add_initializer() = make_tensor("A", onnx::TensorProto::FLOAT, {}, {3.0});
  auto* qx = add_node(g, "FakeQuantizeMXFP8", "fq_x", {"x"}, {"xq"}, "mqbench");
  add_int_attr(qx, "block_size", 32);
  add_int_attr(qx, "axis", 1);
  *qx->add_attribute() = ints_attr("blocked_shape", {0, 2, 32});
  std::vector<std::string> in = {"W"};
  if (weight_op == "FakeQuantizeNVFP4") in.push_back("A");
  auto* qw = add_node(g, weight_op, "fq_w", in, {"wq"}, "mqbench");
  add_int_attr(qw, "block_size", block);
  add_int_attr(qw, "axis", 1);
  *qw->add_attribute() = ints_attr("blocked_shape", {4, 64 / block, block});
  add_int_attr(add_node(g, "Gemm", "gemm", {"xq", "wq"}, {"y"}), "transB", 1);
  return OnnxGraph(std::move(m));
}

// The OCP MX spec's conversion (section 6.3), independent of the kernels' bit tricks: X =
// 2^(floor(log2 amax) - 2), each element the nearest E2M1 value of w / X (ties to the even
// code), saturated at +-6.
double mxfp4_reference(const std::vector<double>& block, size_t i) {
  static const double grid[8] = {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0};
  double amax = 0;
  for (double v : block) amax = std::max<double>(amax, std::fabs(static_cast<float>(v)));
  const int e = std::max(std::ilogb(amax) - 2, -127);
  const double a = std::fabs(static_cast<float>(block[i])) / std::ldexp(1.0, e);
  int best = 0;
  for (int c = 1; c < 8; ++c) {
    const double d = std::fabs(a - grid[c]), b = std::fabs(a - grid[best]);
    if (d < b || (d == b && c % 2 == 0)) best = c;
  }
  return std::copysign(grid[best] * std::ldexp(1.0, e), block[i]);
}

}  // namespace

TEST(Formats, MxAndNvfp4WeightsBecomeCodesAndBlockScalesActivationsComputeTheirs) {
  DeployOptions o;
  o.model_name = "m";
  for (const char* backend : {"QDQ", "Academic", "Tensorrt"}) {
    const auto out = translate(block_sample("FakeQuantizeMXFP4"), backend, o);
    ASSERT_EQ(out.files.size(), 1u) << backend;
    const auto g = OnnxGraph::parse(out.files[0].contents);
    EXPECT_NO_THROW(check_model(g, "m.onnx", ModelCheckOptions{})) << backend;
    EXPECT_EQ(g.opset(""), 23);
    EXPECT_EQ(g.initializer("W"), nullptr);  // the float weight is gone
    for (const auto& n : g.graph().node()) EXPECT_NE(n.domain(), "mqbench") << n.op_type();
    const bool tensorrt = std::string(backend) == "Tensorrt";
    if (!tensorrt) {  // deployed again: refused, saying why (the block scales are computed)
      const std::string again = error_of([&] { find_fake_quants(g); });
      EXPECT_NE(again.find("computes its block scales in the graph"), std::string::npos) << again;
    }
    // the weight: FP4 codes [4, 64] read by DequantizeLinear with a FLOAT scale [4, 2]
    const onnx::NodeProto* dq = nullptr;
    for (const auto& n : g.graph().node()) {
      if (n.op_type() == "DequantizeLinear" && n.output(0) == "wq") dq = &n;
    }
    ASSERT_NE(dq, nullptr) << backend;
    EXPECT_EQ(int_attribute(*dq, "block_size", 0), 32);
    EXPECT_EQ(int_attribute(*dq, "axis", 0), 1);
    const auto* codes = g.initializer(dq->input(0));
    ASSERT_NE(codes, nullptr);
    EXPECT_EQ(codes->data_type(), onnx::TensorProto::FLOAT4E2M1);
    const auto c = to_const(*codes).values;
    const auto s = g.require_constant(dq->input(1), "scale");
    EXPECT_EQ(s.dims, (std::vector<int64_t>{4, 2}));
    const auto w = to_const(*block_sample("FakeQuantizeMXFP4").initializer("W")).values;
    for (size_t e = 0; e < w.size(); ++e) {
      const size_t k = e / 32;
      const std::vector<double> block(w.begin() + static_cast<long>(k * 32),
                                      w.begin() + static_cast<long>(k * 32 + 32));
      EXPECT_EQ(c[e] * s.values[k], mxfp4_reference(block, e % 32)) << backend << " " << e;
    }
    if (tensorrt) {  // TensorRT's dynamic MXFP8 ops (domain trt), as modelopt writes them
      EXPECT_EQ(g.opset("trt"), 1);
      const auto* dq8 = node_of(g, "TRT_MXFP8DynamicQuantize", "x");
      ASSERT_NE(dq8, nullptr);
      EXPECT_EQ(dq8->domain(), "trt");
      EXPECT_EQ(int_attribute(*dq8, "block_size", 0), 32);
      EXPECT_EQ(int_attribute(*dq8, "output_dtype", 0), onnx::TensorProto::FLOAT8E4M3FN);
      ASSERT_EQ(dq8->output_size(), 2);
      const auto* back = node_of(g, "TRT_MXFP8DequantizeLinear", dq8->output(0));
      ASSERT_NE(back, nullptr);
      EXPECT_EQ(back->input(1), dq8->output(1));
      EXPECT_EQ(back->output(0), "xq");
      continue;
    }
    // the activation: block amax -> power-of-two scale -> FLOAT8E4M3FN Q/DQ, in the graph
    const auto* q = node_of(g, "QuantizeLinear", "x");
    ASSERT_NE(q, nullptr);
    EXPECT_EQ(int_attribute(*q, "output_dtype", 0), onnx::TensorProto::FLOAT8E4M3FN);
    EXPECT_EQ(int_attribute(*q, "saturate", 0), 1);
    EXPECT_EQ(int_attribute(*q, "block_size", 0), 32);
    EXPECT_EQ(g.initializer(q->input(1)), nullptr);  // computed from x
  }
  // NVFP4: E4M3 block scales [4, 4] dequantized by the tensor scale A / 2688, then the codes
  const auto g = OnnxGraph::parse(
      translate(block_sample("FakeQuantizeNVFP4", 16), "QDQ", o).files.at(0).contents);
  EXPECT_NO_THROW(check_model(g, "m.onnx", ModelCheckOptions{}));
  const onnx::NodeProto *outer = nullptr, *inner = nullptr;
  for (const auto& n : g.graph().node()) {
    if (n.op_type() == "DequantizeLinear" && n.output(0) == "wq") outer = &n;
  }
  ASSERT_NE(outer, nullptr);
  EXPECT_EQ(int_attribute(*outer, "block_size", 0), 16);
  for (const auto& n : g.graph().node()) {
    if (n.op_type() == "DequantizeLinear" && n.output(0) == outer->input(1)) inner = &n;
  }
  ASSERT_NE(inner, nullptr);
  const auto* s8 = g.initializer(inner->input(0));
  ASSERT_NE(s8, nullptr);
  EXPECT_EQ(s8->data_type(), onnx::TensorProto::FLOAT8E4M3FN);
  EXPECT_EQ(to_const(*s8).dims, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(g.require_constant(inner->input(1), "g").values,
            (std::vector<double>{static_cast<float>(3.0f / 2688.0f)}));
  EXPECT_EQ(g.initializer(outer->input(0))->data_type(), onnx::TensorProto::FLOAT4E2M1);
}

TEST(Formats, MalformedMxNodesAndOtherBackendsAreRefusedByName) {
  auto refused = [](OnnxGraph g, const std::string& backend, const std::string& want) {
    DeployOptions o;
    o.model_name = "m";
    const std::string why = error_of([&] { translate(std::move(g), backend, o); });
    EXPECT_NE(why.find(want), std::string::npos) << backend << ": " << why;
  };
  for (const auto& backend : mqbench::backend_names()) {
    const std::string t = translator_of_backend(backend);
    if (t == "qdq" || t == "academic" || t == "tensorrt_nlp" || t == "tensorrt" || t == "nnie") {
      continue;
    }
    refused(block_sample("FakeQuantizeMXFP4"), backend, "MX and NVFP4 deploy to Tensorrt");
  }
  auto edit = [](const std::string& node, const std::string& attr, const onnx::AttributeProto& a) {
    auto g = block_sample("FakeQuantizeMXFP4");
    auto* n = g.graph().mutable_node(g.node_index(node));
    for (auto& b : *n->mutable_attribute()) {
      if (b.name() == attr) b = a;
    }
    return g;
  };
  onnx::AttributeProto zero;
  zero.set_name("block_size");
  zero.set_type(onnx::AttributeProto::INT);
  zero.set_i(0);
  refused(edit("fq_w", "block_size", zero), "QDQ", "fq_w' (FakeQuantizeMXFP4): block_size 0");
  refused(edit("fq_w", "blocked_shape", ints_attr("blocked_shape", {4, 4, 16})), "QDQ",
          "and blocked_shape disagree");
  refused(edit("fq_w", "blocked_shape", ints_attr("blocked_shape", {8, 2, 32})), "QDQ",
          "blocked_shape does not split weight 'W'");
  refused(edit("fq_x", "blocked_shape", ints_attr("blocked_shape", {-1, -1, 32})), "QDQ",
          "a second -1");
  auto nan = block_sample("FakeQuantizeMXFP4");
  auto w = to_const(*nan.initializer("W"));
  w.values[70] = std::numeric_limits<double>::quiet_NaN();
  *nan.mutable_initializer("W") = make_tensor("W", onnx::TensorProto::FLOAT, w.dims, w.values);
  refused(nan, "QDQ", "weight 'W' holds NaN at index 70");
  auto amax = block_sample("FakeQuantizeNVFP4", 16);
  *amax.mutable_initializer("A") = make_tensor("A", onnx::TensorProto::FLOAT, {}, {-1.0});
  refused(amax, "QDQ", "global_amax must be one finite float32 number >= 0");
  // Finite as a DOUBLE, inf as the float the files hold (found by a review).
  *amax.mutable_initializer("A") = make_tensor("A", onnx::TensorProto::DOUBLE, {}, {1e300});
  refused(amax, "QDQ", "global_amax must be one finite float32 number >= 0");
  *amax.mutable_initializer("A") = make_tensor("A", onnx::TensorProto::DOUBLE, {}, {3e38});
  DeployOptions o;
  o.model_name = "m";
  EXPECT_EQ(error_of([&] { translate(amax, "QDQ", o); }), "");
}
