#pragma once
// The deploy entry point: ONNX with fake-quantize nodes in, a backend's artifacts out.
//
//   mqbench::deploy::DeployOptions opt;
//   opt.model_name = "resnet18";
//   opt.output_dir = "out";
//   auto written = mqbench::deploy::deploy_file("out/resnet18.onnx", "Tensorrt", opt);
//
// Each backend's BackendSpec names its translator (`deploy_translator`); translators live one
// per file under src/deploy/translators/ and register themselves by name. An application adds
// its own with MQBENCH_REGISTER_DEPLOY_TRANSLATOR (mqbench/deploy/translator.h,
// docs/add_a_backend.md).
//
// This header does not include the ONNX protobuf classes, so a translation unit that also sees
// torch's headers (which ship protobuf headers of their own) can include it; translator.h,
// onnx_graph.h and fake_quant.h are for code built against the mqbench::deploy target alone.

#include <functional>
#include <string>
#include <vector>

#include "mqbench/error.h"

namespace mqbench {
namespace deploy {

struct DeployOptions {
  std::string model_name = "mqbench_qmodel";
  std::string output_dir = ".";
  /// Tensorrt: also write the QDQ model onnx_quantized_model.onnx (MQBench's ONNXQLinearPass).
  bool deploy_to_qlinear = false;
  /// Tensorrt and Tensorrt_NLP (its Gemm / MatMul layers): deploy a layer whose weight is
  /// quantized but whose input is not (find_float_layers in mqbench/deploy/fake_quant.h), which
  /// TensorRT would run in float.
  /// false (the default): such a deploy raises DeployError naming each layer; true: it deploys
  /// and a note (starting "warning: ") names them.
  bool allow_float_layers = false;
  /// Replaces the step MQBench calls post_process_clip_ranges in the translators that have it
  /// (tensorrt, snpe, pplw8a16, pplcuda, vitis, tengine_u8, stpu): called with the backend's
  /// table of ranges as JSON text ({tensor: the backend's entry}, in order) and the deploy model as
  /// serialized ONNX, which it may replace; returns the new table as JSON text. Empty (the
  /// default): the built-in rule (post_process_clip_ranges in mqbench/deploy/fake_quant.h).
  /// Python's mqbench.deploy sets it when a LinearQuantizer_process subclass overrides the
  /// method of that name.
  std::function<std::string(const std::string& ranges_json, std::string* model)>
      post_process_clip_ranges;
};

/// One output file: a name relative to the output directory and its contents.
struct Artifact {
  std::string file_name;
  std::string contents;
};

/// One pass a deploy ran (mqbench/deploy/pass.h): its name (its file under src/deploy/passes/),
/// the graph's node count before and after, and its wall time.
struct PassRecord {
  std::string name;
  int nodes_before = 0;
  int nodes_after = 0;
  double milliseconds = 0;
};

struct DeployOutput {
  std::vector<Artifact> files;
  /// Messages for the user (e.g. Vitis: the vendor compile step to run next).
  std::vector<std::string> notes;
};

/// Names of the registered translators.
std::vector<std::string> translator_names();
/// The translator of backend `backend` (its BackendSpec's deploy_translator).
std::string translator_of_backend(const std::string& backend);

/// Checks that `name` (a model name or output file name, `what` in the message) is one file name:
/// 1-200 characters, no '/', no NUL byte, not "." or "..". Raises DeployError otherwise.
void check_file_name(const std::string& name, const char* what);
/// Checks that `dir` exists (creating it) and is writable; raises DeployError otherwise.
void check_output_dir(const std::string& dir);
/// Writes the set of files atomically: each to a temporary in `dir` (created exclusively, with a
/// random name), then, holding an exclusive lock on `dir` (flock), renames them all into place.
/// A file already at a final name is kept as a hard link until the set is in; if a rename
/// fails, the names already replaced get their old file back (or go, where there was none), so
/// the folder keeps its old set whole. Two deploys into one folder (threads or processes)
/// commit one after the other: the folder ends with one complete set, never a mixture.
std::vector<std::string> write_atomically(const std::string& dir, const std::vector<Artifact>& files);

/// translate + write_atomically; returns the paths written. `notes` and `passes` (when given)
/// receive the translator's notes and the passes it ran.
std::vector<std::string> deploy(const std::string& onnx_bytes, const std::string& backend,
                                const DeployOptions& options, std::vector<std::string>* notes = nullptr,
                                std::vector<PassRecord>* passes = nullptr);
std::vector<std::string> deploy_file(const std::string& onnx_path, const std::string& backend,
                                     const DeployOptions& options,
                                     std::vector<std::string>* notes = nullptr,
                                     std::vector<PassRecord>* passes = nullptr);

}  // namespace deploy
}  // namespace mqbench
