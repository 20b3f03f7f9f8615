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
  remove_zero_pads(g);
  RemoveOptions ro;
  ro.backend = "Vitis";
  ro.allow_bias = true;
  ro.per_channel_error = "Vitis-DPU does not support per-channel quantization";
  const auto removed = remove_fake_quant(g, ro);
  Json params = Json::object();
  std::set<std::string> has;
  for (const auto& r : removed) {
    params[r.tensor] = Json{{"scale", r.fq.q.scale[0]}};
    has.insert(r.tensor);
  }
  for (const auto& c : post_process_clip_ranges(g, has)) params[c.first] = params[c.second];
  DeployOutput out;
  out.files.push_back(json_file(options.model_name + "_clip_ranges.json", Json{{"vitis", params}}));
  out.files.push_back(onnx_file(options.model_name + "_deploy_model.onnx", g));
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
