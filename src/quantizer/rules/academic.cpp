// AcademicQuantizer (Academic): no fusion (BatchNorm stays a float module); the inputs of
// QAT Conv2d and Linear layers (plus the user's additional types) are quantized, nodes with
// constant arguments skipped. The first layers (fed by a model input) and the last layers
// (feeding the output) keep 8-bit weights and 8-bit input activations, as is customary in
// low-bit papers.

#include <algorithm>

#include "mqbench/quantizer/model_quantizer.h"

namespace mqbench {
namespace quantizer {
namespace {

QuantizerRules academic() {
  QuantizerRules r;
  r.name = "AcademicQuantizer";
  r.module_types = {"nn.qat.Conv2d", "nn.qat.Linear"};
  r.skip_non_node_args = true;
  r.fuse = false;
  r.plan = [](const graph::Graph& g, const QuantizerRules& rules, const QuantizerOptions& o) {
    detail::Matcher m(g, rules, o);
    std::vector<std::string> log;
    auto nodes = detail::input_act_quants(m, &log);
    auto plan = detail::to_plan(g, nodes, std::move(log));
    // IO layers: nodes with a placeholder among their inputs, and the output's inputs.
    std::vector<int64_t> io;
    for (int64_t i = 0; i < g.size(); ++i) {
      const auto& n = g.node(i);
      if (n.op == graph::OpKind::kOutput) {
        for (auto in : n.inputs) detail::append_unique(io, in);
        continue;
      }
      for (auto in : n.inputs) {
        if (g.node(in).op == graph::OpKind::kPlaceholder) detail::append_unique(io, i);
      }
    }
    const std::pair<int64_t, int64_t> w8 =
        o.weight_symmetric ? std::make_pair<int64_t, int64_t>(-128, 127)
                           : std::make_pair<int64_t, int64_t>(0, 255);
    plan.weight_range = w8;
    for (auto i : io) {
      const auto& n = g.node(i);
      if (n.op != graph::OpKind::kCallModule) continue;
      plan.weight_range_modules.push_back(n.target);
      for (auto in : n.inputs) {
        for (auto& q : plan.act_quants) {
          if (q.node != g.node(in).name || q.quant_min) continue;
          q.quant_min = o.activation_symmetric ? -128 : 0;
          q.quant_max = o.activation_symmetric ? 127 : 255;
          plan.log.push_back("Set " + q.node + " post act quantize to 8 bit.");
        }
      }
    }
    return plan;
  };
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(academic, mqbench::quantizer::academic());
