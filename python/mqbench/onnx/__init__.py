"""ONNX export of the ``torch.ops.mqbench`` ops, from both of torch's exporters.

Importing :mod:`mqbench` imports this package, which registers the TorchScript symbolics of every
op. The modules, one concern each:

* :mod:`mqbench.onnx.common`: what both exporters share (the ``mqbench`` node domain, the opsets,
  the export format ``"mqbench"`` / ``"qdq"`` and its context manager, ONNX dtype codes, the op
  list); a leaf.
* :mod:`mqbench.onnx.symbolic`: the TorchScript symbolics of MQBench's algorithms, and
  :func:`export_onnx`, which runs either exporter. MQBench's own path for it,
  ``mqbench.custom_symbolic_opset``, re-exports it.
* :mod:`mqbench.onnx.formats`: the symbolics of the FP8 and group-wise ops (standard Q/DQ).
* :mod:`mqbench.onnx.mx`: the MX / NVFP4 ops, for both exporters.
* :mod:`mqbench.onnx.llm_ops`: the LLM activation ops (``hadamard_transform``,
  ``fake_quantize_per_token``) as standard ONNX, for both exporters.
* :mod:`mqbench.onnx.dynamo`: the onnxscript translations for ``dynamo=True`` (imported only then:
  it needs ``onnxscript``).
* :mod:`mqbench.onnx.plain_export`: a plain ``torch.onnx.export(..., dynamo=True)`` of a prepared
  model, through ``torch.onnx.ops.symbolic``.

docs/ops.md lists every op's nodes; docs/deploy.md what the deploy passes do with them.

Example::

    from mqbench.onnx import export_format, export_onnx

    export_onnx(model, (x,), "model.onnx")                 # opset 13, MQBench's nodes
    with export_format("qdq"):
        export_onnx(model, (x,), "model_qdq.onnx")         # QuantizeLinear / DequantizeLinear
"""
from mqbench.onnx import (  # noqa: F401  (registers)
    common, formats, llm_ops, mx, plain_export, symbolic)
from mqbench.onnx.common import (  # noqa: F401
    CUSTOM_OPSETS, DEFAULT_OPSET, DOMAIN, DYNAMO_OPSET, FORMATS, MIN_OPSET, export_format,
    get_export_format, set_export_format)
from mqbench.onnx.symbolic import (  # noqa: F401
    HAS_DYNAMO_EXPORTER, HAS_TORCHSCRIPT_EXPORTER, export_onnx, has_attention, use_dynamo)

__all__ = ["CUSTOM_OPSETS", "DEFAULT_OPSET", "DOMAIN", "DYNAMO_OPSET", "FORMATS", "MIN_OPSET",
           "HAS_DYNAMO_EXPORTER", "HAS_TORCHSCRIPT_EXPORTER", "export_format", "export_onnx",
           "get_export_format", "has_attention", "set_export_format", "use_dynamo"]
