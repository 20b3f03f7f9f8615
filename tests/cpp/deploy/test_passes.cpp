// The deploy passes as named units (mqbench/deploy/pass.h): the registry lists one pass per file
// of src/deploy/passes/, each runs alone (positive case, not-applicable case with the model left
// byte for byte, malformed input as a clear error), and a deploy lists the passes it ran.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "mqbench/deploy/pass.h"
#include "mqbench/deploy/translator.h"
#include "onnx_builders.h"

using namespace mqbench::deploy;
using namespace deploy_test;

namespace {

// x -> Pad(all zero pads) -> Resize(scales 2) -> y, a float graph (no fake quantizer, and no
// import of the mqbench domain, which remove_fake_quant and to_qdq drop).
OnnxGraph pad_resize(bool zero_pads = true, bool constant_scales = true) {
  auto m = empty_model("pad_resize");
  m.mutable_opset_import()->RemoveLast();
  auto* g = m.mutable_graph();
  typed(g->add_input(), "x", 4);
  typed(g->add_output(), "y", 4);
  *g->add_initializer() = make_tensor("pads", onnx::TensorProto::INT64, {8},
                                      {0, 0, 0, 0, 0, 0, 0, zero_pads ? 0.0 : 1.0});
  *g->add_initializer() = make_tensor("scales", onnx::TensorProto::FLOAT, {4}, {1, 1, 2, 2});
  add_node(g, "Pad", "pad", {"x", "pads"}, {"p"});
  add_node(g, "Resize", "resize", {"p", "", constant_scales ? "scales" : "p"}, {"y"});
  return OnnxGraph(std::move(m));
}

std::vector<std::string> names(const std::vector<PassRecord>& records) {
  std::vector<std::string> n;
  for (const auto& r : records) n.push_back(r.name);
  return n;
}

}  // namespace

TEST(Passes, OnePassPerFileIsRegisteredByItsName) {
  // The files of src/deploy/passes/ (CMakeLists.txt lists them); a dropped file drops its name.
  EXPECT_EQ(pass_names(), (std::vector<std::string>{"canonicalize_ops", "find_float_layers",
                                                    "post_process_clip_ranges",
                                                    "remove_fake_quant", "remove_zero_pads",
                                                    "resize_to_upsample", "to_qdq"}));
  for (const auto& n : pass_names()) EXPECT_FALSE(pass_description(n).empty()) << n;
  auto g = sample();
  try {
    run_pass("remove_fake_quants", g);
    FAIL() << "an unknown pass ran";
  } catch (const DeployError& e) {
    EXPECT_NE(std::string(e.what()).find("registered passes: canonicalize_ops"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(register_pass("to_qdq", "again", [](OnnxGraph&) { return PassResult{}; }),
               DeployError);
  EXPECT_THROW(register_pass("", "nameless", [](OnnxGraph&) { return PassResult{}; }), DeployError);
}

// run_pass takes a graph straight from a file (pass.h's example): a node without its output or
// inputs is refused before any pass reads them (a review found the entry points that skipped the
// structure check).
TEST(Passes, RunPassRefusesAGraphWhoseNodesLackTheirTensors) {
  for (const auto& name : pass_names()) {
    auto no_output = sample();
    no_output.graph().mutable_node(2)->clear_output();  // the Conv
    no_output.reindex();
    try {
      run_pass(name, no_output);
      ADD_FAILURE() << name << " ran on a node without an output";
    } catch (const DeployError& e) {
      EXPECT_NE(std::string(e.what()).find("given to pass '" + name + "': node 'conv' (Conv) has "
                                           "no output"), std::string::npos) << e.what();
    }
  }
}

TEST(Passes, EachRunsAloneAndLeavesAGraphItDoesNotApplyToAsItIs) {
  // remove_fake_quant / to_qdq: the three groups of sample() go, or become Q -> DQ pairs.
  auto g = sample();
  auto r = run_pass("remove_fake_quant", g);
  EXPECT_TRUE(r.modified);
  EXPECT_EQ(r.summary, "3 groups removed");
  EXPECT_EQ(g.graph().node_size(), 2);  // Conv, Relu
  g = sample(-128, 127);
  EXPECT_TRUE(run_pass("to_qdq", g).modified);
  EXPECT_EQ(count(g, "QuantizeLinear"), 3);
  EXPECT_EQ(count(g, "DequantizeLinear"), 3);
  // post_process_clip_ranges is an analysis: it reports, and leaves the graph as it is.
  g = sample();
  const std::string before = g.serialize();
  r = run_pass("post_process_clip_ranges", g);
  EXPECT_FALSE(r.modified);
  EXPECT_EQ(r.summary, "0 ranges to copy");
  EXPECT_EQ(g.serialize(), before);
  // find_float_layers too: sample()'s conv reads fq_x; without fq_x it is a float layer.
  r = run_pass("find_float_layers", g);
  EXPECT_FALSE(r.modified);
  EXPECT_EQ(r.summary, "0 float layers");
  EXPECT_EQ(g.serialize(), before);
  g.graph().mutable_node(2)->set_input(0, "x");  // the Conv reads x itself
  g.reindex();
  r = run_pass("find_float_layers", g);
  EXPECT_FALSE(r.modified);
  EXPECT_EQ(r.summary, "1 float layers");
  // remove_zero_pads / resize_to_upsample on a graph with a zero Pad and a Resize.
  g = pad_resize();
  EXPECT_TRUE(run_pass("remove_zero_pads", g).modified);
  EXPECT_EQ(count(g, "Pad"), 0);
  EXPECT_TRUE(run_pass("resize_to_upsample", g).modified);
  EXPECT_EQ(count(g, "Upsample"), 1);
  EXPECT_EQ(count(g, "Resize"), 0);
  // Not applicable: a graph without what the pass rewrites is left byte for byte.
  for (const char* name : {"remove_fake_quant", "to_qdq", "remove_zero_pads", "resize_to_upsample",
                           "canonicalize_ops", "find_float_layers"}) {
    auto plain = pad_resize(/*zero_pads=*/false);
    if (std::string(name) == "resize_to_upsample") plain = sample();
    const std::string bytes = plain.serialize();
    EXPECT_FALSE(run_pass(name, plain).modified) << name;
    EXPECT_EQ(plain.serialize(), bytes) << name;
  }
}

TEST(Passes, MalformedInputIsAClearErrorNamingTheNode) {
  auto g = pad_resize(true, /*constant_scales=*/false);
  try {
    run_pass("resize_to_upsample", g);
    FAIL() << "a Resize without constant scales became an Upsample";
  } catch (const DeployError& e) {
    EXPECT_NE(std::string(e.what()).find("Resize node 'resize'"), std::string::npos) << e.what();
  }
  auto wide = sample(0, 65535);
  try {
    run_pass("to_qdq", wide);
    FAIL() << "a 16-bit range got a QDQ form";
  } catch (const DeployError& e) {
    EXPECT_NE(std::string(e.what()).find("fq_x"), std::string::npos) << e.what();
  }
  auto unscaled = sample();  // fq_x's scale is computed (a graph input), not a constant
  unscaled.graph().mutable_node(0)->set_input(1, "computed_somewhere");
  typed(unscaled.graph().add_input(), "computed_somewhere", 0);
  unscaled.reindex();
  for (const char* name : {"remove_fake_quant", "find_float_layers"}) {
    try {
      run_pass(name, unscaled);
      FAIL() << name << " read a fake quantizer with a computed scale";
    } catch (const DeployError& e) {
      EXPECT_NE(std::string(e.what()).find("fq_x"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("scale"), std::string::npos) << e.what();
    }
  }
}

namespace {

// x -> fq_x -> <ops> -> Conv(W through fq_w) -> y: `ops` are (op type, extra input) in order,
// each reading the previous tensor at input 0 (and the extra input, an initializer, at 1).
OnnxGraph conv_after(const std::vector<std::pair<std::string, std::string>>& ops,
                     bool quantized = true) {
  auto m = empty_model("conv_after");
  auto* g = m.mutable_graph();
  typed(g->add_input(), "x", 4);
  typed(g->add_output(), "y", 4);
  auto init = [&](const std::string& name, int32_t type, std::vector<int64_t> dims,
                  std::vector<double> v) { *g->add_initializer() = make_tensor(name, type, dims, v); };
  init("s", onnx::TensorProto::FLOAT, {}, {0.05});
  init("z", onnx::TensorProto::INT32, {}, {0});
  init("qmin", onnx::TensorProto::INT64, {}, {-127});
  init("qmax", onnx::TensorProto::INT64, {}, {127});
  init("W", onnx::TensorProto::FLOAT, {1, 1, 1, 1}, {0.5});
  init("shape", onnx::TensorProto::INT64, {4}, {1, 1, 4, 4});
  init("pads", onnx::TensorProto::INT64, {8}, {0, 0, 1, 1, 0, 0, 1, 1});
  add_node(g, "FixedPerTensorAffine", "fq_w", {"W", "s", "z", "qmin", "qmax"}, {"Wq"}, "mqbench");
  std::string t = "x";
  if (quantized) {
    add_node(g, "FixedPerTensorAffine", "fq_x", {"x", "s", "z", "qmin", "qmax"}, {"xq"}, "mqbench");
    t = "xq";
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    std::vector<std::string> in{t};
    if (!ops[i].second.empty()) in.push_back(ops[i].second);
    const std::string out = "t" + std::to_string(i);
    auto* n = add_node(g, ops[i].first, "op" + std::to_string(i), in, {out});
    if (ops[i].first == "MaxPool") {
      auto* k = n->add_attribute();
      k->set_name("kernel_shape");
      k->set_type(onnx::AttributeProto::INTS);
      k->add_ints(1);
      k->add_ints(1);
    }
    if (ops[i].first == "Concat") add_int_attr(n, "axis", 1);
    t = out;
  }
  add_node(g, "Conv", "conv", {t, "Wq"}, {"y"});
  return OnnxGraph(std::move(m));
}

std::vector<std::string> float_layer_names(const OnnxGraph& g) {
  std::vector<std::string> out;
  for (const auto& l : find_float_layers(g)) out.push_back(l.node + "/" + l.op_type + "/" + l.weight);
  return out;
}

}  // namespace

// Note [Float layers]: the input of a layer with a quantized weight counts as quantized through
// the ops TensorRT moves Q/DQ across, and through no other.
TEST(Passes, FindFloatLayersLooksBackThroughDataMovementOnly) {
  const std::vector<std::string> none, conv{"conv/Conv/W"};
  EXPECT_EQ(float_layer_names(conv_after({})), none);
  EXPECT_EQ(float_layer_names(conv_after({}, /*quantized=*/false)), conv);
  EXPECT_EQ(float_layer_names(conv_after({{"Identity", ""}, {"Reshape", "shape"}, {"MaxPool", ""},
                                          {"Pad", "pads"}, {"Transpose", ""}})),
            none);
  EXPECT_EQ(float_layer_names(conv_after({{"Relu", ""}})), conv);  // a value changed after the Q
  EXPECT_EQ(float_layer_names(conv_after({{"Concat", "W"}})), conv);  // one tensor of two scales
  EXPECT_EQ(float_layer_names(conv_after({{"MaxPool", ""}, {"Sigmoid", ""}, {"Reshape", "shape"}})),
            conv);
  // A Linear on a 3-d input: weight -> quantizer -> Transpose -> MatMul; its data input is the
  // MatMul's other input.
  auto matmul = conv_after({}, /*quantized=*/false);
  auto* g = &matmul.graph();
  add_node(g, "Transpose", "wt", {"Wq"}, {"Wt"});
  g->mutable_node(g->node_size() - 2)->set_op_type("MatMul");  // the Conv
  g->mutable_node(g->node_size() - 2)->set_input(1, "Wt");
  matmul.reindex();
  EXPECT_EQ(float_layer_names(matmul), (std::vector<std::string>{"conv/MatMul/W"}));
  // An unquantized weight: not a layer to find.
  auto no_weight = conv_after({});
  no_weight.graph().mutable_node(2)->set_input(1, "W");  // the Conv reads W unquantized
  no_weight.reindex();
  EXPECT_EQ(float_layer_names(no_weight), none);
}

TEST(Passes, ADeployListsThePassesItRanInOrder) {
  DeployOptions o;
  o.model_name = "m";
  std::vector<PassRecord> ran;
  translate(sample(-128, 127), "Tensorrt", o, &ran);
  EXPECT_EQ(names(ran), (std::vector<std::string>{"canonicalize_ops", "find_float_layers",
                                                  "remove_zero_pads", "remove_fake_quant",
                                                  "post_process_clip_ranges"}));
  EXPECT_EQ(ran[3].nodes_before, 5);  // remove_fake_quant: 3 groups out of 5 nodes
  EXPECT_EQ(ran[3].nodes_after, 2);
  for (const auto& r : ran) EXPECT_GE(r.milliseconds, 0.0) << r.name;
  o.deploy_to_qlinear = true;
  translate(sample(-128, 127), "Tensorrt", o, &ran);
  EXPECT_EQ(names(ran).at(2), "to_qdq");  // the QDQ model first, then the deploy model
  translate(sample(-128, 127), "QDQ", o, &ran);
  EXPECT_EQ(names(ran), (std::vector<std::string>{"canonicalize_ops", "to_qdq"}));
  // Outside a deploy nothing is recorded, and a failed pass is not listed.
  PassTrace trace;
  auto wide = sample(0, 65535);
  EXPECT_THROW(to_qdq(wide, QdqOptions{}), DeployError);
  EXPECT_TRUE(trace.records().empty());
  auto ok = sample();
  remove_zero_pads(ok);
  ASSERT_EQ(trace.records().size(), 1u);
  EXPECT_EQ(trace.records()[0].name, "remove_zero_pads");
}
