// PPLW8A16 (OpenPPL): asymmetric per-tensor 8-bit weights and 16-bit activations.
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(pplw8a16, b::builtin("PPLW8A16", 3, "affine", b::asym(false),
                                              b::asym(false, 16), b::kLsqMinMaxEma,
                                              "TotalINTQuantizer",
    "pplw8a16"));
