// PPLCUDA: <name>_deploy_model.onnx and, as MQBench writes it, a plain-text
// <name>_clip_ranges.json with one "<tensor>: <clip>" line per per-tensor fake quantizer,
// clip = max(-s(qmin - z), s(qmax - z)).

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

// A table entry as Python's str() writes it (MQBench writes f"{k}: {v}").
std::string text_of(const Json& v) {
  return v.is_number_float() ? py_float(v.get<double>()) : v.dump();
}

DeployOutput pplcuda(OnnxGraph g, const DeployOptions& options) {
  JsonObject ranges;
  for (const auto& r : remove_for(g, "PPLCUDA")) {
    if (!r.fq.q.per_channel()) ranges[r.tensor] = symmetric_clip(r.fq.q);
  }
  propagate_ranges(g, ranges, options);
  const Json table = ranges.json();
  std::string text;
  for (const auto& item : table.items()) {
    check_text_key(item.key(), "PPLCUDA", "one \"<tensor>: <clip>\" line per tensor", true);
    text += item.key() + ": " + text_of(item.value()) + "\n";
  }
  DeployOutput out;
  out.files.push_back({options.model_name + "_clip_ranges.json", text});
  out.files.push_back(onnx_file(options.model_name + "_deploy_model.onnx", g));
  return out;
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(pplcuda, "pplcuda", mqbench::deploy::translators::pplcuda);
