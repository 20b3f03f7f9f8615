// QDQ (standard ONNX QuantizeLinear/DequantizeLinear): Tensorrt's schemes and quantizers.
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(qdq, b::builtin("QDQ", 13, "affine", b::sym(true, true),
                                         b::sym(false, true), b::kLsqMinMaxEma, "ModelQuantizer",
    "qdq"));
