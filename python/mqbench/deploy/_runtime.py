"""onnxruntime for checking a deployed model against the fake-quant model (private).

::

    from mqbench.deploy._runtime import onnxruntime_session
    sess = onnxruntime_session(open("out/onnx_quantized_model.onnx", "rb").read())
    y = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})[0]

A leaf module: it imports numpy and onnx, and onnxruntime when a session is made; never torch
(nor ``mqbench.utils.logger``: importing any ``mqbench`` module runs ``mqbench/__init__``, which
loads torch and libmqbench). Its logger is the ``MQBENCH`` logger, by name.
"""
import functools
import logging
import os
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = ["ORT_FP8_RELU_FAULT", "fp8_quantize_after_relu", "onnxruntime_session",
           "warn_fp8_quantize_after_relu"]

logger = logging.getLogger("MQBENCH")

# Note [onnxruntime drops a Relu before an FP8 QuantizeLinear]
# onnxruntime's rewrite rule "ReluQuantRewrite" (class ReluQuantFusion,
# onnxruntime/core/optimizer/qdq_transformer/relu_quantizelinear.cc; a rule of
# "Level2_RuleBasedTransformer", so it runs from ORT_ENABLE_EXTENDED on, the default level
# included) removes a Relu whose only consumer is a per-tensor QuantizeLinear with a constant
# zero point, on the reasoning that the quantization clamps negatives to the zero point anyway.
# That holds for the integer zero points it checks (int8 -128, uint8 0; int16 / uint16 likewise)
# and for no float8 one: FLOAT8E4M3FN / E5M2 are signed with no clamp at 0, yet a float8 zero
# point is not checked at all and the Relu goes. Negative values then reach the QuantizeLinear
# and come out of its DequantizeLinear negative.
# Seen with onnxruntime 1.32.0 (CPU EP, x86-64). Evidence (tests/python/deploy/
# test_runtime_fp8_relu.py; docs/deploy.md, "onnxruntime notes: a Relu dropped before an FP8
# QuantizeLinear"):
#   * a Linear-ReLU-Linear MLP deployed by convert_deploy to Tensorrt with FP8 (E4M3) weights and
#     activations: at the default level its output is 92.5% away from the fake-quant model's
#     (relative L2); at ORT_ENABLE_BASIC, or with this rule disabled alone, 8.6e-8;
#   * the optimized graph that onnxruntime writes (SessionOptions.optimized_model_filepath) at
#     the extended level has no Relu;
#   * disabling, one at a time, QDQS8ToU8Transformer, QDQPropagationTransformer,
#     QDQSelectorActionTransformer, QDQFinalCleanupTransformer, DoubleQDQPairsRemover,
#     ConstantFolding or Level1_RuleBasedTransformer leaves the fault; "ReluQuantRewrite" (or the
#     whole Level2_RuleBasedTransformer) removes it;
#   * on Relu -> QuantizeLinear -> DequantizeLinear alone: a FLOAT8E4M3FN or FLOAT8E5M2 zero point
#     (an initializer or a Constant node, opset 19, 21 or 23) loses the Relu; an INT4 zero point 0
#     does too; int8, uint8, int16 and uint16 zero points 0 keep it; a float8 QuantizeLinear
#     without a zero point input (output_dtype only), with a per-channel zero point, or whose Relu
#     has a second consumer keeps it.
# The deployed file is right (the fake-quant model computes it, onnxruntime at ORT_ENABLE_BASIC
# too); the runtime is wrong. onnxruntime_session disables the rule by name; onnxruntime ignores
# a name it does not know, so a probe model proves the fix works in the installed onnxruntime,
# and otherwise the session runs at ORT_ENABLE_BASIC (or, where even that drops the Relu, with
# no graph optimization). convert_deploy and the mqbench.deploy steps warn when a file they
# write has such a node (warn_fp8_quantize_after_relu).
ORT_FP8_RELU_FAULT = ("ReluQuantRewrite",)

#: The zero-point types of FP8 QuantizeLinear nodes (FNUZ kinds included: the rule does not
#: check them either).
_FLOAT8_TYPES = frozenset({TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                           TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ})

_DOCS = 'docs/deploy.md, "onnxruntime notes: a Relu dropped before an FP8 QuantizeLinear"'


def _model_proto(model):
    """A ModelProto from serialized bytes or a ModelProto."""
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray, memoryview)):
        return onnx.load_from_string(bytes(model))
    raise TypeError(f"model must be serialized ONNX bytes or an onnx.ModelProto, got "
                    f"{type(model).__name__}")


def _is_default_domain(node):
    return node.domain in ("", "ai.onnx")


def fp8_quantize_after_relu(model):
    """The FP8 QuantizeLinear nodes whose Relu onnxruntime's optimizer drops (Note [onnxruntime
    drops a Relu before an FP8 QuantizeLinear]).

    A node is listed when it reads the output of a Relu that has no other consumer and is no
    graph output, and its zero point is one float8 value (an initializer or a Constant node).
    FP8 QuantizeLinear nodes that onnxruntime 1.32 leaves alone are not listed: without a zero
    point input (``output_dtype`` only), with a per-channel zero point, or after a Relu read
    elsewhere too. The main graph is searched (the deploy passes write no subgraphs).

    Args:
        model: serialized ONNX bytes or an ``onnx.ModelProto``.

    Returns:
        list[str]: the nodes' names (a nameless node by its output), in graph order; ``[]``
        when there are none.

    Example::

        fp8_quantize_after_relu(open("out/onnx_quantized_model.onnx", "rb").read())
        # ['/_0_post_act_fake_quantizer/QuantizeLinear_quantized']
    """
    graph = _model_proto(model).graph
    zero_point_types = {t.name: (t.data_type, int(np.prod(t.dims, dtype=np.int64)))
                        for t in graph.initializer}
    consumers = {}
    producers = {}
    for node in graph.node:
        for name in node.input:
            if name:
                consumers[name] = consumers.get(name, 0) + 1
        for name in node.output:
            producers[name] = node
        if node.op_type == "Constant" and _is_default_domain(node):
            value = next((a.t for a in node.attribute if a.name == "value"), None)
            if value is not None:
                zero_point_types[node.output[0]] = (value.data_type,
                                                    int(np.prod(value.dims, dtype=np.int64)))
    graph_outputs = {o.name for o in graph.output}
    found = []
    for node in graph.node:
        if node.op_type != "QuantizeLinear" or not _is_default_domain(node) or \
                len(node.input) < 3 or not node.input[2]:
            continue
        relu = producers.get(node.input[0])
        if relu is None or relu.op_type != "Relu" or not _is_default_domain(relu) or \
                consumers.get(node.input[0]) != 1 or node.input[0] in graph_outputs:
            continue
        if zero_point_types.get(node.input[2], (None, 0))[0] in _FLOAT8_TYPES and \
                zero_point_types[node.input[2]][1] == 1:
            found.append(node.name or node.output[0])
    return found


def _import_onnxruntime():
    try:
        import onnxruntime
    except ImportError as e:
        raise ImportError(f"onnxruntime is needed to run a deployed model ({e}): "
                          f"pip install onnxruntime") from e
    return onnxruntime


def _probe_model():
    """Relu -> QuantizeLinear (FLOAT8E4M3FN zero point) -> DequantizeLinear, scale 1: for x on
    [-1, 1], y on [0, 1] where the Relu is kept and on [-1, 1] where it is dropped."""
    h = helper
    graph = h.make_graph(
        [h.make_node("Relu", ["x"], ["r"]),
         h.make_node("QuantizeLinear", ["r", "s", "z"], ["q"]),
         h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])],
        "relu_fp8_probe", [h.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [h.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [h.make_tensor("s", TensorProto.FLOAT, [], [1.0]),
         h.make_tensor("z", TensorProto.FLOAT8E4M3FN, [], [0])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 19)])
    model.ir_version = 9  # onnxruntime 1.16, the first with FP8 QuantizeLinear on CPU
    return model.SerializeToString()


def _workarounds(ort, names):
    """The ways to keep the Relu, in order of preference: (disabled optimizers, highest level)."""
    return [(tuple(names), None), ((), ort.GraphOptimizationLevel.ORT_ENABLE_BASIC),
            ((), ort.GraphOptimizationLevel.ORT_DISABLE_ALL)]


@functools.lru_cache(maxsize=None)
def _workaround(names):
    """(disabled optimizers, level cap or None, fault seen): the first of ``_workarounds`` that the
    probe model shows keeping its Relu in the installed onnxruntime, and whether the default
    level drops it there. Where the probe cannot run (an onnxruntime without FP8), the first."""
    ort = _import_onnxruntime()
    data = _probe_model()
    x = np.array([-1.0, 1.0], dtype=np.float32)

    def relu_kept(disabled=(), level=None):
        so = ort.SessionOptions()
        so.log_severity_level = 3
        so.intra_op_num_threads = 1
        if level is not None:
            so.graph_optimization_level = level
        sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"],
                                    disabled_optimizers=list(disabled))
        return float(sess.run(None, {"x": x})[0][0]) == 0.0

    try:
        fault = not relu_kept()
        for disabled, level in _workarounds(ort, names):
            if relu_kept(disabled, level):
                return disabled, level, fault
    except Exception:  # noqa: BLE001  (no FP8 kernels here: no FP8 model runs either)
        return tuple(names), None, False
    raise RuntimeError("onnxruntime drops the Relu before an FP8 QuantizeLinear even with no "
                       "graph optimization")


def onnxruntime_session(model, threads=None, level=None):
    """An onnxruntime CPU ``InferenceSession`` that computes a deployed file as written, for
    checking it against the fake-quant model.

    * onnxruntime's ``ReluQuantRewrite`` rule is disabled (``ORT_FP8_RELU_FAULT``; Note
      [onnxruntime drops a Relu before an FP8 QuantizeLinear]); where disabling it does not keep
      the Relu in the installed onnxruntime, the level is capped at ``ORT_ENABLE_BASIC`` (or at
      ``ORT_DISABLE_ALL`` where that drops it too). A model with such a node says so at INFO on
      the ``MQBENCH`` logger, once per session made.
    * ``session.x64quantprecision`` is 1: onnxruntime's precise quantized GEMM on x86 CPUs
      without VNNI (docs/deploy.md, "Running QDQ models in onnxruntime on older x86 CPUs").

    Args:
        model: serialized ONNX bytes, an ``onnx.ModelProto`` or a path to an ONNX file.
        threads: ``intra_op_num_threads`` (None: onnxruntime's choice).
        level: an ``onnxruntime.GraphOptimizationLevel`` (None: onnxruntime's default,
            ``ORT_ENABLE_ALL``).

    Returns:
        onnxruntime.InferenceSession on ``CPUExecutionProvider``.

    Raises:
        ImportError: onnxruntime is not installed (``pip install onnxruntime``).

    Example::

        sess = onnxruntime_session(data, threads=2)
        y = sess.run(None, {"x": x})[0]
    """
    ort = _import_onnxruntime()
    if isinstance(model, (str, os.PathLike)):
        with open(model, "rb") as f:
            model = f.read()
    data = model.SerializeToString() if isinstance(model, onnx.ModelProto) else bytes(model)
    disabled, cap, fault = _workaround(tuple(ORT_FP8_RELU_FAULT))
    so = ort.SessionOptions()
    so.add_session_config_entry("session.x64quantprecision", "1")
    if threads is not None:
        so.intra_op_num_threads = int(threads)
    if level is not None:
        so.graph_optimization_level = level
    optimizing = int(so.graph_optimization_level) >= \
        int(ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED)
    if cap is not None and int(so.graph_optimization_level) > int(cap):
        so.graph_optimization_level = cap
    if fault and optimizing:
        nodes = fp8_quantize_after_relu(data)
        if nodes:
            how = f"with its {', '.join(disabled)} disabled" if disabled else \
                f"at {so.graph_optimization_level.name}"
            logger.info(f"onnxruntime {ort.__version__} drops the Relu in front of the FP8 "
                        f"QuantizeLinear {_names(nodes)} at its default optimization level; "
                        f"running the model {how} (Note [onnxruntime drops a Relu before an "
                        f"FP8 QuantizeLinear] in mqbench/deploy/_runtime.py)")
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(disabled))


def _names(nodes, shown=5):
    listed = ", ".join(f"'{n}'" for n in nodes[:shown])
    return listed + (f" and {len(nodes) - shown} more" if len(nodes) > shown else "")


#: (path, nodes) already warned of: a file is named once per process (Tensorrt's two
#: translators both write onnx_quantized_model.onnx in one deploy).
_warned = set()


def warn_fp8_quantize_after_relu(path, data, stacklevel=2):
    """Warns (``UserWarning``) when the ONNX file ``path``, whose bytes are ``data``, has FP8
    QuantizeLinear nodes after a Relu (``fp8_quantize_after_relu``): the file is right, and
    onnxruntime's default optimization computes it wrongly (Note [onnxruntime drops a Relu
    before an FP8 QuantizeLinear]). Once per path and nodes in a process; bytes without
    ``Relu`` and ``QuantizeLinear`` in them are not parsed.

    Returns:
        list[str]: the nodes found (``[]``: none, no warning).
    """
    if b"Relu" not in data or b"QuantizeLinear" not in data:
        return []
    nodes = fp8_quantize_after_relu(data)
    if nodes and (str(path), tuple(nodes)) not in _warned:
        _warned.add((str(path), tuple(nodes)))
        warnings.warn(
            f"{path}: the FP8 QuantizeLinear {_names(nodes)} read a Relu's output. The file is "
            f"correct, but onnxruntime's graph optimizer (1.32; from ORT_ENABLE_EXTENDED on, "
            f"so at its default level) drops such a Relu and lets negative values through. Run "
            f"the file in onnxruntime with disabled_optimizers={list(ORT_FP8_RELU_FAULT)} (in "
            f"1.32 also: graph_optimization_level=ORT_ENABLE_BASIC); {_DOCS}",
            UserWarning, stacklevel=stacklevel + 1)
    return nodes
