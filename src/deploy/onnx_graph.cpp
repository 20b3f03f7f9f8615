// OnnxGraph: parsing, lookups and edits over an ONNX ModelProto for the deploy passes, the
// structure check and optimize() (dead-node removal + a stable topological sort). Tensors are
// in onnx_tensor.cpp, the constant folder in const_fold.cpp.

#include "mqbench/deploy/onnx_graph.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <queue>
#include <unordered_map>
#include <unordered_set>

namespace mqbench {
namespace deploy {

OnnxGraph OnnxGraph::parse(const std::string& bytes, const std::string& what) {
  return parse(bytes.data(), bytes.size(), what);
}

OnnxGraph OnnxGraph::parse(const void* data, size_t size, const std::string& what) {
  if (size == 0) throw DeployError(what + " is empty");
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) {
    throw DeployError(what + " is larger than 2 GiB, which protobuf cannot parse; export the "
                      "weights as external data is not supported either");
  }
  onnx::ModelProto model;
  if (!model.ParseFromArray(data, static_cast<int>(size))) {
    throw DeployError(what + " is not a valid ONNX model (corrupt or truncated protobuf, " +
                      std::to_string(size) + " bytes)");
  }
  if (!model.has_graph() || model.graph().node_size() == 0) {
    throw DeployError(what + " has no graph nodes (not an ONNX model, or truncated)");
  }
  return OnnxGraph(std::move(model));
}

OnnxGraph OnnxGraph::load(const std::string& path) {
  // A device (/dev/zero), a FIFO or a folder would be read forever or fail obscurely.
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (ec || !std::filesystem::exists(status)) {
    throw DeployError("cannot open ONNX file '" + path + "': no such file");
  }
  if (!std::filesystem::is_regular_file(status)) {
    throw DeployError("ONNX file '" + path + "' is not a regular file");
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) throw DeployError("cannot read ONNX file '" + path + "': " + ec.message());
  if (size > static_cast<uintmax_t>(kMaxModelBytes)) {
    throw DeployError("ONNX file '" + path + "' is " + std::to_string(size) +
                      " bytes, over protobuf's 2 GiB limit");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DeployError("cannot open ONNX file '" + path + "'");
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) {
    throw DeployError("cannot read ONNX file '" + path + "' (it changed while being read?)");
  }
  return parse(bytes, "ONNX file '" + path + "'");
}

OnnxGraph::OnnxGraph(onnx::ModelProto model) : model_(std::move(model)) {
  auto* g = model_.mutable_graph();
  for (int i = 0; i < g->node_size(); ++i) {
    if (g->node(i).name().empty()) g->mutable_node(i)->set_name(g->node(i).op_type() + "_" + std::to_string(i));
  }
  reindex();
}

void OnnxGraph::reindex() {
  producer_.clear();
  consumers_.clear();
  initializer_index_.clear();
  node_index_.clear();
  outputs_.clear();
  inputs_.clear();
  const auto& g = model_.graph();
  for (int i = 0; i < g.node_size(); ++i) {
    const auto& n = g.node(i);
    node_index_[n.name()] = i;
    for (int k = 0; k < n.input_size(); ++k) {
      if (!n.input(k).empty()) consumers_[n.input(k)].emplace_back(i, k);
    }
    for (const auto& o : n.output()) producer_[o] = i;
  }
  for (int i = 0; i < g.initializer_size(); ++i) initializer_index_[g.initializer(i).name()] = i;
  for (const auto& o : g.output()) outputs_.insert(o.name());
  for (const auto& o : g.input()) inputs_.insert(o.name());
}

int OnnxGraph::producer(const std::string& tensor) const {
  auto it = producer_.find(tensor);
  return it == producer_.end() ? -1 : it->second;
}

std::vector<std::pair<int, int>> OnnxGraph::consumers(const std::string& tensor) const {
  auto it = consumers_.find(tensor);
  return it == consumers_.end() ? std::vector<std::pair<int, int>>{} : it->second;
}

bool OnnxGraph::is_graph_output(const std::string& t) const { return outputs_.count(t) > 0; }
bool OnnxGraph::is_graph_input(const std::string& t) const { return inputs_.count(t) > 0; }

const onnx::TensorProto* OnnxGraph::initializer(const std::string& name) const {
  auto it = initializer_index_.find(name);
  return it == initializer_index_.end() ? nullptr : &model_.graph().initializer(it->second);
}

onnx::TensorProto* OnnxGraph::mutable_initializer(const std::string& name) {
  auto it = initializer_index_.find(name);
  return it == initializer_index_.end() ? nullptr : model_.mutable_graph()->mutable_initializer(it->second);
}

int OnnxGraph::node_index(const std::string& name) const {
  auto it = node_index_.find(name);
  return it == node_index_.end() ? -1 : it->second;
}

void OnnxGraph::set_initializer(onnx::TensorProto t) {
  auto it = initializer_index_.find(t.name());
  if (it != initializer_index_.end()) {
    *model_.mutable_graph()->mutable_initializer(it->second) = std::move(t);
    return;
  }
  const std::string name = t.name();
  *model_.mutable_graph()->add_initializer() = std::move(t);
  initializer_index_[name] = model_.graph().initializer_size() - 1;
}

std::string OnnxGraph::unique_name(const std::string& base) {
  auto used = [&](const std::string& s) {
    return producer_.count(s) || consumers_.count(s) || initializer_index_.count(s) ||
           node_index_.count(s) || outputs_.count(s) || inputs_.count(s);
  };
  std::string name = base;
  for (int k = 1; used(name); ++k) name = base + "_" + std::to_string(k);
  // Reserve it: later calls must not hand out the same name before the caller uses it.
  consumers_[name];
  return name;
}

void OnnxGraph::rename_output(const std::string& from, const std::string& to) {
  for (auto& o : *graph().mutable_output()) {
    if (o.name() == from) o.set_name(to);
  }
  outputs_.erase(from);
  outputs_.insert(to);
}

void OnnxGraph::set_input(int node, int slot, const std::string& tensor) {
  auto* n = model_.mutable_graph()->mutable_node(node);
  const std::string old = n->input(slot);
  auto& list = consumers_[old];
  list.erase(std::remove(list.begin(), list.end(), std::make_pair(node, slot)), list.end());
  n->set_input(slot, tensor);
  consumers_[tensor].emplace_back(node, slot);
}

namespace {
// The fewest inputs ONNX allows for the standard ops the deploy passes read by position (the
// opset's schemas); a node with fewer is malformed, and a pass would index past its inputs.
int min_inputs(const onnx::NodeProto& n) {
  if (!n.domain().empty() && n.domain() != "ai.onnx") return 0;
  static const std::unordered_map<std::string, int> table = {
      {"Conv", 2}, {"ConvTranspose", 2}, {"Gemm", 2}, {"MatMul", 2}, {"Add", 2}, {"Sub", 2},
      {"Mul", 2}, {"Div", 2}, {"Reshape", 2}, {"QuantizeLinear", 2}, {"DequantizeLinear", 2},
      {"Relu", 1}, {"Clip", 1}, {"Sigmoid", 1}, {"Concat", 1}, {"Flatten", 1}, {"Squeeze", 1},
      {"Unsqueeze", 1}, {"Resize", 1}, {"Upsample", 1}, {"Pad", 1}, {"Cast", 1}, {"Identity", 1},
      {"Round", 1}, {"MaxPool", 1}, {"AveragePool", 1}, {"GlobalAveragePool", 1},
      {"Transpose", 1}, {"BatchNormalization", 5}};
  const auto it = table.find(n.op_type());
  return it == table.end() ? 0 : it->second;
}
}  // namespace

void OnnxGraph::check_structure(const std::string& what) const {
  const auto& g = model_.graph();
  for (const auto& n : g.node()) {
    // Every ONNX node produces something; the passes read output(0) of the nodes they rewrite.
    if (n.output_size() == 0 || n.output(0).empty()) {
      throw DeployError(what + ": node '" + n.name() + "' (" + n.op_type() + ") has no output");
    }
    const int need = min_inputs(n);
    if (n.input_size() < need) {
      throw DeployError(what + ": node '" + n.name() + "' (" + n.op_type() + ") has " +
                        std::to_string(n.input_size()) + " input(s); ONNX requires at least " +
                        std::to_string(need));
    }
  }
  std::unordered_set<std::string> defined, inits;
  defined.reserve(static_cast<size_t>(g.node_size() + g.initializer_size() + g.input_size()));
  for (const auto& t : g.initializer()) {
    check_tensor_data(t);
    if (!inits.insert(t.name()).second) {
      throw DeployError(what + ": initializer '" + t.name() + "' is defined twice");
    }
    defined.insert(t.name());
  }
  for (const auto& i : g.input()) {
    if (!defined.insert(i.name()).second && !inits.count(i.name())) {
      throw DeployError(what + ": graph input '" + i.name() + "' is listed twice");
    }
  }
  for (const auto& n : g.node()) {
    for (const auto& o : n.output()) {
      if (!o.empty() && !defined.insert(o).second) {
        throw DeployError(what + ": tensor '" + o + "' of node '" + n.name() + "' (" + n.op_type() +
                          ") is already produced by another node, an initializer or a graph input");
      }
    }
  }
  for (const auto& n : g.node()) {
    for (const auto& in : n.input()) {
      if (!in.empty() && !defined.count(in)) {
        throw DeployError(what + ": node '" + n.name() + "' (" + n.op_type() + ") reads '" + in +
                          "', which no node, initializer or graph input provides");
      }
    }
  }
  for (const auto& o : g.output()) {
    if (!defined.count(o.name())) {
      throw DeployError(what + ": graph output '" + o.name() + "' is produced by nothing");
    }
  }
}

void OnnxGraph::replace_uses(const std::string& from, const std::string& to) {
  if (from == to) return;
  auto it = consumers_.find(from);
  if (it == consumers_.end()) return;
  const auto uses = std::move(it->second);
  consumers_.erase(it);
  auto& dest = consumers_[to];
  for (const auto& u : uses) {
    model_.mutable_graph()->mutable_node(u.first)->set_input(u.second, to);
    dest.push_back(u);
  }
}

void OnnxGraph::remove_nodes(const std::set<int>& nodes) {
  auto* g = model_.mutable_graph();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  for (int i = 0; i < g->node_size(); ++i) {
    if (!nodes.count(i)) *kept.Add() = std::move(*g->mutable_node(i));
  }
  g->mutable_node()->Swap(&kept);
  reindex();
  // Constant nodes and initializers that fed only the removed nodes go too.
  for (bool changed = true; changed;) {
    changed = false;
    std::set<int> dead;
    for (int i = 0; i < g->node_size(); ++i) {
      const auto& n = g->node(i);
      if (n.op_type() != "Constant" || n.output_size() != 1) continue;
      if (consumers(n.output(0)).empty() && !is_graph_output(n.output(0))) dead.insert(i);
    }
    if (!dead.empty()) {
      google::protobuf::RepeatedPtrField<onnx::NodeProto> rest;
      for (int i = 0; i < g->node_size(); ++i) {
        if (!dead.count(i)) *rest.Add() = std::move(*g->mutable_node(i));
      }
      g->mutable_node()->Swap(&rest);
      reindex();
      changed = true;
    }
  }
  google::protobuf::RepeatedPtrField<onnx::TensorProto> inits;
  std::set<std::string> dropped;
  for (auto& t : *g->mutable_initializer()) {
    if (consumers(t.name()).empty() && !is_graph_output(t.name())) dropped.insert(t.name());
    else *inits.Add() = std::move(t);
  }
  g->mutable_initializer()->Swap(&inits);
  if (!dropped.empty()) {  // initializers listed as graph inputs (IR < 4) go with them
    google::protobuf::RepeatedPtrField<onnx::ValueInfoProto> ins;
    for (auto& v : *g->mutable_input()) {
      if (!dropped.count(v.name())) *ins.Add() = std::move(v);
    }
    g->mutable_input()->Swap(&ins);
  }
  reindex();
}

void OnnxGraph::replace_nodes(const std::set<int>& dead, std::vector<onnx::NodeProto> added) {
  auto* nodes = model_.mutable_graph()->mutable_node();
  google::protobuf::RepeatedPtrField<onnx::NodeProto> kept;
  for (int i = 0; i < nodes->size(); ++i) {
    if (!dead.count(i)) *kept.Add() = std::move(*nodes->Mutable(i));
  }
  for (auto& n : added) *kept.Add() = std::move(n);
  nodes->Swap(&kept);
  reindex();
  optimize();
}

void OnnxGraph::optimize() {
  const auto& g = model_.graph();
  const int n = g.node_size();
  // Nodes that reach a graph output.
  std::vector<char> live(n, 0);
  std::vector<int> stack;
  for (const auto& o : g.output()) {
    const int p = producer(o.name());
    if (p >= 0 && !live[p]) { live[p] = 1; stack.push_back(p); }
  }
  while (!stack.empty()) {
    const int i = stack.back();
    stack.pop_back();
    for (const auto& in : g.node(i).input()) {
      const int p = producer(in);
      if (p >= 0 && !live[p]) { live[p] = 1; stack.push_back(p); }
    }
  }
  // Kahn's algorithm, lowest original index first: a sorted graph keeps its order.
  std::vector<int> indegree(n, 0);
  std::vector<std::vector<int>> next(n);
  for (int i = 0; i < n; ++i) {
    if (!live[i]) continue;
    std::set<int> preds;
    for (const auto& in : g.node(i).input()) {
      const int p = producer(in);
      if (p >= 0 && p != i && live[p]) preds.insert(p);
    }
    indegree[i] = static_cast<int>(preds.size());
    for (int p : preds) next[p].push_back(i);
  }
  std::priority_queue<int, std::vector<int>, std::greater<int>> ready;
  for (int i = 0; i < n; ++i) if (live[i] && indegree[i] == 0) ready.push(i);
  std::vector<int> order;
  while (!ready.empty()) {
    const int i = ready.top();
    ready.pop();
    order.push_back(i);
    for (int j : next[i]) if (--indegree[j] == 0) ready.push(j);
  }
  const auto live_count = std::count(live.begin(), live.end(), 1);
  if (static_cast<int64_t>(order.size()) != live_count) {
    throw DeployError("the ONNX graph has a cycle; it cannot be sorted topologically");
  }
  google::protobuf::RepeatedPtrField<onnx::NodeProto> sorted;
  for (int i : order) *sorted.Add() = model_.graph().node(i);
  model_.mutable_graph()->mutable_node()->Swap(&sorted);
  reindex();
  remove_nodes({});  // drops initializers nothing uses any more
}

void OnnxGraph::set_opset(const std::string& domain, int64_t version) {
  for (auto& op : *model_.mutable_opset_import()) {
    if (op.domain() == domain || (domain.empty() && op.domain() == "ai.onnx")) {
      op.set_version(version);
      return;
    }
  }
  auto* op = model_.add_opset_import();
  op->set_domain(domain);
  op->set_version(version);
}

int64_t OnnxGraph::opset(const std::string& domain) const {
  for (const auto& op : model_.opset_import()) {
    if (op.domain() == domain || (domain.empty() && op.domain() == "ai.onnx")) return op.version();
  }
  return -1;
}

void OnnxGraph::drop_opset(const std::string& domain) {
  auto* ops = model_.mutable_opset_import();
  for (int i = ops->size() - 1; i >= 0; --i) {
    if (ops->Get(i).domain() == domain) ops->DeleteSubrange(i, 1);
  }
}

std::string OnnxGraph::serialize() const {
  std::string out;
  if (!model_.SerializeToString(&out)) throw DeployError("cannot serialize the ONNX model");
  return out;
}

const onnx::AttributeProto* find_attribute(const onnx::NodeProto& node, const std::string& name) {
  for (const auto& a : node.attribute()) if (a.name() == name) return &a;
  return nullptr;
}

int64_t int_attribute(const onnx::NodeProto& node, const std::string& name, int64_t fallback) {
  const auto* a = find_attribute(node, name);
  if (!a) return fallback;
  if (a->type() == onnx::AttributeProto::FLOAT) {
    return checked_int64(std::trunc(a->f()), "node '" + node.name() + "' attribute " + name);
  }
  return a->i();
}

onnx::AttributeProto make_int_attribute(const std::string& name, int64_t v) {
  onnx::AttributeProto a;
  a.set_name(name);
  a.set_type(onnx::AttributeProto::INT);
  a.set_i(v);
  return a;
}

float float_attribute(const onnx::NodeProto& node, const std::string& name, float fallback) {
  const auto* a = find_attribute(node, name);
  if (!a) return fallback;
  if (a->type() == onnx::AttributeProto::INT) return static_cast<float>(a->i());
  return a->f();
}

void remove_attribute(onnx::NodeProto* node, const std::string& name) {
  auto* attrs = node->mutable_attribute();
  for (int i = 0; i < attrs->size(); ++i) {
    if (attrs->Get(i).name() == name) {
      attrs->DeleteSubrange(i, 1);
      return;
    }
  }
}

}  // namespace deploy
}  // namespace mqbench
