// remove_fake_quant: every fake-quantize group out, its readers rewired to the float tensor,
// weights clipped to their quantization range (mqbench/deploy/fake_quant.h).

#include "mqbench/deploy/fake_quant.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "mqbench/deploy/pass.h"

namespace mqbench {
namespace deploy {
namespace {

// Fast path: a float32 initializer with raw data is clipped in place.
bool clip_raw_float(onnx::TensorProto* w, const QParams& q) {
  if (w->data_type() != onnx::TensorProto::FLOAT || !w->has_raw_data()) return false;
  std::string* raw = w->mutable_raw_data();
  const int64_t numel = static_cast<int64_t>(raw->size() / sizeof(float));
  int64_t outer = 1, channels = 1, inner = numel;
  if (q.per_channel()) {
    const int axis = static_cast<int>(q.axis);
    outer = 1;
    for (int d = 0; d < axis; ++d) outer *= w->dims(d);
    channels = w->dims(axis);
    inner = channels * outer == 0 ? 0 : numel / (channels * outer);
  }
  float* p = reinterpret_cast<float*>(&(*raw)[0]);  // std::string storage is suitably aligned
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t ch = 0; ch < channels; ++ch) {
      const size_t c = q.per_channel() ? static_cast<size_t>(ch) : 0;
      // float bounds: a float between a double bound and its nearest float cannot exist
      const float lo = static_cast<float>(q.min_value(c)), hi = static_cast<float>(q.max_value(c));
      float* v = p + (o * channels + ch) * inner;
      for (int64_t i = 0; i < inner; ++i) v[i] = std::min(std::max(v[i], lo), hi);
    }
  }
  return true;
}

}  // namespace

void clip_weight(OnnxGraph& g, const std::string& name, const QParams& q) {
  const auto* w = g.initializer(name);
  if (!w) return;  // computed weights (e.g. DoReFa's tanh chain) stay as the graph computes them
  // A quantizer's axis and scales are checked against its own input when that is an initializer
  // (fake_quant.cpp: check_channels); one that reads another quantizer's output clips the weight
  // behind the chain, checked here.
  if (q.per_channel() &&
      (q.axis < 0 || q.axis >= w->dims_size() ||
       w->dims(static_cast<int>(q.axis)) != static_cast<int64_t>(q.scale.size()))) {
    throw DeployError("a per-channel quantizer (axis " + std::to_string(q.axis) + ", " +
                      std::to_string(q.scale.size()) + " scales) does not fit weight '" + name +
                      "' (rank " + std::to_string(w->dims_size()) + ") that it clips");
  }
  if (clip_raw_float(g.mutable_initializer(name), q)) return;
  auto c = to_const(*w);
  int64_t outer = 1, channels = 1, inner = 1;
  if (q.per_channel()) {
    const auto axis = static_cast<size_t>(q.axis);
    for (size_t d = 0; d < c.dims.size(); ++d) {
      if (d < axis) outer *= c.dims[d];
      else if (d == axis) channels = c.dims[d];
      else inner *= c.dims[d];
    }
  } else {
    inner = c.numel();
  }
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t ch = 0; ch < channels; ++ch) {
      const double lo = q.min_value(q.per_channel() ? ch : 0), hi = q.max_value(q.per_channel() ? ch : 0);
      double* p = c.values.data() + (o * channels + ch) * inner;
      for (int64_t i = 0; i < inner; ++i) p[i] = std::min(std::max(p[i], lo), hi);
    }
  }
  g.set_initializer(make_tensor(name, w->data_type(), c.dims, c.values));
}

std::vector<Removed> remove_fake_quant(OnnxGraph& g, const RemoveOptions& options) {
  const PassScope scope("remove_fake_quant", g);
  const auto fqs = find_fake_quants(g);
  std::vector<Removed> removed;
  std::set<int> dead;
  std::map<std::string, std::string> replaced;  // fake-quantized tensor -> its float source
  auto resolve = [&](std::string t) {
    for (auto it = replaced.find(t); it != replaced.end(); it = replaced.find(t)) t = it->second;
    return t;
  };
  std::vector<std::pair<std::string, std::string>> renamed_outputs;
  for (const auto& fq : fqs) {
    Removed r;
    r.fq = fq;
    r.role = classify(g, fq, &r.consumer, &r.consumer_op);
    r.tensor = resolve(fq.input);
    refuse_format(fq, options.backend);
    if (fq.nnie && !options.allow_nnie) {
      throw DeployError("fake quantizer '" + fq.name + "' is NNIE's logarithmic quantizer (" +
                        fq.op_type + " with data_max only); " + options.backend +
                        " needs a scale and a zero point: deploy this model with the NNIE "
                        "backend, or prepare it for " + options.backend);
    }
    if (fq.q.per_channel() && !options.per_channel_error.empty()) throw DeployError(options.per_channel_error);
    if (r.role == Role::kBias && !options.allow_bias) {
      throw DeployError("fake quantizer '" + fq.name + "' quantizes the bias of node '" + r.consumer +
                        "'; " + options.backend + " deploys no fake-quantized bias (MQBench allows "
                        "one only for Vitis)");
    }
    g.replace_uses(fq.output, r.tensor);
    if (g.is_graph_output(fq.output)) renamed_outputs.emplace_back(fq.output, r.tensor);
    replaced[fq.output] = r.tensor;
    if (r.role == Role::kWeight && options.clip_weights && !fq.nnie) {
      try {
        clip_weight(g, r.tensor, fq.q);
      } catch (const DeployError& e) {
        throw DeployError("fake quantizer '" + fq.name + "': " + e.what());
      }
    }
    dead.insert(fq.nodes.begin(), fq.nodes.end());
    removed.push_back(std::move(r));
  }
  for (const auto& kv : renamed_outputs) g.rename_output(kv.first, kv.second);
  g.remove_nodes(dead);
  g.optimize();  // Identity / Cast chains that fed only the quantizers' parameters go too
  g.drop_opset("mqbench");
  return removed;
}

MQBENCH_REGISTER_DEPLOY_PASS(remove_fake_quant, "remove_fake_quant",
                             "removes every fake-quantize group, rewiring its readers to the float "
                             "tensor and clipping weights (default RemoveOptions)",
                             [](OnnxGraph& g) {
                               const auto removed = remove_fake_quant(g, RemoveOptions{});
                               return PassResult{!removed.empty(),
                                                 std::to_string(removed.size()) + " groups removed"};
                             });

}  // namespace deploy
}  // namespace mqbench
