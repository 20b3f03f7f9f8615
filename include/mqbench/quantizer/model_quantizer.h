#pragma once
// The model quantizer: MQBench's fusion, QAT-swap and quant-node placement rules over the
// graph IR (include/mqbench/graph/graph.h). Each backend names its rule set in its BackendSpec
// (model_quantizer); rule sets live one per file under src/quantizer/rules/ and register by
// name, like backends. A frontend asks two questions:
//
//   1. find_fusions(float graph, rules): which chains (conv -> bn -> relu, ...) to fuse;
//   2. plan_activation_quant(fused, QAT-swapped graph, rules, options): after which nodes to
//      insert an activation fake quantizer (<node>_post_act_fake_quantizer), and per-node
//      details (8-bit IO for Academic, unsigned ranges for OPENVINO, ...).
//
// Example:
//   auto plan = mqbench::quantizer::plan_activation_quant(g, "ModelQuantizer", {});
//   for (const auto& q : plan.act_quants) std::cout << q.node << "\n";

#include <c10/util/Optional.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mqbench/graph/graph.h"

namespace mqbench {
namespace quantizer {

/// MQBench's extra_quantizer_dict. Types and functions use the IR's canonical names.
struct QuantizerOptions {
  std::vector<std::string> additional_function_type;
  std::vector<std::string> additional_module_type;
  std::vector<std::string> additional_node_name;  // forces insertion, overrides exclusion
  std::vector<std::string> exclude_module_name;
  std::vector<std::string> exclude_function_type;
  std::vector<std::string> exclude_node_name;
  bool academic_mode = false;  // OPENVINO only
  /// The qconfig's weight / activation symmetry (OPENVINO's ranges depend on them).
  bool weight_symmetric = true;
  bool activation_symmetric = true;
  int64_t activation_bits = 8;
  /// The user's extra fusion patterns (extra_fuse_dict['additional_fuser_method_mapping']):
  /// chains of module types (or function names) in data-flow order. They are tried before the
  /// built-in patterns; a match's kind is "user:<index>".
  std::vector<std::vector<std::string>> extra_fusion_patterns;
  /// A Python subclass's overrides of the rule set's type lists (MQBench's properties
  /// function_type_to_quant_input / module_type_to_quant_input, or Vitis's *_quant_output, and
  /// implicit_merge_patterns). When set, a list replaces the rule set's list together with the
  /// additional_* types: the property already decides what it contains.
  c10::optional<std::vector<std::string>> function_types;
  c10::optional<std::vector<std::string>> module_types;
  c10::optional<std::vector<std::vector<std::string>>> implicit_merges;
};

struct ActQuant {
  std::string node;                 // the quantizer goes on this node's output
  c10::optional<int64_t> quant_min, quant_max;  // a range override (Academic IO, OPENVINO unsigned)
  std::string quant_type;           // Vitis: "tensor"
};

struct FusionGroup {
  std::vector<std::string> nodes;   // in data-flow order, e.g. {conv, bn, relu}
  std::string kind;                 // "ConvBnReLU", "ConvBn", "ConvReLU", "LinearReLU", ...
};

struct Plan {
  std::vector<ActQuant> act_quants;
  /// Modules whose weight quantizer gets `weight_range` (Academic's IO layers: 8 bit); when the
  /// list is empty and weight_range is set, every weight quantizer gets it (OPENVINO: 7 bit).
  std::vector<std::string> weight_range_modules;
  c10::optional<std::pair<int64_t, int64_t>> weight_range;
  /// Log lines in MQBench's wording ("Exclude skip: x", "Implicit merge: a + b", ...).
  std::vector<std::string> log;
};

/// The data of one rule set: what MQBench's quantizer class of the same name lists.
struct QuantizerRules {
  std::string name;
  std::vector<std::string> function_types;  // quant-input functions / methods
  std::vector<std::string> module_types;    // quant-input modules (isinstance)
  /// OPENVINO: the module list of academic_mode (QuantizerOptions::academic_mode).
  std::vector<std::string> academic_module_types;
  /// Implicit-merge patterns, consumer first (MQBench's implicit_merge_patterns).
  std::vector<std::vector<std::string>> implicit_merges;
  bool append_additional_function_types = true;
  bool skip_non_node_args = false;  // skip nodes with a constant among their args
  bool fuse = true;                 // Academic does not fuse
  /// QAT-swap exclusions of the rule set (ONNX_QNN keeps Linear layers float).
  std::vector<std::string> qat_exclude_types;
  /// The placement algorithm; receives the merged type lists.
  std::function<Plan(const graph::Graph&, const QuantizerRules&, const QuantizerOptions&)> plan;
};

/// Registers a rule set; raises on an empty or duplicate name.
void register_rules(QuantizerRules rules);
/// The rule set `name`; raises listing the registered ones.
const QuantizerRules& get_rules(const std::string& name);
std::vector<std::string> rules_names();

/// Fusion groups of a float graph: Conv1d/2d/3d, ConvTranspose2d and Linear followed by
/// BatchNorm (or mqbench's FrozenBatchNorm2d) and/or ReLU, and BatchNorm + ReLU, each
/// intermediate output used only by the next node. Empty when the rule set does not fuse.
std::vector<FusionGroup> find_fusions(const graph::Graph& g, const std::string& rules,
                                      const QuantizerOptions& options = {});

/// The activation-quant plan of a fused, QAT-swapped graph.
Plan plan_activation_quant(const graph::Graph& g, const std::string& rules,
                           const QuantizerOptions& options = {});

// ---- building blocks of the rule files -------------------------------------------------------
namespace detail {

/// A rule set's type lists merged with the options' additions.
struct Matcher {
  const graph::Graph& g;
  const QuantizerRules& rules;
  const QuantizerOptions& options;
  std::vector<std::string> functions, modules;

  Matcher(const graph::Graph& g, const QuantizerRules& r, const QuantizerOptions& o);
  bool excluded(int64_t i, bool honour_additional = true) const;
  bool quant_input(int64_t i) const;
  bool implicit_merge(int64_t consumer, int64_t producer) const;
  /// Matches a node against a canonical name: exact module type, or function/method target.
  bool matches(int64_t i, const std::string& name) const;
  bool matches_any(int64_t i, const std::vector<std::string>& names) const;
};

/// MQBench's base _find_act_quants: the inputs of every quant-input node, in graph order.
/// `merged(consumer)`, when given, names one input of the consumer that stays unquantized
/// (-1 for none; TRTModelQuantizer's conv merged into an add).
std::vector<int64_t> input_act_quants(const Matcher& m, std::vector<std::string>* log,
                                      const std::function<int64_t(int64_t)>& merged = nullptr);

/// The plan of a rule set that only quantizes inputs (ModelQuantizer, AcademicNLPQuantizer).
Plan inputs_plan(const graph::Graph& g, const QuantizerRules& rules, const QuantizerOptions& o);

/// Turns node indices into a plan, dropping repeats (first occurrence kept).
Plan to_plan(const graph::Graph& g, const std::vector<int64_t>& nodes, std::vector<std::string> log);

void append_unique(std::vector<int64_t>& v, int64_t x);
int64_t resolve_getitem(const graph::Graph& g, int64_t i);

}  // namespace detail

namespace detail {
struct RulesRegisterer {
  explicit RulesRegisterer(QuantizerRules r) { register_rules(std::move(r)); }
};
}  // namespace detail

}  // namespace quantizer
}  // namespace mqbench

#define MQBENCH_REGISTER_QUANTIZER_RULES(id, ...) \
  static ::mqbench::quantizer::detail::RulesRegisterer mqbench_rules_registerer_##id(__VA_ARGS__)
