// AcademicNLPQuantizer (Academic_NLP): the inputs of linear layers and matmuls, with fusion and
// the base behaviour otherwise.

#include "mqbench/quantizer/model_quantizer.h"

namespace mqbench {
namespace quantizer {
namespace {

QuantizerRules academic_nlp() {
  QuantizerRules r;
  r.name = "AcademicNLPQuantizer";
  r.function_types = {"torch.matmul"};
  r.module_types = {"nn.qat.Linear"};
  r.plan = [](const graph::Graph& g, const QuantizerRules& rules, const QuantizerOptions& o) {
    detail::Matcher m(g, rules, o);
    std::vector<std::string> log;
    auto nodes = detail::input_act_quants(m, &log);
    return detail::to_plan(g, nodes, std::move(log));
  };
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(academic_nlp, mqbench::quantizer::academic_nlp());
