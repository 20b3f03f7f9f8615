// The small graph IR of the quantizer (include/mqbench/graph/graph.h): fx-like node kinds and
// their names, node insertion with name checks, and module-type queries (qualified names).

#include "mqbench/graph/graph.h"

#include <c10/util/Exception.h>

#include <algorithm>

namespace mqbench {
namespace graph {

namespace {
constexpr const char* kOpNames[] = {"placeholder", "get_attr", "call_module",
                                    "call_function", "call_method", "output"};
}  // namespace

const char* op_name(OpKind op) { return kOpNames[static_cast<int>(op)]; }

OpKind op_from_name(const std::string& name) {
  for (int i = 0; i < 6; ++i) {
    if (name == kOpNames[i]) return static_cast<OpKind>(i);
  }
  TORCH_CHECK(false, "graph: unknown node op '", name, "'; valid: placeholder, get_attr, "
              "call_module, call_function, call_method, output");
}

int64_t Graph::add(Node node) {
  TORCH_CHECK(!node.name.empty(), "graph: a node needs a name");
  TORCH_CHECK(index_.count(node.name) == 0, "graph: duplicate node name '", node.name, "'");
  const auto idx = size();
  for (auto in : node.inputs) {
    TORCH_CHECK(in >= 0 && in < idx, "graph: node '", node.name, "' takes input ", in,
                ", which is not an earlier node (the graph has ", idx, " nodes before it)");
  }
  TORCH_CHECK(node.getitem_source < idx, "graph: node '", node.name,
              "' has a getitem source that is not an earlier node");
  TORCH_CHECK(node.op == OpKind::kCallModule || node.module_types.empty(), "graph: node '",
              node.name, "' is not a call_module but lists module types");
  node.users.clear();
  for (auto in : node.inputs) {
    auto& users = nodes_[static_cast<size_t>(in)].users;
    if (std::find(users.begin(), users.end(), idx) == users.end()) users.push_back(idx);
  }
  index_[node.name] = idx;
  nodes_.push_back(std::move(node));
  return idx;
}

int64_t Graph::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? -1 : it->second;
}

bool Graph::is_instance(int64_t i, const std::string& type) const {
  const auto& n = node(i);
  return n.op == OpKind::kCallModule &&
         std::find(n.module_types.begin(), n.module_types.end(), type) != n.module_types.end();
}

bool Graph::is_exact(int64_t i, const std::string& type) const {
  const auto& n = node(i);
  return n.op == OpKind::kCallModule && !n.module_types.empty() && n.module_types[0] == type;
}

}  // namespace graph
}  // namespace mqbench
