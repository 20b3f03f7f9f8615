// NNIE (HiSilicon): a logarithmic 8-bit format driven by each tensor's max |x| (NNIEFakeQuantize).
// The symmetric 8-bit schemes only configure the observers.
#include "backends/builtin.h"

namespace b = mqbench::backends;
MQBENCH_REGISTER_BACKEND(nnie, b::builtin("NNIE", 4, "nnie", b::sym(false), b::sym(false),
                                          {"NNIEFakeQuantize", "NNIEFakeQuantize",
                                           "MinMaxObserver", "EMAMinMaxObserver"},
                                          "ModelQuantizer",
    "nnie"));
