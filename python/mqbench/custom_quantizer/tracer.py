"""The fx tracer MQBench traces with (``CustomedTracer``), plus two fixes for torch 1.13 on
Python 3.11 and a clearer error for data-dependent control flow."""
import dis
import inspect

import torch
from torch.fx import Proxy, Tracer
from torch.fx.proxy import TraceError

__all__ = ["CustomedTracer", "UnpackableProxy"]


class UnpackableProxy(Proxy):
    """A Proxy that can be unpacked (``a, b = x.chunk(2, 1)``) on Python 3.11.

    torch 1.13's ``Proxy.__iter__`` finds the calling instruction with
    ``get_instructions(code)[f_lasti // 2]``, which assumes one instruction per two bytes; 3.11's
    inline cache entries break that, so every unpacking raised. Here the instruction is looked up
    by its byte offset, which is right on every Python version.
    """

    def __iter__(self):
        frame = inspect.currentframe()
        calling = frame.f_back if frame is not None else None
        if calling is not None:
            for inst in dis.get_instructions(calling.f_code):
                if inst.offset == calling.f_lasti:
                    if inst.opname == "UNPACK_SEQUENCE":
                        return (self[i] for i in range(inst.argval))
                    break
        return self.tracer.iter(self)


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
        # mqbench.nn's layers (FrozenBatchNorm2d, ...) are leaves like torch.nn's.
        return m.__module__.startswith(("torch.nn", "mqbench.nn")) and \
            not isinstance(m, torch.nn.Sequential)

    def proxy(self, node):
        return UnpackableProxy(node, self)

    def call_module(self, m, forward, args, kwargs):
        name = self.path_of_module(m)
        self._scope.append(name)
        try:
            return super().call_module(m, forward, args, kwargs)
        except TraceError as e:
            if getattr(e, "_mqbench_scope", False):
                raise
            where = f"module '{name}' ({type(m).__name__})" if name else "the model's forward"
            err = TraceError(
                f"torch.fx cannot trace {where}: {e}. It probably branches or loops on tensor "
                "values. Make the module a leaf (prepare_custom_config_dict['leaf_module'] = "
                f"[{type(m).__name__}]) so it is called as a whole, or fix the branch with "
                "prepare_custom_config_dict['concrete_args'].")
            err._mqbench_scope = True
            raise err from e
        finally:
            self._scope.pop()
