// The model quantizer's rule sets on IR graphs built here: fusion groups and the exact list of
// activation quant sites per backend, against ../shared/mqbench-spec.md A.5-A.6.

#include <gtest/gtest.h>

#include <algorithm>

#include "mqbench/backend.h"
#include "mqbench/quantizer/model_quantizer.h"

namespace {

using mqbench::graph::Graph;
using mqbench::graph::Node;
using mqbench::graph::OpKind;
namespace mq = mqbench::quantizer;
using Range = std::pair<int64_t, int64_t>;

// Small builder: module types are given most-derived first.
struct G {
  Graph g;
  int64_t in(const std::string& name) { return g.add({name, OpKind::kPlaceholder, name}); }
  int64_t mod(const std::string& name, std::vector<std::string> types, std::vector<int64_t> args) {
    Node n{name, OpKind::kCallModule, name, std::move(types), std::move(args)};
    return g.add(std::move(n));
  }
  int64_t fn(const std::string& name, const std::string& target, std::vector<int64_t> args,
             bool all_nodes = true) {
    Node n{name, OpKind::kCallFunction, target, {}, std::move(args)};
    n.all_args_are_nodes = all_nodes;
    return g.add(std::move(n));
  }
  int64_t method(const std::string& name, const std::string& target, std::vector<int64_t> args) {
    return g.add({name, OpKind::kCallMethod, target, {}, std::move(args)});
  }
  void out(std::vector<int64_t> args) { g.add({"output", OpKind::kOutput, "output", {}, std::move(args)}); }
};

const std::vector<std::string> kConvBnReLU{"nn.intrinsic.qat.ConvBnReLU2d", "nn.intrinsic.qat.ConvBn2d",
                                           "nn.qat.Conv2d", "nn.Conv2d"};
const std::vector<std::string> kConvBn{"nn.intrinsic.qat.ConvBn2d", "nn.qat.Conv2d", "nn.Conv2d"};
const std::vector<std::string> kQatLinear{"nn.qat.Linear", "nn.Linear"};

std::vector<std::string> sites(const mq::Plan& p) {
  std::vector<std::string> out;
  for (const auto& q : p.act_quants) out.push_back(q.node);
  return out;
}

// A ResNet-style stem and basic block, after fusion and QAT swap.
G resnet_block() {
  G b;
  auto x = b.in("x");
  auto conv1 = b.mod("conv1", kConvBnReLU, {x});
  auto pool = b.mod("maxpool", {"nn.MaxPool2d"}, {conv1});
  auto ca = b.mod("layer1_0_conv1", kConvBnReLU, {pool});
  auto cb = b.mod("layer1_0_conv2", kConvBn, {ca});
  auto add = b.fn("add", "operator.add", {cb, pool});
  auto relu = b.mod("layer1_0_relu_dup1", {"nn.ReLU"}, {add});
  auto avg = b.mod("avgpool", {"nn.AdaptiveAvgPool2d"}, {relu});
  auto flat = b.fn("flatten", "torch.flatten", {avg}, false);
  auto fc = b.mod("fc", kQatLinear, {flat});
  b.out({fc});
  return b;
}

TEST(ModelQuantizer, EveryBackendNamesRegisteredRules) {
  for (const auto& name : mqbench::backend_names()) {
    EXPECT_NO_THROW(mq::get_rules(mqbench::get_backend(name).model_quantizer)) << name;
  }
  EXPECT_THROW(mq::get_rules("NoSuchQuantizer"), c10::Error);
}

TEST(ModelQuantizer, TensorrtQuantizesTheInputsOfQuantInputNodes) {
  auto b = resnet_block();
  auto plan = mq::plan_activation_quant(b.g, "ModelQuantizer");
  const std::vector<std::string> expected{"x", "conv1", "maxpool", "layer1_0_conv1",
                                          "layer1_0_conv2", "layer1_0_relu_dup1", "flatten"};
  EXPECT_EQ(sites(plan), expected);
}

TEST(ModelQuantizer, ImplicitMergeExclusionsAndAdditions) {
  G b;
  auto x = b.in("x");
  auto y = b.in("y");
  auto mul = b.fn("mul", "operator.mul", {x, y});
  auto add = b.fn("add", "operator.add", {mul, y});
  auto mean = b.method("mean", "mean", {add});
  b.out({mean});
  auto plan = mq::plan_activation_quant(b.g, "ModelQuantizer");
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"x", "y"}));  // mul -> add: implicit merge
  EXPECT_NE(std::find(plan.log.begin(), plan.log.end(), "Implicit merge: add + mul"), plan.log.end());

  mq::QuantizerOptions o;
  o.exclude_node_name = {"mul"};
  o.additional_function_type = {"mean"};
  plan = mq::plan_activation_quant(b.g, "ModelQuantizer", o);
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"y", "add"}));
  o.additional_node_name = {"mul"};  // forces insertion and overrides the exclusion
  plan = mq::plan_activation_quant(b.g, "ModelQuantizer", o);
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"x", "y", "add"}));
  o = {};
  o.exclude_function_type = {"operator.add", "operator.mul"};
  EXPECT_TRUE(mq::plan_activation_quant(b.g, "ModelQuantizer", o).act_quants.empty());
}

TEST(ModelQuantizer, ExcludedModulesAndGetitemSources) {
  auto b = resnet_block();
  mq::QuantizerOptions o;
  o.exclude_module_name = {"layer1_0_conv2", "fc"};
  auto plan = mq::plan_activation_quant(b.g, "ModelQuantizer", o);
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"x", "conv1", "maxpool",
                                                   "layer1_0_conv2", "layer1_0_relu_dup1"}));
  G d;
  auto x = d.in("x");
  auto conv = d.mod("conv", kConvBn, {x});
  Node upd{"update", OpKind::kCallMethod, "update", {}, {x, conv}};
  auto u = d.g.add(upd);
  Node gi{"getitem", OpKind::kCallFunction, "operator.getitem", {}, {u}};
  gi.getitem_source = conv;
  auto item = d.g.add(gi);
  auto pool = d.mod("pool", {"nn.AvgPool2d"}, {item});
  d.out({pool});
  EXPECT_EQ(sites(mq::plan_activation_quant(d.g, "ModelQuantizer")),
            (std::vector<std::string>{"x", "conv"}));
}

TEST(ModelQuantizer, TotalIntAlsoQuantizesOutputs) {
  auto b = resnet_block();
  auto plan = mq::plan_activation_quant(b.g, "TotalINTQuantizer");
  // Outputs of quant-input nodes, or of their pass-op users (the add's ReLU, the avgpool's
  // flatten): all already collected as inputs, except the network output, fc.
  const std::vector<std::string> expected{"x", "conv1", "maxpool", "layer1_0_conv1",
                                          "layer1_0_conv2", "layer1_0_relu_dup1", "flatten", "fc"};
  EXPECT_EQ(sites(plan), expected);
}

TEST(ModelQuantizer, OnnxQnnQuantizesAfterRelu) {
  auto b = resnet_block();
  auto plan = mq::plan_activation_quant(b.g, "ONNXQNNQuantizer");
  // add feeds a ReLU module: the ReLU's output; the maxpool is not a quant-input type here.
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"x", "maxpool", "layer1_0_conv1",
                                                   "layer1_0_conv2", "layer1_0_relu_dup1",
                                                   "flatten", "conv1", "avgpool", "fc"}));
  EXPECT_EQ(mq::get_rules("ONNXQNNQuantizer").qat_exclude_types,
            (std::vector<std::string>{"nn.Linear", "nn.intrinsic.LinearReLU"}));
}

TEST(ModelQuantizer, TengineAddsGraphOutputs) {
  auto b = resnet_block();
  auto s = sites(mq::plan_activation_quant(b.g, "TengineQuantizer"));
  EXPECT_EQ(s.back(), "fc");
  EXPECT_NE(std::find(s.begin(), s.end(), "flatten"), s.end());  // avgpool's user is a flatten
  EXPECT_EQ(std::find(s.begin(), s.end(), "avgpool"), s.end());
}

TEST(ModelQuantizer, VitisQuantizesOutputsAsTensorType) {
  auto b = resnet_block();
  auto plan = mq::plan_activation_quant(b.g, "VitisQuantizer");
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"conv1", "layer1_0_conv1", "layer1_0_conv2",
                                                   "add", "layer1_0_relu_dup1", "avgpool", "fc"}));
  for (const auto& q : plan.act_quants) EXPECT_EQ(q.quant_type, "tensor");
}

TEST(ModelQuantizer, OpenvinoInputsUnsignedAndSevenBitWeights) {
  auto b = resnet_block();
  auto plan = mq::plan_activation_quant(b.g, "OPENVINOQuantizer");
  // maxpool -> conv and flatten -> Linear propagate; fc feeds the output; avgpool feeds a
  // flatten, which qualifies.
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"x", "conv1", "layer1_0_conv1",
                                                   "layer1_0_conv2", "layer1_0_relu_dup1",
                                                   "avgpool"}));
  ASSERT_TRUE(plan.weight_range.has_value());
  EXPECT_EQ(*plan.weight_range, Range(-64, 63));
  for (const auto& q : plan.act_quants) {
    // ReLU outputs, and the avgpool whose nearest upstream quantizer (the ReLU's) is unsigned.
    const bool relu = q.node == "conv1" || q.node == "layer1_0_conv1" ||
                      q.node == "layer1_0_relu_dup1" || q.node == "avgpool";
    EXPECT_EQ(q.quant_min.has_value(), relu) << q.node;
    if (relu) EXPECT_EQ(*q.quant_max, 255) << q.node;
  }
  G p;  // a pool after a ReLU inherits unsignedness from the quantizer upstream
  auto x = p.in("x");
  auto r = p.mod("relu", {"nn.ReLU"}, {x});
  auto pool = p.mod("pool", {"nn.AvgPool2d"}, {r});
  auto conv = p.mod("conv", kConvBn, {pool});
  p.out({conv});
  mq::QuantizerOptions o;
  o.weight_symmetric = false;
  plan = mq::plan_activation_quant(p.g, "OPENVINOQuantizer", o);
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"x", "relu", "pool"}));
  EXPECT_FALSE(plan.act_quants[0].quant_min.has_value());
  EXPECT_EQ(*plan.act_quants[2].quant_min, 0);
  EXPECT_EQ(*plan.weight_range, Range(0, 127));
}

TEST(ModelQuantizer, AcademicKeepsIoLayersAt8Bit) {
  G b;
  auto x = b.in("x");
  auto c1 = b.mod("conv1", {"nn.qat.Conv2d", "nn.Conv2d"}, {x});
  auto bn = b.mod("bn1", {"nn.BatchNorm2d"}, {c1});
  auto c2 = b.mod("conv2", {"nn.qat.Conv2d", "nn.Conv2d"}, {bn});
  auto fc = b.mod("fc", kQatLinear, {c2});
  b.out({fc});
  mq::QuantizerOptions o;
  o.activation_symmetric = false;
  auto plan = mq::plan_activation_quant(b.g, "AcademicQuantizer", o);
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"x", "bn1", "conv2"}));
  EXPECT_EQ(plan.weight_range_modules, (std::vector<std::string>{"conv1", "fc"}));
  EXPECT_EQ(*plan.weight_range, Range(-128, 127));
  EXPECT_EQ(*plan.act_quants[0].quant_max, 255);   // the input of conv1
  EXPECT_EQ(*plan.act_quants[2].quant_max, 255);   // the input of fc
  EXPECT_FALSE(plan.act_quants[1].quant_min.has_value());
  EXPECT_TRUE(mq::find_fusions(b.g, "AcademicQuantizer").empty());
}

TEST(ModelQuantizer, TensorrtNlpSkipsEmbeddingSums) {
  G b;
  auto ids = b.in("input_ids");
  auto tok = b.mod("tok", {"nn.Embedding"}, {ids});
  auto pos = b.mod("pos", {"mqbench.nn.qat.Embedding", "nn.Embedding"}, {ids});
  auto emb = b.fn("add", "operator.add", {tok, pos});
  auto q = b.mod("q", kQatLinear, {emb});
  auto k = b.mod("k", kQatLinear, {emb});
  auto s = b.fn("matmul", "torch.matmul", {q, k});
  auto d = b.fn("truediv", "operator.truediv", {s}, false);
  auto res = b.fn("add_1", "operator.add", {d, emb});
  b.out({res});
  auto plan = mq::plan_activation_quant(b.g, "TensorrtNLPQuantizer");
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"add", "q", "k"}));  // truediv: implicit merge
  plan = mq::plan_activation_quant(b.g, "AcademicNLPQuantizer");
  EXPECT_EQ(sites(plan), (std::vector<std::string>{"add", "q", "k"}));
}

TEST(Fusion, ConvBnReluChainsAndTheirLimits) {
  G b;
  auto x = b.in("x");
  auto c1 = b.mod("conv1", {"nn.Conv2d"}, {x});
  auto bn1 = b.mod("bn1", {"nn.BatchNorm2d"}, {c1});
  auto r1 = b.fn("relu", "F.relu", {bn1});
  auto c2 = b.mod("conv2", {"nn.Conv2d"}, {r1});
  auto bn2 = b.mod("bn2", {"nn.BatchNorm2d"}, {c2});
  auto c3 = b.mod("conv3", {"nn.Conv2d"}, {bn2});   // used twice: not fused
  auto add = b.fn("add", "operator.add", {c3, c3});
  auto d = b.mod("deconv", {"nn.ConvTranspose2d"}, {add});
  auto bn3 = b.mod("bn3", {"nn.BatchNorm2d"}, {d});
  auto r3 = b.mod("relu3", {"nn.ReLU"}, {bn3});
  auto c4 = b.mod("conv4", {"nn.Conv2d"}, {r3});
  auto fbn = b.mod("fbn", {"mqbench.nn.FrozenBatchNorm2d", "nn.BatchNorm2d"}, {c4});
  auto bn5 = b.mod("bn5", {"nn.BatchNorm2d"}, {fbn});
  auto r5 = b.mod("relu5", {"nn.ReLU"}, {bn5});
  auto fc = b.mod("fc", {"nn.Linear"}, {r5});
  auto bn6 = b.mod("bn6", {"nn.BatchNorm1d"}, {fc});
  b.out({bn6});
  auto groups = mq::find_fusions(b.g, "ModelQuantizer");
  std::vector<std::string> kinds;
  for (const auto& f : groups) kinds.push_back(f.kind);
  EXPECT_EQ(kinds, (std::vector<std::string>{"ConvBnReLU2d", "ConvBn2d", "ConvTransposeBnReLU2d",
                                             "ConvFreezebn2d", "BNReLU2d", "LinearBn1d"}));
  EXPECT_EQ(groups[0].nodes, (std::vector<std::string>{"conv1", "bn1", "relu"}));
  EXPECT_EQ(groups[3].nodes, (std::vector<std::string>{"conv4", "fbn"}));
  mq::QuantizerOptions academic;
  academic.academic_mode = true;
  EXPECT_TRUE(mq::find_fusions(b.g, "OPENVINOQuantizer", academic).empty());
}

TEST(Fusion, UserPatternsComeFirst) {
  G b;
  auto x = b.in("x");
  auto c = b.mod("conv", {"nn.Conv2d"}, {x});
  auto s = b.mod("act", {"nn.Sigmoid"}, {c});
  auto c2 = b.mod("conv2", {"nn.Conv2d"}, {s});
  auto bn = b.mod("bn", {"nn.BatchNorm2d"}, {c2});
  b.out({bn});
  mq::QuantizerOptions o;
  o.extra_fusion_patterns = {{"nn.Conv2d", "nn.Sigmoid"}, {"nn.Conv2d", "nn.BatchNorm2d", "nn.ReLU"}};
  auto groups = mq::find_fusions(b.g, "ModelQuantizer", o);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[0].kind, "user:0");
  EXPECT_EQ(groups[0].nodes, (std::vector<std::string>{"conv", "act"}));
  EXPECT_EQ(groups[1].kind, "ConvBn2d");  // the user's 3-long pattern does not match: built-in
}

TEST(Graph, RejectsMalformedGraphs) {
  Graph g;
  g.add({"x", OpKind::kPlaceholder, "x"});
  EXPECT_THROW(g.add({"x", OpKind::kPlaceholder, "x"}), c10::Error);
  EXPECT_THROW(g.add({"y", OpKind::kCallFunction, "operator.add", {}, {5}}), c10::Error);
  EXPECT_THROW(g.add({"z", OpKind::kCallFunction, "f", {"nn.Conv2d"}, {0}}), c10::Error);
  EXPECT_THROW(mqbench::graph::op_from_name("call_modul"), c10::Error);
  EXPECT_EQ(mqbench::graph::op_from_name("call_method"), OpKind::kCallMethod);
}

}  // namespace

namespace {

// A Python subclass's type lists (MQBench's properties) replace the rule set's, additions
// included; the implicit-merge patterns likewise.
TEST(ModelQuantizer, OverriddenTypeListsReplaceTheRuleSets) {
  auto b = resnet_block();
  mq::QuantizerOptions o;
  o.additional_module_type = {"nn.MaxPool2d"};  // ignored once module_types is given
  o.module_types = std::vector<std::string>{"nn.intrinsic.qat.ConvBnReLU2d"};
  o.function_types = std::vector<std::string>{};
  const std::vector<std::string> convs_only{"x", "maxpool"};
  EXPECT_EQ(sites(mq::plan_activation_quant(b.g, "ModelQuantizer", o)), convs_only);

  o.module_types = c10::nullopt;
  o.function_types = std::vector<std::string>{"torch.flatten"};
  auto with_flatten = sites(mq::plan_activation_quant(b.g, "ModelQuantizer", o));
  EXPECT_NE(std::find(with_flatten.begin(), with_flatten.end(), "avgpool"), with_flatten.end());
  EXPECT_EQ(std::find(with_flatten.begin(), with_flatten.end(), "layer1_0_conv2"),
            with_flatten.end());  // the add is no longer a quant-input function

  G m;
  auto x = m.in("x");
  auto mul = m.fn("mul", "operator.mul", {x, x});
  auto add = m.fn("add", "operator.add", {mul, x});
  m.out({add});
  EXPECT_EQ(sites(mq::plan_activation_quant(m.g, "ModelQuantizer")), std::vector<std::string>{"x"});
  mq::QuantizerOptions no_merge;
  no_merge.implicit_merges = std::vector<std::vector<std::string>>{};
  const std::vector<std::string> both{"x", "mul"};
  EXPECT_EQ(sites(mq::plan_activation_quant(m.g, "ModelQuantizer", no_merge)), both);
}

// MQBench's TRTModelQuantizer: an add keeps one float conv input (the last, used only there)
// unquantized; QAT convs are not float ones.
TEST(ModelQuantizer, TrtModelQuantizerMergesAFloatConvIntoTheAdd) {
  G b;
  auto x = b.in("x");
  auto a = b.mod("a", {"nn.Conv2d"}, {x});
  auto c = b.mod("c", {"nn.Conv2d"}, {x});
  auto add = b.fn("add", "operator.add", {a, c});
  b.out({add});
  const std::vector<std::string> base{"a", "c"};
  EXPECT_EQ(sites(mq::plan_activation_quant(b.g, "ModelQuantizer")), base);
  auto trt = mq::plan_activation_quant(b.g, "TRTModelQuantizer");
  EXPECT_EQ(sites(trt), std::vector<std::string>{"a"});
  EXPECT_NE(std::find(trt.log.begin(), trt.log.end(), "Merge into add: add + c"), trt.log.end());

  G q;
  auto y = q.in("y");
  auto qa = q.mod("a", {"nn.qat.Conv2d", "nn.Conv2d"}, {y});
  auto qc = q.mod("c", {"nn.qat.Conv2d", "nn.Conv2d"}, {y});
  q.fn("add", "operator.add", {qa, qc});
  const std::vector<std::string> qat{"y", "a", "c"};  // the QAT convs' input, both add inputs
  EXPECT_EQ(sites(mq::plan_activation_quant(q.g, "TRTModelQuantizer")), qat);
}

}  // namespace
