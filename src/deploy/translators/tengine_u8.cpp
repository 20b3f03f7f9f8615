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

DeployOutput tengine_u8(OnnxGraph g, const DeployOptions& options) {
  const auto removed = remove_for(g, "Tengine_u8");
  JsonObject params;  // tensor -> [scale, zero_point], MQBench's quant_params
  for (const auto& r : removed) {
    if (r.role != Role::kActivation) continue;
    const Json v = Json::array({r.fq.q.scale[0], r.fq.q.zero_point[0]});
    params[r.tensor] = v;
    const int p = g.producer(r.tensor);
    if (p < 0) continue;
    const auto& act = g.graph().node(p);
    if (act.op_type() != "Relu" && !is_relu6(g, act)) continue;
    const int pp = g.producer(act.input(0));
    if (pp >= 0 && g.graph().node(pp).op_type() == "Conv") params[g.graph().node(pp).output(0)] = v;
  }
  propagate_ranges(g, params, options);
  const Json table = params.json();
  std::string text;
  for (const auto& item : table.items()) {
    const Json& v = item.value();
    if (!v.is_array() || v.size() != 2 || !v[0].is_number() || !v[1].is_number_integer()) {
      throw DeployError("Tengine_u8: the entry of '" + item.key() +
                        "' must be [scale, zero_point] (a number and an integer), got " + v.dump());
    }
    check_text_key(item.key(), "Tengine_u8", "one \"<tensor> <scale> <zero_point>\" line per tensor",
                   false);
    text += item.key() + " " + py_float(v[0].get<double>()) + " " + std::to_string(v[1].get<int64_t>()) + "\n";
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

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(tengine_u8, "tengine_u8", mqbench::deploy::translators::tengine_u8);
