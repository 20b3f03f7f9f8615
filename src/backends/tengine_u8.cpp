// Tengine_u8 (OPEN AI LAB Tengine, uint8): asymmetric per-tensor 8-bit.
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(tengine_u8, b::builtin("Tengine_u8", 9, "affine", b::asym(false),
                                                b::asym(false), b::kLsqMinMaxEma,
                                                "TengineQuantizer",
    "tengine_u8"));
