// find_float_layers: the layers with a quantized weight whose input has no activation quantizer,
// which TensorRT runs in float. An analysis: the Tensorrt translators refuse the deploy that
// has any (or, with DeployOptions::allow_float_layers, name them in a note).

#include <map>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "mqbench/deploy/fake_quant.h"
#include "mqbench/deploy/pass.h"

namespace mqbench {
namespace deploy {
namespace {

// Note [Float layers]
// TensorRT runs a convolution or a matrix product in INT8 only when both its weight and its data
// input are quantized: in a Q/DQ model, a DequantizeLinear on each; in the float model with
// dynamic ranges (blob_range, the calibration cache), a range on the input tensor. A layer whose
// weight has a quantizer but whose input has none is built in float (FP32, or FP16 where
// allowed), with no error and at most a line in the builder's verbose log; the model the user
// trained with a quantized weight then runs with a float one in its place (MQBench #95, #207,
// #22 are such reports). The Tensorrt scheme places a quantizer on the input of every
// conv / linear layer, so such a layer means the input quantizer was excluded or removed.
//
// The input counts as quantized when an activation quantizer's output reaches it through ops
// that move data without changing values, across which TensorRT moves Q/DQ (and which the
// exporters put between a quantizer and its layer: a Flatten or Reshape before a Gemm, a Pad
// of a reflect-padded convolution): Identity, Flatten, Reshape, Transpose, Squeeze, Unsqueeze,
// MaxPool (max commutes with a monotone per-tensor quantization) and Pad (zero padding is on
// the grid; reflect and edge padding copy values). Not Concat: its inputs are quantized with
// scales of their own, so the concatenation is no one quantized tensor (TensorRT requantizes it,
// or runs it in float); the layer reading it needs a quantizer of its own, which the Tensorrt
// scheme places. A constant input (an initializer, a Constant) counts as quantized: TensorRT
// folds such a layer at build time.
bool moves_quantized_data(const std::string& op) {
  static const std::set<std::string> ops = {"Identity",  "Flatten",   "Reshape", "Transpose",
                                            "Squeeze",   "Unsqueeze", "MaxPool", "Pad"};
  return ops.count(op) > 0;
}

bool is_layer(const std::string& op) {
  return op == "Conv" || op == "ConvTranspose" || op == "Gemm" || op == "MatMul";
}

// Whether `t` is a constant: an initializer or a Constant node's output, through the Identity /
// Cast / shape ops torch leaves on parameters (bounded: a cycle is a malformed model, refused
// elsewhere).
bool is_constant(const OnnxGraph& g, std::string t) {
  for (int depth = 0; depth < OnnxGraph::kMaxFoldDepth; ++depth) {
    if (g.initializer(t) != nullptr) return true;
    const int p = g.producer(t);
    if (p < 0) return false;
    const auto& n = g.graph().node(p);
    if (n.op_type() == "Constant") return true;
    if (n.input_size() == 0 || !(n.op_type() == "Cast" || moves_quantized_data(n.op_type()))) {
      return false;
    }
    t = n.input(0);
  }
  return false;
}

}  // namespace

std::vector<FloatLayer> find_float_layers(const OnnxGraph& g, bool convolutions) {
  const PassScope scope("find_float_layers", g);
  const auto fqs = find_fake_quants(g);
  // The layers whose weight a quantizer quantizes: {node index: (data input slot, weight)}.
  std::map<int, std::pair<int, std::string>> weighted;
  std::set<std::string> quantized;  // the outputs of the other (activation) quantizers
  for (const auto& fq : fqs) {
    const bool constant = is_constant(g, fq.input);
    bool weight = false;
    for (const auto& c : g.consumers(fq.output)) {
      const auto& n = g.graph().node(c.first);
      int layer = -1, slot = c.second;
      if ((n.op_type() == "Conv" || n.op_type() == "ConvTranspose" || n.op_type() == "Gemm") &&
          c.second == 1) {
        layer = c.first;
      } else if (n.op_type() == "MatMul" && constant && c.second < 2) {
        layer = c.first;
      } else if (n.op_type() == "Transpose" && constant && n.output_size() == 1) {
        // a Linear on a 3-d input: weight -> quantizer -> Transpose -> MatMul
        for (const auto& m : g.consumers(n.output(0))) {
          if (g.graph().node(m.first).op_type() == "MatMul" && m.second < 2) {
            weight = true;
            if (!fq.nnie && !fq.q.is_format()) {
              weighted.emplace(m.first, std::make_pair(m.second, fq.input));
            }
          }
        }
        continue;
      }
      if (layer < 0) continue;
      weight = true;
      // NNIE's quantizer is refused by the Tensorrt translators anyway; the formats are left out
      // (find_float_layers' comment in fake_quant.h).
      if (!fq.nnie && !fq.q.is_format()) weighted.emplace(layer, std::make_pair(slot, fq.input));
    }
    if (!weight) quantized.insert(fq.output);
  }
  // quantized_at(t): whether a quantizer's output (or a constant) reaches t through the ops of
  // Note [Float layers]. Walked iteratively and memoized: a chain of n such ops costs O(n) in
  // all, however many layers read it.
  std::unordered_map<std::string, bool> memo;
  const size_t max_steps = static_cast<size_t>(g.graph().node_size()) + 1;  // bounds a cycle
  auto quantized_at = [&](const std::string& start) {
    std::vector<std::string> path;
    std::string t = start;
    bool found = false;
    while (path.size() <= max_steps) {
      if (quantized.count(t)) { found = true; break; }
      const auto m = memo.find(t);
      if (m != memo.end()) { found = m->second; break; }
      path.push_back(t);
      if (g.initializer(t) != nullptr) { found = true; break; }
      const int p = g.producer(t);
      if (p < 0) break;  // a graph input
      const auto& n = g.graph().node(p);
      if (n.op_type() == "Constant") { found = true; break; }
      if (!moves_quantized_data(n.op_type()) || n.input_size() == 0) break;
      t = n.input(0);
    }
    for (const auto& p : path) memo[p] = found;
    return found;
  };
  std::vector<FloatLayer> out;
  for (const auto& [node, weight] : weighted) {  // node order
    const auto& n = g.graph().node(node);
    if (!is_layer(n.op_type())) continue;
    if (!convolutions && (n.op_type() == "Conv" || n.op_type() == "ConvTranspose")) continue;
    const int data = n.op_type() == "MatMul" ? 1 - weight.first : 0;
    if (data >= n.input_size() || n.input(data).empty()) continue;
    if (!quantized_at(n.input(data))) out.push_back({n.name(), n.op_type(), weight.second});
  }
  return out;
}

MQBENCH_REGISTER_DEPLOY_PASS(find_float_layers, "find_float_layers",
                             "finds the Conv / ConvTranspose / Gemm / MatMul layers whose weight "
                             "is quantized but whose input has no activation quantizer, which "
                             "TensorRT runs in float (an analysis: the graph is not changed)",
                             [](OnnxGraph& g) {
                               const auto layers = find_float_layers(g);
                               return PassResult{false, std::to_string(layers.size()) +
                                                            " float layers"};
                             });

}  // namespace deploy
}  // namespace mqbench
