// remove_zero_pads: Pad nodes whose pads are all zero go (MQBench's remove_fake_pad_op).

#include "mqbench/deploy/fake_quant.h"

#include <algorithm>

#include "mqbench/deploy/pass.h"

namespace mqbench {
namespace deploy {

bool remove_zero_pads(OnnxGraph& g) {
  const PassScope scope("remove_zero_pads", g);
  std::set<int> dead;
  std::vector<std::pair<std::string, std::string>> renamed;
  for (int i = 0; i < g.graph().node_size(); ++i) {
    const auto& n = g.graph().node(i);
    if (n.op_type() != "Pad") continue;
    std::vector<double> pads;
    if (const auto* a = find_attribute(n, "pads")) {
      pads.assign(a->ints().begin(), a->ints().end());
    } else {
      ConstTensor c;
      if (n.input_size() < 2 || !g.constant(n.input(1), &c)) continue;
      pads = c.values;
    }
    if (!std::all_of(pads.begin(), pads.end(), [](double v) { return v == 0; })) continue;
    g.replace_uses(n.output(0), n.input(0));
    if (g.is_graph_output(n.output(0))) renamed.emplace_back(n.output(0), n.input(0));
    dead.insert(i);
  }
  for (const auto& kv : renamed) g.rename_output(kv.first, kv.second);
  if (!dead.empty()) g.remove_nodes(dead);
  return !dead.empty();
}

MQBENCH_REGISTER_DEPLOY_PASS(remove_zero_pads, "remove_zero_pads",
                             "removes Pad nodes whose pads are all zero (MQBench's remove_fake_pad_op)",
                             [](OnnxGraph& g) { return PassResult{remove_zero_pads(g), ""}; });

}  // namespace deploy
}  // namespace mqbench
