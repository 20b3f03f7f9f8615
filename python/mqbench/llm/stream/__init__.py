"""Checkpoint to checkpoint, block by block: ``quantize_checkpoint`` and its command line
``python -m mqbench.llm`` (docs/llm-scale.md)."""
from mqbench.llm.stream.quantize import ALGORITHMS, quantize_checkpoint

__all__ = ["ALGORITHMS", "quantize_checkpoint"]
