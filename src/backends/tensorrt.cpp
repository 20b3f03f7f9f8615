// Tensorrt (NVIDIA TensorRT): symmetric 8-bit on [-127, 127]; per-channel weights, per-tensor
// activations; LSQ quantizers, MinMax weight and EMA activation observers.
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(tensorrt, b::builtin("Tensorrt", 1, "affine", b::sym(true, true),
                                              b::sym(false, true), b::kLsqMinMaxEma,
                                              "ModelQuantizer",
    "tensorrt"));
