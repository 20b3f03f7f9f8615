// Tengine_u8: <name>_for_tengine.onnx (fake quantization removed, weights clipped) and
// <name>_for_tengine.scale, one "<tensor> <scale> <zero_point>" line per quantized activation;
// a ReLU / ReLU6 output right after a Conv also gives its parameters to the Conv's output, as
// MQBench's remove_fakequantize_and_collect_params_tengine.

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

bool is_relu6(const OnnxGraph& g, const onnx::NodeProto& n) {
  if (n.op_type() != "Clip" || n.input_size() < 3) return false;
  ConstTensor lo, hi;
  return g.constant(n.input(1), &lo) && g.constant(n.input(2), &hi) && lo.numel() == 1 &&
         hi.numel() == 1 && lo.values[0] == 0 && hi.values[0] == 6;
}

DeployOutput tengine(OnnxGraph g, const DeployOptions& options) {
  const auto removed = remove_for(g, "Tengine_u8");
  std::vector<std::string> order;
  std::map<std::string, std::pair<double, int64_t>> params;
  auto put = [&](const std::string& t, std::pair<double, int64_t> v) {
    if (!params.count(t)) order.push_back(t);
    params[t] = v;
  };
  for (const auto& r : removed) {
    if (r.role != Role::kActivation) continue;
    const std::pair<double, int64_t> v{r.fq.q.scale[0], r.fq.q.zero_point[0]};
    put(r.tensor, v);
    const int p = g.producer(r.tensor);
    if (p < 0) continue;
    const auto& act = g.graph().node(p);
    if (act.op_type() != "Relu" && !is_relu6(g, act)) continue;
    const int pp = g.producer(act.input(0));
    if (pp >= 0 && g.graph().node(pp).op_type() == "Conv") put(g.graph().node(pp).output(0), v);
  }
  std::set<std::string> has(order.begin(), order.end());
  for (const auto& c : post_process_clip_ranges(g, has)) put(c.first, params[c.second]);
  std::string text;
  for (const auto& t : order) {
    text += t + " " + py_float(params[t].first) + " " + std::to_string(params[t].second) + "\n";
  }
  DeployOutput out;
  out.files.push_back({options.model_name + "_for_tengine.scale", text});
  out.files.push_back(onnx_file(options.model_name + "_for_tengine.onnx", g));
  return out;
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(tengine, "tengine", mqbench::deploy::translators::tengine);
