// TotalINTQuantizer (SNPE, PPLW8A16, PPLCUDA, STPU): everything runs in integer, so besides the
// inputs of every quant-input node its output is quantized too; when its user is a "pass" op
// (relu, relu6, flatten, dropout) the user's output is quantized instead. The network output is
// quantized as a consequence.

#include "mqbench/quantizer/model_quantizer.h"
#include "quantizer/rules/base_types.h"

namespace mqbench {
namespace quantizer {
namespace {

QuantizerRules total_int() {
  QuantizerRules r;
  r.name = "TotalINTQuantizer";
  r.function_types = rules::base_functions();
  r.module_types = rules::base_modules();
  r.implicit_merges = {{"operator.add", "operator.mul"}};
  r.plan = [](const graph::Graph& g, const QuantizerRules& rules, const QuantizerOptions& o) {
    static const std::vector<std::string> pass{"F.relu", "F.relu6", "torch.flatten",
                                               "nn.Dropout2d", "nn.ReLU", "nn.ReLU6"};
    detail::Matcher m(g, rules, o);
    std::vector<std::string> log;
    auto nodes = detail::input_act_quants(m, &log);
    for (int64_t i = 0; i < g.size(); ++i) {
      // MQBench's exclusion here does not honour additional_node_name.
      if (m.excluded(i, /*honour_additional=*/false) || !m.quant_input(i)) continue;
      for (auto u : g.node(i).users) {
        if (m.matches_any(u, pass)) {
          nodes.push_back(u);
        } else if (!m.implicit_merge(u, i)) {
          nodes.push_back(i);
        }
      }
    }
    return detail::to_plan(g, nodes, std::move(log));
  };
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(total_int, mqbench::quantizer::total_int());
