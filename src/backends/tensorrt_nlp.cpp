// Tensorrt_NLP: Tensorrt's parameters with the transformer-aware quantizer rules.
#include "backends/builtin.h"

MQBENCH_REGISTER_BACKEND(tensorrt_nlp, mqbench::backends::alias("Tensorrt_NLP", 10, "Tensorrt",
                                                                "TensorrtNLPQuantizer",
    "academic"));
