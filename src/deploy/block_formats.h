#pragma once
// The block-scaled formats (MXFP8, MXFP4, NVFP4: docs/formats-mx.md) in standard ONNX, for
// to_qdq (docs/design/formats.md).

#include <string>
#include <vector>

#include "mqbench/deploy/fake_quant.h"

namespace mqbench {
namespace deploy {

/// Writes the MX / NVFP4 group `fq` as standard ONNX, producing fq.output: its nodes are
/// appended to `added`, its constants become initializers of `g`. A weight (an initializer) is
/// quantized here, with the kernels' own formulas (src/ops/common/mx_formula.h): its codes
/// become a FLOAT8E4M3FN / FLOAT4E2M1 initializer read by a blocked DequantizeLinear, whose
/// scale is a FLOAT initializer (MX) or NVFP4's E4M3 block scales dequantized by the tensor
/// scale (TensorRT's two DequantizeLinear). An activation gets the graph that computes its block
/// scales from the data, as python/mqbench/onnx/mx.py exports it in the "qdq" format; for
/// `tensorrt`, NVFP4 and MXFP8 activations blocked along their last axis get TensorRT's
/// dynamic-quantize ops instead (domain trt, as modelopt writes them). Returns the opset the
/// nodes need (21 for MXFP8, 23 for the FP4 formats).
int64_t block_format_qdq(OnnxGraph& g, const FakeQuant& fq, bool tensorrt, bool qlinear_names,
                         std::vector<onnx::NodeProto>* added);

}  // namespace deploy
}  // namespace mqbench
