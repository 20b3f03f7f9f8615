// Vitis (Xilinx DPU): <name>_deploy_model.onnx and <name>_clip_ranges.json =
// {"vitis": {tensor / weight / bias: {"scale": s}}}, per-tensor power-of-two quantization only.
// The xmodel compile step (MQBench's mqbench.deploy.convert_xir) needs Xilinx's Vitis-AI
// packages (xir, pytorch_nndct), which are not available here: the note says what to run.

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

DeployOutput vitis(OnnxGraph g, const DeployOptions& options) {
  RemoveOptions ro;
  ro.allow_bias = true;
  ro.per_channel_error = "Vitis-DPU does not support per-channel quantization";
  JsonObject params;
  for (const auto& r : remove_for(g, "Vitis", ro)) params[r.tensor] = Json{{"scale", r.fq.q.scale[0]}};
  propagate_ranges(g, params, options);
  DeployOutput out = ranges_and_model(options, Json{{"vitis", params.json()}}, g);
  out.notes.push_back("Vitis: compile the xmodel inside Xilinx's Vitis-AI docker with `python -m "
                      "mqbench.deploy.convert_xir -Q " + options.model_name + ".onnx -C " +
                      options.model_name + "_deploy_model.onnx -N " + options.model_name +
                      "` (MQBench's tool; it needs the Vitis-AI packages xir and pytorch_nndct)");
  return out;
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(vitis, "vitis", mqbench::deploy::translators::vitis);
