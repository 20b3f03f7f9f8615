#pragma once
// OnnxGraph: an ONNX model (onnx 1.23's protobuf classes, compiled into this library) with the
// lookups the deploy passes need: producer and consumers of each tensor, constant values
// (initializers, Constant nodes, and small chains of Identity / Cast / Reshape / Squeeze /
// Unsqueeze / Round / Clip over them, which torch leaves in front of quantization parameters), and
// edits (rewire a consumer, remove nodes, add initializers) that keep those lookups current.
//
// Every failure is a DeployError whose message names the node or tensor at fault.

#include <onnx/onnx_pb.h>

#include "mqbench/error.h"

#include <cstdint>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace mqbench {
namespace deploy {

/// A constant tensor, values widened to double (exact for every integer type ONNX uses here).
struct ConstTensor {
  std::vector<int64_t> dims;
  std::vector<double> values;
  int32_t elem_type = onnx::TensorProto::FLOAT;
  int64_t numel() const { return static_cast<int64_t>(values.size()); }
};

// Tensors (src/deploy/onnx_tensor.cpp).

/// Reads a TensorProto (raw_data or typed fields) into a ConstTensor.
ConstTensor to_const(const onnx::TensorProto& t);
/// Checks that an initializer's shape agrees with the data it holds (a truncated file, a
/// hand-edited shape would send every pass that walks its dims past the data); DeployError.
void check_tensor_data(const onnx::TensorProto& t);
/// Builds a TensorProto named `name` holding `values` as `elem_type` (raw data, little endian).
onnx::TensorProto make_tensor(const std::string& name, int32_t elem_type,
                              const std::vector<int64_t>& dims, const std::vector<double>& values);

class OnnxGraph {
 public:
  /// Parses serialized ONNX; a corrupt or truncated buffer raises DeployError.
  static OnnxGraph parse(const std::string& bytes, const std::string& what = "ONNX model");
  static OnnxGraph parse(const void* data, size_t size, const std::string& what = "ONNX model");
  /// Reads a regular file of at most kMaxModelBytes (anything else: DeployError).
  static OnnxGraph load(const std::string& path);
  /// Protobuf parses at most 2 GiB; larger models must keep weights as external data, which the
  /// deploy passes do not read.
  static constexpr int64_t kMaxModelBytes = (int64_t(1) << 31) - 1;
  explicit OnnxGraph(onnx::ModelProto model);

  OnnxGraph(OnnxGraph&&) = default;
  OnnxGraph& operator=(OnnxGraph&&) = default;
  OnnxGraph(const OnnxGraph& other) : OnnxGraph(other.model_) {}
  OnnxGraph& operator=(const OnnxGraph& other) {
    model_ = other.model_;
    reindex();
    return *this;
  }

  onnx::ModelProto& model() { return model_; }
  const onnx::ModelProto& model() const { return model_; }
  onnx::GraphProto& graph() { return *model_.mutable_graph(); }
  const onnx::GraphProto& graph() const { return model_.graph(); }

  /// Rebuilds the tensor maps; call after editing the protobuf directly.
  void reindex();

  /// Index of the node producing `tensor`, or -1 (graph input, initializer or unknown).
  int producer(const std::string& tensor) const;
  /// (node index, input slot) of every consumer of `tensor`, in node order.
  std::vector<std::pair<int, int>> consumers(const std::string& tensor) const;
  bool is_graph_output(const std::string& tensor) const;
  bool is_graph_input(const std::string& tensor) const;
  const onnx::TensorProto* initializer(const std::string& name) const;
  onnx::TensorProto* mutable_initializer(const std::string& name);
  /// Index of the node named `name`, or -1.
  int node_index(const std::string& name) const;
  /// The name of node `i`; unnamed nodes are given "<op_type>_<i>" when the graph is indexed.
  const std::string& node_name(int i) const { return graph().node(i).name(); }

  /// The value of `tensor` when it is a constant (see the file comment; src/deploy/const_fold.cpp),
  /// else false. The walk
  /// back through Identity / Cast / ... nodes stops after kMaxFoldDepth of them, raising
  /// DeployError: that bounds the recursion, and rejects a cycle (a malformed model).
  bool constant(const std::string& tensor, ConstTensor* out) const;
  static constexpr int kMaxFoldDepth = 64;
  /// As constant(), raising DeployError naming `what` when `tensor` is not constant.
  ConstTensor require_constant(const std::string& tensor, const std::string& what) const;

  /// Replaces (or adds) the initializer `name`.
  void set_initializer(onnx::TensorProto t);
  /// Returns a name not used by any tensor, node or initializer, based on `base`.
  std::string unique_name(const std::string& base);

  /// Renames graph output `from` to `to` (MQBench keeps the pre-quantizer tensor name).
  void rename_output(const std::string& from, const std::string& to);
  /// Points input `slot` of node `node` at `tensor`.
  void set_input(int node, int slot, const std::string& tensor);
  /// Points every input that reads `from` at `to` (one pass over `from`'s consumers, however
  /// many: set_input on each would be quadratic in the fan-out).
  void replace_uses(const std::string& from, const std::string& to);
  /// Removes the nodes at the given indices, then initializers and Constant nodes nothing
  /// uses any more, then re-indexes.
  void remove_nodes(const std::set<int>& nodes);
  /// Removes the nodes at the given indices, appends `added`, then optimize() (which places the
  /// new nodes in topological order).
  void replace_nodes(const std::set<int>& dead, std::vector<onnx::NodeProto> added);
  /// Drops nodes whose outputs reach no graph output, unused initializers, and sorts the
  /// nodes topologically (stable for an already sorted graph). Raises on a cycle.
  void optimize();
  /// Sets (or adds) the opset import of `domain`.
  void set_opset(const std::string& domain, int64_t version);
  int64_t opset(const std::string& domain) const;
  /// Removes the opset import of `domain` (e.g. "mqbench" once no fake-quantize node is left).
  void drop_opset(const std::string& domain);

  std::string serialize() const;

  /// The structure every ONNX graph must have, checked in one pass: each tensor produced once
  /// (node outputs, initializers and graph inputs; an initializer may be listed as an input),
  /// each node input and graph output provided by one of them. Nodes inside subgraphs (If, Loop)
  /// may read the outer scope and are not checked. Raises DeployError naming `what` and the
  /// tensor. onnx's checker would also refuse legitimate models (MQBench 1.10's custom nodes in the
  /// default domain, NNIE's Upsample), so the deploy passes use this instead, on their input and
  /// on every ONNX file they write.
  void check_structure(const std::string& what) const;

 private:
  bool constant_at(const std::string& tensor, ConstTensor* out, int depth) const;

  onnx::ModelProto model_;
  std::map<std::string, int> producer_;
  std::map<std::string, std::vector<std::pair<int, int>>> consumers_;
  std::map<std::string, int> initializer_index_;
  std::map<std::string, int> node_index_;
  std::set<std::string> outputs_, inputs_;
};

/// Attribute helpers: the attribute named `name` of `node`, or nullptr.
const onnx::AttributeProto* find_attribute(const onnx::NodeProto& node, const std::string& name);
int64_t int_attribute(const onnx::NodeProto& node, const std::string& name, int64_t fallback);
/// `v` (a value read from the model) as an integer, rounded to nearest; NaN, infinities and values
/// outside int64 raise DeployError naming `what` (a plain cast would be undefined behaviour).
int64_t checked_int64(double v, const std::string& what);
float float_attribute(const onnx::NodeProto& node, const std::string& name, float fallback);
/// An INT attribute `name` = v, for the nodes the passes write.
onnx::AttributeProto make_int_attribute(const std::string& name, int64_t v);
void remove_attribute(onnx::NodeProto* node, const std::string& name);

}  // namespace deploy
}  // namespace mqbench
