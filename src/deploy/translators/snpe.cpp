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
  JsonObject act;
  for (const auto& r : remove_for(g, "SNPE")) {
    if (r.role != Role::kActivation) continue;
    const auto& q = r.fq.q;
    act[r.tensor] = Json::array({Json{{"bitwidth", q.bit()}, {"min", q.min_value()}, {"max", q.max_value()}}});
  }
  propagate_ranges(g, act, options);
  return ranges_and_model(
      options, Json{{"activation_encodings", act.json()}, {"param_encodings", Json::object()}}, g);
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(snpe, "snpe", mqbench::deploy::translators::snpe);
