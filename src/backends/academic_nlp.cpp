// Academic_NLP: Academic's user-given parameters with the transformer-aware quantizer rules.
#include "backends/builtin.h"

MQBENCH_REGISTER_BACKEND(academic_nlp, mqbench::backends::alias("Academic_NLP", 11, "Academic",
                                                                "AcademicNLPQuantizer",
    "academic"));
