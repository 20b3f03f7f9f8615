// OPENVINO: <name>_deploy_model.onnx in which every fake quantizer is one OpenVINO
// FakeQuantize node (domain org.openvinotoolkit, named as the quantizer) with inputs
// [x, input_min_<x>, input_max_<x>, output_min_<x>, output_max_<x>] and levels = qmax - qmin + 1,
// as MQBench's replace_fakequantize_and_collect_params_openvino writes it:
//   s = |s|, z = clip(round(z), qmin, qmax), high = (qmax - z) s, low = high - s (qmax - qmin);
// a 128-level (7-bit) weight range is written as levels 256 with qmin * 2 and qmax * 2 + 1,
// over the weight clipped to the 7-bit range (what training computed).
// Per-channel ranges are shaped to broadcast along the channel axis of the weight.

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

DeployOutput openvino(OnnxGraph g, const DeployOptions& options) {
  remove_zero_pads(g);
  const auto fqs = find_fake_quants(g);
  std::set<int> dead;
  std::vector<onnx::NodeProto> added;
  std::set<std::string> made;
  for (const auto& fq : fqs) {
    if (fq.nnie) throw DeployError("fake quantizer '" + fq.name + "' is NNIE's; OPENVINO cannot deploy it");
    refuse_format(fq, "OPENVINO");
    int64_t qmin = fq.q.quant_min, qmax = fq.q.quant_max;
    int64_t levels = qmax - qmin + 1;
    if (levels == 128) {
      // The 7-bit weights OPENVINO simulates ([-64, 63]) go out in the int8 layout OpenVINO's
      // low-precision transforms expect (256 levels over [-128 s, 127 s]), as MQBench writes
      // them; the weight itself is clipped to the simulated [-64 s, 63 s] first, so weights that
      // training clipped stay clipped in the deployed model (OpenVINO rounds the rest to the
      // same levels of s).
      clip_weight(g, fq.input, fq.q);
      levels = 256;
      qmax = qmax * 2 + 1;
      qmin = qmin * 2;
    }
    const size_t n = fq.q.scale.size();
    std::vector<double> low(n), high(n);
    for (size_t c = 0; c < n; ++c) {
      const double s = std::abs(fq.q.scale[c]);
      const int64_t z = std::min(std::max(fq.q.zero_point[c], qmin), qmax);
      high[c] = static_cast<double>(qmax - z) * s;
      low[c] = high[c] - s * static_cast<double>(qmax - qmin);
    }
    std::vector<int64_t> dims;
    if (fq.q.per_channel()) {
      const auto* w = g.initializer(fq.input);
      const int rank = w ? w->dims_size() : static_cast<int>(fq.q.axis) + 1;
      dims.assign(rank, 1);
      dims[fq.q.axis] = static_cast<int64_t>(n);
    } else {
      dims = {};
    }
    const char* prefixes[] = {"input_min_", "input_max_", "output_min_", "output_max_"};
    onnx::NodeProto node;
    node.set_op_type("FakeQuantize");
    node.set_domain("org.openvinotoolkit");
    node.set_name(fq.name);
    node.add_input(fq.input);
    for (int k = 0; k < 4; ++k) {
      const std::string name = prefixes[k] + fq.input;
      node.add_input(name);
      if (made.insert(name).second) {
        g.set_initializer(make_tensor(name, onnx::TensorProto::FLOAT, dims, k % 2 == 0 ? low : high));
      }
    }
    node.add_output(fq.output);
    auto* a = node.add_attribute();
    a->set_name("levels");
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(levels);
    added.push_back(node);
    dead.insert(fq.nodes.begin(), fq.nodes.end());
  }
  g.replace_nodes(dead, std::move(added));  // old nodes out, new ones in, sorted
  g.drop_opset("mqbench");
  g.set_opset("org.openvinotoolkit", 1);
  return DeployOutput{{onnx_file(options.model_name + "_deploy_model.onnx", g)}, {}};
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(openvino, "openvino", mqbench::deploy::translators::openvino);
