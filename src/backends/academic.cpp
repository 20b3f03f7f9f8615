// Academic: no hardware; the user gives w_qscheme and a_qscheme (any bit width, symmetry,
// per-channel, pot scale) and may choose any fake quantizer and observer.
#include "backends/builtin.h"

MQBENCH_REGISTER_BACKEND(academic, mqbench::backends::alias("Academic", 0, "", "AcademicQuantizer",
    "academic"));
