// TensorrtNLPQuantizer (Tensorrt_NLP): transformer rules. Inputs of linear layers, matmuls and
// adds; nodes with constant arguments are skipped; an add of an embedding output (position +
// token embeddings) stays unquantized; add(mul) and add(truediv) are implicit merges.

#include <algorithm>

#include "mqbench/quantizer/model_quantizer.h"

namespace mqbench {
namespace quantizer {
namespace {

QuantizerRules tensorrt_nlp() {
  QuantizerRules r;
  r.name = "TensorrtNLPQuantizer";
  r.function_types = {"operator.add", "torch.matmul"};
  r.module_types = {"nn.qat.Linear"};
  r.implicit_merges = {{"operator.add", "operator.mul"}, {"operator.add", "operator.truediv"}};
  r.skip_non_node_args = true;
  r.plan = [](const graph::Graph& g, const QuantizerRules& rules, const QuantizerOptions& o) {
    detail::Matcher m(g, rules, o);
    std::vector<std::string> log;
    // The graph without the adds that sum an embedding output (position + token embeddings).
    std::vector<std::string> skip;
    for (int64_t i = 0; i < g.size(); ++i) {
      const auto& n = g.node(i);
      if (!m.matches(i, "operator.add")) continue;
      const bool embedding = std::any_of(n.inputs.begin(), n.inputs.end(), [&](int64_t in) {
        return g.is_instance(in, "nn.Embedding");
      });
      if (embedding) skip.push_back(n.name);
    }
    QuantizerOptions opts = o;
    opts.exclude_node_name.insert(opts.exclude_node_name.end(), skip.begin(), skip.end());
    detail::Matcher m2(g, rules, opts);
    auto nodes = detail::input_act_quants(m2, &log);
    return detail::to_plan(g, nodes, std::move(log));
  };
  return r;
}

}  // namespace
}  // namespace quantizer
}  // namespace mqbench

MQBENCH_REGISTER_QUANTIZER_RULES(tensorrt_nlp, mqbench::quantizer::tensorrt_nlp());
