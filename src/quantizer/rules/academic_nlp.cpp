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
  r.plan = detail::inputs_plan;
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(academic_nlp, mqbench::quantizer::academic_nlp());
