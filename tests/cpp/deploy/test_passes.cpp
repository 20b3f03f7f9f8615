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
  EXPECT_EQ(pass_names(), (std::vector<std::string>{"canonicalize_ops", "post_process_clip_ranges",
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
  // remove_zero_pads / resize_to_upsample on a graph with a zero Pad and a Resize.
  g = pad_resize();
  EXPECT_TRUE(run_pass("remove_zero_pads", g).modified);
  EXPECT_EQ(count(g, "Pad"), 0);
  EXPECT_TRUE(run_pass("resize_to_upsample", g).modified);
  EXPECT_EQ(count(g, "Upsample"), 1);
  EXPECT_EQ(count(g, "Resize"), 0);
  // Not applicable: a graph without what the pass rewrites is left byte for byte.
  for (const char* name : {"remove_fake_quant", "to_qdq", "remove_zero_pads", "resize_to_upsample",
                           "canonicalize_ops"}) {
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
  try {
    run_pass("remove_fake_quant", unscaled);
    FAIL() << "a fake quantizer with a computed scale was removed";
  } catch (const DeployError& e) {
    EXPECT_NE(std::string(e.what()).find("fq_x"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("scale"), std::string::npos) << e.what();
  }
}

TEST(Passes, ADeployListsThePassesItRanInOrder) {
  DeployOptions o;
  o.model_name = "m";
  std::vector<PassRecord> ran;
  translate(sample(-128, 127), "Tensorrt", o, &ran);
  EXPECT_EQ(names(ran), (std::vector<std::string>{"canonicalize_ops", "remove_zero_pads",
                                                  "remove_fake_quant", "post_process_clip_ranges"}));
  EXPECT_EQ(ran[2].nodes_before, 5);  // remove_fake_quant: 3 groups out of 5 nodes
  EXPECT_EQ(ran[2].nodes_after, 2);
  for (const auto& r : ran) EXPECT_GE(r.milliseconds, 0.0) << r.name;
  o.deploy_to_qlinear = true;
  translate(sample(-128, 127), "Tensorrt", o, &ran);
  EXPECT_EQ(names(ran).at(1), "to_qdq");  // the QDQ model first, then the deploy model
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
