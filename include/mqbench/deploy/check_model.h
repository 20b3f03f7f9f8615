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
// libonnx (Debian's 1.12) knows opsets up to 17 of the default domain and IR version 8. A model
// importing a newer opset of a standard domain (the dynamo exporter writes opset 18) cannot be
// judged by its schemas: for it the schema checks and shape inference are skipped, and only the
// checks above and OnnxGraph::check_structure apply (docs/security.md).
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

/// The newest opset of `domain` ("" for the default) whose schemas libonnx holds.
int64_t known_opset(const std::string& domain);

}  // namespace deploy
}  // namespace mqbench
