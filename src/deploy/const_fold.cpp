// The constant folder behind OnnxGraph::constant: initializers, Constant nodes, and the small
// chains torch leaves in front of quantization parameters (Identity, Cast, Round, Floor, Neg,
// Clip, Reshape, Squeeze, Unsqueeze), walked back at most OnnxGraph::kMaxFoldDepth nodes. Every
// index and shape read from the model is checked here (docs/security.md).

#include <algorithm>
#include <cmath>
#include <limits>

#include "mqbench/deploy/onnx_graph.h"

namespace mqbench {
namespace deploy {
namespace {

// Round half to even, as ONNX's Round.
double round_even(double v) { return std::nearbyint(v); }

double cast_value(double v, int32_t to) {
  switch (to) {
    case onnx::TensorProto::FLOAT: return static_cast<double>(static_cast<float>(v));
    case onnx::TensorProto::DOUBLE: return v;
    case onnx::TensorProto::BOOL: return v != 0 ? 1 : 0;
    default: return std::trunc(v);  // float -> integer truncates toward zero (onnxruntime)
  }
}

}  // namespace

bool OnnxGraph::constant(const std::string& tensor, ConstTensor* out) const {
  return constant_at(tensor, out, 0);
}

bool OnnxGraph::constant_at(const std::string& tensor, ConstTensor* out, int depth) const {
  if (tensor.empty()) return false;
  if (const auto* init = initializer(tensor)) {
    *out = to_const(*init);
    return true;
  }
  const int p = producer(tensor);
  if (p < 0) return false;
  const auto& n = model_.graph().node(p);
  const std::string& op = n.op_type();
  if (depth >= kMaxFoldDepth) {
    throw DeployError("constant folding of '" + tensor + "' at node '" + n.name() +
                      "' passes through more than " + std::to_string(kMaxFoldDepth) +
                      " nodes: the graph has a cycle, or a chain too long to fold");
  }
  if (!n.domain().empty() && n.domain() != "ai.onnx") return false;
  if (op == "Constant") {
    for (const auto& a : n.attribute()) {
      if (a.name() == "value") {
        *out = to_const(a.t());
        return true;
      }
      if (a.name() == "value_float") { *out = ConstTensor{{}, {a.f()}, onnx::TensorProto::FLOAT}; return true; }
      if (a.name() == "value_int") {
        *out = ConstTensor{{}, {static_cast<double>(a.i())}, onnx::TensorProto::INT64};
        return true;
      }
      if (a.name() == "value_floats") {
        *out = ConstTensor{{a.floats_size()}, {a.floats().begin(), a.floats().end()}, onnx::TensorProto::FLOAT};
        return true;
      }
      if (a.name() == "value_ints") {
        ConstTensor c{{a.ints_size()}, {}, onnx::TensorProto::INT64};
        for (auto v : a.ints()) c.values.push_back(static_cast<double>(v));
        *out = c;
        return true;
      }
    }
    return false;
  }
  if (n.input_size() == 0) return false;
  ConstTensor x;
  if (!constant_at(n.input(0), &x, depth + 1)) return false;
  if (op == "Identity") {
    *out = x;
    return true;
  }
  if (op == "Cast") {
    const auto to = static_cast<int32_t>(int_attribute(n, "to", onnx::TensorProto::FLOAT));
    for (auto& v : x.values) v = cast_value(v, to);
    x.elem_type = to;
    *out = x;
    return true;
  }
  if (op == "Round" || op == "Floor" || op == "Neg") {
    for (auto& v : x.values) v = op == "Round" ? round_even(v) : op == "Floor" ? std::floor(v) : -v;
    *out = x;
    return true;
  }
  if (op == "Clip") {
    double lo = -std::numeric_limits<double>::infinity(), hi = -lo;
    ConstTensor b;
    if (n.input_size() > 1 && !n.input(1).empty()) {
      if (!constant_at(n.input(1), &b, depth + 1) || b.numel() != 1) return false;
      lo = b.values[0];
    }
    if (n.input_size() > 2 && !n.input(2).empty()) {
      if (!constant_at(n.input(2), &b, depth + 1) || b.numel() != 1) return false;
      hi = b.values[0];
    }
    for (auto& v : x.values) v = std::min(std::max(v, lo), hi);
    *out = x;
    return true;
  }
  if (op == "Reshape") {
    ConstTensor shape;
    if (n.input_size() < 2 || !constant_at(n.input(1), &shape, depth + 1)) return false;
    std::vector<int64_t> dims;
    int64_t known = 1, infer = -1;
    const auto bad = [&](const std::string& why) {
      return DeployError("Reshape node '" + n.name() + "': " + why);
    };
    for (size_t i = 0; i < shape.values.size(); ++i) {
      auto d = checked_int64(shape.values[i], "Reshape node '" + n.name() + "' shape");
      if (d == 0 && i < x.dims.size()) d = x.dims[i];
      if (d == -1) {
        if (infer >= 0) throw bad("more than one -1 in the shape");
        infer = static_cast<int64_t>(i);
      } else if (d < 0 || (d > 0 && known > std::numeric_limits<int64_t>::max() / d)) {
        throw bad("invalid dimension " + std::to_string(d));
      } else {
        known *= d;
      }
      dims.push_back(d);
    }
    if (infer >= 0) dims[infer] = known == 0 ? 0 : x.numel() / known;
    int64_t total = 1;
    for (auto d : dims) total *= d;  // bounded: each factor checked above
    if (total != x.numel()) {
      throw bad("shape holds " + std::to_string(total) + " values, the input " +
                std::to_string(x.numel()));
    }
    x.dims = dims;
    *out = x;
    return true;
  }
  if (op == "Squeeze" || op == "Unsqueeze") {
    std::vector<int64_t> axes;
    if (const auto* a = find_attribute(n, "axes")) axes.assign(a->ints().begin(), a->ints().end());
    ConstTensor ax;
    if (axes.empty() && n.input_size() > 1 && constant_at(n.input(1), &ax, depth + 1)) {
      for (auto v : ax.values) axes.push_back(checked_int64(v, n.op_type() + " node '" + n.name() + "' axes"));
    }
    // Axes come from the file: each must lie in [-rank, rank) of the output (Unsqueeze) or the
    // input (Squeeze).
    const auto rank_for_axes =
        static_cast<int64_t>(x.dims.size() + (op == "Unsqueeze" ? axes.size() : 0));
    for (auto a : axes) {
      if (a < -rank_for_axes || a >= rank_for_axes) {
        throw DeployError(op + " node '" + n.name() + "': axis " + std::to_string(a) +
                          " is out of range for rank " + std::to_string(rank_for_axes));
      }
    }
    if (op == "Squeeze") {
      std::vector<int64_t> dims;
      const auto rank = static_cast<int64_t>(x.dims.size());
      for (int64_t i = 0; i < rank; ++i) {
        const bool listed = std::any_of(axes.begin(), axes.end(),
                                        [&](int64_t a) { return (a < 0 ? a + rank : a) == i; });
        if (!(x.dims[i] == 1 && (axes.empty() || listed))) dims.push_back(x.dims[i]);
      }
      x.dims = dims;
    } else {
      const auto rank = static_cast<int64_t>(x.dims.size() + axes.size());
      std::vector<int64_t> norm;
      for (auto a : axes) norm.push_back(a < 0 ? a + rank : a);
      std::sort(norm.begin(), norm.end());
      if (std::adjacent_find(norm.begin(), norm.end()) != norm.end()) {
        throw DeployError("Unsqueeze node '" + n.name() + "': repeated axis");
      }
      for (auto a : norm) x.dims.insert(x.dims.begin() + a, 1);
    }
    *out = x;
    return true;
  }
  return false;
}

ConstTensor OnnxGraph::require_constant(const std::string& tensor, const std::string& what) const {
  ConstTensor c;
  if (!constant(tensor, &c)) {
    throw DeployError(what + ": input '" + tensor + "' is not a constant (the deploy passes need "
                      "quantization parameters as initializers or Constant nodes)");
  }
  return c;
}

}  // namespace deploy
}  // namespace mqbench
