// Tensorrt_NLP: Tensorrt's parameters with the transformer-aware quantizer rules; deployed as
// Academic's QDQ file, with Tensorrt's refusal of float layers (translators/tensorrt_nlp.cpp).
#include "backends/builtin.h"

MQBENCH_REGISTER_BACKEND(tensorrt_nlp, mqbench::backends::alias("Tensorrt_NLP", 10, "Tensorrt",
                                                                "TensorrtNLPQuantizer",
    "tensorrt_nlp"));
