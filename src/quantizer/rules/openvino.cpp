// OPENVINOQuantizer (OPENVINO): a quantizer goes on every node that feeds a "qualified"
// consumer (convolutions, linear layers, pools, upsampling, add, mean, sum, flatten, ...) and on
// every model input, except nodes feeding the output and producer -> consumer pairs through
// which OpenVINO propagates the quantization (max pool or flatten into conv / matmul).
// Weights use 7 bits ([-64, 63]; academic mode [-63, 63]; asymmetric [0, 127]) to avoid
// accumulator overflow in AVX2 / AVX-512 int8 kernels. With symmetric activations, the outputs
// of ReLUs are unsigned ([0, 2^b - 1]); a pooling-like node is unsigned when all the nearest
// quantizers upstream of it are.

#include <algorithm>

#include "mqbench/quantizer/model_quantizer.h"

namespace mqbench {
namespace quantizer {
namespace {

const std::vector<std::string>& functions() {
  static const std::vector<std::string> f{"operator.add", "F.adaptive_avg_pool2d",
                                          "F.max_pool2d", "F.avg_pool2d", "torch.flatten",
                                          "mean", "sum", "F.interpolate"};
  return f;
}

QuantizerRules openvino() {
  QuantizerRules r;
  r.name = "OPENVINOQuantizer";
  r.function_types = functions();
  r.module_types = {"nn.intrinsic.qat.ConvBnReLU2d", "nn.intrinsic.qat.ConvBn2d",
                    "nn.intrinsic.qat.ConvReLU2d", "nn.intrinsic.qat.ConvBnReLU1d",
                    "nn.intrinsic.qat.ConvBn1d", "nn.qat.Conv2d", "nn.qat.Linear",
                    "nn.AvgPool2d", "nn.AdaptiveAvgPool2d", "nn.MaxPool2d", "nn.Upsample"};
  r.academic_module_types = {"nn.Conv2d", "nn.Linear", "nn.AvgPool2d", "nn.AdaptiveAvgPool2d",
                             "nn.MaxPool2d", "nn.Upsample"};
  r.plan = [](const graph::Graph& g, const QuantizerRules& rules, const QuantizerOptions& o) {
    QuantizerRules local = rules;
    if (o.academic_mode) local.module_types = rules.academic_module_types;
    detail::Matcher m(g, local, o);
    std::vector<std::string> pass{"operator.getitem", "getattr"};
    if (!o.academic_mode) pass.push_back("torch.cat");
    static const std::vector<std::string> producers{"F.max_pool2d", "torch.flatten",
                                                    "nn.MaxPool2d", "nn.Flatten"};
    static const std::vector<std::string> consumers{
        "F.conv1d", "F.conv2d", "F.conv3d", "torch.matmul", "nn.intrinsic.qat.ConvBnReLU2d",
        "nn.intrinsic.qat.ConvBn2d", "nn.intrinsic.qat.ConvReLU2d", "nn.qat.Conv2d",
        "nn.qat.Linear"};
    auto is_consumer = [&](int64_t u) {
      if (m.matches_any(u, consumers)) return true;
      for (const auto& c : consumers) {
        if (g.is_instance(u, c)) return true;
      }
      return false;
    };
    std::vector<std::string> log;
    std::vector<int64_t> nodes;
    for (int64_t i = 0; i < g.size(); ++i) {
      const auto& n = g.node(i);
      if (m.excluded(i)) {
        log.push_back("Exclude skip: " + n.name);
        continue;
      }
      if (m.matches_any(i, pass) || n.op == graph::OpKind::kOutput) continue;
      if (n.op == graph::OpKind::kPlaceholder) {
        nodes.push_back(i);
        continue;
      }
      const bool feeds_output = std::any_of(n.users.begin(), n.users.end(), [&](int64_t u) {
        return g.node(u).op == graph::OpKind::kOutput;
      });
      if (feeds_output) continue;
      const bool propagated = m.matches_any(i, producers) &&
                              std::any_of(n.users.begin(), n.users.end(), is_consumer);
      if (propagated) continue;
      const bool qualified = std::any_of(n.users.begin(), n.users.end(), [&](int64_t u) {
        return m.quant_input(u) || g.node(u).op == graph::OpKind::kPlaceholder;
      });
      if (qualified) nodes.push_back(i);
    }
    auto plan = detail::to_plan(g, nodes, std::move(log));
    if (o.weight_symmetric) {
      plan.weight_range = o.academic_mode ? std::make_pair<int64_t, int64_t>(-63, 63)
                                          : std::make_pair<int64_t, int64_t>(-64, 63);
    } else {
      plan.weight_range = std::make_pair<int64_t, int64_t>(0, 127);
    }
    if (!o.activation_symmetric) return plan;
    // Unsigned activations: ReLU outputs, then pooling-like nodes whose nearest upstream
    // quantizers are all unsigned (breadth-first over inputs, level by level).
    static const std::vector<std::string> real_unsigned{
        "nn.ReLU", "F.relu", "nn.intrinsic.qat.ConvBnReLU2d", "nn.intrinsic.qat.ConvReLU2d",
        "nn.intrinsic.qat.ConvBnReLU1d"};
    static const std::vector<std::string> maybe_modules{"nn.Upsample", "nn.MaxPool2d",
                                                        "nn.AvgPool2d", "nn.AdaptiveAvgPool2d"};
    const int64_t umax = (int64_t(1) << o.activation_bits) - 1;
    std::vector<int> state(static_cast<size_t>(g.size()), 0);  // 0 none, 1 signed, 2 unsigned
    for (auto& q : plan.act_quants) {
      const int64_t i = g.find(q.node);
      // Fused ReLU modules match by isinstance (mqbench's own ConvBnReLU2d subclasses torch's).
      bool unsigned_out = m.matches_any(i, real_unsigned) ||
                          std::any_of(real_unsigned.begin(), real_unsigned.end(),
                                      [&](const std::string& t) { return g.is_instance(i, t); });
      if (!unsigned_out && (m.matches_any(i, functions()) || m.matches_any(i, maybe_modules))) {
        std::vector<int64_t> level = g.node(i).inputs;
        std::vector<bool> seen(static_cast<size_t>(g.size()), false);
        while (!level.empty()) {
          std::vector<int64_t> found, next;
          for (auto v : level) {
            if (seen[static_cast<size_t>(v)]) continue;
            seen[static_cast<size_t>(v)] = true;
            if (state[static_cast<size_t>(v)] != 0) found.push_back(v);
            for (auto in : g.node(v).inputs) next.push_back(in);
          }
          if (!found.empty()) {
            unsigned_out = std::all_of(found.begin(), found.end(), [&](int64_t v) {
              return state[static_cast<size_t>(v)] == 2;
            });
            break;
          }
          level = std::move(next);
        }
      }
      state[static_cast<size_t>(i)] = unsigned_out ? 2 : 1;
      if (unsigned_out) {
        q.quant_min = 0;
        q.quant_max = umax;
      }
    }
    return plan;
  };
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(openvino, mqbench::quantizer::openvino());
