// resize_to_upsample: every Resize becomes Upsample(X, scales) with its mode, for NNIE's
// toolchain (MQBench's replace_resize_op_with_upsample).

#include "mqbench/deploy/fake_quant.h"


#include "mqbench/deploy/pass.h"

namespace mqbench {
namespace deploy {

bool resize_to_upsample(OnnxGraph& g) {
  const PassScope scope("resize_to_upsample", g);
  bool changed = false;
  for (auto& n : *g.graph().mutable_node()) {
    if (n.op_type() != "Resize") continue;
    changed = true;
    std::string scales;
    if (n.input_size() > 2 && !n.input(2).empty()) scales = n.input(2);
    else if (n.input_size() == 2) scales = n.input(1);  // opset 10: Resize(X, scales)
    ConstTensor c;
    if (scales.empty() || !g.constant(scales, &c) || c.values.empty()) {
      throw DeployError("Resize node '" + n.name() + "' has no constant scales (sizes-based "
                        "Resize cannot become Upsample)");
    }
    std::string mode = "nearest";
    if (const auto* a = find_attribute(n, "mode")) mode = a->s();
    const std::string x = n.input(0);
    n.clear_input();
    n.add_input(x);
    n.add_input(scales);
    n.clear_attribute();
    auto* a = n.add_attribute();
    a->set_name("mode");
    a->set_type(onnx::AttributeProto::STRING);
    a->set_s(mode);
    n.set_op_type("Upsample");
  }
  g.reindex();
  g.remove_nodes({});
  return changed;
}

MQBENCH_REGISTER_DEPLOY_PASS(resize_to_upsample, "resize_to_upsample",
                             "replaces every Resize by Upsample(X, scales) (NNIE; MQBench's "
                             "replace_resize_op_with_upsample)",
                             [](OnnxGraph& g) { return PassResult{resize_to_upsample(g), ""}; });

}  // namespace deploy
}  // namespace mqbench
