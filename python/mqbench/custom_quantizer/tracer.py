"""The fx tracer MQBench traces with (``CustomedTracer``), plus unpacking of traced values on
every Python version and clearer errors for starred unpacking and data-dependent control flow."""
import dis
import inspect

import torch
from torch.fx import Proxy, Tracer
from torch.fx.proxy import Attribute, TraceError

__all__ = ["CustomedTracer", "UnpackableProxy", "UnpackableAttribute"]


def _calling_instruction(frame):
    """The instruction ``frame`` is executing, found by its byte offset (``f_lasti``).

    torch 1.13 looked it up as ``get_instructions(code)[f_lasti // 2]``, which assumes two bytes
    per instruction; Python 3.11's inline cache entries break that. Offsets are right on every
    version."""
    if frame is None:
        return None
    for inst in dis.get_instructions(frame.f_code):
        if inst.offset == frame.f_lasti:
            return inst
    return None


class UnpackableProxy(Proxy):
    """A Proxy that can be unpacked: ``a, b = x.chunk(2, 1)``, ``n, c, h, w = x.shape``.

    Unpacking into ``k`` names (``UNPACK_SEQUENCE k``) becomes ``k`` getitem nodes. The
    attributes of such a proxy (``x.shape``) are :class:`UnpackableAttribute`\\ s, so they
    unpack the same way. Starred unpacking (``n, *rest = x.shape``) needs the number of
    elements, which symbolic tracing does not know: it raises a ``TraceError`` that says what to
    write instead. Any other iteration (``for d in x.shape``, ``f(*x)``) is the tracer's
    ``iter`` as in torch.fx (a ``TraceError``).

    Example::

        gm = torch.fx.GraphModule(model, CustomedTracer().trace(model))
        # forward: n, c, h, w = x.shape -> getattr_1 = x.shape; getitem = getattr_1[0]; ...
    """

    def __getattr__(self, k):
        # torch.fx's Proxy.__getattr__ returns a plain Attribute, which iterates with torch's
        # own __iter__ (wrong on torch 1.13 with Python 3.11) and has no starred-unpack error.
        return UnpackableAttribute(self, k)

    def __iter__(self):
        frame = inspect.currentframe()
        inst = _calling_instruction(frame.f_back if frame is not None else None)
        if inst is not None and inst.opname == "UNPACK_SEQUENCE":
            return (self[i] for i in range(inst.argval))
        if inst is not None and inst.opname == "UNPACK_EX":
            before, after = inst.arg & 0xFF, inst.arg >> 8
            names = ", ".join([f"v{i}" for i in range(before)] + ["*rest"] +
                              [f"w{i}" for i in range(after)])
            source = (f"{self.root.node.name}.{self.attr}" if isinstance(self, Attribute)
                      else self.node.name)
            err = TraceError(
                f"cannot trace the starred unpacking `{names} = {source}`: a starred target "
                "needs the number of elements, which symbolic tracing does not know. Index "
                "instead (`n, rest = x.shape[0], x.shape[1:]`), or unpack a fixed number of "
                "names (`n, c, h, w = x.shape`).")
            err._mqbench_own_hint = True  # CustomedTracer.call_module adds no control-flow hint
            raise err
        return self.tracer.iter(self)


class UnpackableAttribute(Attribute, UnpackableProxy):
    """``torch.fx.proxy.Attribute`` (a lazily recorded ``getattr``, or a method call when
    called) that unpacks like :class:`UnpackableProxy`."""


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
