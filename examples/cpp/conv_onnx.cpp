// The ONNX half of quantize_conv: writes the trained layer as torch.onnx.export writes mqbench's
// quantizers, x -> fixed per-tensor -> Conv(weight through per-channel LSQ) -> per-tensor LSQ -> y.
// It uses the ONNX protobuf classes, so it is compiled against mqbench::deploy without torch's
// include folders (torch ships protobuf headers of its own: docs/design/build-and-ci.md).

#include "conv_onnx.h"

#include "mqbench/deploy/translator.h"

namespace {

namespace dep = mqbench::deploy;

void add_node(onnx::GraphProto* g, const char* op, const char* domain, std::vector<std::string> in,
              const char* out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_domain(domain);
  n->set_name(std::string(op) + "_" + out);
  for (auto& i : in) n->add_input(i);
  n->add_output(out);
}

}  // namespace

std::string conv_onnx(const ConvLayer& layer) {
  onnx::ModelProto m;
  m.set_ir_version(7);
  m.add_opset_import()->set_version(13);
  auto* mq = m.add_opset_import();
  mq->set_domain("mqbench");
  mq->set_version(1);
  auto* g = m.mutable_graph();
  g->set_name("quantize_conv");
  auto io = [](onnx::ValueInfoProto* v, const char* name, std::vector<int64_t> dims) {
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(onnx::TensorProto::FLOAT);
    for (auto d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  };
  io(g->add_input(), "x", {1, 3, 12, 12});
  io(g->add_output(), "y", {1, 8, 12, 12});
  const auto f = onnx::TensorProto::FLOAT;
  *g->add_initializer() = dep::make_tensor("conv.weight", f, layer.weight_shape, layer.weight);
  *g->add_initializer() = dep::make_tensor("conv.bias", f, {8}, layer.bias);
  *g->add_initializer() = dep::make_tensor("w.scale", f, {8}, layer.w_scale);
  *g->add_initializer() = dep::make_tensor("w.zero_point", f, {8}, std::vector<double>(8, 0.0));
  *g->add_initializer() = dep::make_tensor("a.scale", f, {1}, {layer.a_scale});
  *g->add_initializer() = dep::make_tensor("a.zero_point", f, {1}, {0.0});
  *g->add_initializer() = dep::make_tensor("qmin", onnx::TensorProto::INT64, {}, {-128.0});
  *g->add_initializer() = dep::make_tensor("qmax", onnx::TensorProto::INT64, {}, {127.0});
  *g->add_initializer() = dep::make_tensor("x.scale", f, {1}, {layer.x_scale});
  *g->add_initializer() = dep::make_tensor("x.zero_point", f, {1}, {0.0});
  *g->add_initializer() = dep::make_tensor("x.qmin", onnx::TensorProto::INT64, {}, {-127.0});
  *g->add_initializer() = dep::make_tensor("x.qmax", onnx::TensorProto::INT64, {}, {127.0});
  add_node(g, "FixedPerTensorAffine", "mqbench", {"x", "x.scale", "x.zero_point", "x.qmin", "x.qmax"},
           "xq");
  add_node(g, "FakeQuantizeLearnablePerchannelAffine", "mqbench", {"conv.weight", "w.scale", "w.zero_point"}, "wq");
  for (auto [name, v] : {std::pair<const char*, int64_t>{"quant_min", -127}, {"quant_max", 127}}) {
    auto* a = g->mutable_node(1)->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  add_node(g, "Conv", "", {"xq", "wq", "conv.bias"}, "conv_out");
  auto* conv_node = g->mutable_node(2);
  for (const char* attr : {"pads"}) {
    auto* a = conv_node->add_attribute();
    a->set_name(attr);
    a->set_type(onnx::AttributeProto::INTS);
    for (int k = 0; k < 4; ++k) a->add_ints(1);
  }
  add_node(g, "LearnablePerTensorAffine", "mqbench", {"conv_out", "a.scale", "a.zero_point", "qmin", "qmax"}, "y");
  return dep::OnnxGraph(std::move(m)).serialize();
}


