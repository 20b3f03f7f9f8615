// PPLW8A16 (OpenPPL): <name>_deploy_model.onnx and <name>_clip_ranges.json =
// {"ppl": {tensor or weight: {"step", "zero_point", "min", "max", "bit", "type": "biased"}}} for
// every fake-quantized tensor; per-channel weights have lists for step, zero_point, min and max.

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

Json entry(const QParams& q) {
  if (!q.per_channel()) {
    return Json{{"step", q.scale[0]}, {"zero_point", q.zero_point[0]}, {"min", q.min_value()},
                {"max", q.max_value()}, {"bit", q.bit()}, {"type", "biased"}};
  }
  Json step = Json::array(), zp = Json::array(), mn = Json::array(), mx = Json::array();
  for (size_t c = 0; c < q.scale.size(); ++c) {
    step.push_back(q.scale[c]);
    zp.push_back(q.zero_point[c]);
    mn.push_back(q.min_value(c));
    mx.push_back(q.max_value(c));
  }
  return Json{{"step", step}, {"zero_point", zp}, {"min", mn}, {"max", mx}, {"bit", q.bit()}, {"type", "biased"}};
}

DeployOutput pplw8a16(OnnxGraph g, const DeployOptions& options) {
  JsonObject params;
  for (const auto& r : remove_for(g, "PPLW8A16")) params[r.tensor] = entry(r.fq.q);
  propagate_ranges(g, params, options);
  return ranges_and_model(options, Json{{"ppl", params.json()}}, g);
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(pplw8a16, "pplw8a16", mqbench::deploy::translators::pplw8a16);
