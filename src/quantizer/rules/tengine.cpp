// TengineQuantizer (Tengine_u8): the base inputs plus concatenation, hardswish and sigmoid;
// also the outputs of every quant-input node (of its user when that is a flatten) and every
// graph output that is not a getitem or a placeholder. No implicit merges.

#include "mqbench/quantizer/model_quantizer.h"
#include "quantizer/rules/base_types.h"

namespace mqbench {
namespace quantizer {
namespace {

QuantizerRules tengine() {
  QuantizerRules r;
  r.name = "TengineQuantizer";
  r.function_types = {"torch.cat", "F.hardswish", "F.sigmoid"};
  for (const auto& f : rules::base_functions()) r.function_types.push_back(f);
  r.module_types = {"nn.Hardswish", "nn.Sigmoid"};
  for (const auto& t : rules::base_modules()) r.module_types.push_back(t);
  r.plan = [](const graph::Graph& g, const QuantizerRules& rules, const QuantizerOptions& o) {
    detail::Matcher m(g, rules, o);
    std::vector<std::string> log;
    auto nodes = detail::input_act_quants(m, &log);
    for (int64_t i = 0; i < g.size(); ++i) {
      const auto& n = g.node(i);
      if (n.op == graph::OpKind::kOutput) {
        for (auto in : n.inputs) {
          const auto& src = g.node(in);
          const bool getitem = src.op == graph::OpKind::kCallFunction &&
                               src.target == "operator.getitem";
          if (!getitem && src.op != graph::OpKind::kPlaceholder) nodes.push_back(in);
        }
        continue;
      }
      if (m.excluded(i) || !m.quant_input(i)) continue;
      for (auto u : n.users) nodes.push_back(m.matches(u, "torch.flatten") ? u : i);
    }
    for (auto& x : nodes) x = detail::resolve_getitem(g, x);
    return detail::to_plan(g, nodes, std::move(log));
  };
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(tengine, mqbench::quantizer::tengine());
