// pybind11 glue for the graph IR and the model quantizer (include/mqbench/quantizer/). Graphs
// cross as lists of node dicts; plans come back as dicts. Errors become ValueError.

#include <c10/util/Exception.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "errors.h"
#include "mqbench/quantizer/model_quantizer.h"

namespace py = pybind11;

namespace mqbench {
namespace python {
namespace {

namespace mg = mqbench::graph;
namespace mq = mqbench::quantizer;

mg::Graph to_graph(const py::list& nodes) {
  mg::Graph g;
  for (const auto& item : nodes) {
    auto d = item.cast<py::dict>();
    mg::Node n;
    n.name = d["name"].cast<std::string>();
    n.op = mg::op_from_name(d["op"].cast<std::string>());
    n.target = d["target"].cast<std::string>();
    if (d.contains("module_types")) n.module_types = d["module_types"].cast<std::vector<std::string>>();
    if (d.contains("inputs")) n.inputs = d["inputs"].cast<std::vector<int64_t>>();
    if (d.contains("all_args_are_nodes")) n.all_args_are_nodes = d["all_args_are_nodes"].cast<bool>();
    if (d.contains("getitem_source")) n.getitem_source = d["getitem_source"].cast<int64_t>();
    g.add(std::move(n));
  }
  return g;
}

mq::QuantizerOptions to_options(const py::dict& d) {
  mq::QuantizerOptions o;
  auto list = [&](const char* key, std::vector<std::string>& out) {
    if (d.contains(key)) out = d[key].cast<std::vector<std::string>>();
  };
  list("additional_function_type", o.additional_function_type);
  list("additional_module_type", o.additional_module_type);
  list("additional_node_name", o.additional_node_name);
  list("exclude_module_name", o.exclude_module_name);
  list("exclude_function_type", o.exclude_function_type);
  list("exclude_node_name", o.exclude_node_name);
  if (d.contains("academic_mode")) o.academic_mode = d["academic_mode"].cast<bool>();
  if (d.contains("weight_symmetric")) o.weight_symmetric = d["weight_symmetric"].cast<bool>();
  if (d.contains("activation_symmetric")) o.activation_symmetric = d["activation_symmetric"].cast<bool>();
  if (d.contains("activation_bits")) o.activation_bits = d["activation_bits"].cast<int64_t>();
  if (d.contains("extra_fusion_patterns")) {
    o.extra_fusion_patterns = d["extra_fusion_patterns"].cast<std::vector<std::vector<std::string>>>();
  }
  // A subclass's overrides of the rule set's lists (absent or None: the rule set's own).
  if (d.contains("function_types") && !d["function_types"].is_none()) {
    o.function_types = d["function_types"].cast<std::vector<std::string>>();
  }
  if (d.contains("module_types") && !d["module_types"].is_none()) {
    o.module_types = d["module_types"].cast<std::vector<std::string>>();
  }
  if (d.contains("implicit_merges") && !d["implicit_merges"].is_none()) {
    o.implicit_merges = d["implicit_merges"].cast<std::vector<std::vector<std::string>>>();
  }
  return o;
}

}  // namespace

void bind_quantizer(py::module_& m) {
  m.def("find_fusions", [](const py::list& nodes, const std::string& rules, const py::dict& opts) {
    return as_value_error([&] {
      std::vector<std::pair<std::vector<std::string>, std::string>> out;
      for (auto& f : mq::find_fusions(to_graph(nodes), rules, to_options(opts))) {
        out.emplace_back(f.nodes, f.kind);
      }
      return out;
    });
  }, "Fusion groups (node names, kind) of a float graph given as node dicts.");
  m.def("plan_activation_quant", [](const py::list& nodes, const std::string& rules,
                                    const py::dict& opts) {
    return as_value_error([&] {
      auto plan = mq::plan_activation_quant(to_graph(nodes), rules, to_options(opts));
      py::list acts;
      for (const auto& q : plan.act_quants) {
        py::dict a;
        a["node"] = q.node;
        a["quant_min"] = q.quant_min ? py::object(py::int_(*q.quant_min)) : py::none();
        a["quant_max"] = q.quant_max ? py::object(py::int_(*q.quant_max)) : py::none();
        a["quant_type"] = q.quant_type;
        acts.append(a);
      }
      py::dict d;
      d["act_quants"] = acts;
      d["weight_range_modules"] = plan.weight_range_modules;
      d["weight_range"] = plan.weight_range ? py::object(py::make_tuple(plan.weight_range->first,
                                                                        plan.weight_range->second))
                                            : py::none();
      d["log"] = plan.log;
      return d;
    });
  }, "The activation-quant plan of a fused, QAT-swapped graph given as node dicts.");
  m.def("quantizer_rules", [](const std::string& name) {
    return as_value_error([&] {
      const auto& r = mq::get_rules(name);
      py::dict d;
      d["name"] = r.name;
      d["fuse"] = r.fuse;
      d["qat_exclude_types"] = r.qat_exclude_types;
      d["function_types"] = r.function_types;
      d["module_types"] = r.module_types;
      d["academic_module_types"] = r.academic_module_types;
      d["implicit_merges"] = r.implicit_merges;
      d["append_additional_function_types"] = r.append_additional_function_types;
      return d;
    });
  }, "The data of a rule set: name, whether it fuses, QAT-swap exclusions, its type lists "
     "(canonical names) and implicit-merge patterns.");
  m.def("quantizer_rules_names", [] { return mq::rules_names(); });
}

}  // namespace python
}  // namespace mqbench
