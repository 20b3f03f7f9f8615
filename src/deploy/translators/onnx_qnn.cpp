// ONNX_QNN (TVM QNN / onnxruntime QLinear ops): <name>.onnx in the output directory, as MQBench's
// ONNXQNNPass: quantizers become uint8 QuantizeLinear / DequantizeLinear (zero point z - qmin);
// a ReLU (or ReLU6 Clip) in front of a quantizer is merged into it (zero point 0; ReLU6 also
// caps the scale at 6/255); then Conv -> QLinearConv (uint8 weights, int32 bias),
// Add -> com.microsoft QLinearAdd, GlobalAveragePool / AveragePool -> com.microsoft
// QLinearGlobalAveragePool / QLinearAveragePool wherever their inputs are dequantized and their
// output (directly or through a Flatten) is quantized; the Q / DQ pairs around them go. Other
// ops (Gemm, Concat, MaxPool...) stay float between their DQ and Q.

#include <cmath>

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

// A standard QuantizeLinear / DequantizeLinear with its three inputs (x, scale, zero point):
// the only kind the rewrites below read by position. (Found by a fuzz campaign: a node of
// another domain retyped "QuantizeLinear", with no zero point initializer, crashed merge_relu.)
bool is_qdq(const onnx::NodeProto& n, const char* op) {
  return n.op_type() == op && (n.domain().empty() || n.domain() == "ai.onnx") &&
         n.input_size() == 3 && n.output_size() == 1;
}

const onnx::NodeProto* producer_of(const OnnxGraph& g, const std::string& t, const char* op) {
  const int p = g.producer(t);
  if (p < 0) return nullptr;
  const auto& n = g.graph().node(p);
  const bool qdq = std::string(op) == "QuantizeLinear" || std::string(op) == "DequantizeLinear";
  if (qdq ? !is_qdq(n, op) : n.op_type() != op) return nullptr;
  return &n;
}

// Relu -> Q: zero point 0, Relu bypassed; Clip(0, 6) -> Q: also scale = min(s, 6 / 255).
void merge_relu(OnnxGraph& g) {
  for (int i = 0; i < g.graph().node_size(); ++i) {
    const auto q = g.graph().node(i);
    if (!is_qdq(q, "QuantizeLinear")) continue;
    // to_qdq's quantizers hold their scale and zero point as initializers; others stay as they are.
    const auto* s = g.initializer(q.input(1));
    const auto* z = g.initializer(q.input(2));
    if (!s || !z) continue;
    const int p = g.producer(q.input(0));
    if (p < 0) continue;
    const auto act = g.graph().node(p);
    if (act.output_size() < 1 || act.input_size() < 1) continue;
    if (g.consumers(act.output(0)).size() != 1 || g.is_graph_output(act.output(0))) continue;
    bool relu6 = false;
    if (act.op_type() == "Clip" && act.input_size() == 3) {
      ConstTensor lo, hi;
      relu6 = g.constant(act.input(1), &lo) && g.constant(act.input(2), &hi) && lo.numel() == 1 &&
              hi.numel() == 1 && lo.values[0] == 0 && hi.values[0] == 6;
      if (!relu6) continue;
    } else if (act.op_type() != "Relu") {
      continue;
    }
    {
      auto c = to_const(*z);
      std::fill(c.values.begin(), c.values.end(), 0.0);
      g.set_initializer(make_tensor(z->name(), z->data_type(), c.dims, c.values));
    }
    if (relu6) {
      s = g.initializer(q.input(1));  // set_initializer may have moved the initializers
      auto c = to_const(*s);
      for (auto& v : c.values) v = std::min(v, static_cast<double>(6.0f / 255.0f));
      g.set_initializer(make_tensor(s->name(), s->data_type(), c.dims, c.values));
    }
    g.set_input(i, 0, act.input(0));
  }
  g.optimize();
}

struct Dequantized {  // x_q, x_scale, x_zero_point of a DequantizeLinear
  std::string q, scale, zero_point;
};

bool dequantized(const OnnxGraph& g, const std::string& t, Dequantized* d) {
  const auto* dq = producer_of(g, t, "DequantizeLinear");
  if (!dq || find_attribute(*dq, "axis")) return false;
  *d = {dq->input(0), dq->input(1), dq->input(2)};
  return true;
}

// The quantizer that takes `t` (directly or through one Flatten): returns its node index and
// the Flatten's index (or -1).
bool quantized_output(const OnnxGraph& g, const std::string& t, int* q, int* flatten) {
  auto only = [&](const std::string& x) -> int {
    const auto cs = g.consumers(x);
    return cs.size() == 1 && !g.is_graph_output(x) && cs[0].second == 0 ? cs[0].first : -1;
  };
  int c = only(t);
  *flatten = -1;
  if (c >= 0 && g.graph().node(c).op_type() == "Flatten") {
    *flatten = c;
    c = only(g.graph().node(c).output(0));
  }
  if (c < 0 || !is_qdq(g.graph().node(c), "QuantizeLinear") || find_attribute(g.graph().node(c), "axis")) {
    return false;
  }
  *q = c;
  return true;
}

bool quantize_weight(OnnxGraph& g, const std::string& w_dq, const std::string& base,
                     Dequantized* w, std::string* w_float) {
  const auto* dq = producer_of(g, w_dq, "DequantizeLinear");
  if (!dq) return false;
  const auto* q = producer_of(g, dq->input(0), "QuantizeLinear");
  if (!q || !g.initializer(q->input(0))) return false;
  *w_float = q->input(0);
  const auto wc = to_const(*g.initializer(q->input(0)));
  const auto s = g.require_constant(q->input(1), "weight scale");
  const auto z = g.require_constant(q->input(2), "weight zero point");
  const int64_t axis = int_attribute(*q, "axis", 1);
  const bool per_channel = s.numel() > 1 || find_attribute(*q, "axis");
  int64_t channels = 1, inner = wc.numel();
  if (per_channel) {
    if (axis != 0 || wc.dims.empty() || wc.dims[0] <= 0) return false;
    channels = wc.dims[0];
    inner = wc.numel() / channels;
  }
  // One scale and zero point per channel (or one in all): sizes come from the file.
  const auto fits = [&](const ConstTensor& t) {
    return t.numel() == (per_channel ? channels : 1) || (!per_channel && t.numel() >= 1);
  };
  if (!fits(s) || !fits(z)) {
    throw DeployError("QuantizeLinear '" + q->name() + "': " + std::to_string(s.numel()) +
                      " scales and " + std::to_string(z.numel()) + " zero points for " +
                      std::to_string(channels) + " channel(s) of weight '" + q->input(0) + "'");
  }
  std::vector<double> wq(wc.values.size());
  for (int64_t c = 0; c < channels; ++c) {
    const double sc = s.values[per_channel ? c : 0], zc = z.values[per_channel ? c : 0];
    for (int64_t i = 0; i < inner; ++i) {
      const double v = std::nearbyint(wc.values[c * inner + i] / sc) + zc;
      wq[c * inner + i] = std::min(std::max(v, 0.0), 255.0);
    }
  }
  const std::string name = g.unique_name(base + "_quantized");
  g.set_initializer(make_tensor(name, onnx::TensorProto::UINT8, wc.dims, wq));
  *w = {name, dq->input(1), dq->input(2)};
  return true;
}

onnx::NodeProto qlinear_node(const std::string& op, const std::string& domain, const onnx::NodeProto& from) {
  onnx::NodeProto n;
  n.set_op_type(op);
  n.set_domain(domain);
  n.set_name(from.name());
  for (const auto& a : from.attribute()) *n.add_attribute() = a;
  return n;
}

void replace_ops(OnnxGraph& g) {
  std::vector<onnx::NodeProto> added;
  std::set<int> dead;
  for (int i = 0; i < g.graph().node_size(); ++i) {
    const auto n = g.graph().node(i);
    const std::string& op = n.op_type();
    if (op != "Conv" && op != "Add" && op != "GlobalAveragePool" && op != "AveragePool") continue;
    int qi, flatten;
    if (!quantized_output(g, n.output(0), &qi, &flatten)) continue;
    const auto& qout = g.graph().node(qi);
    Dequantized a, b;
    if (!dequantized(g, n.input(0), &a)) continue;
    onnx::NodeProto r;
    if (op == "Conv") {
      std::string w_float;
      if (n.input_size() < 2 || !quantize_weight(g, n.input(1), n.input(1), &b, &w_float)) continue;
      r = qlinear_node("QLinearConv", "", n);
      for (const auto& t : {a.q, a.scale, a.zero_point, b.q, b.scale, b.zero_point, qout.input(1), qout.input(2)}) {
        r.add_input(t);
      }
      if (n.input_size() > 2 && !n.input(2).empty()) {
        const auto bias = g.require_constant(n.input(2), "Conv '" + n.name() + "' bias");
        const auto sx = g.require_constant(a.scale, "input scale");
        const auto sw = g.require_constant(b.scale, "weight scale");
        std::vector<double> q(bias.values.size());
        if (sx.numel() != 1 || (sw.numel() != 1 && sw.numel() != bias.numel())) {
          throw DeployError("Conv '" + n.name() + "': " + std::to_string(bias.numel()) +
                            " bias values for " + std::to_string(sx.numel()) + " input and " +
                            std::to_string(sw.numel()) + " weight scales");
        }
        for (size_t c = 0; c < q.size(); ++c) {
          q[c] = std::nearbyint(bias.values[c] / (sx.values[0] * sw.values[sw.numel() > 1 ? c : 0]));
        }
        const std::string name = g.unique_name(n.input(2) + "_quantized");
        g.set_initializer(make_tensor(name, onnx::TensorProto::INT32, bias.dims, q));
        r.add_input(name);
      }
    } else if (op == "Add") {
      if (n.input_size() != 2 || !dequantized(g, n.input(1), &b)) continue;
      r = qlinear_node("QLinearAdd", "com.microsoft", n);
      for (const auto& t : {a.q, a.scale, a.zero_point, b.q, b.scale, b.zero_point, qout.input(1), qout.input(2)}) {
        r.add_input(t);
      }
    } else {
      r = qlinear_node(op == "AveragePool" ? "QLinearAveragePool" : "QLinearGlobalAveragePool", "com.microsoft", n);
      auto* cl = r.add_attribute();
      cl->set_name("channels_last");
      cl->set_type(onnx::AttributeProto::INT);
      cl->set_i(0);
      for (const auto& t : {a.q, a.scale, a.zero_point, qout.input(1), qout.input(2)}) r.add_input(t);
    }
    if (flatten >= 0) {  // QLinear op -> Flatten (on uint8) -> former Q output
      const std::string mid = g.unique_name(n.output(0) + "_quantized");
      r.add_output(mid);
      g.set_input(flatten, 0, mid);
      g.graph().mutable_node(flatten)->set_output(0, qout.output(0));
    } else {
      r.add_output(qout.output(0));
    }
    added.push_back(r);
    dead.insert(i);
    dead.insert(qi);
  }
  g.replace_nodes(dead, std::move(added));  // old nodes out, new ones in, sorted
}

DeployOutput onnx_qnn(OnnxGraph g, const DeployOptions& options) {
  QdqOptions o;
  o.uint8 = true;
  o.backend = "ONNX_QNN";
  to_qdq(g, o);
  merge_relu(g);
  replace_ops(g);
  g.set_opset("com.microsoft", 1);
  return DeployOutput{{onnx_file(options.model_name + ".onnx", g)}, {}};
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(onnx_qnn, "onnx_qnn", mqbench::deploy::translators::onnx_qnn);
