"""The export of a prepared model as ``convert_deploy`` makes it (private): the deep copy it
exports, the arguments as ``dummy_input`` gives them (Note [One dict argument]), the opset its
formats need, and the choice of torch's exporter. ``convert_deploy`` writes the bytes;
``mqbench.deploy.check`` exports the same model in memory to match a deployed file's tensors.
"""
import copy
import inspect
import io
import operator
import warnings

import torch

from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.onnx.symbolic import (DEFAULT_OPSET, HAS_DYNAMO_EXPORTER, export_format, export_onnx,
                                   has_attention, use_dynamo)
from mqbench.utils.logger import logger

#: MQBench's opset for the TorchScript exporter (``mqbench.convert_deploy.OPSET``).
OPSET = DEFAULT_OPSET


def export_bytes(model, dummy_input, input_names=None, output_names=None, dynamic_axes=None,
                  dynamo=None):
    """The ONNX export (mqbench's nodes) of ``model`` on ``dummy_input`` as bytes: the arguments
    as ``convert_onnx`` reads them (Note [One dict argument])."""
    args = dummy_input
    dict_input = dict_parameter(model, dummy_input)  # the dict or None (a tuple now)
    if dict_input is not None:
        # Note [One dict argument]: a model whose forward takes one dict (MQBench's detection
        # models: forward(self, input): x = input['x']) gets the dict as its one positional
        # argument. torch's exporters read a dict at the end of the argument tuple as keyword
        # arguments; the empty dict after it is those (none), as on torch 1.x, where MQBench
        # exported these models. The inputs are named after the dict's keys, the outputs after
        # the nested structure the model returns ("y.z" for out["y"]["z"]; "x_out" for an
        # output that would take an input's name).
        args = (dict(dict_input), {})  # a copy: forward() may update the dict it gets
        if input_names is None:
            input_names = [name for name, _ in flatten(dict_input)]
        if output_names is None:
            with torch.no_grad():
                out = model(copy.copy(dict_input))  # forward() may update the dict it gets
            if isinstance(out, dict):
                # an output named like an input (the dict returned with its "x" in it) would
                # rename the input ("x.1"): the output gets "_out" instead
                taken = set(input_names)
                output_names = [name + "_out" if name in taken else name
                                for name, _ in flatten(out)]
    elif isinstance(args, dict):  # keyword arguments, by forward()'s parameter names
        args = keyword_arguments(model, args)
        if input_names is None:
            input_names = list(args)
        args = (args,)  # the exporters read a dict at the end of the arguments as keywords
    elif isinstance(args, torch.Tensor):
        args = (args,)
    elif isinstance(args, list):
        args = tuple(args)
    if dynamo is None and not use_dynamo(None) and HAS_DYNAMO_EXPORTER:
        # Note [The exporter for dynamo=None]: the TorchScript exporter, as MQBench; a model it
        # cannot export (an aten op it has no symbolic for at this opset, such as
        # scaled_dot_product_attention at 13) goes to the dynamo exporter, which the log names
        try:
            return export_with(model, args, input_names, output_names, dynamic_axes, False)
        except ValueError as first:
            try:
                data = export_with(model, args, input_names, output_names, dynamic_axes, True)
            except ValueError as second:
                raise ValueError(
                    f"ONNX export of {type(model).__name__} failed with both of torch's "
                    f"exporters. TorchScript: {first.__cause__ or first}\nDynamo: "
                    f"{second.__cause__ or second}") from second
            reason = (str(first.__cause__ or first).splitlines() or [""])[0][:200]
            logger.info(f"{type(model).__name__}: the TorchScript ONNX exporter failed "
                        f"({reason}); exported with torch's dynamo exporter instead "
                        f"(dynamo=True)")
            return data
    return export_with(model, args, input_names, output_names, dynamic_axes, use_dynamo(dynamo))


def export_with(model, args, input_names, output_names, dynamic_axes, dynamo):
    """One export of ``model`` by the exporter ``dynamo`` picks, as bytes."""
    # MQBench's opset 13, or 14 for attention (scaled_dot_product_attention's first opset), or
    # the formats' opset (FP8: 19, group-wise and MXFP8: 21, MXFP4 and NVFP4: 23)
    opset = None if dynamo else (max(OPSET, 14) if has_attention(model) else OPSET)
    needed = format_opset(model)
    if needed is not None:
        opset = needed if opset is None else max(opset, needed)
    buffer = io.BytesIO()
    try:
        with torch.no_grad(), export_format("mqbench"), warnings.catch_warnings():
            # torch's notice on a dict input that the model updates (Note [One dict argument])
            warnings.filterwarnings("ignore", message="We detected that you are modifying a "
                                    "dictionary that is an input to your model")
            # the TorchScript exporter knows opsets up to 20; the formats' symbolics write
            # their opset-21 / 23 nodes themselves (docs/formats.md)
            warnings.filterwarnings("ignore", message="Exporting to ONNX opset version 2[1-9] "
                                    "is not supported")
            export_onnx(model, args, buffer, input_names=input_names,
                        output_names=output_names, dynamic_axes=dynamic_axes,
                        opset_version=opset, dynamo=dynamo,
                        do_constant_folding=True)
    except Exception as e:  # torch names the op it cannot export
        hint = "" if dynamo else " (the dynamo exporter may take it: pass dynamo=True)"
        raise ValueError(f"ONNX export of {type(model).__name__} failed{hint}: {e}") from e
    return buffer.getvalue()


def export_model_bytes(model, args, kwargs, input_names=None, dynamo=False):
    """The export of ``model`` called as ``model(*args, **kwargs)``, as bytes (the check's
    reference: :func:`mqbench.deploy.check.check_deploy`)."""
    dummy_input = dict(kwargs) if kwargs else (args if len(args) == 1 and
                                               isinstance(args[0], dict) else tuple(args))
    return export_bytes(model, dummy_input, input_names=input_names, dynamo=dynamo)


def dict_parameter(model, dummy_input):
    """The dict ``model`` takes as its one positional argument, or None.

    ``dummy_input`` may be that dict, ``(dict,)``, or a dict from ``input_shape_dict`` whose keys
    are not forward()'s parameter names but keys the model reads from its one parameter."""
    if isinstance(dummy_input, (tuple, list)) and len(dummy_input) == 1 \
            and isinstance(dummy_input[0], dict):
        return dummy_input[0]
    if not isinstance(dummy_input, dict):
        return None
    return dummy_input if set(dummy_input) <= keys_read_from_one_argument(model) else None


def keyword_arguments(model, kwargs):
    """``kwargs`` (a ``dummy_input`` dict for a model that does not take one dict) in the order
    of forward()'s parameters, which is the order of the ONNX inputs; a key that names no
    parameter is a ValueError listing them."""
    params = [name for name, p in inspect.signature(model.forward).parameters.items()
              if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    unknown = [k for k in kwargs if k not in params]
    if unknown:
        raise ValueError(f"dummy_input names {unknown}, which are not parameters of "
                         f"{type(model).__name__}.forward {params}: give a dict keyed by its "
                         f"parameter names, or a tuple in their order")
    return {name: kwargs[name] for name in params if name in kwargs}


def keys_read_from_one_argument(model):
    """The string keys a GraphModule with one placeholder reads from it (``input['x']``);
    empty for any other model, whose input names are free (``{"data": shape}`` for
    ``forward(self, x)`` names the ONNX input)."""
    graph = getattr(model, "graph", None)
    if graph is None:
        return set()
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        return set()
    def reads_a_key(user):  # input['x'] or input.get('x')
        return (user.op == "call_function" and user.target is operator.getitem) or \
            (user.op == "call_method" and user.target == "get")
    return {user.args[1] for user in placeholders[0].users
            if reads_a_key(user) and len(user.args) > 1 and isinstance(user.args[1], str)}


def flatten(value, prefix=""):
    """``[(dotted name, tensor)]`` of the tensors in nested dicts / lists / tuples, in the order
    torch's exporters flatten them (dicts in insertion order)."""
    if isinstance(value, torch.Tensor):
        return [(prefix or "output", value)]
    items = value.items() if isinstance(value, dict) else enumerate(value) \
        if isinstance(value, (list, tuple)) else ()
    out = []
    for key, item in items:
        out += flatten(item, f"{prefix}.{key}" if prefix else str(key))
    return out


def export_copy(model):
    """The model convert_deploy exports: a deep copy (graph included) in eval mode with every
    observer off, so calibration statistics cannot move during tracing."""
    copied = copy.deepcopy(model)  # GraphModule.__deepcopy__ copies the graph too
    copied.eval()
    for m in copied.modules():
        if isinstance(m, QuantizeBase):
            m.disable_observer()
    return copied


def format_opset(model):
    """The ONNX opset the model's format fake quantizers need (docs/formats.md,
    docs/formats-mx.md), or None: FP8 writes QuantizeLinear with a float8 zero point (opset 19),
    group-wise quantization blocked Q/DQ (21), MXFP8 blocked FLOAT8E4M3FN Q/DQ (21), MXFP4 and
    NVFP4 FLOAT4E2M1 (23). The deploy passes read and translate each of them."""
    from mqbench.onnx.formats import BLOCK_OPSET, FP8_OPSET
    from mqbench.onnx.mx import MX_OPSETS, NVFP4_OPSET
    from mqbench.fake_quantize.fp8 import FP8FakeQuantize, LearnableFP8FakeQuantize
    from mqbench.fake_quantize.group import GroupFakeQuantize, LearnableGroupFakeQuantize
    from mqbench.fake_quantize.mx import MXFakeQuantize, NVFP4FakeQuantize
    refuse_mxfp6(model)
    opsets = []
    for m in model.modules():
        if isinstance(m, MXFakeQuantize):
            opsets.append(MX_OPSETS[m.format][0])
        elif isinstance(m, NVFP4FakeQuantize):
            opsets.append(NVFP4_OPSET)
        elif isinstance(m, (GroupFakeQuantize, LearnableGroupFakeQuantize)):
            opsets.append(BLOCK_OPSET)
        elif isinstance(m, (FP8FakeQuantize, LearnableFP8FakeQuantize)):
            opsets.append(FP8_OPSET)
    return max(opsets, default=None)


def refuse_mxfp6(model):
    """Raises mqbench.onnx.mx.NO_FP6_EXPORT's ValueError, naming the fake quantizer, for a model
    with an MXFP6 fake quantizer: no ONNX model these exporters write holds FP6 elements."""
    from mqbench.fake_quantize.mx import MXFakeQuantize
    from mqbench.onnx.mx import refuse_mxfp6
    for name, m in model.named_modules():
        if isinstance(m, MXFakeQuantize):
            refuse_mxfp6(m.format, f"fake quantizer {name!r}")
