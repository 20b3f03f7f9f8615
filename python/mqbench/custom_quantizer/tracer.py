"""The fx tracer MQBench traces with (``CustomedTracer``), with clearer errors for starred
unpacking and data-dependent control flow.

Unpacking a traced value into a fixed number of names (``n, c, h, w = x.shape``,
``a, b = x.chunk(2, 1)``) is torch.fx's own: ``Proxy.__iter__`` reads the calling instruction
and, for ``UNPACK_SEQUENCE k``, returns ``k`` getitem proxies. torch 1.13 found that instruction
at ``f_lasti // 2``, which Python 3.11's variable-length bytecode broke, so this module used to
carry its own Proxy class to unpack; torch 2.0 fixed it (pytorch/pytorch#92895), and every torch
we support (2.5-2.14) unpacks by itself (tests/python/quantizer/test_tracer_unpack.py runs it). What is
left here is the message for what cannot be traced: starred unpacking, and control flow inside
a module.
"""
import dis
import inspect

import torch
from torch.fx import Tracer
from torch.fx.proxy import Attribute, TraceError

from mqbench.utils.module_types import is_conv1d

__all__ = ["CustomedTracer"]


def _calling_instruction(frame):
    """The instruction ``frame`` is executing, found by its byte offset (``f_lasti``)."""
    if frame is None:
        return None
    for inst in dis.get_instructions(frame.f_code):
        if inst.offset == frame.f_lasti:
            return inst
    return None


def _starred_unpacking_error(proxy, inst):
    """The TraceError for ``v0, *rest = proxy`` (``UNPACK_EX``): what to write instead."""
    before, after = inst.arg & 0xFF, inst.arg >> 8
    names = ", ".join([f"v{i}" for i in range(before)] + ["*rest"] +
                      [f"w{i}" for i in range(after)])
    source = (f"{proxy.root.node.name}.{proxy.attr}" if isinstance(proxy, Attribute)
              else proxy.node.name)
    err = TraceError(
        f"cannot trace the starred unpacking `{names} = {source}`: a starred target "
        "needs the number of elements, which symbolic tracing does not know. Index "
        "instead (`n, rest = x.shape[0], x.shape[1:]`), or unpack a fixed number of "
        "names (`n, c, h, w = x.shape`).")
    err._mqbench_own_hint = True  # CustomedTracer.call_module adds no control-flow hint
    return err


class CustomedTracer(Tracer):
    """torch.fx Tracer whose leaf modules are torch.nn's and mqbench.nn's (except Sequential) and the given
    ``customed_leaf_module`` classes, as MQBench's. When tracing fails inside a module (for
    example on data-dependent control flow), the error names that module and suggests
    ``leaf_module`` / ``concrete_args``."""

    def __init__(self, *args, customed_leaf_module=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.customed_leaf_module = customed_leaf_module
        self._scope = []

    def is_leaf_module(self, m, module_qualified_name):
        if self.customed_leaf_module and isinstance(m, self.customed_leaf_module):
            return True
        # transformers' Conv1D (GPT-2) is called whole, then replaced by its nn.Linear
        # (mqbench.capture.conv1d)
        if is_conv1d(m):
            return True
        # mqbench.nn's layers (FrozenBatchNorm2d, ...) are leaves like torch.nn's.
        return m.__module__.startswith(("torch.nn", "mqbench.nn")) and \
            not isinstance(m, torch.nn.Sequential)

    def iter(self, obj):
        """torch.fx's ``Proxy.__iter__`` calls this for every iteration it does not unpack
        itself; a starred unpacking (``UNPACK_EX`` in the frame that iterates, the caller of
        ``Proxy.__iter__``) gets an error that says what to write, anything else torch's."""
        frame = inspect.currentframe()
        try:
            proxy_iter = frame.f_back if frame is not None else None
            if proxy_iter is not None and proxy_iter.f_code.co_name == "__iter__":
                inst = _calling_instruction(proxy_iter.f_back)
                if inst is not None and inst.opname == "UNPACK_EX":
                    raise _starred_unpacking_error(obj, inst)
        finally:
            del frame  # a frame referenced from its own locals is a reference cycle
        return super().iter(obj)

    def call_module(self, m, forward, args, kwargs):
        name = self.path_of_module(m)
        self._scope.append(name)
        try:
            return super().call_module(m, forward, args, kwargs)
        except TraceError as e:
            if getattr(e, "_mqbench_scope", False):
                raise
            where = f"module '{name}' ({type(m).__name__})" if name else "the model's forward"
            if getattr(e, "_mqbench_own_hint", False):
                err = TraceError(f"torch.fx cannot trace {where}: {e}")
            else:
                err = TraceError(
                    f"torch.fx cannot trace {where}: {e}. It probably branches or loops on "
                    "tensor values. Make the module a leaf (prepare_custom_config_dict["
                    f"'leaf_module'] = [{type(m).__name__}]) so it is called as a whole, or fix "
                    "the branch with prepare_custom_config_dict['concrete_args'].")
            err._mqbench_scope = True
            raise err from e
        finally:
            self._scope.pop()
