// NNIE (HiSilicon): <name>_deploy_model.onnx and <name>_gfpq_param_dict.json =
// {"nnie": {"gfpq_param_dict": {node name: [clip value of each quantized input]}}}, as MQBench's
// remove_fakequantize_and_collect_params_nnie: Resize becomes Upsample(X, scales, mode), zero
// Pads go, weights are clipped to [-data_max, data_max], activations give their data_max.
// Unlike MQBench main, the DequantizeLinear nodes go too (docs/compatibility.md), and grouped
// convolutions are recognised by their `group` attribute rather than by attribute position.

#include <cmath>

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

DeployOutput nnie(OnnxGraph g, const DeployOptions& options) {
  resize_to_upsample(g);
  RemoveOptions ro;
  ro.clip_weights = false;  // NNIE clips to +-data_max below
  ro.allow_nnie = true;
  const auto removed = remove_for(g, "NNIE", ro);
  std::map<std::string, double> clip_val;
  DeployOutput out;
  for (const auto& r : removed) {
    const double clip = r.fq.nnie ? r.fq.data_max : symmetric_clip(r.fq.q);
    if (clip == 0.0) {  // calibrated on all-zero data: the range is {0}
      out.notes.push_back("NNIE: fake quantizer '" + r.fq.name + "' has data_max 0 (it only saw "
                          "zeros in calibration): '" + r.tensor + "' quantizes to 0");
    }
    if (r.role == Role::kActivation) {
      clip_val[r.tensor] = clip;
    } else if (const auto* w = g.initializer(r.tensor)) {
      auto c = to_const(*w);
      for (auto& v : c.values) v = std::min(std::max(v, -clip), clip);
      g.set_initializer(make_tensor(r.tensor, w->data_type(), c.dims, c.values));
    }
  }
  static const std::set<std::string> skip = {"Flatten", "Relu", "PRelu", "Sigmoid", "Reshape", "Softmax",
                                             "CaffeSoftmax", "Clip", "GlobalAveragePool", "Mul"};
  JsonObject params;
  int interp = 0;
  for (const auto& n : g.graph().node()) {
    if (n.op_type() == "Conv" && int_attribute(n, "group", 1) != 1) continue;
    const bool upsample = n.op_type() == "Upsample" || n.op_type() == "DynamicUpsample";
    Json values = Json::array();
    for (int k = 0; k < (upsample ? std::min(1, n.input_size()) : n.input_size()); ++k) {
      auto it = clip_val.find(n.input(k));
      if (it != clip_val.end()) values.push_back(it->second);
    }
    if (skip.count(n.op_type()) || values.empty()) continue;
    params[n.name()] = values;
    if (upsample) params[n.name() + "_permute_" + std::to_string(interp++)] = values;
  }
  out.files.push_back(json_file(options.model_name + "_gfpq_param_dict.json",
                                Json{{"nnie", Json{{"gfpq_param_dict", params.json()}}}}));
  // Upsample is deprecated since opset 10, but NNIE's toolchain reads it (MQBench writes it).
  ModelCheckOptions check;
  check.deprecated_ops_allowed = {"Upsample"};
  out.files.push_back(onnx_file(options.model_name + "_deploy_model.onnx", g, check));
  return out;
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(nnie, "nnie", mqbench::deploy::translators::nnie);
