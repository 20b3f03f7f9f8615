// TRTModelQuantizer (MQBench's tensorrt_quantizer.py; not the default of any backend): the base
// rules, except that an add may keep one input unquantized, as TensorRT fuses an add into the
// convolution that produces one of its inputs. Scanning the add's inputs from the last to the
// first, the first float nn.Conv2d / nn.Linear (exact type) used only by this add stays
// unquantized. As in MQBench, QAT-swapped convolutions are not float ones, so this only acts on
// layers left float (exclude_module_name, a QAT mapping that skips them).

#include "mqbench/quantizer/model_quantizer.h"
#include "quantizer/rules/base_types.h"

namespace mqbench {
namespace quantizer {
namespace {

QuantizerRules trt_model() {
  QuantizerRules r;
  r.name = "TRTModelQuantizer";
  r.function_types = rules::base_functions();
  r.module_types = rules::base_modules();
  r.implicit_merges = {{"operator.add", "operator.mul"}};
  r.plan = [](const graph::Graph& g, const QuantizerRules& rules, const QuantizerOptions& o) {
    detail::Matcher m(g, rules, o);
    auto merged = [&](int64_t add) -> int64_t {
      if (!m.matches(add, "operator.add")) return -1;
      const auto& inputs = g.node(add).inputs;
      for (auto it = inputs.rbegin(); it != inputs.rend(); ++it) {
        const auto& src = g.node(*it);
        const bool layer = g.is_exact(*it, "nn.Conv2d") || g.is_exact(*it, "nn.Linear");
        if (src.op == graph::OpKind::kCallModule && layer && src.users.size() == 1) return *it;
      }
      return -1;
    };
    std::vector<std::string> log;
    auto nodes = detail::input_act_quants(m, &log, merged);
    return detail::to_plan(g, nodes, std::move(log));
  };
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(trt_model, mqbench::quantizer::trt_model());
