#pragma once
// ONNX graph builders shared by the deploy tests (test_deploy.cpp, test_canonicalize_ops.cpp,
// test_passes.cpp): nodes, attributes, typed graph inputs and outputs, and the small fake-quant
// model most tests start from.

#include <cstdint>
#include <string>
#include <vector>

#include "mqbench/deploy/onnx_graph.h"

namespace deploy_test {

using mqbench::deploy::OnnxGraph;
using mqbench::deploy::make_tensor;

inline onnx::NodeProto* add_node(onnx::GraphProto* g, const std::string& op, const std::string& name,
                          std::vector<std::string> in, std::vector<std::string> out,
                          const std::string& domain = "") {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(name);
  n->set_domain(domain);
  for (auto& i : in) n->add_input(i);
  for (auto& o : out) n->add_output(o);
  return n;
}

inline void add_int_attr(onnx::NodeProto* n, const std::string& name, int64_t v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}

// A float tensor of rank `rank` with unknown dimensions: onnx's checker wants a type and a
// shape on every graph input and output, and strict shape inference the right rank.
inline void typed(onnx::ValueInfoProto* v, const std::string& name, int rank) {
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  auto* shape = t->mutable_shape();
  for (int i = 0; i < rank; ++i) shape->add_dim();
}

// A model importing opset 13 and the mqbench domain, with an empty graph named `name`.
inline onnx::ModelProto empty_model(const std::string& name) {
  onnx::ModelProto m;
  m.set_ir_version(7);
  m.add_opset_import()->set_version(13);
  auto* mq = m.add_opset_import();
  mq->set_domain("mqbench");
  mq->set_version(1);
  m.mutable_graph()->set_name(name);
  return m;
}

// x -> FixedPerTensorAffine -> Conv(W via FakeQuantizeLearnablePerchannelAffine) -> Relu
//   -> LearnablePerTensorAffine -> y (a fake-quantized graph output)
inline OnnxGraph sample(int64_t act_qmin = -127, int64_t act_qmax = 127) {
  auto m = empty_model("sample");
  auto* g = m.mutable_graph();
  typed(g->add_input(), "x", 4);
  typed(g->add_output(), "y", 4);
  auto init = [&](const std::string& name, int32_t type, std::vector<int64_t> dims, std::vector<double> v) {
    *g->add_initializer() = make_tensor(name, type, dims, v);
  };
  init("s_x", onnx::TensorProto::FLOAT, {}, {0.05});
  init("z_x", onnx::TensorProto::INT32, {}, {0});
  init("qmin", onnx::TensorProto::INT64, {}, {static_cast<double>(act_qmin)});
  init("qmax", onnx::TensorProto::INT64, {}, {static_cast<double>(act_qmax)});
  init("W", onnx::TensorProto::FLOAT, {2, 1, 1, 1}, {0.5, -3.0});
  init("s_w", onnx::TensorProto::FLOAT, {2}, {0.01, 0.02});
  init("z_w", onnx::TensorProto::FLOAT, {2}, {0, 0});
  init("s_y", onnx::TensorProto::FLOAT, {1}, {0.1});
  init("z_y", onnx::TensorProto::FLOAT, {1}, {0.4});  // learnable: a float, rounded on deploy
  add_node(g, "FixedPerTensorAffine", "fq_x", {"x", "s_x", "z_x", "qmin", "qmax"}, {"xq"}, "mqbench");
  auto* w = add_node(g, "FakeQuantizeLearnablePerchannelAffine", "fq_w", {"W", "s_w", "z_w"}, {"Wq"}, "mqbench");
  add_int_attr(w, "quant_min", -127);
  add_int_attr(w, "quant_max", 127);
  add_node(g, "Conv", "conv", {"xq", "Wq"}, {"c"});
  add_node(g, "Relu", "relu", {"c"}, {"r"});
  add_node(g, "LearnablePerTensorAffine", "fq_y", {"r", "s_y", "z_y", "qmin", "qmax"}, {"y"}, "mqbench");
  return OnnxGraph(std::move(m));
}

inline int count(const OnnxGraph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.graph().node()) n += node.op_type() == op;
  return n;
}

inline void set_shape(onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims) {
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(onnx::TensorProto::FLOAT);
  auto* shape = t->mutable_shape();
  for (auto d : dims) {
    if (d < 0) shape->add_dim()->set_dim_param("batch");
    else shape->add_dim()->set_dim_value(d);
  }
}

}  // namespace deploy_test
