// PPLCUDA: <name>_deploy_model.onnx and, as MQBench writes it, a plain-text
// <name>_clip_ranges.json with one "<tensor>: <clip>" line per per-tensor fake quantizer,
// clip = max(-s(qmin - z), s(qmax - z)).

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

DeployOutput ppl_cuda(OnnxGraph g, const DeployOptions& options) {
  const auto removed = remove_for(g, "PPLCUDA");
  std::vector<std::pair<std::string, double>> lines;
  std::map<std::string, double> value;
  std::set<std::string> has;
  for (const auto& r : removed) {
    if (r.fq.q.per_channel()) continue;
    if (!value.count(r.tensor)) lines.emplace_back(r.tensor, 0.0);
    value[r.tensor] = symmetric_clip(r.fq.q);
    has.insert(r.tensor);
  }
  for (const auto& c : post_process_clip_ranges(g, has)) {
    lines.emplace_back(c.first, 0.0);
    value[c.first] = value[c.second];
  }
  std::string text;
  for (const auto& l : lines) text += l.first + ": " + py_float(value[l.first]) + "\n";
  DeployOutput out;
  out.files.push_back({options.model_name + "_clip_ranges.json", text});
  out.files.push_back(onnx_file(options.model_name + "_deploy_model.onnx", g));
  return out;
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(ppl_cuda, "ppl_cuda", mqbench::deploy::translators::ppl_cuda);
