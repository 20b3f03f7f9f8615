#pragma once
// The deploy's input and output checks against the ONNX standard, with libonnx's own checker
// (onnx::checker::check_model) and strict shape inference (type checks on, errors fatal): what
// `onnx.checker.check_model(model, full_check=True)` does in Python.
//
// Before the checker runs, the model is read for what libonnx cannot judge:
//  * the IR version: 3 (the first with opset imports) to 14 (the newest onnx 1.23 writes and
//    onnxruntime 1.32 reads);
//  * opset imports: each domain once, a version >= 1; every node's domain imported;
//  * the `mqbench` domain holds only MQBench's fake-quantize ops (docs/deploy.md), with one
//    output each.
// On the deploy's input (`mqbench_forms`), two more forms MQBench writes are accepted: its 1.10
// fake-quantize nodes in the default domain, and MQBench main's QuantizeLinear /
// DequantizeLinear with quant_min / quant_max / data_max attributes the standard schema does
// not know. The checker then reads a copy in which those nodes sit in the `mqbench` domain and
// those attributes are gone, and the input's nodes are in topological order (the deploy sorts
// the graph itself; an unsorted but acyclic input is not refused for that). A written file gets
// no such allowance: it must pass as it is.
//
// The checker, shape inference and schemas are onnx 1.23's C++ library, compiled into
// libmqbench_deploy (cmake/OnnxFromSource.cmake): every op of a standard domain is judged by the
// schema of the model's opset, up to the newest a runtime here reads (opset 23 of the default
// domain: float 8, 4-bit and block-quantized QuantizeLinear / DequantizeLinear included). A model
// importing an opset newer than those schemas is refused.
//
// Every failure is a DeployError naming `what` and, where the fault is in a node, the node.

#include <set>
#include <string>

#include "mqbench/deploy/onnx_graph.h"

namespace mqbench {
namespace deploy {

struct ModelCheckOptions {
  /// The deploy's input: MQBench's own non-standard forms (above) are accepted.
  bool mqbench_forms = false;
  /// Deprecated standard ops allowed anyway (NNIE's deploy model keeps Upsample, which its
  /// toolchain reads, as MQBench writes it); they are checked as custom ops.
  std::set<std::string> deprecated_ops_allowed;
};

/// Checks `g` as described above; raises DeployError naming `what` and the node at fault.
void check_model(const OnnxGraph& g, const std::string& what, const ModelCheckOptions& options = {});

/// The newest opset of `domain` ("" for the default) whose schemas the compiled-in onnx holds.
int64_t known_opset(const std::string& domain);

}  // namespace deploy
}  // namespace mqbench
