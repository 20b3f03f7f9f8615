// check_model at the opsets after 17: the schemas of opsets 18-23 judge every
// op, shapes are inferred through QuantizeLinear / DequantizeLinear, Resize, Cast and the
// reductions, and the float 8, 4-bit and block-quantized forms of QuantizeLinear /
// DequantizeLinear pass. With Debian's libonnx 1.12 (schemas to opset 17) the refusals below
// were models deployed without complaint, and the valid models were refused (float 8 and 4-bit
// were types it did not know).

#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "mqbench/deploy/check_model.h"
#include "onnx_builders.h"

using namespace mqbench::deploy;
using namespace deploy_test;

namespace {

onnx::ModelProto standard_model(int64_t opset) {
  onnx::ModelProto m;
  m.set_ir_version(10);
  m.add_opset_import()->set_version(opset);
  m.mutable_graph()->set_name("g");
  return m;
}

void declare(onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims,
             int32_t type = onnx::TensorProto::FLOAT) {
  set_shape(v, name, std::move(dims));
  v->mutable_type()->mutable_tensor_type()->set_elem_type(type);
}

// A tensor of a type make_tensor does not write (float 8, 4-bit): zero bytes, packed as ONNX
// packs it.
onnx::TensorProto zeros(const std::string& name, int32_t type, const std::vector<int64_t>& dims,
                        int64_t per_byte = 1) {
  onnx::TensorProto t;
  t.set_name(name);
  t.set_data_type(type);
  int64_t n = 1;
  for (auto d : dims) {
    t.add_dims(d);
    n *= d;
  }
  t.set_raw_data(std::string(static_cast<size_t>((n + per_byte - 1) / per_byte), '\0'));
  return t;
}

onnx::TensorProto floats(const std::string& name, const std::vector<int64_t>& dims, double v) {
  int64_t n = 1;
  for (auto d : dims) n *= d;
  return make_tensor(name, onnx::TensorProto::FLOAT, dims,
                     std::vector<double>(static_cast<size_t>(n), v));
}

void add_string_attr(onnx::NodeProto* n, const std::string& name, const std::string& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}

std::string refusal(const onnx::ModelProto& m) {
  try {
    check_model(OnnxGraph(m), "model");
  } catch (const DeployError& e) {
    return e.what();
  }
  return "";
}

// x [1, 4] -> QuantizeLinear -> DequantizeLinear -> MatMul(w [k, 3]) -> y [1, 3]
onnx::ModelProto qdq_matmul(int64_t opset, int64_t k) {
  auto m = standard_model(opset);
  auto* g = m.mutable_graph();
  declare(g->add_input(), "x", {1, 4});
  declare(g->add_output(), "y", {1, 3});
  *g->add_initializer() = make_tensor("s", onnx::TensorProto::FLOAT, {}, {0.1});
  *g->add_initializer() = make_tensor("zp", onnx::TensorProto::INT8, {}, {0});
  *g->add_initializer() = floats("w", {k, 3}, 0.5);
  add_node(g, "QuantizeLinear", "q", {"x", "s", "zp"}, {"xq"});
  add_node(g, "DequantizeLinear", "dq", {"xq", "s", "zp"}, {"xd"});
  add_node(g, "MatMul", "mm", {"xd", "w"}, {"y"});
  return m;
}

// x [1, 3, 8, 8] -> Resize(scales 1, 1, 2, 2) -> Add(b) -> y
onnx::ModelProto resize_add(int64_t opset, int64_t b_side) {
  auto m = standard_model(opset);
  auto* g = m.mutable_graph();
  declare(g->add_input(), "x", {1, 3, 8, 8});
  declare(g->add_output(), "y", {1, 3, 16, 16});
  *g->add_initializer() = make_tensor("scales", onnx::TensorProto::FLOAT, {4}, {1, 1, 2, 2});
  *g->add_initializer() = floats("b", {1, 3, b_side, b_side}, 0.0);
  add_string_attr(add_node(g, "Resize", "up", {"x", "", "scales"}, {"r"}), "mode", "nearest");
  add_node(g, "Add", "add", {"r", "b"}, {"y"});
  return m;
}

// x [1, 4] -> QuantizeLinear(zero point of `type`) -> DequantizeLinear -> y
onnx::ModelProto float_qdq(int64_t opset, int32_t type, int64_t per_byte = 1) {
  auto m = standard_model(opset);
  auto* g = m.mutable_graph();
  declare(g->add_input(), "x", {1, 4});
  declare(g->add_output(), "y", {1, 4});
  *g->add_initializer() = make_tensor("s", onnx::TensorProto::FLOAT, {}, {0.1});
  *g->add_initializer() = zeros("zp", type, {}, per_byte);
  add_node(g, "QuantizeLinear", "q", {"x", "s", "zp"}, {"xq"});
  add_node(g, "DequantizeLinear", "dq", {"xq", "s", "zp"}, {"y"});
  return m;
}

// x [2, 8] @ DequantizeLinear(w [8, 16] of `type`, scale `scale_dims`, block_size, axis 1) -> y
onnx::ModelProto blocked_weight(int64_t opset, int32_t type, std::vector<int64_t> scale_dims,
                                int64_t block_size, bool zero_point = false) {
  auto m = standard_model(opset);
  auto* g = m.mutable_graph();
  declare(g->add_input(), "x", {2, 8});
  declare(g->add_output(), "y", {2, 16});
  const int64_t per_byte = type == onnx::TensorProto::INT8 ? 1 : 2;
  *g->add_initializer() = zeros("w", type, {8, 16}, per_byte);
  *g->add_initializer() = floats("ws", scale_dims, 0.1);
  std::vector<std::string> in = {"w", "ws"};
  if (zero_point) {
    *g->add_initializer() = zeros("wz", type, scale_dims, per_byte);
    in.push_back("wz");
  }
  auto* dq = add_node(g, "DequantizeLinear", "dqw", in, {"wf"});
  add_int_attr(dq, "axis", 1);
  if (block_size != 0) add_int_attr(dq, "block_size", block_size);
  add_node(g, "MatMul", "mm", {"x", "wf"}, {"y"});
  return m;
}

bool says(const std::string& why, const std::string& what) {
  return why.find(what) != std::string::npos;
}

}  // namespace

TEST(CheckModel, ShapesAreInferredThroughQuantizeAndDequantizeAtOpset21) {
  EXPECT_EQ(refusal(qdq_matmul(21, 4)), "");
  for (int64_t opset : {18, 19, 20, 21, 23}) {
    const std::string why = refusal(qdq_matmul(opset, 5));
    EXPECT_TRUE(says(why, "fails onnx's shape inference") && says(why, "node name: mm"))
        << opset << ": " << why;
  }
}

TEST(CheckModel, ShapesAreInferredThroughResizeAtOpset20) {
  EXPECT_EQ(refusal(resize_add(20, 16)), "");
  const std::string why = refusal(resize_add(20, 8));
  EXPECT_TRUE(says(why, "node name: add") && says(why, "Incompatible dimensions")) << why;
}

TEST(CheckModel, CastAndReductionsAreCheckedAtTheirNewOpsets) {
  // A Cast to float 8 (opset 19) whose output is declared float.
  auto cast = standard_model(19);
  declare(cast.mutable_graph()->add_input(), "x", {1, 4});
  declare(cast.mutable_graph()->add_output(), "y", {1, 4});
  add_int_attr(add_node(cast.mutable_graph(), "Cast", "to_fp8", {"x"}, {"y"}), "to",
               onnx::TensorProto::FLOAT8E5M2);
  std::string why = refusal(cast);
  EXPECT_TRUE(says(why, "to_fp8") && says(why, "elem type")) << why;
  cast.mutable_graph()->mutable_output(0)->Clear();
  declare(cast.mutable_graph()->mutable_output(0), "y", {1, 4}, onnx::TensorProto::FLOAT8E5M2);
  EXPECT_EQ(refusal(cast), "");
  // ReduceMean with its axes as an input (opset 18), one outside the rank.
  auto reduce = standard_model(18);
  declare(reduce.mutable_graph()->add_input(), "x", {1, 4});
  declare(reduce.mutable_graph()->add_output(), "y", {1, 1});
  *reduce.mutable_graph()->add_initializer() = make_tensor("axes", onnx::TensorProto::INT64, {1}, {5});
  add_node(reduce.mutable_graph(), "ReduceMean", "mean", {"x", "axes"}, {"y"});
  why = refusal(reduce);
  EXPECT_TRUE(says(why, "node name: mean") && says(why, "axis")) << why;
}

TEST(CheckModel, Float8And4BitQuantizeDequantizePass) {
  EXPECT_EQ(refusal(float_qdq(19, onnx::TensorProto::FLOAT8E4M3FN)), "");
  EXPECT_EQ(refusal(float_qdq(19, onnx::TensorProto::FLOAT8E5M2)), "");
  EXPECT_EQ(refusal(float_qdq(21, onnx::TensorProto::INT4, 2)), "");
  EXPECT_EQ(refusal(float_qdq(21, onnx::TensorProto::UINT4, 2)), "");
  EXPECT_EQ(refusal(float_qdq(23, onnx::TensorProto::FLOAT4E2M1, 2)), "");
  // Each type before the opset that gave it to QuantizeLinear: refused by the schema.
  for (auto [opset, type] : {std::pair<int64_t, int32_t>{18, onnx::TensorProto::FLOAT8E4M3FN},
                            {20, onnx::TensorProto::INT4},
                            {22, onnx::TensorProto::FLOAT4E2M1}}) {
    const std::string why = refusal(float_qdq(opset, type, type == onnx::TensorProto::FLOAT8E4M3FN ? 1 : 2));
    EXPECT_TRUE(says(why, "'q'") || says(why, "node name: q")) << opset << ": " << why;
  }
  // saturate (opset 19) and output_dtype (opset 21) are read against the schema.
  auto fp8 = float_qdq(19, onnx::TensorProto::FLOAT8E4M3FN);
  add_int_attr(fp8.mutable_graph()->mutable_node(0), "saturate", 0);
  EXPECT_EQ(refusal(fp8), "");
  auto old = float_qdq(18, onnx::TensorProto::INT8);
  add_int_attr(old.mutable_graph()->mutable_node(0), "saturate", 0);
  EXPECT_TRUE(says(refusal(old), "saturate")) << refusal(old);
  auto dtype = float_qdq(21, onnx::TensorProto::INT8);
  add_int_attr(dtype.mutable_graph()->mutable_node(0), "output_dtype", onnx::TensorProto::UINT8);
  const std::string why = refusal(dtype);
  EXPECT_TRUE(says(why, "node name: q") && says(why, "output_dtype")) << why;
}

TEST(CheckModel, BlockQuantizedDequantizePassesAndItsScaleShapeIsChecked) {
  EXPECT_EQ(refusal(blocked_weight(21, onnx::TensorProto::INT4, {8, 2}, 8)), "");
  EXPECT_EQ(refusal(blocked_weight(21, onnx::TensorProto::UINT4, {8, 2}, 8, true)), "");
  EXPECT_EQ(refusal(blocked_weight(21, onnx::TensorProto::INT4, {8, 3}, 6)), "");  // ceil(16 / 6)
  EXPECT_EQ(refusal(blocked_weight(23, onnx::TensorProto::FLOAT4E2M1, {8, 1}, 16)), "");
  // One block wider than the axis (ceil(16 / block) = 1, computed without overflow).
  EXPECT_EQ(refusal(blocked_weight(21, onnx::TensorProto::INT4, {8, 1},
                                   std::numeric_limits<int64_t>::max())), "");
  EXPECT_EQ(refusal(blocked_weight(19, onnx::TensorProto::INT8, {16}, 0)), "");  // per axis
  // onnxruntime's DequantizeLinear refuses each of these when it runs; onnx's checker passes
  // them all (it reads neither the scale's nor the zero point's shape).
  struct Case {
    onnx::ModelProto model;
    std::string says;
  };
  const Case cases[] = {
      {blocked_weight(21, onnx::TensorProto::INT4, {8, 3}, 8), "blocks of 8 along axis 1"},
      {blocked_weight(21, onnx::TensorProto::INT4, {4, 2}, 8), "blocks of 8 along axis 1"},
      {blocked_weight(21, onnx::TensorProto::INT4, {2}, 8), "blocks of 8 along axis 1"},
      {blocked_weight(21, onnx::TensorProto::INT4, {8, 2}, -8), "block_size -8 is negative"},
      {blocked_weight(19, onnx::TensorProto::INT8, {5}, 0), "quantized per axis 1"},
      {blocked_weight(19, onnx::TensorProto::INT8, {8, 2}, 0), "quantized per axis 1"},
  };
  for (const auto& c : cases) {
    const std::string why = refusal(c.model);
    EXPECT_TRUE(says(why, "node 'dqw' (DequantizeLinear)") && says(why, c.says)) << why;
  }
  auto zp = blocked_weight(21, onnx::TensorProto::UINT4, {8, 2}, 8, true);
  *zp.mutable_graph()->mutable_initializer(2) = zeros("wz", onnx::TensorProto::UINT4, {8, 1}, 2);
  std::string why = refusal(zp);
  EXPECT_TRUE(says(why, "node 'dqw'") && says(why, "zero point's shape [8, 1]")) << why;
  // block_size is an attribute of opset 21's schema.
  why = refusal(blocked_weight(19, onnx::TensorProto::INT8, {8, 2}, 8));
  EXPECT_TRUE(says(why, "block_size") && says(why, "onnx's checker")) << why;
  // An axis outside the input's rank.
  auto axis = blocked_weight(21, onnx::TensorProto::INT4, {8, 2}, 8);
  axis.mutable_graph()->mutable_node(0)->mutable_attribute(0)->set_i(5);
  why = refusal(axis);
  EXPECT_TRUE(says(why, "node 'dqw'") && says(why, "axis 5")) << why;
}

TEST(CheckModel, PackedInitializersAreMeasuredAsOnnxPacksThem) {
  // 4-bit values two to a byte: [8, 15] is 60 bytes (the last one half padding).
  EXPECT_NO_THROW(check_tensor_data(zeros("w", onnx::TensorProto::INT4, {8, 15}, 2)));
  auto short_by_one = zeros("w", onnx::TensorProto::INT4, {8, 15}, 2);
  short_by_one.mutable_raw_data()->pop_back();
  EXPECT_THROW(check_tensor_data(short_by_one), DeployError);
  // One byte per 4-bit element (unpacked) is not the packed size either: [8, 15] in 120 bytes.
  EXPECT_THROW(check_tensor_data(zeros("w", onnx::TensorProto::INT4, {8, 15}, 1)), DeployError);
  EXPECT_THROW(check_tensor_data(zeros("w", onnx::TensorProto::FLOAT4E2M1, {2}, 1)), DeployError);
  EXPECT_NO_THROW(check_tensor_data(zeros("f", onnx::TensorProto::FLOAT8E4M3FN, {3, 5})));
  auto fp8 = zeros("f", onnx::TensorProto::FLOAT8E4M3FN, {3, 5});
  fp8.mutable_raw_data()->append("x");
  EXPECT_THROW(check_tensor_data(fp8), DeployError);
  // Typed data: 4-bit values two to an int32_data entry.
  onnx::TensorProto typed4;
  typed4.set_name("t");
  typed4.set_data_type(onnx::TensorProto::UINT4);
  typed4.add_dims(5);
  for (int i = 0; i < 3; ++i) typed4.add_int32_data(0);
  EXPECT_NO_THROW(check_tensor_data(typed4));
  typed4.add_int32_data(0);
  EXPECT_THROW(check_tensor_data(typed4), DeployError);
}

TEST(CheckModel, AnOpsetNewerThanTheSchemasIsRefused) {
  auto m = qdq_matmul(21, 4);
  auto* op = m.add_opset_import();
  op->set_domain("ai.onnx.preview.training");
  op->set_version(99);
  const std::string why = refusal(m);
  EXPECT_TRUE(says(why, "opset 99 of domain 'ai.onnx.preview.training' is newer than the "
                        "deploy's onnx checker knows")) << why;
  EXPECT_GE(known_opset(""), 23);
}

// Found by an hour-long tests/fuzz/campaign.py run (seed 2029, PPLW8A16): a MaxPool whose pads
// (0, 0, 0, 3) exceed its 2 x 2 kernel passed onnx's checker, was deployed, and onnxruntime
// refused the written model ("pads[dim] < kernel_shape[dim]").
TEST(CheckModel, PoolingPadsSmallerThanTheKernel) {
  const auto pool = [](std::vector<double> pads) {
    auto m = standard_model(13);
    auto* g = m.mutable_graph();
    declare(g->add_input(), "x", {1, 1, 8, 8});
    auto* n = add_node(g, "MaxPool", "pool", {"x"}, {"y"});
    for (const char* name : {"kernel_shape", "pads"}) {
      auto* a = n->add_attribute();
      a->set_name(name);
      a->set_type(onnx::AttributeProto::INTS);
      if (std::string(name) == "kernel_shape") {
        a->add_ints(2);
        a->add_ints(2);
      } else {
        for (double p : pads) a->add_ints(static_cast<int64_t>(p));
      }
    }
    const int64_t h = (8 + static_cast<int64_t>(pads[0] + pads[2]) - 2) / 1 + 1;
    const int64_t w = (8 + static_cast<int64_t>(pads[1] + pads[3]) - 2) / 1 + 1;
    declare(g->add_output(), "y", {1, 1, h, w});
    return m;
  };
  EXPECT_EQ(refusal(pool({0, 0, 1, 1})), "");
  const std::string why = refusal(pool({0, 0, 0, 3}));
  EXPECT_TRUE(says(why, "node 'pool' (MaxPool): pads holds 3, not smaller than the kernel's 2"))
      << why;
}
