// VitisQuantizer (Vitis DPU): quantizes the *outputs* of convolutions, linear layers, pools,
// BatchNorm, ReLU, PReLU, Upsample and of add / mul / cat / pooling / relu / conv / linear /
// interpolate calls; every activation quantizer is a 'tensor' TQT quantizer.

#include "mqbench/quantizer/model_quantizer.h"

namespace mqbench {
namespace quantizer {
namespace {

QuantizerRules vitis() {
  QuantizerRules r;
  r.name = "VitisQuantizer";
  r.function_types = {"operator.add", "operator.mul", "torch.cat", "F.adaptive_avg_pool2d",
                      "F.avg_pool2d", "F.relu", "F.conv2d", "F.linear", "F.interpolate"};
  r.module_types = {"nn.intrinsic.qat.ConvBnReLU2d", "nn.intrinsic.qat.ConvBn2d",
                    "nn.qat.Conv2d", "mqbench.nn.intrinsic.qat.ConvBnReLU2d",
                    "mqbench.nn.intrinsic.qat.ConvBn2d", "mqbench.nn.intrinsic.qat.ConvReLU2d",
                    "nn.ConvTranspose2d", "nn.qat.Linear", "nn.AvgPool2d",
                    "nn.AdaptiveAvgPool2d", "nn.BatchNorm2d", "nn.ReLU", "nn.PReLU",
                    "nn.Upsample"};
  r.plan = [](const graph::Graph& g, const QuantizerRules& rules, const QuantizerOptions& o) {
    detail::Matcher m(g, rules, o);
    std::vector<std::string> log;
    std::vector<int64_t> nodes;
    for (int64_t i = 0; i < g.size(); ++i) {
      if (m.excluded(i)) {
        log.push_back("Exclude skip: " + g.node(i).name);
        continue;
      }
      if (m.quant_input(i)) nodes.push_back(i);
    }
    auto plan = detail::to_plan(g, nodes, std::move(log));
    for (auto& q : plan.act_quants) q.quant_type = "tensor";
    return plan;
  };
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(vitis, mqbench::quantizer::vitis());
