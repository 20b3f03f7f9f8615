"""MQBench's module path for the ONNX export of the fake-quantize ops.

The code lives in :mod:`mqbench.onnx.symbolic` (the TorchScript symbolics and ``export_onnx``);
this module re-exports its public names, so MQBench scripts that import
``mqbench.custom_symbolic_opset`` keep working::

    from mqbench.custom_symbolic_opset import export_format, export_onnx
"""
from mqbench.onnx.symbolic import (  # noqa: F401  (re-exported)
    CUSTOM_OPSETS, DEFAULT_OPSET, DOMAIN, DYNAMO_OPSET, FORMATS, HAS_DYNAMO_EXPORTER,
    HAS_TORCHSCRIPT_EXPORTER, MIN_OPSET, SYMBOLICS, dorefa_normalize, export_format, export_onnx,
    fake_quantize_adaround_per_channel, fake_quantize_adaround_per_tensor,
    fake_quantize_dsq_per_channel, fake_quantize_dsq_per_tensor, fake_quantize_learnable_per_channel_affine,
    fake_quantize_learnable_per_tensor_affine, fake_quantize_nnie, fake_quantize_pact,
    fake_quantize_per_channel_affine, fake_quantize_per_tensor_affine,
    fake_quantize_qdrop_per_channel, fake_quantize_qdrop_per_tensor, fake_quantize_tqt,
    get_export_format, has_attention, pot_quantization, set_export_format, use_dynamo)
