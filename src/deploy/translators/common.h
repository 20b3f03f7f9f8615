#pragma once
// Shared helpers of the translators in this folder (one translator per file).

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "mqbench/deploy/translator.h"

namespace mqbench {
namespace deploy {
namespace translators {

// Insertion-ordered, as Python's json.dump of a dict writes MQBench's files.
using Json = nlohmann::ordered_json;

inline Artifact onnx_file(const std::string& name, const OnnxGraph& g) { return {name, g.serialize()}; }
inline Artifact json_file(const std::string& name, const Json& j) { return {name, j.dump(4)}; }

/// A float as Python's str() writes it (shortest repr that round-trips).
inline std::string py_float(double v) {
  std::string s = Json(v).dump();
  if (s.find_first_of(".eE") == std::string::npos && s.find("inf") == std::string::npos &&
      s.find("nan") == std::string::npos) {
    s += ".0";
  }
  return s;
}

/// MQBench's linear-backend removal: zero Pads out, then every fake quantizer (weights clipped).
inline std::vector<Removed> remove_for(OnnxGraph& g, const char* backend, RemoveOptions ro = {}) {
  ro.backend = backend;
  remove_zero_pads(g);
  return remove_fake_quant(g, ro);
}

/// post_process_clip_ranges on a JSON object keyed by tensor name.
inline void propagate_ranges(const OnnxGraph& g, Json& ranges) {
  std::set<std::string> has;
  for (const auto& kv : ranges.items()) has.insert(kv.key());
  for (const auto& c : post_process_clip_ranges(g, has)) ranges[c.first] = ranges[c.second];
}

/// The two files of the linear backends: <name>_clip_ranges.json and <name>_deploy_model.onnx.
inline DeployOutput ranges_and_model(const DeployOptions& o, const Json& ranges, const OnnxGraph& g) {
  DeployOutput out;
  out.files.push_back(json_file(o.model_name + "_clip_ranges.json", ranges));
  out.files.push_back(onnx_file(o.model_name + "_deploy_model.onnx", g));
  return out;
}

/// The symmetric clip value of a per-tensor group: max(-s(qmin - z), s(qmax - z)).
inline double symmetric_clip(const QParams& q) { return std::max(-q.min_value(), q.max_value()); }

}  // namespace translators
}  // namespace deploy
}  // namespace mqbench
