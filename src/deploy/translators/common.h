#pragma once
// Shared helpers of the translators in this folder (one translator per file).

#include <nlohmann/json.hpp>

#include <algorithm>
#include <deque>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "mqbench/deploy/check_model.h"
#include "mqbench/deploy/translator.h"

namespace mqbench {
namespace deploy {
namespace translators {

// Insertion-ordered, as Python's json.dump of a dict writes MQBench's files.
using Json = nlohmann::ordered_json;

/// An insertion-ordered JSON object (the key order of MQBench's files) for the per-tensor
/// tables. ordered_json finds a key by a linear scan, so filling it is quadratic in the number
/// of tensors (minutes on a 100k-node graph), and it keeps its items in a vector, so a reference
/// from `t[a]` dangles once `t[b]` adds a key. Here lookups are hashed and entries never move.
class JsonObject {
 public:
  JsonObject() = default;
  // The index points into items_: a copy would point into the original; a move keeps them.
  JsonObject(const JsonObject&) = delete;
  JsonObject& operator=(const JsonObject&) = delete;
  JsonObject(JsonObject&&) = default;
  JsonObject& operator=(JsonObject&&) = default;

  /// The entry of `key`, added (null) when absent.
  Json& operator[](const std::string& key) {
    auto it = index_.find(key);
    if (it != index_.end()) return it->second->second;
    items_.emplace_back(key, Json());
    index_.emplace(key, &items_.back());
    return items_.back().second;
  }
  bool contains(const std::string& key) const { return index_.count(key) > 0; }
  /// The keys, in insertion order.
  std::vector<std::string> keys() const {
    std::vector<std::string> k;
    k.reserve(items_.size());
    for (const auto& kv : items_) k.push_back(kv.first);
    return k;
  }
  /// The ordered_json object; the keys are unique, so they are appended without a lookup.
  Json json() const {
    Json j = Json::object();
    auto& items = j.get_ref<Json::object_t&>();
    items.reserve(items_.size());
    for (const auto& kv : items_) items.emplace_back(kv.first, kv.second);
    return j;
  }

 private:
  std::deque<std::pair<std::string, Json>> items_;
  std::unordered_map<std::string, std::pair<std::string, Json>*> index_;
};

/// An ONNX artifact, checked first: the structure, then onnx's checker and strict shape
/// inference (check_model): a translator that would write a model a runtime refuses raises
/// instead.
inline Artifact onnx_file(const std::string& name, const OnnxGraph& g,
                          const ModelCheckOptions& check = {}) {
  g.check_structure(name);
  check_model(g, name, check);
  return {name, g.serialize()};
}
inline Artifact json_file(const std::string& name, const Json& j) { return {name, j.dump(4)}; }

/// Refuses a tensor name that a line-based text artifact (PPLCUDA's clip ranges, Tengine's scale
/// file) cannot hold: ONNX allows any string as a name, but a '\n' in one would end its line
/// early and start a forged one ("a: 1\nb: 2"; found by the deploy fuzzer), and in a
/// space-separated format a space would shift the columns. `format` describes the file's lines.
inline void check_text_key(const std::string& name, const char* backend, const char* format,
                           bool spaces_allowed) {
  const auto bad = [&](unsigned char c) { return c < 0x20 || c == 0x7f || (!spaces_allowed && c == ' '); };
  if (std::none_of(name.begin(), name.end(), [&](char c) { return bad(static_cast<unsigned char>(c)); })) {
    return;
  }
  static const char* hex = "0123456789abcdef";
  std::string shown;  // the name (its first 60 bytes), each such character as \xHH
  for (const char c : name.substr(0, 60)) {
    const auto u = static_cast<unsigned char>(c);
    shown += bad(u) ? std::string("\\x") + hex[u >> 4] + hex[u & 15] : std::string(1, c);
  }
  throw DeployError(std::string(backend) + ": tensor name '" + shown + "' holds " +
                    (spaces_allowed ? "a control character" : "a space or a control character") +
                    ", which its text file (" + format + ") cannot hold; rename the tensor");
}

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

/// post_process_clip_ranges on a table keyed by tensor name: the built-in rule, or the
/// replacement in `o.post_process_clip_ranges`, which gets the table and the model and may
/// return another table and another model (then read back and checked as any input is).
inline void propagate_ranges(OnnxGraph& g, JsonObject& ranges, const DeployOptions& o) {
  if (o.post_process_clip_ranges) {
    const std::string sent = g.serialize();
    std::string model = sent;
    const std::string text = o.post_process_clip_ranges(ranges.json().dump(), &model);
    Json table = Json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!table.is_object()) {
      throw DeployError("post_process_clip_ranges must return a dict {tensor name: range}; got " +
                        (table.is_discarded() ? std::string("text that is not JSON")
                                              : std::string(table.type_name())));
    }
    JsonObject replaced;
    for (auto& item : table.items()) replaced[item.key()] = item.value();
    ranges = std::move(replaced);  // a move keeps the entries where the index points
    if (model != sent) {
      g = OnnxGraph::parse(model, "the model post_process_clip_ranges returned");
      g.check_structure("the model post_process_clip_ranges returned");
    }
    return;
  }
  const auto keys = ranges.keys();
  const std::set<std::string> has(keys.begin(), keys.end());
  for (const auto& c : post_process_clip_ranges(g, has)) ranges[c.first] = ranges[c.second];
}

/// The two files of the linear backends: <name>_clip_ranges.json and <name>_deploy_model.onnx.
inline DeployOutput ranges_and_model(const DeployOptions& o, const Json& ranges, const OnnxGraph& g) {
  DeployOutput out;
  out.files.push_back(json_file(o.model_name + "_clip_ranges.json", ranges));
  out.files.push_back(onnx_file(o.model_name + "_deploy_model.onnx", g));
  return out;
}

/// The Tensorrt translators' answer to the layers find_float_layers found in `layers`: none,
/// nothing; otherwise a DeployError naming each (node and weight) and the way out, or, with
/// `o.allow_float_layers`, a note in `notes` naming them (its text starts "warning: ", which the
/// CLI and Python's logger show as a warning).
inline void answer_float_layers(const std::vector<FloatLayer>& layers, const DeployOptions& o,
                                const char* backend, std::vector<std::string>* notes) {
  if (layers.empty()) return;
  std::string named;
  for (const auto& l : layers) {
    named += (named.empty() ? "'" : ", '") + l.node + "' (" + l.op_type + ", weight '" + l.weight +
             "')";
  }
  const std::string count = std::to_string(layers.size()) +
                            (layers.size() == 1 ? " layer has" : " layers have");
  if (o.allow_float_layers) {
    notes->push_back("warning: " + count + " a quantized weight but no quantizer on " +
                     (layers.size() == 1 ? "its" : "their") + " input; "
                     "TensorRT runs " + (layers.size() == 1 ? "it" : "them") +
                     " in float (deployed as asked by allow_float_layers): " + named);
    return;
  }
  throw DeployError(std::string(backend) + ": " + count +
                    " a quantized weight but no quantizer on " +
                    (layers.size() == 1 ? "its" : "their") + " input, so TensorRT would run " +
                    (layers.size() == 1 ? "it" : "them") + " in float without an error: " + named +
                    ". Quantize its input: check the prepare config's extra_qconfig_dict and "
                    "extra_quantizer_dict (exclude_module_name, exclude_node_name, "
                    "exclude_function_type; additional_node_name forces a node's inputs), or "
                    "pass allow_float_layers=True (mqbench-deploy --allow-float-layers) to deploy "
                    "it in float anyway");
}

/// The symmetric clip value of a per-tensor group: max(-s(qmin - z), s(qmax - z)).
inline double symmetric_clip(const QParams& q) { return std::max(-q.min_value(), q.max_value()); }

}  // namespace translators
}  // namespace deploy
}  // namespace mqbench
