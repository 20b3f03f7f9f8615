#pragma once
// A small graph IR for the model quantizer, with torch.fx's node kinds. Frontends (the Python
// fx frontend today, a TorchScript one later) convert their graphs into it; the quantizer
// reads it and returns a plan (include/mqbench/quantizer/model_quantizer.h).
//
// Names are canonical strings so the rules never depend on where a class lives in a given
// torch version:
//   * module types: the class's package path with "torch." / "ao." and the ".modules..." tail
//     dropped, then the class name: "nn.Conv2d", "nn.qat.Linear",
//     "nn.intrinsic.qat.ConvBnReLU2d", "mqbench.nn.intrinsic.qat.ConvTransposeBn2d". A node
//     lists its class and all base classes (most derived first), for isinstance matching.
//   * functions: "operator.add", "F.relu" (torch.nn.functional), "torch.cat", ...;
//     call_method targets are method names ("mean", "update").
//
// Example:
//   mqbench::graph::Graph g;
//   auto x = g.add({"x", mqbench::graph::OpKind::kPlaceholder, "x"});
//   auto conv = g.add({"conv1", OpKind::kCallModule, "conv1", {"nn.intrinsic.qat.ConvBnReLU2d"}, {x}});
//   g.add({"output", OpKind::kOutput, "output", {}, {conv}});

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace mqbench {
namespace graph {

enum class OpKind { kPlaceholder, kGetAttr, kCallModule, kCallFunction, kCallMethod, kOutput };

/// "placeholder", "get_attr", ... (torch.fx's op names).
const char* op_name(OpKind op);
/// The OpKind of an fx op name; raises for an unknown one.
OpKind op_from_name(const std::string& name);

struct Node {
  std::string name;
  OpKind op = OpKind::kCallFunction;
  /// call_module: the module's qualified name; call_function: the canonical function name;
  /// call_method: the method name; placeholder / get_attr / output: as fx.
  std::string target;
  /// call_module only: canonical names of the module's class and its bases, most derived first.
  std::vector<std::string> module_types;
  /// Indices of the nodes among the positional args, flattened through lists, tuples and dicts
  /// in order (kwargs are not part of the IR: MQBench's rules ignore them).
  std::vector<int64_t> inputs;
  /// False when some positional arg is a constant (not a node).
  bool all_args_are_nodes = true;
  /// For an operator.getitem node that reads a value a dict.update call wrote: the node that
  /// produced the value (MQBench's getitem2node); -1 otherwise.
  int64_t getitem_source = -1;
  /// Users (nodes that take this one as a positional input), filled by Graph::add.
  std::vector<int64_t> users;
};

class Graph {
 public:
  /// Appends a node and returns its index. Inputs must name earlier nodes; names are unique.
  int64_t add(Node node);
  const Node& node(int64_t i) const { return nodes_.at(static_cast<size_t>(i)); }
  const std::vector<Node>& nodes() const { return nodes_; }
  int64_t size() const { return static_cast<int64_t>(nodes_.size()); }
  /// The index of the node called `name`, or -1.
  int64_t find(const std::string& name) const;

  /// True when the node is a call_module whose class or a base class is `type` (isinstance).
  bool is_instance(int64_t i, const std::string& type) const;
  /// True when the node is a call_module of exactly `type`.
  bool is_exact(int64_t i, const std::string& type) const;

 private:
  std::vector<Node> nodes_;
  std::unordered_map<std::string, int64_t> index_;
};

}  // namespace graph
}  // namespace mqbench
