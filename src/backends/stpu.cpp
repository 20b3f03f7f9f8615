// STPU (Sophgo): symmetric per-tensor 8-bit on [-127, 127] with fixed (observer-driven) qparams.
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(stpu, b::builtin("STPU", 12, "affine", b::sym(false, true),
                                          b::sym(false, true),
                                          {"FixedFakeQuantize", "FixedFakeQuantize",
                                           "MinMaxObserver", "EMAMinMaxObserver"},
                                          "TotalINTQuantizer",
    "stpu"));
