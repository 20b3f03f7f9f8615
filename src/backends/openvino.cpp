// OPENVINO (Intel): symmetric 8-bit, per-channel weights, per-tensor activations (the
// quantizer narrows weights to 7 bits at prepare time, as MQBench does).
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(openvino, b::builtin("OPENVINO", 8, "affine", b::sym(true), b::sym(false),
                                              b::kLsqMinMaxEma, "OPENVINOQuantizer",
    "openvino"));
