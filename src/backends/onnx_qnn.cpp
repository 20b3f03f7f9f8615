// ONNX_QNN (TVM QNN / ONNX QLinear ops): asymmetric per-tensor 8-bit; MinMax observers for both.
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(onnx_qnn, b::builtin("ONNX_QNN", 6, "affine", b::asym(false),
                                              b::asym(false), b::kLsqMinMax, "ONNXQNNQuantizer",
    "onnx_qnn"));
