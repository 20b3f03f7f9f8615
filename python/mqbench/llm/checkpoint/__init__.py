"""LLM checkpoints in compressed-tensors' format, the one vLLM, SGLang and transformers load
(docs/llm.md, "Serving"): ``save_quantized`` writes one, ``load_quantized`` reads one back."""
from mqbench.llm.checkpoint.load import load_quantized
from mqbench.llm.checkpoint.save import save_quantized

__all__ = ["load_quantized", "save_quantized"]
