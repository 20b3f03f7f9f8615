// Tensorrt: the float model without fake quantization (<name>_deploy_model.onnx) and each
// activation's symmetric clip value (<name>_clip_ranges.json, {"tensorrt": {"blob_range":
// {tensor: s * max(-qmin, qmax)}}}), as MQBench's deploy_qparams_tensorrt. With
// deploy_to_qlinear, also the QDQ model onnx_quantized_model.onnx (translator
// "tensorrt_qlinear", MQBench's ONNXQLinearPass): 8-bit symmetric only.

#include <algorithm>

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
  DeployOutput out;
  if (options.deploy_to_qlinear) out.files.push_back(qlinear(g));  // from a copy of the fakeq model
  remove_zero_pads(g);
  RemoveOptions ro;
  ro.backend = "Tensorrt";
  const auto removed = remove_fake_quant(g, ro);
  Json ranges = Json::object();
  std::set<std::string> has;
  for (const auto& r : removed) {
    if (r.role != Role::kActivation) continue;
    const auto& q = r.fq.q;
    ranges[r.tensor] = q.scale[0] * static_cast<double>(std::max(-q.quant_min, q.quant_max));
    has.insert(r.tensor);
  }
  for (const auto& c : post_process_clip_ranges(g, has)) ranges[c.first] = ranges[c.second];
  out.files.push_back(json_file(options.model_name + "_clip_ranges.json",
                                Json{{"tensorrt", Json{{"blob_range", ranges}}}}));
  out.files.push_back(onnx_file(options.model_name + "_deploy_model.onnx", g));
  if (options.deploy_to_qlinear) std::rotate(out.files.begin(), out.files.begin() + 1, out.files.end());
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
