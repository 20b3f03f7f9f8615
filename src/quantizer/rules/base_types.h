#pragma once
// Type lists shared by several rule sets (MQBench's ModelQuantizer class attributes).

#include <string>
#include <vector>

namespace mqbench {
namespace quantizer {
namespace rules {

/// ModelQuantizer.function_type_to_quant_input.
inline std::vector<std::string> base_functions() {
  return {"operator.add", "operator.mul", "F.adaptive_avg_pool2d", "F.interpolate"};
}

/// ModelQuantizer.module_type_to_quant_input.
inline std::vector<std::string> base_modules() {
  return {"nn.intrinsic.qat.ConvBnReLU2d", "nn.intrinsic.qat.ConvBn2d", "nn.qat.Conv2d",
          "nn.ConvTranspose2d", "nn.qat.Linear", "nn.MaxPool2d", "nn.AvgPool2d",
          "nn.AdaptiveAvgPool2d", "nn.BatchNorm2d", "nn.PReLU", "nn.Upsample"};
}

}  // namespace rules
}  // namespace quantizer
}  // namespace mqbench
