// Tensorrt_NLP: Academic's file (<name>.onnx as QDQ, mqbench's nodes kept where a range has no QDQ
// form; the translator "academic" in qdq.cpp), for TensorRT. A QDQ model whose MatMul or Gemm
// has a quantized weight but a float input makes TensorRT run that layer in float, as the
// Tensorrt deploy would: the same refusal (find_float_layers, Note [Float layers] in
// src/deploy/passes/find_float_layers.cpp; DeployOptions::allow_float_layers deploys it with a
// note), for the Gemm and MatMul layers only. The scheme (TensorrtNLPQuantizer, MQBench's rules)
// quantizes the inputs of linear layers and matmuls and never a convolution's, so a convolution
// (a vision transformer's patch embedding) has a float input by the scheme's design, not by an
// exclusion; refusing it would refuse every such model. Academic and Academic_NLP, research
// backends with no runtime of their own, keep float layers as they are.

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

DeployOutput tensorrt_nlp(OnnxGraph g, const DeployOptions& options) {
  const auto float_layers = find_float_layers(g, /*convolutions=*/false);
  DeployOutput out = get_translator("academic")(std::move(g), options);
  answer_float_layers(float_layers, options, "Tensorrt_NLP", &out.notes);
  return out;
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(tensorrt_nlp, "tensorrt_nlp",
                                   mqbench::deploy::translators::tensorrt_nlp);
