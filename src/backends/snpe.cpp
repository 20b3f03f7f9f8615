// SNPE (Qualcomm Snapdragon NPE): asymmetric per-tensor 8-bit weights and activations; every
// op's inputs are quantized (TotalINTQuantizer).
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(snpe, b::builtin("SNPE", 2, "affine", b::asym(false), b::asym(false),
                                          b::kLsqMinMaxEma, "TotalINTQuantizer",
    "snpe"));
