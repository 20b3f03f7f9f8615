// post_process_clip_ranges: the range of each Flatten / Resize / Reshape input that has none,
// found downstream (MQBench's post_process_clip_ranges). An analysis: the translators copy the
// ranges into their tables.

#include "mqbench/deploy/fake_quant.h"

#include <string>
#include <unordered_map>

#include "mqbench/deploy/pass.h"

namespace mqbench {
namespace deploy {
namespace {

bool is_shape_op(const std::string& op) { return op == "Flatten" || op == "Resize" || op == "Reshape"; }

}  // namespace

std::vector<std::pair<std::string, std::string>> post_process_clip_ranges(
    const OnnxGraph& g, std::set<std::string> has) {
  const PassScope scope("post_process_clip_ranges", g);
  // source(t): t when it has a range; else, when t's first consumer is a shape op, the source of
  // that node's output; else none (""). Walked iteratively and memoized, so a chain of n shape
  // ops costs O(n) in all, not O(n) per node, and no recursion grows with the graph. A node's
  // walk only goes downstream, and the nodes are in topological order: the inputs added to `has`
  // below lie upstream of every later walk, so the memo stays exact.
  std::unordered_map<std::string, std::string> memo;
  const size_t max_steps = static_cast<size_t>(g.graph().node_size()) + 1;  // bounds a cycle
  auto source = [&](const std::string& start) {
    std::vector<std::string> path;
    std::string t = start, found;
    while (path.size() <= max_steps) {
      if (has.count(t)) { found = t; break; }
      const auto m = memo.find(t);
      if (m != memo.end()) { found = m->second; break; }
      path.push_back(t);
      const auto cs = g.consumers(t);
      if (cs.empty()) break;
      const auto& n = g.graph().node(cs[0].first);
      if (!is_shape_op(n.op_type()) || n.output_size() == 0) break;
      t = n.output(0);
    }
    for (const auto& p : path) memo[p] = found;
    return found;
  };
  std::vector<std::pair<std::string, std::string>> copies;
  for (const auto& node : g.graph().node()) {
    if (!is_shape_op(node.op_type()) || node.input_size() == 0 || node.output_size() == 0) continue;
    const std::string& in = node.input(0);
    if (has.count(in)) continue;
    const std::string from = source(node.output(0));
    if (!from.empty()) {
      copies.emplace_back(in, from);
      has.insert(in);
    }
  }
  return copies;
}

// Alone, the ranges are those of the fake-quantize groups' inputs; the graph is left as it is.
MQBENCH_REGISTER_DEPLOY_PASS(post_process_clip_ranges, "post_process_clip_ranges",
                             "finds, for each Flatten / Resize / Reshape input without a range, the "
                             "range to copy from downstream (MQBench's post_process_clip_ranges; "
                             "an analysis: the graph is not changed)",
                             [](OnnxGraph& g) {
                               std::set<std::string> has;
                               for (const auto& fq : find_fake_quants(g)) has.insert(fq.input);
                               const auto copies = post_process_clip_ranges(g, std::move(has));
                               return PassResult{false, std::to_string(copies.size()) +
                                                            " ranges to copy"};
                             });

}  // namespace deploy
}  // namespace mqbench
