// Vitis (Xilinx / AMD DPU): symmetric per-tensor 8-bit with power-of-two scales; TQT fake
// quantizers, MinMaxFloor weight and PoTMode activation observers.
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(vitis, b::builtin("Vitis", 5, "vitis", b::sym(false, false, true),
                                           b::sym(false, false, true),
                                           {"TqtFakeQuantize", "TqtFakeQuantize",
                                            "MinMaxFloorObserver", "PoTModeObserver"},
                                           "VitisQuantizer",
    "vitis"));
