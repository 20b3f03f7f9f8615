"""mqbench: MQBench's API on a native LibTorch core.

Importing the package loads libmqbench, which registers the fake-quantize ops as
``torch.ops.mqbench.*``, and registers their ONNX export symbolics.

Without torch installed, only ``mqbench.deploy.check`` (the check of a deployed file against the
fake-quant model's export, ``mqbench-deploy check``) imports; any other part of the package
raises an ImportError that says torch is needed.
"""
try:
    import torch  # loads libtorch before the extension that links it
except ModuleNotFoundError as _e:
    if _e.name != "torch":
        raise
    torch = None


def _load_native():
    """Imports mqbench._C, explaining a torch it was not built for."""
    torch_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    try:
        from mqbench import _C
    except ImportError as e:
        raise ImportError(
            f"mqbench's native module failed to load with torch {torch.__version__} ({e}). "
            "It must be built against the torch installed here: rebuild it "
            "(scripts/build.sh, or pip install --no-build-isolation .)") from e
    built = ".".join(_C.__torch_version__.split(".")[:2])
    if built != torch_minor:
        raise ImportError(
            f"mqbench was built against torch {_C.__torch_version__} but torch "
            f"{torch.__version__} is installed; rebuild mqbench (scripts/build.sh, or "
            "pip install --no-build-isolation .) or install torch "
            f"{built}.*")
    return _C


if torch is None:
    __version__ = None

    def __getattr__(name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise ImportError(f"mqbench.{name} needs torch, which is not installed (pip install "
                          f"torch); without it only mqbench.deploy.check runs")
else:
    _C = _load_native()
    __version__ = _C.__version__

    from mqbench import onnx  # noqa: E402,F401  (registers the ONNX symbolics of every op)
    from mqbench import custom_symbolic_opset  # noqa: E402,F401  (MQBench's path of mqbench.onnx)
    from mqbench import _fake_kernels  # noqa: E402,F401  (fake kernels: torch.compile / export)
