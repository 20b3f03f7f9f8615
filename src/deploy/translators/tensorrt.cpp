// Tensorrt: the float model without fake quantization (<name>_deploy_model.onnx) and each
// activation's symmetric clip value (<name>_clip_ranges.json, {"tensorrt": {"blob_range":
// {tensor: s * max(-qmin, qmax)}}}), as MQBench's deploy_qparams_tensorrt. With
// deploy_to_qlinear, also the QDQ model onnx_quantized_model.onnx (translator
// "tensorrt_qlinear", MQBench's ONNXQLinearPass): 8-bit symmetric only. A model with FP8 fake
// quantizers (docs/formats.md) gets the QDQ model alone, FP8 Q/DQ included (opset 19); one with
// group-wise weights the same, each weight an INT4 initializer read by a DequantizeLinear.

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

Artifact qlinear(OnnxGraph g) {
  QdqOptions o;
  o.tensorrt = true;
  o.qlinear_names = true;
  o.backend = "Tensorrt";
  to_qdq(g, o);
  return onnx_file("onnx_quantized_model.onnx", g);
}

DeployOutput tensorrt(OnnxGraph g, const DeployOptions& options) {
  // TensorRT reads FP8 only as explicit Q/DQ: no clip value in blob_range can say "FP8".
  const auto fqs = find_fake_quants(g);
  const auto format = std::find_if(fqs.begin(), fqs.end(),
                                   [](const FakeQuant& fq) { return fq.q.is_format(); });
  if (format != fqs.end()) {
    return DeployOutput{{qlinear(std::move(g))},
                        {"fake quantizer '" + format->name + "' is " + format->q.describe() +
                         ", which TensorRT reads only from a QDQ model: wrote "
                         "onnx_quantized_model.onnx alone (no " + options.model_name +
                         "_deploy_model.onnx or clip ranges)"}};
  }
  DeployOutput out;
  if (options.deploy_to_qlinear) out.files.push_back(qlinear(g));  // from a copy of the fakeq model
  JsonObject ranges;
  for (const auto& r : remove_for(g, "Tensorrt")) {
    if (r.role != Role::kActivation) continue;
    const auto& q = r.fq.q;
    ranges[r.tensor] = q.scale[0] * static_cast<double>(std::max(-q.quant_min, q.quant_max));
  }
  propagate_ranges(g, ranges, options);
  const Json j{{"tensorrt", Json{{"blob_range", ranges.json()}}}};
  auto files = ranges_and_model(options, j, g).files;
  out.files.insert(out.files.begin(), files.begin(), files.end());
  return out;
}

DeployOutput tensorrt_qlinear(OnnxGraph fakeq, const DeployOptions&) {
  return DeployOutput{{qlinear(std::move(fakeq))}, {}};
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(tensorrt, "tensorrt", mqbench::deploy::translators::tensorrt);
MQBENCH_REGISTER_DEPLOY_TRANSLATOR(tensorrt_qlinear, "tensorrt_qlinear",
                                   mqbench::deploy::translators::tensorrt_qlinear);
