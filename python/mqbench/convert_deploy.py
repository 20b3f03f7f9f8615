"""Deploy a prepared model to a backend's files (``mqbench.convert_deploy``).

::

    from mqbench.convert_deploy import convert_deploy
    convert_deploy(model.eval(), BackendType.Tensorrt, {"x": [1, 3, 224, 224]},
                   output_path="out", model_name="resnet18")
    # out/resnet18.onnx (fake-quantized), out/resnet18_deploy_model.onnx,
    # out/resnet18_clip_ranges.json, out/resnet18_calib.cache (TensorRT's calibration cache)

Each backend runs its registered steps in order (``BACKEND_DEPLOY_FUNCTION``, MQBench's table):
``convert_merge_bn`` (BatchNorm folded into the weights), ``convert_onnx`` (``torch.onnx.export``
with mqbench's fake-quantize nodes: the TorchScript exporter at opset 13, or with ``dynamo=True``
the dynamo exporter at opset 18), then the backend's C++ translator, which removes or rewrites
the fake-quantize nodes and writes MQBench's files (docs/deploy.md lists them).
Every file is written atomically. The caller's model is not modified.
"""
import importlib.util
import os
import threading

import torch

from mqbench import _C
from mqbench._deploy_export import (OPSET, dict_parameter, export_bytes, export_copy,
                                    refuse_mxfp6)
from mqbench.fake_quantize.quantize_base import QuantizeBase
from mqbench.fusion_method import convert_merge_bn
from mqbench.onnx.symbolic import use_dynamo
from mqbench.prepare_by_platform import BackendType
from mqbench.utils.arguments import check_arg
from mqbench.utils.logger import log_deploy_notes, log_deploy_passes, logger
from mqbench.utils.module_types import parameter_holders
from mqbench.utils.registry import BACKEND_DEPLOY_FUNCTION, register_deploy_function
from mqbench.utils.state import warn_uncalibrated

__all__ = ["convert_deploy", "convert_merge_bn", "convert_onnx", "convert_onnx_qlinear",
           "deploy_qparams_tensorrt", "deploy_qparams_snpe", "deploy_qparams_pplw8a16",
           "deploy_qparams_ppl_cuda", "deploy_qparams_nnie", "deploy_qparams_vitis",
           "deploy_qparams_openvino", "deploy_qparams_tvm", "deploy_qparams_tengine",
           "deploy_qparams_stpu", "deploy_qparams_qdq", "deploy_qparams_academic",
           "qmin_max_dict", "export_copy", "OPSET"]


#: ``{ONNX node name: (quant_min, quant_max)}`` of the last exported model, as MQBench main's
#: global of the same name. Unlike MQBench it is cleared by every ``convert_onnx`` (stale entries
#: from another model cannot leak in).
qmin_max_dict = {}


class _PendingSet(threading.local):
    """The files of the convert_deploy running in this thread, held until its last step:
    ``convert_onnx``'s ``<model_name>.onnx`` and the translators' files are committed together
    by one ``_C.deploy_write`` (one transaction: a failed deploy leaves the folder's old set
    whole, the intermediate export included)."""

    def __init__(self):
        self.directory = None  # None: no convert_deploy is collecting, steps write at once
        self.files = {}

    def holds(self, path):
        directory, name = os.path.split(path)
        return self.directory is not None and \
            os.path.realpath(directory or ".") == self.directory

    def commit(self):
        files, self.files = self.files, {}
        return _C.deploy_write(self.directory, files) if files else []


_pending = _PendingSet()


def _read_model(onnx_model_path):
    if _pending.holds(onnx_model_path):
        name = os.path.basename(onnx_model_path)
        if name in _pending.files:
            return _pending.files[name]
    with open(onnx_model_path, "rb") as f:
        return f.read()


def _translate(translator, onnx_model_path, model_name, output_path, deploy_to_qlinear=False,
               allow_float_layers=False):
    model_bytes = _read_model(onnx_model_path)
    passes = []
    if _pending.holds(os.path.join(output_path, model_name)):
        files, notes = _C.deploy_translate(model_bytes, translator, model_name, deploy_to_qlinear,
                                           passes=passes, allow_float_layers=allow_float_layers)
        _pending.files.update(files)
        written = [os.path.join(output_path, name) for name in files]
    else:
        written, notes = _C.deploy_run(model_bytes, translator, model_name, output_path,
                                       deploy_to_qlinear, passes=passes,
                                       allow_float_layers=allow_float_layers)
        for path in written:
            logger.info(f"wrote {path}")
    log_deploy_passes(passes)
    log_deploy_notes(notes)  # a "warning: " note (allowed float layers) at WARNING
    from mqbench.deploy._runtime import warn_fp8_quantize_after_relu
    for path in written:  # Note [onnxruntime drops a Relu before an FP8 QuantizeLinear]
        if path.endswith(".onnx"):
            warn_fp8_quantize_after_relu(path, _read_model(path))
    return written


# Note [Deployed weights on their grid]
# A weight Q/DQ pair in ONNX rounds w / s; our fake-quantize kernels round w * (1 / s) (MQBench's
# arithmetic). The two differ for a weight within an ulp of a rounding tie, and such a weight
# deploys one level away from the one the fake-quant model computed with. One level is small at
# 8 bits, but at 4 bits it is a whole step. On a tiny Llama with AWQ's float INT4 weights, 10 of
# 4096 weights of the first layer moved and the logits differed by 0.5 %. A model's weights
# are rewritten for the export as the weight quantizer's output (the dequantized grid values),
# so the file's Q/DQ pairs find exactly the levels the fake-quant model used, for every backend
# and format that keeps the quantizers in its file: the Q/DQ ones (Academic, Academic_NLP,
# Tensorrt_NLP, QDQ), ONNX_QNN (QLinear ops, weights quantized with the quantizer's qparams) and
# OPENVINO (FakeQuantize nodes). The float backends (Tensorrt, SNPE, PPL*, NNIE, Vitis, Tengine,
# STPU) keep MQBench's clipped float weights: their toolchains quantize the weights again with
# scales of their own, and a pre-rounded weight would be rounded twice (torchvision's
# shufflenet on Tensorrt: cosine 0.957, where the sweep asks for more than 0.999, when it was
# tried). ``convert_deploy`` exports under ``_WeightsOnTheirGrid`` for the former; the
# originals come back after the export. Left alone: a module whose forward rescales the weight
# before its quantizer (a fused BatchNorm before ``convert_merge_bn``), a module of a user's class,
# and a weight held by several modules (an embedding table tied to the head): the other holder may
# read it float, or through another quantizer.
_GRID_WEIGHT_TYPES = (torch.nn.Linear, torch.nn.modules.conv._ConvNd, torch.nn.Embedding)
_GRID_WEIGHT_TRANSLATORS = ("academic", "tensorrt_nlp", "qdq", "onnx_qnn", "openvino")


def _grid_weights(backend_type):
    """Whether ``backend_type``'s files keep the quantizers (Note [Deployed weights on their
    grid]): its translator is one of ``_GRID_WEIGHT_TRANSLATORS``."""
    try:
        return _C.get_backend(backend_type.value)["deploy_translator"] in \
            _GRID_WEIGHT_TRANSLATORS
    except Exception:  # noqa: BLE001  (a backend only the Python registry knows)
        return False


def _weight_on_grid(mod):
    fq = getattr(mod, "weight_fake_quant", None)
    w = getattr(mod, "weight", None)
    return isinstance(fq, QuantizeBase) and isinstance(w, torch.nn.Parameter) and \
        isinstance(mod, _GRID_WEIGHT_TYPES) and getattr(mod, "bn", None) is None and \
        type(mod).__module__.startswith(("mqbench.nn.", "torch.")) and \
        bool(fq.fake_quant_enabled[0] == 1)


class _WeightsOnTheirGrid(object):
    """``with _WeightsOnTheirGrid(model):`` each quantized weight replaced by its quantizer's
    output (Note [Deployed weights on their grid]), the originals restored on exit."""

    def __init__(self, model):
        self.model = model
        self._saved = []

    def __enter__(self):
        try:
            self._swap()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _swap(self):
        mods = [m for m in self.model.modules() if _weight_on_grid(m)]
        users = parameter_holders(self.model)  # quantized or not (a tied embedding)
        with torch.no_grad():
            for m in mods:
                if users[id(m.weight)] != 1:
                    continue
                fq = m.weight_fake_quant
                observing = bool(fq.observer_enabled[0] == 1)
                fq.enable_observer(False)  # computing the grid values must not observe
                try:
                    q = fq(m.weight)
                finally:
                    fq.enable_observer(observing)
                if q.shape == m.weight.shape and q.dtype == m.weight.dtype and \
                        bool(torch.isfinite(q).all()):
                    self._saved.append((m.weight, m.weight.data))
                    m.weight.data = q.detach().clone()

    def __exit__(self, *exc):
        for param, data in self._saved:
            param.data = data
        self._saved = []
        return False


def convert_onnx(model, input_shape_dict=None, dummy_input=None, onnx_model_path=None,
                 input_names=None, output_names=None, dynamic_axes=None, dynamo=None, **kwargs):
    """Exports ``model`` with its fake-quantize nodes to ``onnx_model_path``.

    Without ``dummy_input``, inputs are ``torch.rand(shape)`` for each ``input_shape_dict`` entry,
    named after its keys (the model's forward() parameter names). ``dynamo`` picks the exporter
    as :func:`mqbench.onnx.export_onnx` does: False for the TorchScript one
    (opset ``OPSET``, 13), True for the dynamo one (opset 18), None for TorchScript while torch
    has it, and the dynamo one for a model TorchScript refuses (logged)."""
    if dummy_input is None:
        if not input_shape_dict:
            raise ValueError("convert_onnx needs input_shape_dict ({name: shape}) or dummy_input")
        device = next((p.device for p in model.parameters()), torch.device("cpu"))
        dummy_input = {name: torch.rand(shape, device=device)
                       for name, shape in input_shape_dict.items()}
        if dict_parameter(model, dummy_input) is None:  # one tensor per forward() parameter
            dummy_input = tuple(dummy_input.values())
            if input_names is None:
                input_names = list(input_shape_dict.keys())
    model_bytes = export_bytes(model, dummy_input, input_names, output_names, dynamic_axes,
                                dynamo)
    qmin_max_dict.clear()
    for fq in _C.deploy_fake_quant_params(model_bytes):
        if not fq["nnie"] and fq["format"] == "int":  # FP8 has no integer range
            qmin_max_dict[fq["name"]] = (fq["quant_min"], fq["quant_max"])
    directory, name = os.path.split(onnx_model_path)
    if _pending.holds(onnx_model_path):  # committed with the translator's files
        _C.deploy_check_file_name(name, "onnx_model_path's file name")
        _pending.files[name] = model_bytes
        return
    _C.deploy_write(directory or ".", {name: model_bytes})
    logger.info(f"wrote {onnx_model_path}")


def convert_onnx_qlinear(model, onnx_model_path, model_name, output_path, deploy_to_qlinear=False,
                         **kwargs):
    """Tensorrt with ``deploy_to_qlinear``: writes ``onnx_quantized_model.onnx``, the QDQ model
    (8-bit symmetric only), as MQBench 1.10's ONNXQLinearPass."""
    if deploy_to_qlinear:
        _translate("tensorrt_qlinear", onnx_model_path, model_name, output_path)


def _deploy_step(translator, doc, float_layers=False):
    def step(model, onnx_model_path, model_name, output_path, **kwargs):
        # the Tensorrt steps (float_layers) take convert_deploy's allow_float_layers
        allow = bool(kwargs.get("allow_float_layers", False)) if float_layers else False
        _translate(translator, onnx_model_path, model_name, output_path, allow_float_layers=allow)
    step.__doc__ = doc
    step.mqbench_translator = translator  # one of ours: its files join convert_deploy's set
    return step


deploy_qparams_tensorrt = _deploy_step(
    "tensorrt", "Tensorrt: <name>_deploy_model.onnx + <name>_clip_ranges.json + <name>_calib.cache "
    "(TensorRT's calibration cache); float layers refused unless allow_float_layers.", True)
deploy_qparams_snpe = _deploy_step("snpe", "SNPE: <name>_deploy_model.onnx + <name>_clip_ranges.json (encodings).")
deploy_qparams_pplw8a16 = _deploy_step(
    "pplw8a16", "PPLW8A16: <name>_deploy_model.onnx + <name>_clip_ranges.json.")
deploy_qparams_ppl_cuda = _deploy_step(
    "pplcuda", "PPLCUDA: <name>_deploy_model.onnx + text clip ranges.")
deploy_qparams_nnie = _deploy_step("nnie", "NNIE: <name>_deploy_model.onnx + <name>_gfpq_param_dict.json.")
deploy_qparams_vitis = _deploy_step("vitis", "Vitis: <name>_deploy_model.onnx + <name>_clip_ranges.json.")
deploy_qparams_openvino = _deploy_step("openvino", "OPENVINO: <name>_deploy_model.onnx with FakeQuantize nodes.")
deploy_qparams_tvm = _deploy_step("onnx_qnn", "ONNX_QNN: <name>.onnx with QLinear ops.")
deploy_qparams_tengine = _deploy_step("tengine_u8", "Tengine_u8: <name>_for_tengine.onnx + .scale.")
deploy_qparams_stpu = _deploy_step("stpu", "STPU: <name>_for_stpu.onnx + <name>_stpu_minmax.json.")
deploy_qparams_qdq = _deploy_step("qdq", "QDQ: <name>.onnx with standard QuantizeLinear/DequantizeLinear.")
deploy_qparams_academic = _deploy_step(
    "academic", "Academic: <name>.onnx as QDQ (mqbench's nodes kept where a range has no QDQ form).")
deploy_qparams_tensorrt_nlp = _deploy_step(
    "tensorrt_nlp", "Tensorrt_NLP: Academic's <name>.onnx; float layers refused unless "
    "allow_float_layers.", True)

_PIPELINES = [
    (BackendType.Tensorrt, [convert_merge_bn, convert_onnx, convert_onnx_qlinear, deploy_qparams_tensorrt]),
    (BackendType.SNPE, [convert_merge_bn, convert_onnx, deploy_qparams_snpe]),
    (BackendType.PPLW8A16, [convert_merge_bn, convert_onnx, deploy_qparams_pplw8a16]),
    (BackendType.PPLCUDA, [convert_merge_bn, convert_onnx, deploy_qparams_ppl_cuda]),
    (BackendType.NNIE, [convert_merge_bn, convert_onnx, deploy_qparams_nnie]),
    (BackendType.Vitis, [convert_merge_bn, convert_onnx, deploy_qparams_vitis]),
    (BackendType.OPENVINO, [convert_merge_bn, convert_onnx, deploy_qparams_openvino]),
    (BackendType.ONNX_QNN, [convert_merge_bn, convert_onnx, deploy_qparams_tvm]),
    (BackendType.Tengine_u8, [convert_merge_bn, convert_onnx, deploy_qparams_tengine]),
    (BackendType.STPU, [convert_merge_bn, convert_onnx, deploy_qparams_stpu]),
    (BackendType.QDQ, [convert_merge_bn, convert_onnx, deploy_qparams_qdq]),
    (BackendType.Academic, [convert_onnx, deploy_qparams_academic]),
    (BackendType.Academic_NLP, [convert_onnx, deploy_qparams_academic]),
    (BackendType.Tensorrt_NLP, [convert_onnx, deploy_qparams_tensorrt_nlp]),
]
_OWN_STEPS = frozenset(step for _, steps in _PIPELINES for step in steps)
for _backend, _steps in _PIPELINES:
    for _step in _steps:
        register_deploy_function(_backend)(_step)


def _steps(backend_type):
    if backend_type in BACKEND_DEPLOY_FUNCTION:
        return BACKEND_DEPLOY_FUNCTION[backend_type]
    # A backend registered at run time with a deploy_translator deploys like the built-ins.
    translator = _C.get_backend(backend_type.value)["deploy_translator"] \
        if isinstance(backend_type, BackendType) else ""
    if translator:
        return [convert_merge_bn, convert_onnx,
                _deploy_step(translator, f"{backend_type.value}: translator {translator}.")]
    raise KeyError(f"no deploy functions are registered for {backend_type}; register them with "
                   f"mqbench.utils.registry.register_deploy_function, or give the backend a "
                   f"deploy_translator")


def _check_prepared(model):
    if isinstance(model, (torch.nn.DataParallel, torch.nn.parallel.DistributedDataParallel)):
        raise TypeError(f"convert_deploy got a {type(model).__name__}; deploy the prepared model "
                        "it wraps: convert_deploy(model.module, ...) (on one rank)")
    if not isinstance(model, torch.fx.GraphModule):
        raise TypeError(f"convert_deploy needs the GraphModule returned by prepare_by_platform, "
                        f"got {type(model).__name__}")
    if not any(isinstance(m, QuantizeBase) for m in model.modules()):
        raise ValueError("the model has no fake quantizers: it was not prepared. Call "
                         "mqbench.prepare_by_platform.prepare_by_platform(model, backend) and "
                         "calibrate it before convert_deploy")


def convert_deploy(model, backend_type, input_shape_dict=None, dummy_input=None, output_path="./",
                   model_name="mqbench_qmodel", deploy_to_qlinear=False, *, dynamo=None,
                   allow_float_layers=False, check_inputs=None, **extra_kwargs):
    """Deploys a prepared, calibrated (or trained) model for ``backend_type``.

    Args:
        model: the ``GraphModule`` from ``prepare_by_platform``; it is deep-copied, put in eval
            mode with observers off, and the copy is deployed.
        input_shape_dict: ``{forward() parameter name: shape}``; random inputs of these shapes
            drive the export. Or give ``dummy_input`` (a tensor or tuple of tensors).
        output_path: directory for every file (created if needed; checked before any work).
        model_name: the file name stem: one file name (1-200 characters, no ``/``, no NUL byte,
            not ``.`` or ``..``), so every file lands inside ``output_path``.
        deploy_to_qlinear: Tensorrt: also write the QDQ model ``onnx_quantized_model.onnx``.
        dynamo: the ONNX exporter (keyword only; not in MQBench): False for torch's TorchScript
            exporter (opset 13), True for its dynamo exporter (opset 18, needs ``onnxscript``),
            None (default) for TorchScript while torch has it, and the dynamo exporter for a
            model the TorchScript one refuses (logged). Every backend writes the same files and
            values from both; node and tensor names differ (docs/deploy.md).
        allow_float_layers: Tensorrt and Tensorrt_NLP (keyword only; not in MQBench): deploy a
            model in which a layer's weight is quantized but its input is not, which TensorRT
            runs in float; a warning names those layers. False (default): such a model raises
            ``ValueError`` naming each layer and its weight. Other backends ignore it.
        check_inputs: inputs of the model (a tensor, a tuple in forward()'s order, or a dict by
            name; keyword only, not in MQBench). When given, the deployed file is checked
            against the model layer by layer before anything is written
            (:func:`mqbench.deploy.check_deploy`; docs/deploy.md, "When the deployed model
            disagrees"): the table is logged, and a file that departs beyond tolerance raises
            ``mqbench.deploy.check.DeployCheckError`` naming the first layer, with nothing
            written. The float backends' files hold no quantizer (their toolchains quantize
            from the ranges file): for them the fake-quant export is checked, and Tensorrt's
            QDQ model when ``deploy_to_qlinear`` writes it.
        extra_kwargs: ``input_names``, ``output_names``, ``dynamic_axes`` for the export
            (MQBench main drops them).

    Returns the paths written (MQBench returns None).
    """
    check_arg(convert_deploy, "backend_type", backend_type,
              lambda v: isinstance(v, BackendType), "a BackendType member")
    check_arg(convert_deploy, "input_shape_dict", input_shape_dict,
              lambda v: v is None or isinstance(v, dict), "a dict {input name: shape} or None")
    check_arg(convert_deploy, "dummy_input", dummy_input,
              lambda v: v is None or isinstance(v, (torch.Tensor, tuple, list, dict)),
              "a tensor, a tuple of inputs, a dict (one dict argument) or None")
    check_arg(convert_deploy, "output_path", output_path,
              lambda v: isinstance(v, (str, os.PathLike)), "a directory path (str)")
    check_arg(convert_deploy, "deploy_to_qlinear", deploy_to_qlinear,
              lambda v: isinstance(v, int) and v in (0, 1), "a bool")
    check_arg(convert_deploy, "allow_float_layers", allow_float_layers,
              lambda v: isinstance(v, int) and v in (0, 1), "a bool")
    output_path = os.fspath(output_path)
    steps = _steps(backend_type)
    _check_prepared(model)
    refuse_mxfp6(model)  # before any work: MXFP6 has no ONNX form (docs/formats-mx.md)
    if input_shape_dict is None and dummy_input is None:
        raise ValueError("convert_deploy needs input_shape_dict ({name: shape}) or dummy_input")
    unknown = set(extra_kwargs) - {"input_names", "output_names", "dynamic_axes"}
    if unknown:
        raise TypeError(f"convert_deploy got unexpected keyword arguments {sorted(unknown)}")
    if not isinstance(model_name, str):
        raise TypeError(f"model_name must be a str, got {type(model_name).__name__}")
    use_dynamo(dynamo)  # a bad value or an exporter this torch lacks fails before any work
    _C.deploy_check_file_name(model_name, "model_name")  # before any work, as the path below
    _C.deploy_check_output_dir(output_path)  # an unwritable path fails before any work
    deploy_model = export_copy(model)
    warn_uncalibrated(deploy_model, "convert_deploy")
    kwargs = dict(input_shape_dict=input_shape_dict, dummy_input=dummy_input,
                  output_path=output_path, model_name=model_name,
                  onnx_model_path=os.path.join(output_path, model_name + ".onnx"),
                  deploy_to_qlinear=deploy_to_qlinear, **extra_kwargs)
    if dynamo is not None:  # only when asked: deploy functions registered by users keep their kwargs
        kwargs["dynamo"] = dynamo
    if allow_float_layers:  # likewise; read by the Tensorrt steps only
        kwargs["allow_float_layers"] = True
    before = _listing(output_path)
    if _pending.directory is not None:
        raise RuntimeError("convert_deploy called from inside a deploy step of another "
                           "convert_deploy in the same thread")
    _pending.directory = os.path.realpath(output_path)
    reference = None
    try:
        for step in steps:
            if step not in _OWN_STEPS and not hasattr(step, "mqbench_translator"):
                # a user's step may read the files from the folder: commit what is pending
                _commit_pending()
            if step is convert_onnx and _grid_weights(backend_type):
                with _WeightsOnTheirGrid(deploy_model):  # Note [Deployed weights on their grid]
                    step(deploy_model, **kwargs)
            else:
                step(deploy_model, **kwargs)
            if step is convert_onnx:  # the fake-quant export: the check's map of the tensors
                reference = _pending.files.get(model_name + ".onnx")
        if check_inputs is not None:  # before anything is written: a bad file never lands
            _check_deployed(model, backend_type, output_path, model_name, reference,
                            check_inputs)
        _commit_pending()
    finally:
        _pending.directory, _pending.files = None, {}
    return sorted(p for p, t in _listing(output_path).items() if before.get(p) != t)


def _checked_file(backend_type, model_name):
    """(file name, runtime, note) of the file ``convert_deploy``'s check runs: the file itself
    for the backends whose files keep the quantizers, the fake-quant export for the float
    backends (their quantization is the vendor's, from the ranges file)."""
    try:
        translator = _C.get_backend(backend_type.value)["deploy_translator"]
    except Exception:  # noqa: BLE001  (a backend only the Python registry knows)
        translator = ""
    pending = _pending.files
    if translator in ("qdq", "academic", "tensorrt_nlp", "onnx_qnn"):
        return model_name + ".onnx", "onnxruntime", None
    if translator == "openvino":
        # in OpenVINO where it is installed, else its FakeQuantize nodes emulated in onnxruntime
        runtime = "openvino" if importlib.util.find_spec("openvino") is not None else \
            "onnxruntime"
        return model_name + "_deploy_model.onnx", runtime, None
    if translator == "tensorrt" and "onnx_quantized_model.onnx" in pending:
        return "onnx_quantized_model.onnx", "onnxruntime", None
    hint = " (deploy_to_qlinear=True also writes the QDQ model, which the check runs)" \
        if translator == "tensorrt" else ""
    return model_name + ".onnx", "onnxruntime", (
        f"{backend_type.value}'s deploy model is float: its toolchain quantizes it from the "
        f"ranges file, which no runtime here runs. Checked: the fake-quant export "
        f"{model_name}.onnx{hint}")


def _check_deployed(model, backend_type, output_path, model_name, reference, inputs):
    """convert_deploy's check_inputs: the deployed file against the model, layer by layer
    (mqbench.deploy.check); the table is logged, a departure raises DeployCheckError."""
    from mqbench.deploy.check import DeployCheckError, check_deploy
    name, runtime, note = _checked_file(backend_type, model_name)
    if note:
        logger.info(note)
    data = _read_model(os.path.join(output_path, name))
    report = check_deploy(model, data, inputs, runtime=runtime, reference=reference)
    report.file = name
    if not report.ok:
        row = report.first_divergent_row
        raise DeployCheckError(
            f"convert_deploy: the deployed {name} departs from the model at layer "
            f"'{row.layer}' ({row.kind}, tensor '{row.tensor}'): {row.beyond} of {row.numel} "
            f"values beyond tolerance; nothing was written.\n{report}", report)
    logger.info(f"convert_deploy check_inputs:\n{report}")


def _commit_pending():
    for path in _pending.commit():
        logger.info(f"wrote {path}")


def _listing(directory):
    out = {}
    for name in os.listdir(directory):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            out[path] = os.stat(path).st_mtime_ns
    return out
