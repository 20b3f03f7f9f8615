// canonicalize_ops on small hand-built graphs: the forms torch's dynamo exporter writes for
// global average pooling and flattening become the TorchScript exporter's; everything else, and
// graphs whose shapes are unknown, stay as they are.

#include <gtest/gtest.h>

#include <cmath>

#include "mqbench/deploy/canonicalize.h"
#include "mqbench/deploy/translator.h"
#include "onnx_builders.h"

using namespace mqbench::deploy;
using namespace deploy_test;

namespace {

// x [2, 8, 4, 4] -> Relu -> r -> ReduceMean(axes as an opset-18 input) -> m [2, 8, 1, 1]
//   -> Reshape([2, 8]) -> y
// `x_dims` empty: x has no recorded shape.
onnx::ModelProto dynamo_style(std::vector<double> axes, int64_t keepdims,
                              std::vector<double> shape, std::vector<int64_t> x_dims,
                              bool value_info = true) {
  onnx::ModelProto m;
  m.set_ir_version(10);
  m.add_opset_import()->set_version(18);
  auto* g = m.mutable_graph();
  g->set_name("dynamo_style");
  if (x_dims.empty()) g->add_input()->set_name("x");
  else set_shape(g->add_input(), "x", x_dims);
  if (x_dims.empty()) g->add_output()->set_name("y");
  else set_shape(g->add_output(), "y", std::vector<int64_t>(shape.size(), -1));
  *g->add_initializer() = make_tensor("axes", onnx::TensorProto::INT64,
                                      {static_cast<int64_t>(axes.size())}, axes);
  *g->add_initializer() = make_tensor("shape", onnx::TensorProto::INT64,
                                      {static_cast<int64_t>(shape.size())}, shape);
  add_node(g, "Relu", "node_relu", {"x"}, {"r"});
  add_int_attr(add_node(g, "ReduceMean", "node_mean", {"r", "axes"}, {"m"}), "keepdims", keepdims);
  add_node(g, "Reshape", "node_view", {"m", "shape"}, {"y"});
  if (value_info && !x_dims.empty()) {
    set_shape(g->add_value_info(), "r", x_dims);
    set_shape(g->add_value_info(), "m", {x_dims[0], x_dims[1], 1, 1});
  }
  return m;
}

std::vector<std::string> ops(const OnnxGraph& g) {
  std::vector<std::string> out;
  for (const auto& n : g.graph().node()) out.push_back(n.op_type());
  return out;
}

}  // namespace

TEST(CanonicalizeOps, DynamoPoolingAndFlatteningBecomeTheTorchScriptOps) {
  OnnxGraph g(dynamo_style({-1, -2}, 1, {2, 8}, {2, 8, 4, 4}));
  EXPECT_TRUE(canonicalize_ops(g));
  EXPECT_EQ(ops(g), (std::vector<std::string>{"Relu", "GlobalAveragePool", "Flatten"}));
  const auto& pool = g.graph().node(1);
  EXPECT_EQ(pool.name(), "node_mean");  // names and tensors kept
  EXPECT_EQ(pool.input_size(), 1);
  EXPECT_EQ(pool.input(0), "r");
  EXPECT_EQ(pool.output(0), "m");
  EXPECT_EQ(pool.attribute_size(), 0);
  const auto& flatten = g.graph().node(2);
  EXPECT_EQ(flatten.input_size(), 1);
  EXPECT_EQ(int_attribute(flatten, "axis", -1), 1);
  EXPECT_EQ(flatten.output(0), "y");
  EXPECT_EQ(g.initializer("axes"), nullptr);  // the constants nothing reads any more go
  EXPECT_EQ(g.initializer("shape"), nullptr);
  g.check_structure("canonicalized");
}

TEST(CanonicalizeOps, AxesAttributeOfOpset13AndInferredShapesAndMinusOne) {
  // Opset 13's axes attribute; x's rank known from the graph input only (through the Relu);
  // the Reshape's shape with -1 and 0 (copy) entries, its input's shape recorded.
  auto m = dynamo_style({}, 1, {0, -1}, {2, 8, 4, 4}, false);
  auto* g = m.mutable_graph();
  auto* mean = g->mutable_node(1);
  mean->mutable_input()->RemoveLast();
  auto* a = mean->add_attribute();
  a->set_name("axes");
  a->set_type(onnx::AttributeProto::INTS);
  a->add_ints(2);
  a->add_ints(3);
  set_shape(g->add_value_info(), "m", {2, 8, 1, 1});
  OnnxGraph og(std::move(m));
  EXPECT_TRUE(canonicalize_ops(og));
  EXPECT_EQ(ops(og), (std::vector<std::string>{"Relu", "GlobalAveragePool", "Flatten"}));
}

TEST(CanonicalizeOps, OtherReductionsAndReshapesAreLeftAlone) {
  struct Case {
    std::vector<double> axes;
    int64_t keepdims;
    std::vector<double> shape;
    std::vector<int64_t> x_dims;
    bool value_info;
    std::vector<std::string> expected;
    const char* why;
  };
  const Case cases[] = {
      {{1, 2}, 1, {2, 4, 4}, {2, 8, 4, 4}, true, {"Relu", "ReduceMean", "Reshape"},
       "not the spatial axes; not a flattening"},
      {{2, 3}, 0, {8, 2}, {2, 8, 4, 4}, true, {"Relu", "ReduceMean", "Reshape"},
       "keepdims=0; a reshape that is no flatten"},
      {{2, 3}, 1, {16, 1}, {2, 8, 4, 4}, true, {"Relu", "GlobalAveragePool", "Reshape"},
       "a reshape to another split (the pooling still applies)"},
      {{2, 3}, 1, {2, 8}, {}, true, {"Relu", "ReduceMean", "Reshape"}, "shapes unknown"},
      {{2, 3}, 1, {2, 8}, {-1, 8, 4, 4}, false, {"Relu", "GlobalAveragePool", "Reshape"},
       "a symbolic batch: the rank is known, a static flatten is not"},
      {{1, 2}, 1, {2, 8}, {2, 8, 4}, false, {"Relu", "ReduceMean", "Reshape"}, "rank 3"},
  };
  for (const auto& c : cases) {
    OnnxGraph g(dynamo_style(c.axes, c.keepdims, c.shape, c.x_dims, c.value_info));
    const auto before = g.serialize();
    const bool modified = canonicalize_ops(g);
    EXPECT_EQ(ops(g), c.expected) << c.why;
    const bool same = c.expected == std::vector<std::string>{"Relu", "ReduceMean", "Reshape"};
    EXPECT_EQ(modified, !same) << c.why;
    if (same) EXPECT_EQ(g.serialize(), before) << c.why;  // untouched, byte for byte
  }
  // A node of another domain named ReduceMean is not ONNX's.
  auto m = dynamo_style({2, 3}, 1, {16, 1}, {2, 8, 4, 4});
  m.mutable_graph()->mutable_node(1)->set_domain("com.example");
  OnnxGraph other(std::move(m));
  EXPECT_FALSE(canonicalize_ops(other));
}

TEST(CanonicalizeOps, MalformedNumbersAreErrorsAndOutOfRangeAxesAreLeftToTheRuntime) {
  // A shape holding NaN (a float tensor: an integer one cannot carry it).
  auto m = dynamo_style({2, 3}, 1, {2, 8}, {2, 8, 4, 4});
  *m.mutable_graph()->mutable_initializer(1) =
      make_tensor("shape", onnx::TensorProto::FLOAT, {2}, {std::nan(""), 8});
  OnnxGraph nan(std::move(m));
  EXPECT_THROW(canonicalize_ops(nan), DeployError);
  OnnxGraph far(dynamo_style({2, 7}, 1, {16, 1}, {2, 8, 4, 4}));
  EXPECT_FALSE(canonicalize_ops(far));
  // Dimensions whose product overflows int64: no flatten, no undefined behaviour.
  OnnxGraph huge(dynamo_style({1}, 1, {int64_t(1) << 40, -1},
                              {int64_t(1) << 40, int64_t(1) << 40, int64_t(1) << 40, 1}));
  EXPECT_FALSE(canonicalize_ops(huge));
}

TEST(CanonicalizeOps, EveryTranslatorSeesTheCanonicalForm) {
  // A dynamo-style float graph deploys with Tensorrt to GlobalAveragePool + Flatten.
  DeployOptions o;
  o.model_name = "m";
  const auto out = translate(OnnxGraph(dynamo_style({-1, -2}, 1, {2, 8}, {2, 8, 4, 4})),
                             "Tensorrt", o);
  ASSERT_EQ(out.files.size(), 3u);  // the clip ranges, the deploy model, the calibration cache
  const auto deployed = OnnxGraph::parse(out.files[1].contents);
  EXPECT_EQ(ops(deployed), (std::vector<std::string>{"Relu", "GlobalAveragePool", "Flatten"}));
}
