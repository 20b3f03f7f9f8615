#pragma once
// One form for the ops that torch's two ONNX exporters write differently, so a translator (and
// the files it writes) does not depend on the exporter (docs/deploy.md, "Exporters"):
//
//  * ReduceMean over axes {2, 3} of a rank-4 tensor with keepdims=1 (axes as the attribute of
//    opset < 18 or the constant input of opset >= 18) becomes GlobalAveragePool. The dynamo
//    exporter writes adaptive_avg_pool2d(x, 1) (nn.AdaptiveAvgPool2d(1)) this way; the
//    TorchScript exporter writes GlobalAveragePool, which every backend's toolchain knows.
//  * Reshape of a tensor of known static shape [d0, d1, ..., dk] (k >= 2) to the constant shape
//    [d0, d1 * ... * dk] becomes Flatten(axis=1). The dynamo exporter writes torch.flatten(x, 1)
//    as a Reshape to a constant shape (the batch size written in); the TorchScript exporter
//    writes Flatten, which holds for any batch size.
//
// Both are the same computation. Shapes come from the model (graph inputs and outputs,
// value_info, initializers; the dynamo exporter records every tensor's), ranks also through ops
// that keep their input's rank; where neither is known the node is left as it is.

#include "mqbench/deploy/onnx_graph.h"

namespace mqbench {
namespace deploy {

/// Applies the rewrites above in place; returns whether the graph changed (unchanged: the
/// pattern did not apply). Node names and output tensor names are kept.
bool canonicalize_ops(OnnxGraph& g);

}  // namespace deploy
}  // namespace mqbench
