#pragma once
// Shared helpers of the translators in this folder (one translator per file).

#include <nlohmann/json.hpp>

#include <string>

#include "mqbench/deploy/deploy.h"

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

/// The symmetric clip value of a per-tensor group: max(-s(qmin - z), s(qmax - z)).
inline double symmetric_clip(const QParams& q) { return std::max(-q.min_value(), q.max_value()); }

}  // namespace translators
}  // namespace deploy
}  // namespace mqbench
