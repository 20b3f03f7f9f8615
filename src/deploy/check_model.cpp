// check_model: the ONNX standard's checks on the deploy's input and on every ONNX file it writes
// (mqbench/deploy/check_model.h says which).

#include "mqbench/deploy/check_model.h"

#include "mqbench/deploy/fake_quant.h"

#include <onnx/checker.h>
#include <onnx/defs/schema.h>
#include <onnx/shape_inference/implementation.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <queue>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace mqbench {
namespace deploy {
namespace {

constexpr const char* kMqbenchDomain = "mqbench";
constexpr int64_t kMaxIrVersion = 14;

// "ai.onnx" is another name of the default domain.
std::string canonical(const std::string& domain) { return domain == "ai.onnx" ? "" : domain; }

bool is_standard(const std::string& domain) {
  const std::string d = canonical(domain);
  return d.empty() || d == "ai.onnx.ml" || d == "ai.onnx.training" ||
         d == "ai.onnx.preview.training";
}

std::string describe(const onnx::NodeProto& n) {
  return "node '" + n.name() + "' (" + (n.domain().empty() ? "" : n.domain() + ":") + n.op_type() + ")";
}

// The first line of an exception from libonnx (its messages run on with a dump of the node).
std::string first_line(const std::string& s) {
  const auto nl = s.find('\n');
  std::string line = nl == std::string::npos ? s : s.substr(0, nl);
  // The node's name and type follow on a "==> Context:" line: keep it.
  const auto ctx = s.find("==> Context:");
  if (ctx != std::string::npos) {
    const auto end = s.find('\n', ctx);
    line += " (" + s.substr(ctx + 4, end == std::string::npos ? std::string::npos : end - ctx - 4) + ")";
  }
  return line;
}

// The nodes of `g` in a topological order that keeps the given order where it already is one;
// a cycle leaves the rest in place (the checker then names a node of it).
void sort_nodes(onnx::GraphProto* g) {
  const int n = g->node_size();
  std::unordered_map<std::string, int> producer;
  for (int i = 0; i < n; ++i) {
    for (const auto& o : g->node(i).output()) {
      if (!o.empty()) producer.emplace(o, i);
    }
  }
  std::vector<int> indegree(n, 0);
  std::vector<std::vector<int>> next(n);
  for (int i = 0; i < n; ++i) {
    std::set<int> preds;
    for (const auto& in : g->node(i).input()) {
      const auto it = producer.find(in);
      if (it != producer.end() && it->second != i) preds.insert(it->second);
    }
    indegree[i] = static_cast<int>(preds.size());
    for (int p : preds) next[p].push_back(i);
  }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < n; ++i) {
    if (indegree[i] == 0) ready.push(i);
  }
  std::vector<int> order;
  std::vector<char> placed(n, 0);
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    placed[i] = 1;
    for (int j : next[i]) {
      if (--indegree[j] == 0) ready.push(j);
    }
  }
  for (int i = 0; i < n; ++i) {
    if (!placed[i]) order.push_back(i);
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> sorted;
  for (int i : order) *sorted.Add() = std::move(*g->mutable_node(i));
  g->mutable_node()->Swap(&sorted);
}

// The newest opset of each domain a runtime here (onnxruntime 1.2x, OpenVINO) reads; a model
// importing a later one (or a mutated number) would carry it into every artifact.
int64_t newest_opset(const std::string& domain) {
  static const std::map<std::string, int64_t> newest = {
      {"", 23}, {"ai.onnx.ml", 5}, {"com.microsoft", 1}, {"mqbench", 1},
      {"org.openvinotoolkit", 1}};
  const auto it = newest.find(domain);
  return it == newest.end() ? -1 : it->second;
}

const onnx::AttributeProto* attribute(const onnx::NodeProto& n, const char* name) {
  return find_attribute(n, name);
}

// Checks onnxruntime makes on the inferred shapes when it loads a model, which onnx's shape
// inference does not all make (libonnx 1.12, the deploy's checker before onnx 1.23 was compiled
// in, made none): after inference, the dimensions two inputs of one node must share.
class InferredShapes {
 public:
  explicit InferredShapes(const onnx::GraphProto& g) {
    auto add = [&](const onnx::ValueInfoProto& v) {
      if (!v.type().has_tensor_type() || !v.type().tensor_type().has_shape()) return;
      types_[v.name()] = v.type().tensor_type().elem_type();
      std::vector<int64_t> dims;
      for (const auto& d : v.type().tensor_type().shape().dim()) {
        dims.push_back(d.has_dim_value() ? d.dim_value() : -1);
      }
      shapes_[v.name()] = dims;
    };
    for (const auto& v : g.input()) add(v);
    for (const auto& v : g.value_info()) add(v);
    for (const auto& v : g.output()) add(v);
    for (const auto& t : g.initializer()) {
      shapes_[t.name()] = {t.dims().begin(), t.dims().end()};
      types_[t.name()] = t.data_type();
    }
  }
  // The element type of `t`, or 0 (unknown).
  int32_t type_of(const std::string& t) const {
    const auto it = types_.find(t);
    return it == types_.end() ? 0 : it->second;
  }
  // The shape of `t`, or nullptr.
  const std::vector<int64_t>* of(const std::string& t) const {
    const auto it = shapes_.find(t);
    return it == shapes_.end() ? nullptr : &it->second;
  }

 private:
  std::unordered_map<std::string, std::vector<int64_t>> shapes_;
  std::unordered_map<std::string, int32_t> types_;
};

// The convolution and pooling ops, whose attributes and ranks are checked below.
bool is_window_op(const std::string& op) {
  static const std::set<std::string> ops = {"Conv", "ConvTranspose", "ConvInteger", "MaxPool",
                                            "AveragePool", "LpPool", "MaxUnpool", "QLinearConv",
                                            "DeformConv"};
  return ops.count(op) > 0;
}

// Checks libonnx 1.12's shape inference did not make before it read the attributes of the
// convolution and pooling ops: with a zero stride it divided by zero, with attribute lists
// shorter than the kernel's rank it read past them (both found by a fuzz campaign, as crashes
// inside libonnx). onnx 1.13 and later refuse these models the same way; the checks stay, so a
// regression of onnx's own is refused here first.
void check_window_attributes(const InferredShapes& recorded, const onnx::NodeProto& n,
                             const std::string& what) {
  if (!is_window_op(n.op_type())) return;
  const auto fail = [&](const std::string& why) {
    throw DeployError(what + ": " + describe(n) + ": " + why);
  };
  // The kernel's spatial rank: from kernel_shape, else from the weight's recorded shape; the
  // input's and the weight's recorded ranks must agree with it.
  const bool pool = n.op_type().find("Pool") != std::string::npos;
  const int w_slot = n.op_type() == "QLinearConv" ? 3 : 1;
  const std::vector<int64_t>* w = nullptr;
  if (!pool && n.input_size() > w_slot) w = recorded.of(n.input(w_slot));
  const int x_slot = 0;
  const std::vector<int64_t>* x = n.input_size() > x_slot ? recorded.of(n.input(x_slot)) : nullptr;
  int64_t spatial = -1;
  if (const auto* k = attribute(n, "kernel_shape")) {
    spatial = k->ints_size();
  } else if (w) {
    spatial = static_cast<int64_t>(w->size()) - 2;
  }
  if (w && w->size() < 3) {
    fail("its weight has rank " + std::to_string(w->size()) + " (M x C x k1...)");
  }
  if (x && x->size() < 3) {
    fail("its input has rank " + std::to_string(x->size()) + " (N x C x D1...)");
  }
  if (w && static_cast<int64_t>(w->size()) != spatial + 2) {
    fail("its weight has rank " + std::to_string(w->size()) + ", not " +
         std::to_string(spatial + 2));
  }
  if (x && spatial >= 0 && static_cast<int64_t>(x->size()) != spatial + 2) {
    fail("its input has rank " + std::to_string(x->size()) + ", not " +
         std::to_string(spatial + 2));
  }
  const auto positive = [&](const char* name, int64_t per_dim, int64_t min) {
    const auto* a = attribute(n, name);
    if (!a) return;
    if (a->type() != onnx::AttributeProto::INTS) fail(std::string(name) + " must be a list of ints");
    if (spatial >= 0 && a->ints_size() != per_dim * spatial) {
      fail(std::string(name) + " has " + std::to_string(a->ints_size()) + " values for a " +
           std::to_string(spatial) + "-d kernel");
    }
    for (auto v : a->ints()) {
      if (v < min) fail(std::string(name) + " holds " + std::to_string(v));
    }
  };
  // (With neither, the lengths are left to shape inference, which then has no weight shape to
  // index by either.)
  if (spatial == 0) fail("the kernel has no spatial dimension");
  positive("kernel_shape", 1, 1);
  positive("strides", 1, 1);
  positive("dilations", 1, 1);
  positive("pads", 2, 0);
  positive("output_padding", 1, 0);
  positive("output_shape", 1, 0);
  if (const auto* a = attribute(n, "group")) {
    if (a->type() != onnx::AttributeProto::INT || a->i() < 1) fail("group must be a positive int");
  }
  // onnxruntime's pooling kernels want each pad smaller than the kernel along its axis (a window
  // that lies wholly in the padding has no input to pool); onnx's checker does not ask.
  const auto* k = attribute(n, "kernel_shape");
  const auto* p = attribute(n, "pads");
  if (pool && k && p && p->ints_size() == 2 * k->ints_size()) {
    for (int i = 0; i < p->ints_size(); ++i) {
      const int64_t kernel = k->ints(i % k->ints_size());
      if (p->ints(i) >= kernel) {
        fail("pads holds " + std::to_string(p->ints(i)) + ", not smaller than the kernel's " +
             std::to_string(kernel) + " along its axis");
      }
    }
  }
}

// String attributes onnxruntime reads as enums.
void check_mode_attributes(const onnx::NodeProto& n, const std::string& what) {
  if (n.op_type() != "Resize" && n.op_type() != "Upsample") return;
  static const std::map<std::string, std::set<std::string>> allowed = {
      {"mode", {"nearest", "linear", "cubic", "bilinear"}},
      {"coordinate_transformation_mode",
       {"half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners",
        "asymmetric", "tf_half_pixel_for_nn", "tf_crop_and_resize"}},
      {"nearest_mode", {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"}},
      {"keep_aspect_ratio_policy", {"stretch", "not_larger", "not_smaller"}}};
  for (const auto& kv : allowed) {
    const auto* a = attribute(n, kv.first.c_str());
    if (a && !kv.second.count(a->s())) {
      std::string shown = a->s().substr(0, 40);
      throw DeployError(what + ": " + describe(n) + ": " + kv.first + " '" + shown +
                        "' is not one ONNX defines");
    }
  }
  if (n.op_type() == "Upsample") {
    const auto* a = attribute(n, "mode");
    if (a && a->s() == "cubic") {
      throw DeployError(what + ": " + describe(n) + ": Upsample has no cubic mode");
    }
  }
}

// ONNX's 0 / 1 flags. ONNX defines no other value, and its own tools read one differently: for
// a ReduceMax-18 with keepdims 127 (found by tests/fuzz/campaign.py) onnx's shape
// inference and onnxruntime 1.32 drop the axis (keepdims == 1 keeps it), onnx's reference
// evaluator keeps it (keepdims != 0), so the shapes checked are not the shapes every tool computes.
void check_flag_attributes(const onnx::NodeProto& n, const std::string& what) {
  static const std::set<std::string> flags = {
      "keepdims", "noop_with_empty_axes", "select_last_index", "transA", "transB", "saturate",
      "count_include_pad", "ceil_mode", "allowzero", "training_mode", "storage_order",
      "exclusive", "reverse", "largest", "sorted", "upper", "fmod", "detect_negative",
      "detect_positive", "center_point_box"};
  for (const auto& a : n.attribute()) {
    if (a.type() == onnx::AttributeProto::INT && a.i() != 0 && a.i() != 1 &&
        flags.count(a.name())) {
      throw DeployError(what + ": " + describe(n) + ": " + a.name() + " " + std::to_string(a.i()) +
                        " is not 0 or 1");
    }
  }
}

// Note [Resize scales before shape inference]
// libonnx's shape inference of Resize and Upsample (resizeShapeInferenceHelper) casts
// floor(dim * scale) to int64 without a range check: a constant scale of 3.9e25, found by the
// fuzz campaign, is undefined behaviour there. The scales it can read (an initializer, a
// Constant node's value, Upsample-7's attribute; OnnxGraph::constant also follows the short
// Identity / Cast chains the passes fold) must be finite, positive and at most kMaxResizeScale;
// any dimension below 2^39 then scales within int64. Computed scales are not read by the
// inference (no data propagation) and are left to the runtime.
constexpr double kMaxResizeScale = 16777216.0;  // 2^24

void check_resize_scales(const OnnxGraph& g, const onnx::NodeProto& n, int64_t opset,
                         const std::string& what) {
  if (n.op_type() != "Resize" && n.op_type() != "Upsample") return;
  std::vector<double> scales;
  if (const auto* a = attribute(n, "scales")) scales.assign(a->floats().begin(), a->floats().end());
  const int k = n.op_type() == "Resize" && opset >= 11 ? 2 : 1;  // opset 11+: roi, then scales
  ConstTensor c;
  if (n.input_size() > k && !n.input(k).empty() && g.constant(n.input(k), &c) &&
      (c.elem_type == onnx::TensorProto::FLOAT || c.elem_type == onnx::TensorProto::DOUBLE)) {
    scales.insert(scales.end(), c.values.begin(), c.values.end());
  }
  for (const double v : scales) {
    if (!(std::isfinite(v) && v > 0.0 && v <= kMaxResizeScale)) {
      std::ostringstream shown;
      shown << v;
      throw DeployError(what + ": " + describe(n) + ": scale " + shown.str() + " is not a "
                        "finite factor in (0, 2^24]");
    }
  }
}

bool valid_elem_type(int32_t t) {
  return t != onnx::TensorProto::UNDEFINED && onnx::TensorProto_DataType_IsValid(t);
}

// The element types written in the model (initializers, Constant values, the graph's inputs and
// outputs, value_info): onnxruntime refuses a number that names no type.
void check_elem_types(const onnx::GraphProto& g, const std::string& what) {
  for (const auto& t : g.initializer()) {
    if (!valid_elem_type(t.data_type())) {
      throw DeployError(what + ": initializer '" + t.name() + "' has data type " +
                        std::to_string(t.data_type()) + ", which ONNX does not define");
    }
  }
  for (const auto& n : g.node()) {
    for (const auto& a : n.attribute()) {
      if (a.has_t() && !valid_elem_type(a.t().data_type())) {
        throw DeployError(what + ": " + describe(n) + ": attribute " + a.name() +
                          " holds a tensor of data type " + std::to_string(a.t().data_type()) +
                          ", which ONNX does not define");
      }
    }
  }
  for (const auto* list : {&g.input(), &g.output(), &g.value_info()}) {
    for (const auto& v : *list) {
      if (v.type().has_tensor_type() && v.type().tensor_type().has_elem_type() &&
          !valid_elem_type(v.type().tensor_type().elem_type())) {
        throw DeployError(what + ": tensor '" + v.name() + "' is declared with data type " +
                          std::to_string(v.type().tensor_type().elem_type()) +
                          ", which ONNX does not define");
      }
    }
  }
}

// The shapes of a QuantizeLinear's / DequantizeLinear's scale and zero point against its input,
// as onnxruntime's kernels require them when they run (onnx's shape inference reads neither):
//  * per tensor: a scale of one element (a scalar, or 1-D of size 1);
//  * per axis (block_size 0, opset 13+): a 1-D scale of the size of the input's `axis`;
//  * blocked (block_size > 0, opset 21+): a scale of the input's rank whose `axis` dimension is
//    ceil(D / block_size) and whose other dimensions are the input's;
// and a zero point, when given, of the scale's shape.
void check_quantize_params(const InferredShapes& shapes, const onnx::NodeProto& n,
                           const std::function<void(const std::string&)>& fail) {
  const auto shape = [&](int k) -> const std::vector<int64_t>* {
    return n.input_size() > k && !n.input(k).empty() ? shapes.of(n.input(k)) : nullptr;
  };
  const auto text = [](const std::vector<int64_t>& dims) {
    std::string t = "[";
    for (size_t i = 0; i < dims.size(); ++i) t += (i ? ", " : "") + std::to_string(dims[i]);
    return t + "]";
  };
  const int64_t block = int_attribute(n, "block_size", 0);
  if (block < 0) fail("block_size " + std::to_string(block) + " is negative");
  const auto one_element = [](const std::vector<int64_t>* dims) {
    return dims->size() == 0 || (dims->size() == 1 && (*dims)[0] == 1);
  };
  const auto *x = shape(0), *scale = shape(1), *zero = shape(2);
  const auto agree = [](const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (a[i] >= 0 && b[i] >= 0 && a[i] != b[i]) return false;
    }
    return true;
  };
  if (scale && zero && !agree(*scale, *zero) && !(one_element(scale) && one_element(zero))) {
    fail("its zero point's shape " + text(*zero) + " is not its scale's " + text(*scale));
  }
  if (!x || !scale || one_element(scale)) return;  // (one element: per tensor)
  const auto rank = static_cast<int64_t>(x->size());
  int64_t axis = int_attribute(n, "axis", 1);
  if (axis < -rank || axis >= rank) {
    fail("axis " + std::to_string(axis) + " is out of range for its input of rank " +
         std::to_string(rank));
  }
  if (axis < 0) axis += rank;
  const int64_t d = (*x)[axis];
  if (block == 0) {
    if (scale->size() != 1 || ((*scale)[0] >= 0 && d >= 0 && (*scale)[0] != d)) {
      fail("its scale has shape " + text(*scale) + "; quantized per axis " +
           std::to_string(axis) + " of an input of shape " + text(*x) + ", it has shape [" +
           std::to_string(d) + "] (or one element, per tensor)");
    }
    return;
  }
  bool fits = static_cast<int64_t>(scale->size()) == rank;
  for (int64_t i = 0; fits && i < rank; ++i) {
    const int64_t want = i == axis ? (d < 0 ? -1 : d / block + (d % block != 0)) : (*x)[i];
    if ((*scale)[i] >= 0 && want >= 0 && (*scale)[i] != want) fits = false;
  }
  if (!fits) {
    fail("its scale has shape " + text(*scale) + "; quantized in blocks of " +
         std::to_string(block) + " along axis " + std::to_string(axis) + " of an input of shape " +
         text(*x) + ", it has the input's shape with ceil(" + std::to_string(d) + " / " +
         std::to_string(block) + ") on that axis");
  }
}

void check_inferred(const onnx::GraphProto& g, int64_t opset, const std::string& what) {
  const InferredShapes shapes(g);
  const auto same = [](int64_t a, int64_t b) { return a < 0 || b < 0 || a == b; };
  for (const auto& n : g.node()) {
    if (!is_standard(n.domain())) continue;
    const auto fail = [&](const std::string& why) {
      throw DeployError(what + ": " + describe(n) + ": " + why);
    };
    const auto shape = [&](int k) -> const std::vector<int64_t>* {
      return n.input_size() > k && !n.input(k).empty() ? shapes.of(n.input(k)) : nullptr;
    };
    const std::string& op = n.op_type();
    if (op == "QuantizeLinear" || op == "DequantizeLinear") check_quantize_params(shapes, n, fail);
    if (op == "QuantizeLinear" && n.input_size() > 0) {
      // onnxruntime implements QuantizeLinear for float input (and float16) only.
      const int32_t t = shapes.type_of(n.input(0));
      if (t != 0 && t != onnx::TensorProto::FLOAT && t != onnx::TensorProto::FLOAT16) {
        fail("it quantizes a tensor of data type " + std::to_string(t) + " (onnxruntime's "
             "QuantizeLinear takes float input)");
      }
    } else if (op == "Flatten" || op == "Softmax" || op == "LogSoftmax" || op == "Hardmax") {
      const auto* x = shape(0);
      if (!x) continue;
      const auto rank = static_cast<int64_t>(x->size());
      const int64_t axis = int_attribute(n, "axis", op == "Flatten" ? 1 : -1);
      const int64_t hi = op == "Flatten" ? rank : rank - 1;  // Flatten's axis may be the rank
      if (axis < -rank || axis > hi) {
        fail("axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(rank));
      }
    } else if (op == "Resize" && opset >= 11) {
      // Opset 11+: scales (input 2) or sizes (input 3), one of them.
      const bool scales = n.input_size() > 2 && !n.input(2).empty();
      const bool sizes = n.input_size() > 3 && !n.input(3).empty();
      if (scales == sizes) fail("it needs scales or sizes, one of them");
    } else if (op == "Gemm" || op == "MatMul") {
      const auto *a = shape(0), *b = shape(1);
      if (!a || !b || a->empty() || b->empty()) continue;
      const bool ta = op == "Gemm" && int_attribute(n, "transA", 0) != 0;
      const bool tb = op == "Gemm" && int_attribute(n, "transB", 0) != 0;
      if (op == "Gemm" && (a->size() != 2 || b->size() != 2)) fail("Gemm takes 2-d inputs");
      const int64_t ka = ta ? (*a)[0] : a->back();
      const int64_t kb = b->size() == 1 ? (*b)[0] : tb ? b->back() : (*b)[b->size() - 2];
      if (!same(ka, kb)) {
        fail("the inner dimensions of its inputs differ (" + std::to_string(ka) + " and " +
             std::to_string(kb) + ")");
      }
    } else if (op == "Conv" || op == "ConvTranspose") {
      const auto *x = shape(0), *w = shape(1);
      if (x && x->size() < 3) fail("its input has rank " + std::to_string(x->size()) + " (N x C x D1...)");
      if (!x || !w || x->size() < 2 || w->size() < 2) continue;
      if (x->size() != w->size()) fail("input and weight ranks differ");
      const int64_t group = int_attribute(n, "group", 1);  // >= 1: check_window_attributes
      const int64_t c = (*x)[1];
      // c == w[1] x group, by division: group comes from the file and the product may overflow
      // (found by the deploy fuzzer in CI: group 2^63 - 1).
      if (op == "Conv" && c >= 0 && (*w)[1] >= 0 && (c % group != 0 || c / group != (*w)[1])) {
        fail("input channels " + std::to_string(c) + " != weight channels " +
             std::to_string((*w)[1]) + " x group " + std::to_string(group));
      }
      if (op == "Conv" && (*w)[0] >= 0 && (*w)[0] % group != 0) {
        fail("output channels " + std::to_string((*w)[0]) + " are not divisible by group");
      }
      if (op == "ConvTranspose" && c >= 0 && (c % group != 0 || ((*w)[0] >= 0 && c != (*w)[0]))) {
        fail("input channels " + std::to_string(c) + " do not match the weight's " +
             std::to_string((*w)[0]) + " (group " + std::to_string(group) + ")");
      }
    } else if (op == "Concat") {
      const auto* first = shape(0);
      if (!first) continue;
      const auto rank = static_cast<int64_t>(first->size());
      int64_t axis = int_attribute(n, "axis", 0);
      if (axis < -rank || axis >= rank) fail("axis " + std::to_string(axis) + " is out of range");
      if (axis < 0) axis += rank;
      for (int k = 1; k < n.input_size(); ++k) {
        const auto* s = shape(k);
        if (!s) continue;
        if (s->size() != first->size()) fail("its inputs differ in rank");
        for (int64_t d = 0; d < rank; ++d) {
          if (d != axis && !same((*s)[d], (*first)[d])) {
            fail("input " + std::to_string(k) + " differs in dimension " + std::to_string(d));
          }
        }
      }
    }
  }
  // Every recorded dimension must be a size (onnxruntime multiplies them).
  for (const auto* list : {&g.input(), &g.output(), &g.value_info()}) {
    for (const auto& v : *list) {
      int64_t total = 1;
      for (const auto& d : v.type().tensor_type().shape().dim()) {
        if (!d.has_dim_value()) continue;
        const int64_t x = d.dim_value();
        if (x < 0 || (x > 0 && total > std::numeric_limits<int64_t>::max() / x)) {
          throw DeployError(what + ": tensor '" + v.name() + "' has a shape whose size "
                            "overflows or is negative");
        }
        total *= x;
      }
    }
  }
}

// ONNX wants nodes in topological order; on the input the deploy sorts them itself, but a file
// written must be sorted (the checker's copy may have set a fake quantizer's extra inputs aside).
void check_sorted(const onnx::GraphProto& g, const std::string& what) {
  std::unordered_set<std::string> defined;
  for (const auto& t : g.initializer()) defined.insert(t.name());
  for (const auto& i : g.input()) defined.insert(i.name());
  for (const auto& n : g.node()) {
    for (const auto& in : n.input()) {
      if (!in.empty() && !defined.count(in)) {
        throw DeployError(what + ": " + describe(n) + " reads '" + in + "' before any node "
                          "writes it (the nodes are not in topological order)");
      }
    }
    for (const auto& o : n.output()) defined.insert(o);
  }
}

// `n` (a node of the checker's copy) as Identity(input 0), keeping its name and output.
void as_identity(onnx::NodeProto* n) {
  const std::string x = n->input_size() > 0 ? n->input(0) : std::string();
  n->clear_input();
  n->add_input(x);
  n->clear_attribute();
  n->set_op_type("Identity");
  n->set_domain("");
}

}  // namespace

int64_t known_opset(const std::string& domain) {
  const auto& map = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  const auto it = map.find(canonical(domain));
  return it == map.end() ? -1 : it->second.second;
}

void check_model(const OnnxGraph& g, const std::string& what, const ModelCheckOptions& options) {
  const auto& model = g.model();
  if (model.ir_version() < 3) {
    throw DeployError(what + ": IR version " + std::to_string(model.ir_version()) +
                      " (ONNX models record the IR version they follow; 3 or later has opset "
                      "imports)");
  }
  // IR 14 is the newest onnx 1.23 writes and onnxruntime 1.32 loads; a later one (or a mutated
  // number) would be written into every artifact, which no runtime here could read.
  if (model.ir_version() > kMaxIrVersion) {
    throw DeployError(what + ": IR version " + std::to_string(model.ir_version()) +
                      " is newer than the deploy knows (" + std::to_string(kMaxIrVersion) + ")");
  }
  // Opset imports: one per domain, positive versions.
  std::map<std::string, int64_t> imports;
  for (const auto& op : model.opset_import()) {
    if (op.version() < 1) {
      throw DeployError(what + ": the opset import of domain '" + op.domain() + "' has version " +
                        std::to_string(op.version()));
    }
    if (!imports.emplace(canonical(op.domain()), op.version()).second) {
      throw DeployError(what + ": domain '" + op.domain() + "' is imported twice");
    }
    const int64_t newest = newest_opset(canonical(op.domain()));
    if ((newest > 0 && op.version() > newest) || (op.domain().empty() && op.version() < 7)) {
      throw DeployError(what + ": opset " + std::to_string(op.version()) + " of domain '" +
                        op.domain() + "' is outside what the deploy and its runtimes read (" +
                        (op.domain().empty() ? std::string("7 to ") : std::string("up to ")) +
                        std::to_string(newest) + ")");
    }
  }
  // Every op of a standard domain is judged by the schema of the model's opset: one newer than
  // the schemas compiled in (onnx 1.23's) could not be.
  for (const auto& kv : imports) {
    if (is_standard(kv.first) && kv.second > known_opset(kv.first)) {
      throw DeployError(what + ": opset " + std::to_string(kv.second) + " of domain '" +
                        kv.first + "' is newer than the deploy's onnx checker knows (" +
                        std::to_string(known_opset(kv.first)) + ")");
    }
  }

  onnx::ModelProto copy = model;
  auto* graph = copy.mutable_graph();
  bool moved_to_mqbench = false;
  for (auto& n : *graph->mutable_node()) {
    const std::string d = canonical(n.domain());
    const bool custom = d == kMqbenchDomain || (options.mqbench_forms && d.empty() &&
                                                is_fake_quant_op(n.op_type()));
    if (!custom && !imports.count(d)) {
      throw DeployError(what + ": " + describe(n) + " is in domain '" + n.domain() +
                        "', which the model does not import (opset_import)");
    }
    // The deploy reads an exported model: standard ops and MQBench's fake quantizers. Ops of
    // other domains (onnxruntime's com.microsoft, a vendor's) it can neither check nor translate.
    if (options.mqbench_forms && !custom && !is_standard(d)) {
      throw DeployError(what + ": " + describe(n) + " is in domain '" + n.domain() + "'; the "
                        "deploy reads standard ONNX ops and MQBench's fake quantizers only");
    }
    if (custom) {
      const bool block_format = d == kMqbenchDomain && is_block_format_op(n.op_type());
      if (!is_fake_quant_op(n.op_type()) && !block_format) {
        throw DeployError(what + ": " + describe(n) + ": the mqbench domain has no op '" +
                          n.op_type() + "' (its ops are MQBench's fake quantizers)");
      }
      if (n.output_size() != 1) {
        throw DeployError(what + ": " + describe(n) + " has " + std::to_string(n.output_size()) +
                          " outputs; a fake quantizer has one");
      }
      if (!d.empty() && !imports.count(d)) {
        throw DeployError(what + ": " + describe(n) + " is in domain 'mqbench', which the model "
                          "does not import (opset_import)");
      }
      // For libonnx, a fake quantizer is what it computes for shapes and types: an Identity of
      // its input. (Shape inference infers nothing through an op it has no schema for, so a
      // custom node would hide every shape error after it.)
      as_identity(&n);
      continue;
    }
    if (d == "org.openvinotoolkit" && n.op_type() == "FakeQuantize" && n.input_size() > 0) {
      as_identity(&n);  // OpenVINO's FakeQuantize keeps its input's shape and type, as above
      continue;
    }
    if (d.empty() && options.deprecated_ops_allowed.count(n.op_type())) {
      n.set_domain("mqbench.allowed");  // a domain libonnx does not judge
      moved_to_mqbench = true;
      continue;
    }
    if (options.mqbench_forms && d.empty() &&
        (n.op_type() == "QuantizeLinear" || n.op_type() == "DequantizeLinear")) {
      for (const char* a : {"quant_min", "quant_max", "data_max"}) remove_attribute(&n, a);
    }
  }
  if (moved_to_mqbench) {
    auto set_import = [&](const std::string& domain) {
      for (const auto& op : copy.opset_import()) {
        if (op.domain() == domain) return;
      }
      auto* op = copy.add_opset_import();
      op->set_domain(domain);
      op->set_version(1);
    };
    set_import(kMqbenchDomain);
    set_import("mqbench.allowed");
  }
  check_elem_types(copy.graph(), what);
  // On the model's own nodes (the copy may have set some aside, above).
  const InferredShapes recorded(model.graph());
  for (const auto& n : model.graph().node()) {
    if (!is_standard(n.domain())) continue;
    check_window_attributes(recorded, n, what);
    check_mode_attributes(n, what);
    check_flag_attributes(n, what);
    check_resize_scales(g, n, imports.count("") ? imports.at("") : 0, what);
  }
  if (!options.mqbench_forms) check_sorted(model.graph(), what);
  if (options.mqbench_forms) sort_nodes(graph);
  {
    // libonnx 1.12's inference of the convolutions read its input's and weight's dims without
    // checking their rank (a weight rewired to a scalar Constant crashed it, found by the
    // campaign). A first, lenient pass with those ops set aside gives the ranks of whatever
    // feeds them; the attribute and rank checks then run with those before the strict pass.
    onnx::ModelProto probe = copy;
    for (auto& n : *probe.mutable_graph()->mutable_node()) {
      if (is_standard(n.domain()) && is_window_op(n.op_type())) n.set_domain("mqbench.window");
    }
    auto* op = probe.add_opset_import();
    op->set_domain("mqbench.window");
    op->set_version(1);
    try {
      onnx::shape_inference::InferShapes(probe, onnx::OpSchemaRegistry::Instance(),
                                         onnx::ShapeInferenceOptions(false, 0, false));
    } catch (const std::exception&) {
      // the strict pass below reports what is wrong
    }
    const InferredShapes inferred(probe.graph());
    for (const auto& n : model.graph().node()) {
      if (is_standard(n.domain())) check_window_attributes(inferred, n, what);
    }
  }
  try {
    onnx::checker::check_model(copy);
  } catch (const std::exception& e) {
    throw DeployError(what + " fails onnx's checker: " + first_line(e.what()));
  }
  try {
    onnx::ShapeInferenceOptions strict(/*check_type=*/true, /*error_mode=*/1,
                                       /*data_propagation=*/false);
    onnx::shape_inference::InferShapes(copy, onnx::OpSchemaRegistry::Instance(), strict);
  } catch (const std::exception& e) {
    throw DeployError(what + " fails onnx's shape inference: " + first_line(e.what()));
  }
  check_inferred(copy.graph(), imports.count("") ? imports.at("") : 0, what);
}

}  // namespace deploy
}  // namespace mqbench
