// MQBench's ModelQuantizer, the default rule set (Tensorrt, NNIE, QDQ use it; each rule file is
// named after the MQBench quantizer class it implements, less "Quantizer"): fuse,
// swap to QAT modules, and quantize the inputs of convolutions, linear layers, pools, BatchNorm,
// PReLU, Upsample, add, mul, adaptive average pooling and interpolation. A mul feeding an add is
// an implicit merge: no quantizer between.

#include "mqbench/quantizer/model_quantizer.h"
#include "quantizer/rules/base_types.h"

namespace mqbench {
namespace quantizer {
namespace {

QuantizerRules model() {
  QuantizerRules r;
  r.name = "ModelQuantizer";
  r.function_types = rules::base_functions();
  r.module_types = rules::base_modules();
  r.implicit_merges = {{"operator.add", "operator.mul"}};
  r.plan = detail::inputs_plan;
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(model, mqbench::quantizer::model());
