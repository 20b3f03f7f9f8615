// canonicalize_ops: the exporter-independent forms of global average pooling and flattening
// (mqbench/deploy/canonicalize.h says which, and why).

#include "mqbench/deploy/canonicalize.h"

#include "mqbench/deploy/pass.h"

#include <limits>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace mqbench {
namespace deploy {
namespace {

bool is_standard(const onnx::NodeProto& n) { return n.domain().empty() || n.domain() == "ai.onnx"; }

// Ops whose output has the rank of their first input.
bool keeps_rank(const onnx::NodeProto& n) {
  static const std::set<std::string> standard = {
      "Abs", "AveragePool", "BatchNormalization", "Cast", "Ceil", "Clip", "Conv",
      "ConvTranspose", "DequantizeLinear", "Dropout", "Elu", "Erf", "Exp", "Floor",
      "GlobalAveragePool", "GlobalMaxPool", "HardSigmoid", "HardSwish", "Identity",
      "InstanceNormalization", "LRN", "LeakyRelu", "Log", "LogSoftmax", "MaxPool", "Neg", "PRelu",
      "Pad", "QuantizeLinear", "Reciprocal", "Relu", "Resize", "Round", "Selu", "Sigmoid", "Sign",
      "Softmax", "Softplus", "Sqrt", "Tanh", "Upsample"};
  // MQBench's fake-quantize nodes (mqbench domain, or the default domain as MQBench 1.10 wrote
  // them) output their input's shape.
  static const std::set<std::string> fake_quant = {
      "FixedPerTensorAffine", "LearnablePerTensorAffine", "FixedPerChannelAffine",
      "FakeQuantizeLearnablePerchannelAffine", "FakeQuantizeDSQPertensor",
      "FakeQuantizeDSQPerchannel", "FakeQuantizeTqtAffine", "NNIEQuantize"};
  if (n.domain() == "mqbench") return fake_quant.count(n.op_type()) > 0;
  return is_standard(n) && (standard.count(n.op_type()) || fake_quant.count(n.op_type()));
}

// Elementwise ops with broadcasting: the output's rank is the largest input rank.
bool broadcasts(const onnx::NodeProto& n) {
  static const std::set<std::string> ops = {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min",
                                            "Sum", "Mean"};
  return is_standard(n) && ops.count(n.op_type()) > 0;
}

// Shapes the model records (graph inputs and outputs, value_info, initializers), -1 for a
// symbolic dimension, and ranks derived through rank-keeping ops.
class Shapes {
 public:
  explicit Shapes(const OnnxGraph& g) : g_(g) {
    auto add = [&](const onnx::ValueInfoProto& v) {
      if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
      std::vector<int64_t> dims;
      for (const auto& d : v.type().tensor_type().shape().dim()) {
        dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
      }
      recorded_[v.name()] = dims;
    };
    for (const auto& v : g.graph().input()) add(v);
    for (const auto& v : g.graph().output()) add(v);
    for (const auto& v : g.graph().value_info()) add(v);
    for (const auto& t : g.graph().initializer()) {
      recorded_[t.name()] = std::vector<int64_t>(t.dims().begin(), t.dims().end());
    }
  }

  /// The recorded shape of `t`, every dimension static; false otherwise.
  bool static_shape(const std::string& t, std::vector<int64_t>* dims) const {
    const auto it = recorded_.find(t);
    if (it == recorded_.end()) return false;
    for (auto d : it->second) {
      if (d < 0) return false;
    }
    *dims = it->second;
    return true;
  }

  /// The rank of `t`, or -1 when neither recorded nor derivable within kMaxFoldDepth ops.
  int64_t rank(const std::string& t, int depth = 0) {
    const auto it = recorded_.find(t);
    if (it != recorded_.end()) return static_cast<int64_t>(it->second.size());
    const auto memo = ranks_.find(t);
    if (memo != ranks_.end()) return memo->second;
    int64_t r = -1;
    const int p = g_.producer(t);
    if (p >= 0 && depth < OnnxGraph::kMaxFoldDepth) {
      const auto& n = g_.graph().node(p);
      if (keeps_rank(n) && n.input_size() > 0) {
        r = rank(n.input(0), depth + 1);
      } else if (is_standard(n) && n.op_type() == "Flatten") {
        r = 2;
      } else if (broadcasts(n)) {
        for (const auto& in : n.input()) {
          const int64_t ri = rank(in, depth + 1);
          if (ri < 0) {
            r = -1;
            break;
          }
          r = std::max(r, ri);
        }
      }
    }
    ranks_[t] = r;
    return r;
  }

 private:
  const OnnxGraph& g_;
  std::map<std::string, std::vector<int64_t>> recorded_;
  std::map<std::string, int64_t> ranks_;
};

std::string describe(const onnx::NodeProto& n) { return n.op_type() + " node '" + n.name() + "'"; }

// ReduceMean(x, axes {2, 3}, keepdims=1) of a rank-4 x -> GlobalAveragePool(x).
bool reduce_mean_to_global_average_pool(const OnnxGraph& g, Shapes& shapes, onnx::NodeProto* n) {
  if (n->op_type() != "ReduceMean" || !is_standard(*n) || n->input_size() < 1) return false;
  if (int_attribute(*n, "keepdims", 1) != 1) return false;
  std::vector<int64_t> axes;
  if (const auto* a = find_attribute(*n, "axes")) {
    axes.assign(a->ints().begin(), a->ints().end());
  } else if (n->input_size() > 1 && !n->input(1).empty()) {
    ConstTensor c;
    if (!g.constant(n->input(1), &c)) return false;  // axes computed at run time
    for (double v : c.values) axes.push_back(checked_int64(v, describe(*n) + " axes"));
  }
  if (axes.empty()) return false;  // every axis (or none, with noop_with_empty_axes)
  if (shapes.rank(n->input(0)) != 4) return false;
  std::set<int64_t> normalized;
  for (auto a : axes) {
    if (a < -4 || a >= 4) return false;  // malformed: left for the runtime to refuse
    normalized.insert(a < 0 ? a + 4 : a);
  }
  if (normalized != std::set<int64_t>{2, 3}) return false;
  const std::string x = n->input(0);
  n->clear_input();
  n->add_input(x);
  n->clear_attribute();
  n->set_op_type("GlobalAveragePool");
  return true;
}

// Reshape(x, [d0, d1 * ... * dk]) of a static x of rank >= 3 -> Flatten(x, axis=1).
bool reshape_to_flatten(const OnnxGraph& g, const Shapes& shapes, onnx::NodeProto* n) {
  if (n->op_type() != "Reshape" || !is_standard(*n) || n->input_size() < 2) return false;
  std::vector<int64_t> in;
  if (!shapes.static_shape(n->input(0), &in) || in.size() < 3) return false;
  ConstTensor shape;
  if (!g.constant(n->input(1), &shape) || shape.numel() != 2) return false;
  int64_t rest = 1, total = in[0];
  for (size_t i = 1; i < in.size(); ++i) {  // dimensions from the file: no overflow
    if (in[i] != 0 && (rest > std::numeric_limits<int64_t>::max() / in[i] ||
                       total > std::numeric_limits<int64_t>::max() / in[i])) {
      return false;
    }
    rest *= in[i];
    total *= in[i];
  }
  int64_t d0 = checked_int64(shape.values[0], describe(*n) + " shape");
  int64_t d1 = checked_int64(shape.values[1], describe(*n) + " shape");
  if (int_attribute(*n, "allowzero", 0) == 0) {  // 0 copies the input's dimension
    if (d0 == 0) d0 = in[0];
    if (d1 == 0) d1 = in[1];
  }
  if (d0 == -1 && d1 != -1) d0 = d1 > 0 && total % d1 == 0 ? total / d1 : -2;
  if (d1 == -1 && d0 != -1) d1 = d0 > 0 && total % d0 == 0 ? total / d0 : -2;
  if (d0 != in[0] || d1 != rest) return false;
  const std::string x = n->input(0);
  n->clear_input();
  n->add_input(x);
  n->clear_attribute();
  auto* axis = n->add_attribute();
  axis->set_name("axis");
  axis->set_type(onnx::AttributeProto::INT);
  axis->set_i(1);
  n->set_op_type("Flatten");
  return true;
}

}  // namespace

bool canonicalize_ops(OnnxGraph& g) {
  const PassScope scope("canonicalize_ops", g);
  Shapes shapes(g);
  bool modified = false;
  for (auto& n : *g.graph().mutable_node()) {
    modified |= reduce_mean_to_global_average_pool(g, shapes, &n);
    modified |= reshape_to_flatten(g, shapes, &n);
  }
  if (modified) g.remove_nodes({});  // re-indexes; drops the axes / shape constants now unused
  return modified;
}

MQBENCH_REGISTER_DEPLOY_PASS(canonicalize_ops, "canonicalize_ops",
                             "global average pooling and flattening in the form torch's TorchScript "
                             "exporter writes (ReduceMean -> GlobalAveragePool, Reshape -> Flatten)",
                             [](OnnxGraph& g) { return PassResult{canonicalize_ops(g), ""}; });

}  // namespace deploy
}  // namespace mqbench
