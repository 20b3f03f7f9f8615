// The model quantizer's engine (include/mqbench/quantizer/model_quantizer.h): the rule-set
// registry, fusion matching, and the building blocks the rule files under rules/ combine.

#include "mqbench/quantizer/model_quantizer.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <mutex>

namespace mqbench {
namespace quantizer {

using graph::Graph;
using graph::OpKind;

namespace {

struct RulesRegistry {
  std::mutex mutex;
  std::vector<QuantizerRules> rules;
};

RulesRegistry& rules_registry() {
  static RulesRegistry r;
  return r;
}

bool contains(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

}  // namespace

void register_rules(QuantizerRules rules) {
  auto& r = rules_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  TORCH_CHECK(!rules.name.empty(), "register_rules: the rule set has no name");
  TORCH_CHECK(static_cast<bool>(rules.plan), "register_rules(", rules.name, "): no plan function");
  for (const auto& x : r.rules) {
    TORCH_CHECK(x.name != rules.name, "register_rules: a rule set named '", rules.name,
                "' is already registered");
  }
  r.rules.push_back(std::move(rules));
}

const QuantizerRules& get_rules(const std::string& name) {
  auto& r = rules_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const auto& x : r.rules) {
    if (x.name == name) return x;
  }
  std::vector<std::string> names;
  for (const auto& x : r.rules) names.push_back(x.name);
  TORCH_CHECK(false, "unknown quantizer rules '", name, "'; registered: ", join(names));
}

std::vector<std::string> rules_names() {
  auto& r = rules_registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& x : r.rules) names.push_back(x.name);
  return names;
}

// ---- fusion ----------------------------------------------------------------------------------

namespace {

struct Root {
  const char* type;
  const char* kind;     // fused kind prefix
  const char* suffix;   // dimension suffix
  std::vector<std::string> norms;
};

const std::vector<Root>& roots() {
  static const std::vector<Root> r{
      {"nn.Conv1d", "Conv", "1d", {"nn.BatchNorm1d"}},
      {"nn.Conv2d", "Conv", "2d", {"nn.BatchNorm2d", "mqbench.nn.FrozenBatchNorm2d"}},
      {"nn.Conv3d", "Conv", "3d", {"nn.BatchNorm3d"}},
      {"nn.ConvTranspose2d", "ConvTranspose", "2d",
       {"nn.BatchNorm2d", "mqbench.nn.FrozenBatchNorm2d"}},
      {"nn.Linear", "Linear", "", {"nn.BatchNorm1d"}},
  };
  return r;
}

bool is_relu(const Graph& g, int64_t i) {
  const auto& n = g.node(i);
  return g.is_exact(i, "nn.ReLU") || (n.op == OpKind::kCallFunction && n.target == "F.relu");
}

// The single user of node i, or -1.
int64_t only_user(const Graph& g, int64_t i) {
  const auto& users = g.node(i).users;
  if (users.size() != 1) return -1;
  // The user must take i exactly once (conv -> bn, not add(conv, conv)).
  const auto& in = g.node(users[0]).inputs;
  return std::count(in.begin(), in.end(), i) == 1 ? users[0] : -1;
}

}  // namespace

std::vector<FusionGroup> find_fusions(const Graph& g, const std::string& rules_name,
                                      const QuantizerOptions& options) {
  const auto& rules = get_rules(rules_name);
  std::vector<FusionGroup> groups;
  if (!rules.fuse || (rules.name == "OPENVINOQuantizer" && options.academic_mode)) return groups;
  std::vector<bool> used(static_cast<size_t>(g.size()), false);
  auto matches = [&](int64_t i, const std::string& name) {
    const auto& n = g.node(i);
    return g.is_exact(i, name) ||
           ((n.op == OpKind::kCallFunction || n.op == OpKind::kCallMethod) && n.target == name);
  };
  for (int64_t i = 0; i < g.size(); ++i) {
    if (used[static_cast<size_t>(i)]) continue;
    bool user_match = false;
    for (size_t p = 0; p < options.extra_fusion_patterns.size() && !user_match; ++p) {
      const auto& pattern = options.extra_fusion_patterns[p];
      if (pattern.size() < 2 || !matches(i, pattern[0])) continue;
      std::vector<int64_t> chain{i};
      for (size_t k = 1; k < pattern.size(); ++k) {
        const int64_t next = only_user(g, chain.back());
        if (next < 0 || used[static_cast<size_t>(next)] || !matches(next, pattern[k])) break;
        chain.push_back(next);
      }
      if (chain.size() != pattern.size()) continue;
      FusionGroup fg;
      for (auto c : chain) {
        fg.nodes.push_back(g.node(c).name);
        used[static_cast<size_t>(c)] = true;
      }
      fg.kind = "user:" + std::to_string(p);
      groups.push_back(std::move(fg));
      user_match = true;
    }
    if (user_match) continue;
    for (const auto& root : roots()) {
      if (!g.is_exact(i, root.type)) continue;
      std::vector<int64_t> chain{i};
      std::string kind = root.kind;
      int64_t next = only_user(g, i);
      if (next >= 0) {
        for (const auto& norm : root.norms) {
          if (g.is_exact(next, norm)) {
            chain.push_back(next);
            kind += norm == "mqbench.nn.FrozenBatchNorm2d" ? "Freezebn" : "Bn";
            next = only_user(g, next);
            break;
          }
        }
      }
      if (next >= 0 && is_relu(g, next)) {
        chain.push_back(next);
        kind += "ReLU";
      }
      if (chain.size() > 1) {
        if (std::string(root.kind) == "Linear" && kind == "LinearBn") kind = "LinearBn1d";
        else kind += root.suffix;
        FusionGroup fg;
        for (auto c : chain) {
          fg.nodes.push_back(g.node(c).name);
          used[static_cast<size_t>(c)] = true;
        }
        fg.kind = kind;
        groups.push_back(std::move(fg));
      }
      break;
    }
    // BatchNorm + ReLU (torch fuses it into BNReLU2d/3d when no conv precedes the BN).
    if (!used[static_cast<size_t>(i)] &&
        (g.is_exact(i, "nn.BatchNorm2d") || g.is_exact(i, "nn.BatchNorm3d"))) {
      const int64_t next = only_user(g, i);
      if (next >= 0 && is_relu(g, next)) {
        const bool is3d = g.is_exact(i, "nn.BatchNorm3d");
        groups.push_back({{g.node(i).name, g.node(next).name}, is3d ? "BNReLU3d" : "BNReLU2d"});
        used[static_cast<size_t>(i)] = used[static_cast<size_t>(next)] = true;
      }
    }
  }
  return groups;
}

Plan plan_activation_quant(const Graph& g, const std::string& rules_name,
                           const QuantizerOptions& options) {
  const auto& rules = get_rules(rules_name);
  return rules.plan(g, rules, options);
}

// ---- building blocks -----------------------------------------------------------------------

namespace detail {

Matcher::Matcher(const Graph& graph, const QuantizerRules& r, const QuantizerOptions& o)
    : g(graph), rules(r), options(o), functions(r.function_types), modules(r.module_types) {
  if (o.function_types) {
    functions = *o.function_types;
  } else if (r.append_additional_function_types) {
    functions.insert(functions.end(), o.additional_function_type.begin(),
                     o.additional_function_type.end());
  }
  if (o.module_types) {
    modules = *o.module_types;
  } else {
    modules.insert(modules.end(), o.additional_module_type.begin(),
                   o.additional_module_type.end());
  }
}

bool Matcher::excluded(int64_t i, bool honour_additional) const {
  const auto& n = g.node(i);
  if (honour_additional && contains(options.additional_node_name, n.name)) return false;
  if (n.op == OpKind::kCallModule && contains(options.exclude_module_name, n.target)) return true;
  if ((n.op == OpKind::kCallFunction || n.op == OpKind::kCallMethod) &&
      contains(options.exclude_function_type, n.target)) {
    return true;
  }
  return contains(options.exclude_node_name, n.name);
}

bool Matcher::quant_input(int64_t i) const {
  const auto& n = g.node(i);
  if (contains(options.additional_node_name, n.name)) return true;
  if (n.op == OpKind::kCallModule) {
    for (const auto& t : modules) {
      if (g.is_instance(i, t)) return true;
    }
    return false;
  }
  return (n.op == OpKind::kCallFunction || n.op == OpKind::kCallMethod) &&
         contains(functions, n.target);
}

bool Matcher::matches(int64_t i, const std::string& name) const {
  const auto& n = g.node(i);
  if (n.op == OpKind::kCallModule) return g.is_exact(i, name);
  return (n.op == OpKind::kCallFunction || n.op == OpKind::kCallMethod) && n.target == name;
}

bool Matcher::matches_any(int64_t i, const std::vector<std::string>& names) const {
  for (const auto& x : names) {
    if (matches(i, x)) return true;
  }
  return false;
}

bool Matcher::implicit_merge(int64_t consumer, int64_t producer) const {
  const auto& patterns = options.implicit_merges ? *options.implicit_merges : rules.implicit_merges;
  for (const auto& pattern : patterns) {
    for (size_t a = 0; a < pattern.size(); ++a) {
      if (!matches(consumer, pattern[a])) continue;
      for (size_t b = a + 1; b < pattern.size(); ++b) {
        if (matches(producer, pattern[b])) return true;
      }
    }
  }
  return false;
}

void append_unique(std::vector<int64_t>& v, int64_t x) {
  if (std::find(v.begin(), v.end(), x) == v.end()) v.push_back(x);
}

int64_t resolve_getitem(const Graph& g, int64_t i) {
  const auto s = g.node(i).getitem_source;
  return s >= 0 ? s : i;
}

std::vector<int64_t> input_act_quants(const Matcher& m, std::vector<std::string>* log,
                                      const std::function<int64_t(int64_t)>& merged) {
  std::vector<int64_t> out;
  const auto& g = m.g;
  for (int64_t i = 0; i < g.size(); ++i) {
    const auto& n = g.node(i);
    if (m.excluded(i)) {
      if (log) log->push_back("Exclude skip: " + n.name);
      continue;
    }
    if (!m.quant_input(i)) continue;
    if (m.rules.skip_non_node_args && !n.all_args_are_nodes) continue;
    const int64_t kept_float = merged ? merged(i) : -1;
    for (auto in : n.inputs) {
      if (in == kept_float) {
        if (log) log->push_back("Merge into add: " + n.name + " + " + g.node(in).name);
        continue;
      }
      if (m.implicit_merge(i, in)) {
        if (log) log->push_back("Implicit merge: " + n.name + " + " + g.node(in).name);
        continue;
      }
      append_unique(out, resolve_getitem(g, in));
    }
  }
  return out;
}

Plan inputs_plan(const Graph& g, const QuantizerRules& rules, const QuantizerOptions& o) {
  Matcher m(g, rules, o);
  std::vector<std::string> log;
  auto nodes = input_act_quants(m, &log);
  return to_plan(g, nodes, std::move(log));
}

Plan to_plan(const Graph& g, const std::vector<int64_t>& nodes, std::vector<std::string> log) {
  Plan p;
  std::vector<int64_t> seen;
  for (auto i : nodes) {
    if (std::find(seen.begin(), seen.end(), i) != seen.end()) continue;
    seen.push_back(i);
    ActQuant q;
    q.node = g.node(i).name;
    p.act_quants.push_back(std::move(q));
  }
  p.log = std::move(log);
  return p;
}

}  // namespace detail
}  // namespace quantizer
}  // namespace mqbench
