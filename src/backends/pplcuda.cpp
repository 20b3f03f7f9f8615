// PPLCUDA (OpenPPL CUDA): asymmetric 8-bit, per-channel weights, per-tensor activations.
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(pplcuda, b::builtin("PPLCUDA", 7, "affine", b::asym(true), b::asym(false),
                                             b::kLsqMinMax, "TotalINTQuantizer",
    "pplcuda"));
