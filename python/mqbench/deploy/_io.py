"""Reading an ONNX file for the ``mqbench.deploy`` steps and graph helpers (private).

A leaf module: ``_step.py`` (the steps) and ``common.py`` (``ONNXGraph``) both read models
through it, and it imports neither.
"""
import os
import stat

import onnx


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
