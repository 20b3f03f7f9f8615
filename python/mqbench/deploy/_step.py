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
import warnings

import numpy as np
import onnx

from mqbench import _C
# The reading helpers live in the leaf module _io (common.py reads with them too).
from mqbench.deploy._io import model_bytes, read_onnx
from mqbench.deploy._runtime import warn_fp8_quantize_after_relu
from mqbench.utils.logger import log_deploy_notes, log_deploy_passes, logger


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
                   post_process_clip_ranges=None, qmin_max_dict=None, allow_float_layers=False):
        check_model_name(model_name)
        data = with_qmin_max(model_bytes(model), qmin_max_dict)
        passes = []
        files, notes = _C.deploy_translate(data, translator, model_name, deploy_to_qlinear,
                                           post_process_clip_ranges, True, passes=passes,
                                           allow_float_layers=allow_float_layers)
        log_deploy_passes(passes)
        log_deploy_notes(notes)
        for name, content in files.items():  # Note [onnxruntime drops a Relu before an FP8 ...]
            if name.endswith(".onnx"):
                warn_fp8_quantize_after_relu(name, content)
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
