"""What the ``mqbench.deploy`` steps share (private).

Each step of MQBench's deploy package (``remove_fakequantize_and_collect_params`` and its
variants, ``ONNXQNNPass``, ``ONNXQLinearPass``) is here a class of MQBench's name whose work
is one C++ translator, the same one ``convert_deploy`` runs, so the files are the same byte for
byte. The class splits that work into two overridable halves:

* ``translate(model, model_name, ...)``: runs the translator on a model (a path, serialized
  bytes, an ``onnx.ModelProto`` or an ``ONNXGraph``) and returns ``{file name: bytes}``;
  nothing is written. This is also how to run a step on a model in memory.
* ``write_files(output_dir, files)``: writes them atomically into ``output_dir`` (the input
  file's folder; every name is one file name) and returns the paths.

MQBench's own methods that the translator does inside (clip_weight, merge_relu_pass, ...) are
there with their names; calling one raises ``NotImplementedError`` naming the translator, and
a subclass that overrides one is warned that the override is not called.
``LinearQuantizer_process.post_process_clip_ranges`` (also of Tengine_process and STPU_process)
is the exception: the translator calls an override of it (docs/deploy.md).
"""
import os
import stat
import warnings

import numpy as np
import onnx

from mqbench import _C
from mqbench.utils.logger import log_deploy_passes, logger

#: protobuf parses at most 2 GiB (OnnxGraph::kMaxModelBytes).
MAX_MODEL_BYTES = (1 << 31) - 1


def check_input_path(onnx_path):
    """The path as a str, once it names a regular file of at most MAX_MODEL_BYTES."""
    if not isinstance(onnx_path, (str, os.PathLike)):
        raise TypeError(f"onnx_path must be a path (str or os.PathLike), got "
                        f"{type(onnx_path).__name__}")
    path = os.fspath(onnx_path)
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"ONNX file '{path}' does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"ONNX file '{path}' is not a regular file")
    if st.st_size > MAX_MODEL_BYTES:
        raise ValueError(f"ONNX file '{path}' is {st.st_size} bytes, over protobuf's 2 GiB limit")
    return path


def read_onnx(onnx_path):
    """The bytes of a regular file of at most 2 GiB (not a device, FIFO or folder). The file
    is opened without blocking and checked again through its descriptor, so a path swapped for
    a FIFO after the first check cannot hang the read."""
    path = check_input_path(onnx_path)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ValueError(f"ONNX file '{path}' is not a regular file")
        data = f.read(MAX_MODEL_BYTES + 1)
    if len(data) > MAX_MODEL_BYTES:
        raise ValueError(f"ONNX file '{path}' grew over protobuf's 2 GiB limit while being read")
    return data


def model_bytes(model):
    """Serialized ONNX from a path, bytes, an onnx.ModelProto or an ONNXGraph."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        return bytes(model)
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if hasattr(model, "model") and isinstance(model.model, onnx.ModelProto):  # ONNXGraph
        return model.model.SerializeToString()
    return read_onnx(model)


def check_model_name(model_name):
    """model_name must be one file name, so every file lands in the folder asked for."""
    if not isinstance(model_name, str):
        raise TypeError(f"model_name must be a str, got {type(model_name).__name__}")
    _C.deploy_check_file_name(model_name, "model_name")


def output_dir_of(onnx_path):
    """The folder of the input file: where MQBench's steps write."""
    return os.path.dirname(os.fspath(onnx_path)) or "."


def with_qmin_max(data, qmin_max_dict):
    """MQBench main strips quant_min / quant_max from its QuantizeLinear nodes into
    ``qmin_max_dict`` ({node name: (qmin, qmax)}); they are put back as attributes, which the
    translators read, on the nodes named there that lack them."""
    if not qmin_max_dict:
        return data
    if not isinstance(qmin_max_dict, dict):
        raise TypeError(f"qmin_max_dict must be a dict {{node name: (quant_min, quant_max)}}, got "
                        f"{type(qmin_max_dict).__name__}")
    model = onnx.load_from_string(data)
    changed = False
    for node in model.graph.node:
        if node.name not in qmin_max_dict or any(a.name == "quant_min" for a in node.attribute):
            continue
        try:
            qmin, qmax = (int(v) for v in qmin_max_dict[node.name])
        except (TypeError, ValueError):
            raise ValueError(f"qmin_max_dict['{node.name}'] must be (quant_min, quant_max), got "
                             f"{qmin_max_dict[node.name]!r}") from None
        node.attribute.extend([onnx.helper.make_attribute("quant_min", qmin),
                               onnx.helper.make_attribute("quant_max", qmax)])
        changed = True
    return model.SerializeToString() if changed else data


def parse_qparams(node, name2data, required=True):
    """MQBench's parse_qparams: (tensor name, scale, zero point, qmin, qmax) of a fake-quantize
    node, from ``name2data`` (common.prepare_data) and its trailing inputs or attributes."""
    from mqbench.deploy.common import parse_attrs

    def data(name):
        if name not in name2data:
            raise KeyError(f"'{name}' (an input of node '{node.name}') is not an initializer or a "
                           f"Constant output (torch may leave Identity / Cast nodes in front of "
                           f"quantization parameters; the deploy translators fold them)")
        return name2data[name]

    if len(node.input) < 3:
        raise ValueError(f"node '{node.name}' ({node.op_type}) has {len(node.input)} inputs; a "
                         f"fake-quantize node has x, scale, zero_point")
    tensor_name = node.input[0]
    scale, zero_point = data(node.input[1]), data(node.input[2])
    attrs = parse_attrs(node.attribute)
    if len(node.input) > 3:
        qmin, qmax = (data(n) for n in node.input[-2:])
    elif "quant_min" in attrs and "quant_max" in attrs:
        qmin, qmax = attrs["quant_min"], attrs["quant_max"]
    elif required:
        raise ValueError(f"quant_min and quant_max are not found for <{node.name}>: neither "
                         f"inputs 3-4 nor attributes")
    else:
        qmin = qmax = None
    return tensor_name, scale, zero_point, qmin, qmax


def json_default(value):
    """json.dumps of the numpy scalars and arrays a post_process_clip_ranges may return."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"post_process_clip_ranges returned a {type(value).__name__}, which JSON "
                    f"cannot hold")


class DeployStep(object):
    """The base of the deploy steps: translate, then write_files (see the module comment)."""

    #: The C++ translator the step runs (None where the arguments choose it).
    translator = None
    #: MQBench methods of the class whose work the translator does inside.
    done_in_cpp = ()

    def _not_called(self, method):
        """The error of a method of MQBench's that the translator does inside."""
        where = f"'{self.translator}'" if self.translator else "the backend's"
        return NotImplementedError(
            f"{type(self).__name__}.{method} is done inside mqbench's C++ {where} translator "
            f"(src/deploy/translators/), which this step runs; it cannot be called on its own. "
            f"Override translate() or write_files() to change the step's output")

    def write_files(self, output_dir, files):
        """Writes ``{file name: bytes}`` into ``output_dir`` atomically (temporaries, then
        renames; a failure leaves the folder's old files whole) and returns the paths."""
        written = _C.deploy_write(output_dir, files)
        for path in written:
            logger.info(f"wrote {path}")
        return written

    def _translate(self, model, translator, model_name, deploy_to_qlinear=False,
                   post_process_clip_ranges=None, qmin_max_dict=None):
        check_model_name(model_name)
        data = with_qmin_max(model_bytes(model), qmin_max_dict)
        passes = []
        files, notes = _C.deploy_translate(data, translator, model_name, deploy_to_qlinear,
                                           post_process_clip_ranges, True, passes=passes)
        log_deploy_passes(passes)
        for note in notes:
            logger.info(note)
        return files

    def _deploy(self, onnx_path, model_name, translate):
        """The step on a file: checks the name and the input, translates, writes beside it."""
        self._warn_not_called()
        check_model_name(model_name)
        data = read_onnx(onnx_path)
        files = translate(data)
        written = self.write_files(output_dir_of(onnx_path), files)
        logger.info("Finish deploy process.")
        return written

    def _warn_not_called(self):
        """A subclass overriding a method the translator does inside is told so, instead of being
        ignored without a word."""
        for cls in type(self).__mro__:
            if cls.__module__.startswith("mqbench."):
                break
            for name in self.done_in_cpp:
                if name in cls.__dict__:
                    warnings.warn(
                        f"{cls.__name__}.{name} is not called: mqbench's C++ translator does "
                        f"that step inside. Override translate() or write_files() (or, for "
                        f"the linear backends, post_process_clip_ranges) to change the output",
                        UserWarning, stacklevel=3)
