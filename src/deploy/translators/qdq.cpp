// QDQ and Academic: <name>.onnx with every fake quantizer as a standard QuantizeLinear
// [-> Clip] -> DequantizeLinear pair (opset 13), runnable by any ONNX runtime. Ranges narrower
// than int8 / uint8 (4-bit, [-127, 127]) saturate exactly through an integer Clip. FP8 groups
// keep their float8 Q/DQ (opset 19), group-wise ones their blocked Q/DQ (opset 21).
//
// Academic (also Academic_NLP and Tensorrt_NLP, which MQBench deploys with convert_onnx only)
// falls back to keeping mqbench's fake-quantize nodes when a range has no QDQ form (e.g. 16-bit).

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

DeployOutput qdq(OnnxGraph g, const DeployOptions& options) {
  QdqOptions o;
  o.backend = "QDQ";
  to_qdq(g, o);
  return DeployOutput{{onnx_file(options.model_name + ".onnx", g)}, {}};
}

DeployOutput academic(OnnxGraph fakeq, const DeployOptions& options) {
  try {
    return qdq(fakeq, options);  // a copy: the fake-quant model is the fallback
  } catch (const DeployError& e) {
    // MQBench 1.10 wrote its fake quantizers in the default domain, where no ONNX tool knows
    // them: the written model has them in the mqbench domain, which it imports.
    bool moved = false;
    for (auto& n : *fakeq.graph().mutable_node()) {
      if (n.domain().empty() && is_fake_quant_op(n.op_type())) {
        n.set_domain("mqbench");
        moved = true;
      }
    }
    if (moved && fakeq.opset("mqbench") < 0) fakeq.set_opset("mqbench", 1);
    return DeployOutput{{onnx_file(options.model_name + ".onnx", fakeq)},
                        {std::string("kept mqbench's fake-quantize nodes in ") + options.model_name +
                         ".onnx: " + e.what()}};
  }
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(qdq, "qdq", mqbench::deploy::translators::qdq);
MQBENCH_REGISTER_DEPLOY_TRANSLATOR(academic, "academic", mqbench::deploy::translators::academic);
