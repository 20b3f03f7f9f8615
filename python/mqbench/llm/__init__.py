"""Post-training quantization algorithms for large language models (docs/llm.md):
SmoothQuant (W8A8), GPTQ, AWQ and SignRound (weight-only INT4 / INT3), the round-to-nearest
baseline, and ``rotate`` (QuaRot's Hadamard rotations, for W4A4). They edit a float model's weights in place, before ``prepare_by_platform``;
``save_quantized`` / ``load_quantized`` write and read the checkpoints serving engines load;
``quantize_checkpoint`` (``python -m mqbench.llm``) quantizes a checkpoint block by block."""
from mqbench.llm.awq import awq
from mqbench.llm.checkpoint import load_quantized, save_quantized
from mqbench.llm.gptq import gptq
from mqbench.llm.qparams import load_weight_qparams
from mqbench.llm.rotate import rotate
from mqbench.llm.rtn import rtn
from mqbench.llm.signround import signround
from mqbench.llm.smoothquant import smoothquant
from mqbench.llm.stream import quantize_checkpoint

__all__ = ["awq", "gptq", "load_quantized", "load_weight_qparams", "quantize_checkpoint", "rotate", "rtn",
           "save_quantized", "signround", "smoothquant"]
