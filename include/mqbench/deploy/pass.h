#pragma once
// Deploy passes as named units. Each pass is one file, src/deploy/passes/<name>.cpp, whose name is
// the pass's registry key (as onnx/optimizer and onnxruntime's optimizer name theirs):
//
//   canonicalize_ops          the exporter-independent forms of pooling and flattening
//   remove_fake_quant         fake-quantize groups out, weights clipped
//   remove_zero_pads          Pad nodes with all-zero pads out
//   resize_to_upsample        Resize -> Upsample (NNIE)
//   post_process_clip_ranges  ranges for Flatten / Resize / Reshape inputs (an analysis)
//   find_float_layers         layers with a quantized weight and a float input (an analysis)
//   to_qdq                    fake-quantize groups -> QuantizeLinear [-> Clip] -> DequantizeLinear
//
// The translators call the typed functions (fake_quant.h, canonicalize.h) with their options.
// Every call records itself in the current PassTrace, so a deploy lists the passes it ran
// (DeployOutput::passes; the CLI prints them with --verbose, Python logs them to the "MQBENCH"
// logger at DEBUG). The registry runs one pass alone, with its default options:
//
//   mqbench::deploy::OnnxGraph g = mqbench::deploy::OnnxGraph::load("model.onnx");
//   const auto result = mqbench::deploy::run_pass("remove_zero_pads", g);  // result.modified
//
// A new pass: a file under src/deploy/passes/ (listed in CMakeLists.txt) whose function opens a
// PassScope and which registers itself with MQBENCH_REGISTER_DEPLOY_PASS; tests for the positive
// case, the not-applicable case (model unchanged) and malformed input (docs/deploy.md).

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "mqbench/deploy/deploy.h"
#include "mqbench/deploy/onnx_graph.h"

namespace mqbench {
namespace deploy {

/// What running a pass alone did: whether the graph changed, and a few words (counts) if any.
struct PassResult {
  bool modified = false;
  std::string summary;
};

using PassFunction = std::function<PassResult(OnnxGraph&)>;

/// Registers pass `name` (its file name); raises DeployError on an empty or duplicate name.
void register_pass(const std::string& name, const std::string& description, PassFunction fn);
/// The registered passes' names, sorted.
std::vector<std::string> pass_names();
/// The one-line description of pass `name`; raises DeployError listing the names if unknown.
const std::string& pass_description(const std::string& name);
/// Runs pass `name` alone on `g` with its default options (it is recorded in the current trace
/// as any call is); raises DeployError listing the registered names when there is none, and
/// when `g` fails OnnxGraph::check_structure (the passes read every node's inputs and outputs).
PassResult run_pass(const std::string& name, OnnxGraph& g);

/// Collects the passes run on this thread while it lives (nested traces: the innermost one).
class PassTrace {
 public:
  PassTrace();
  ~PassTrace();
  PassTrace(const PassTrace&) = delete;
  PassTrace& operator=(const PassTrace&) = delete;
  const std::vector<PassRecord>& records() const { return records_; }

 private:
  std::vector<PassRecord> records_;
  std::vector<PassRecord>* previous_;
};

/// Opened first thing by every pass function: appends the pass to the current trace (if any)
/// when it returns (not when it throws), with the graph's node count before and after.
class PassScope {
 public:
  PassScope(const char* name, const OnnxGraph& g);
  ~PassScope();
  PassScope(const PassScope&) = delete;
  PassScope& operator=(const PassScope&) = delete;

 private:
  const char* name_;
  const OnnxGraph& g_;
  int nodes_before_;
  int uncaught_;
  std::chrono::steady_clock::time_point start_;
};

namespace detail {
struct PassRegisterer {
  PassRegisterer(const std::string& name, const std::string& description, PassFunction fn) {
    register_pass(name, description, std::move(fn));
  }
};
}  // namespace detail

}  // namespace deploy
}  // namespace mqbench

/// Registers pass `name` at load time; `id` names the static registrar; the rest is the
/// PassFunction that runs it alone (default options).
#define MQBENCH_REGISTER_DEPLOY_PASS(id, name, description, ...)                         \
  static ::mqbench::deploy::detail::PassRegisterer mqbench_pass_registerer_##id(name, description, \
                                                                                __VA_ARGS__)
