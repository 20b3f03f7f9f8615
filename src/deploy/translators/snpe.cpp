// SNPE: <name>_deploy_model.onnx and <name>_clip_ranges.json in SNPE's quantization-overrides
// layout: {"activation_encodings": {tensor: [{"bitwidth", "min", "max"}]}, "param_encodings": {}}.
// min / max are s * (qmin - z) and s * (qmax - z) in wide integers (MQBench main wraps them in
// uint8: docs/compatibility.md).

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

DeployOutput snpe(OnnxGraph g, const DeployOptions& options) {
  remove_zero_pads(g);
  RemoveOptions ro;
  ro.backend = "SNPE";
  const auto removed = remove_fake_quant(g, ro);
  Json act = Json::object();
  std::set<std::string> has;
  for (const auto& r : removed) {
    if (r.role != Role::kActivation) continue;
    const auto& q = r.fq.q;
    act[r.tensor] = Json::array({Json{{"bitwidth", q.bit()}, {"min", q.min_value()}, {"max", q.max_value()}}});
    has.insert(r.tensor);
  }
  for (const auto& c : post_process_clip_ranges(g, has)) act[c.first] = act[c.second];
  DeployOutput out;
  out.files.push_back(json_file(options.model_name + "_clip_ranges.json",
                                Json{{"activation_encodings", act}, {"param_encodings", Json::object()}}));
  out.files.push_back(onnx_file(options.model_name + "_deploy_model.onnx", g));
  return out;
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(snpe, "snpe", mqbench::deploy::translators::snpe);
