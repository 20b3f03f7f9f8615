// ONNXQNNQuantizer (ONNX_QNN: TVM QNN / ONNX QLinear ops): quantizes the inputs and the outputs
// of convolutions, linear layers, average pools and adds (after a following ReLU when there is
// one). Linear layers are not swapped to QAT modules: ONNX has no QLinear fully connected op.

#include "mqbench/quantizer/model_quantizer.h"

namespace mqbench {
namespace quantizer {
namespace {

QuantizerRules onnx_qnn() {
  QuantizerRules r;
  r.name = "ONNXQNNQuantizer";
  r.function_types = {"operator.add", "F.adaptive_avg_pool2d"};
  r.append_additional_function_types = false;
  r.module_types = {"nn.intrinsic.qat.ConvBnReLU2d", "nn.intrinsic.qat.ConvBn2d",
                    "nn.qat.Conv2d", "nn.qat.Linear", "mqbench.nn.intrinsic.qat.LinearBn1d",
                    "nn.AvgPool2d", "nn.AdaptiveAvgPool2d"};
  r.implicit_merges = {{"nn.ReLU", "operator.add"}};
  r.qat_exclude_types = {"nn.Linear", "nn.intrinsic.LinearReLU"};
  r.plan = [](const graph::Graph& g, const QuantizerRules& rules, const QuantizerOptions& o) {
    static const std::vector<std::string> relus{"nn.ReLU", "nn.ReLU6", "F.relu", "F.relu6"};
    detail::Matcher m(g, rules, o);
    std::vector<std::string> log;
    auto nodes = detail::input_act_quants(m, &log);
    for (int64_t i = 0; i < g.size(); ++i) {
      if (m.excluded(i) || !m.quant_input(i)) continue;
      for (auto u : g.node(i).users) nodes.push_back(m.matches_any(u, relus) ? u : i);
    }
    return detail::to_plan(g, nodes, std::move(log));
  };
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(onnx_qnn, mqbench::quantizer::onnx_qnn());
