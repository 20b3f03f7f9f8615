// STPU (Sophgo): <name>_for_stpu.onnx and <name>_stpu_minmax.json, as MQBench's
// remove_fakequantize_and_collect_params_stpu: per-tensor ranges {"min": -127 s, "max": 127 s}
// for activations (by tensor) and weights ("<node>_weights"); a Conv followed by a Mul by a
// constant absorbs it; Concat ranges go to its inputs; biases get
// "<node>_bias": {"alpha": walpha * ialpha, "zero_point": 0} (alphas = range / 254); Sigmoid outputs
// are [-1, 1]; ReLU outputs give their range to their inputs; outputs of Conv / ConvTranspose /
// Gemm / Upsample get "emin" (the IEEE single exponent field of their bound, minus a margin).

#include <cmath>
#include <cstring>

#include "deploy/translators/common.h"

namespace mqbench {
namespace deploy {
namespace translators {
namespace {

int exponent_field(double v) {
  const float f = static_cast<float>(std::abs(v));
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return static_cast<int>((bits >> 23) & 0xff);
}

double vmax(const Json& e) { return std::max(std::abs(e["min"].get<double>()), std::abs(e["max"].get<double>())); }

Json range(double s) { return Json{{"min", -127.0 * s}, {"max", 127.0 * s}}; }

// Conv -> Mul(constant scalar): the constant goes into the weight and bias.
void absorb_mul(OnnxGraph& g, JsonObject& minmax) {
  std::set<int> dead;
  for (int i = 0; i < g.graph().node_size(); ++i) {
    const auto conv = g.graph().node(i);
    if (conv.op_type() != "Conv") continue;
    const auto cs = g.consumers(conv.output(0));
    if (cs.size() != 1 || g.is_graph_output(conv.output(0))) continue;
    const auto& mul = g.graph().node(cs[0].first);
    if (mul.op_type() != "Mul" || mul.input_size() != 2) continue;
    ConstTensor k;
    if (!g.constant(mul.input(1 - cs[0].second), &k) || k.numel() != 1) continue;
    // Only a factor that broadcasts to the Conv's output shape: a one-element constant of a
    // higher rank than the output ([1,1,1,1,1] on N x C x H x W) makes the Mul's output rank
    // larger, and absorbing it would change the rank every later node sees (a Resize's scales
    // then no longer match its input; found by a fuzz campaign: onnxruntime refused the file).
    const auto* w = conv.input_size() > 1 ? g.initializer(conv.input(1)) : nullptr;
    if (!w || k.dims.size() > static_cast<size_t>(w->dims_size())) continue;
    const double f = k.values[0];
    for (int slot = 1; slot < conv.input_size(); ++slot) {
      const auto* t = g.initializer(conv.input(slot));
      if (!t) continue;
      auto c = to_const(*t);
      for (auto& v : c.values) v *= f;
      g.set_initializer(make_tensor(t->name(), t->data_type(), c.dims, c.values));
    }
    const std::string key = conv.name() + "_weights";
    if (minmax.contains(key)) {
      const double a = minmax[key]["min"].get<double>() * f, b = minmax[key]["max"].get<double>() * f;
      minmax[key] = Json{{"min", std::min(a, b)}, {"max", std::max(a, b)}};
    }
    const std::string out = mul.output(0);
    g.graph().mutable_node(i)->set_output(0, out);
    dead.insert(cs[0].first);
  }
  if (!dead.empty()) g.remove_nodes(dead);
}

DeployOutput stpu(OnnxGraph g, const DeployOptions& options) {
  RemoveOptions ro;
  ro.per_channel_error = "STPU deploys per-tensor quantization only";
  const auto removed = remove_for(g, "STPU", ro);
  JsonObject minmax;
  for (const auto& r : removed) {
    if (r.role == Role::kWeight) minmax[r.consumer + "_weights"] = range(r.fq.q.scale[0]);
    else minmax[r.tensor] = range(r.fq.q.scale[0]);
  }
  absorb_mul(g, minmax);
  for (const auto& n : g.graph().node()) {
    if (n.op_type() == "Concat" && minmax.contains(n.output(0))) {
      for (const auto& in : n.input()) minmax[in] = minmax[n.output(0)];
    }
  }
  for (const auto& n : g.graph().node()) {
    if ((n.op_type() == "Conv" || n.op_type() == "Gemm") && n.input_size() > 2 && !n.input(2).empty()) {
      const std::string w = n.name() + "_weights";
      if (!minmax.contains(w) || !minmax.contains(n.input(0))) continue;
      const auto& we = minmax[w];
      const auto& ie = minmax[n.input(0)];
      const double walpha = (we["max"].get<double>() - we["min"].get<double>()) / 254.0;
      const double ialpha = (ie["max"].get<double>() - ie["min"].get<double>()) / 254.0;
      minmax[n.name() + "_bias"] = Json{{"alpha", walpha * ialpha}, {"zero_point", 0}};
    }
    if (n.op_type() == "Sigmoid") minmax[n.output(0)] = Json{{"min", -1}, {"max", 1}};
  }
  propagate_ranges(g, minmax, options);
  for (const auto& n : g.graph().node()) {  // merge_relu_layer
    if (n.op_type() == "Relu" && minmax.contains(n.output(0))) minmax[n.input(0)] = minmax[n.output(0)];
  }
  for (const auto& n : g.graph().node()) {
    if (n.output_size() == 0) continue;
    const std::string& out = n.output(0);
    if (!minmax.contains(out) || !minmax[out].contains("max")) continue;
    if (n.op_type() == "Upsample" || n.op_type() == "DynamicUpsample") {
      minmax[out]["emin"] = exponent_field(vmax(minmax[out])) - 20;
    } else if (n.op_type() == "Conv" || n.op_type() == "ConvTranspose") {
      const auto* w = g.initializer(n.input(1));
      const std::string wkey = n.name() + "_weights";
      if (!w || w->dims_size() < 3 || !minmax.contains(wkey) || !minmax.contains(n.input(0))) continue;
      double fan_in = 1;
      for (int d = 1; d < w->dims_size(); ++d) fan_in *= static_cast<double>(w->dims(d));
      const double bound = std::max(std::sqrt(fan_in) * vmax(minmax[n.input(0)]) * vmax(minmax[wkey]),
                                    vmax(minmax[out]));
      minmax[out]["emin"] = exponent_field(bound) - 10;
    } else if (n.op_type() == "Gemm") {
      minmax[out]["emin"] = 128;
    }
  }
  DeployOutput out;
  out.files.push_back(json_file(options.model_name + "_stpu_minmax.json", minmax.json()));
  out.files.push_back(onnx_file(options.model_name + "_for_stpu.onnx", g));
  return out;
}

}  // namespace
}  // namespace translators
}  // namespace deploy
}  // namespace mqbench

MQBENCH_REGISTER_DEPLOY_TRANSLATOR(stpu, "stpu", mqbench::deploy::translators::stpu);
