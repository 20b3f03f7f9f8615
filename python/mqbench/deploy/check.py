"""Which layer of a deployed file departs from the model it came from (``mqbench.deploy.check``).

::

    from mqbench.deploy import check_deploy
    report = check_deploy(prepared, "out/resnet18.onnx", x)   # a QDQ deploy, in onnxruntime
    print(report)                    # one row per quantized tensor, in the file's order
    report.first_divergent           # 'layer2.0.conv1', or None when the file agrees
    report.to_html("check.html")

    # the same without torch: the deployed file against the fake-quant model's export
    #   mqbench-deploy check out/resnet18.onnx --reference fq.onnx --inputs x.npy

Note [Checking a deployed file layer by layer]
The file runs in its runtime (onnxruntime or OpenVINO) with every tensor that holds a quantizer's
output exposed as a graph output. The reference (the fake-quant model through forward hooks, or
its ONNX export run through the standard-op emulation) then computes each quantizer's output
from the file's own values of the tensors before it: each activation quantizer's output is
replaced by the file's value before the layers after it run ("lockstep"). A rounding tie that
the two runtimes broke differently therefore stays one step at one place instead of growing
through the layers after it, and the first layer beyond tolerance is where the file departs,
not where the departure became visible.

Tensors are matched through the fake-quant export of the same model: each of mqbench's nodes
there names its quantizer (the TorchScript exporter's scope names, the dynamo exporter's
``pkg.torch.onnx.name_scopes``, a weight's initializer name) and its output tensor, and the
translators keep that tensor's name: a DequantizeLinear (QDQ, Academic, Tensorrt's QDQ model) or
an OpenVINO FakeQuantize writes it, and a QLinear op (ONNX_QNN) writes the integers of the
tensor before it as ``<tensor>_quantized`` (read with the quantizer's scale and zero point).
A float file (Tensorrt's ``_deploy_model.onnx``, SNPE, PPL, ...) holds no quantizer: its
quantization is the vendor's, from the ranges file, and no tensor maps.

Exposing a tensor keeps onnxruntime from fusing the Q/DQ group around it into an integer
kernel (QLinearConv and the like): the rows measure the file's arithmetic, unfused. The file is
also run once as deployed, nothing exposed, and its outputs compared with the model's end to
end; that figure (``report.end_to_end``, a note of the report) is where a fault of the fused
kernels shows. It is reported, not judged: end to end, a tie broken the other way grows through
the layers after it (a random-weight resnet18's Tensorrt QDQ model, intact: 4e-7 to 5e-2 over
three inputs).

Errors are measured in integer steps of each tensor's quantizer: a value one step off is a
rounding tie (two runtimes summing in different orders), more is a departure. Rows without a
grid (the graph outputs) use ``rtol`` of their largest value.

Nothing at module level imports torch: :func:`check_files` and the command line run without it.
"""
import argparse
import ast
import contextlib
import dataclasses
import html
import math
import os
import sys
import tempfile

import numpy as np
import onnx

from mqbench.deploy import _emulate, _io

__all__ = ["check_deploy", "check_files", "DeployCheckReport", "LayerRow", "DeployCheckError",
           "RUNTIMES"]

RUNTIMES = ("onnxruntime", "openvino")
#: Graph outputs (no quantizer grid) agree when within this share of their largest value.
DEFAULT_RTOL = 1e-3
_STEP_SLACK = 1e-3  # float noise on a step count: 1.0005 steps is still one step


class DeployCheckError(ValueError):
    """A deployed file departs from its model beyond tolerance; ``.report`` has the rows."""

    def __init__(self, message, report):
        super().__init__(message)
        self.report = report


@dataclasses.dataclass
class LayerRow:
    """One compared tensor.

    layer: the module (or input, or function node) whose output the tensor is; quantizer: the
    fake quantizer that gives it ('' for a graph output); kind: 'activation', 'weight' or
    'output'; tensor: its name in the deployed file; max_abs / max_rel: the largest difference
    and that over the reference's largest value; max_steps: the largest difference in steps of
    the quantizer (None without a grid); off_by_one: values exactly one step apart (ties);
    beyond: values beyond tolerance; numel: values compared."""
    layer: str
    quantizer: str
    kind: str
    tensor: str
    max_abs: float
    max_rel: float
    max_steps: float
    off_by_one: int
    beyond: int
    numel: int

    @property
    def diverged(self):
        return self.beyond > 0


_HEADERS = ("#", "layer", "kind", "max abs", "max rel", "max steps", "ties", "beyond", "values")


class DeployCheckReport(object):
    """The rows of a check, in the deployed file's order (``.rows``), and the first layer beyond
    tolerance (``.first_divergent``: a module path, or None when the file agrees)."""

    def __init__(self, rows, file, runtime, steps, rtol, notes=()):
        self.rows = list(rows)
        self.file = file
        self.runtime = runtime
        self.steps = steps
        self.rtol = rtol
        self.notes = list(notes)
        #: the largest relative difference of the outputs, the file run as deployed (fused
        #: kernels) against the model end to end; reported, not judged (None: not measured)
        self.end_to_end = None

    @property
    def first_divergent(self):
        row = self.first_divergent_row
        return None if row is None else row.layer

    @property
    def first_divergent_row(self):
        return next((r for r in self.rows if r.diverged), None)

    @property
    def ok(self):
        return self.first_divergent_row is None

    def _cells(self, i, r):
        steps = "-" if r.max_steps is None else f"{r.max_steps:.3g}"
        return (str(i), r.layer, r.kind, f"{r.max_abs:.3e}", f"{r.max_rel:.3e}", steps,
                str(r.off_by_one), str(r.beyond), str(r.numel))

    def summary(self):
        row = self.first_divergent_row
        head = (f"{self.file} in {self.runtime}: {len(self.rows)} tensors compared, tolerance "
                f"{self.steps:g} step(s) on quantized tensors, rtol {self.rtol:g} on outputs")
        if row is None:
            return head + "; every tensor agrees"
        what = f"{row.max_steps:.3g} steps" if row.max_steps is not None else \
            f"relative {row.max_rel:.3e}"
        return (head + f"; first departure: layer '{row.layer}' ({row.kind}"
                f"{', quantizer ' + repr(row.quantizer) if row.quantizer else ''}, tensor "
                f"'{row.tensor}'): {row.beyond} of {row.numel} values beyond tolerance, up to "
                f"{what}")

    def table(self):
        rows = [self._cells(i, r) for i, r in enumerate(self.rows)]
        widths = [max([len(h)] + [len(row[k]) for row in rows]) for k, h in enumerate(_HEADERS)]
        line = lambda cells: "  ".join(c.ljust(w) if k in (1, 2) else c.rjust(w)  # noqa: E731
                                       for k, (c, w) in enumerate(zip(cells, widths)))
        marks = ["" if not r.diverged else "  <- beyond tolerance" for r in self.rows]
        return "\n".join([line(_HEADERS)] + [line(c) + m for c, m in zip(rows, marks)])

    def __str__(self):
        return "\n".join([self.summary(), self.table()] + self.notes)

    __repr__ = __str__

    def to_html(self, path):
        """Writes the table and a plot of the error along the depth to the file ``path``
        (atomically: a temporary in the same folder, then a rename); returns the path."""
        path = os.fspath(path)
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            raise FileNotFoundError(f"to_html: the folder '{directory}' does not exist")
        data = _render_html(self).encode("utf-8")
        fd, tmp = tempfile.mkstemp(prefix=".mqbench_check.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # as open() would have made it
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return path


def _svg_plot(report):
    """The per-row error along the depth, as inline SVG: steps for quantized tensors (log
    scale, the tolerance as a dashed line), rows beyond tolerance in red."""
    rows = report.rows
    if not rows:
        return ""
    w, h, left, bottom, top = 900, 260, 60, 30, 10
    lo = 1e-4
    tol = max(report.steps, lo)
    vals = []
    for r in rows:
        v = r.max_steps if r.max_steps is not None else r.max_rel / report.rtol * tol
        vals.append(max(v, lo) if math.isfinite(v) else math.inf)
    hi = max([v for v in vals if math.isfinite(v)] + [tol * 10])
    vals = [min(v, hi) for v in vals]  # an infinite error (a NaN in one file) at the top

    def y(v):
        frac = (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        return top + (1 - frac) * (h - top - bottom)

    step_x = (w - left - 10) / max(len(rows), 1)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
             f'role="img" aria-label="error along the depth">',
             f'<line x1="{left}" y1="{y(tol):.1f}" x2="{w - 10}" '
             f'y2="{y(tol):.1f}" stroke="#888" stroke-dasharray="4 3"/>',
             f'<text x="4" y="{y(tol) + 4:.1f}" font-size="10">tol</text>']
    for e in range(int(math.floor(math.log10(lo))), int(math.ceil(math.log10(hi))) + 1):
        if lo <= 10 ** e <= hi:
            parts.append(f'<text x="4" y="{y(10 ** e) + 4:.1f}" font-size="10">1e{e}</text>')
    for i, (r, v) in enumerate(zip(rows, vals)):
        x = left + i * step_x
        color = "#C44E52" if r.diverged else ("#4C72B0" if r.kind != "weight" else "#55A868")
        parts.append(f'<rect x="{x:.1f}" y="{y(v):.1f}" width="{max(step_x - 1, 1):.1f}" '
                     f'height="{h - bottom - y(v):.1f}" fill="{color}">'
                     f'<title>{html.escape(r.layer)} ({r.kind}): {v:.3g}</title></rect>')
    parts.append(f'<text x="{left}" y="{h - 8}" font-size="11">depth (rows in file order); '
                 f'height: max error in quantization steps (outputs: relative error scaled to '
                 f'the same tolerance line)</text></svg>')
    return "\n".join(parts)


def _render_html(report):
    esc = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    p = ['<!DOCTYPE html>', '<html lang="en">', '<head>', '<meta charset="utf-8">',
         '<title>mqbench deploy check</title>',
         '<style>body{font-family:sans-serif;margin:2em;max-width:80em}'
         'table{border-collapse:collapse;font-size:0.9em}'
         'th,td{border:1px solid #ccc;padding:2px 8px}td.num{text-align:right;'
         'font-family:monospace}tr.beyond{background:#fbe3e4}</style>', '</head>', '<body>',
         '<h1>Deploy check</h1>', f'<p>{esc(report.summary())}</p>']
    p += [f'<p>{esc(n)}</p>' for n in report.notes]
    p += ['<h2>Error along the depth</h2>', _svg_plot(report), '<h2>Rows</h2>',
          '<table id="rows"><tr>' + "".join(f"<th>{esc(h)}</th>" for h in _HEADERS) +
          '<th>quantizer</th><th>tensor</th></tr>']
    for i, r in enumerate(report.rows):
        cells = report._cells(i, r)
        cls = ' class="beyond"' if r.diverged else ''
        p.append(f'<tr{cls}>' + "".join(
            f'<td class="num">{esc(c)}</td>' if k not in (1, 2) else f'<td>{esc(c)}</td>'
            for k, c in enumerate(cells)) + f'<td>{esc(r.quantizer)}</td><td>{esc(r.tensor)}'
            '</td></tr>')
    p += ['</table>', '<h2>How to read this</h2>', '<ul>',
          '<li>Each row is a tensor the deployed file computes and the model computes, compared '
          'on identical inputs: every activation quantizer of the reference reads the file\'s '
          'values of the tensors before it.</li>',
          '<li><b>steps</b>: the difference in integer steps of the tensor\'s quantizer. One '
          'step (a tie) is two runtimes rounding a value at a midpoint apart; more is a '
          'departure.</li>',
          '<li>The first red row is where the file departs from the model.</li>', '</ul>',
          '</body>', '</html>']
    return "\n".join(p) + "\n"


# -- reading the files ----------------------------------------------------------------------
def _model_bytes(model, what):
    """Serialized ONNX from a path (the checked reader of ``_io``), bytes or a ModelProto."""
    try:
        return _io.model_bytes(model)
    except TypeError:
        raise TypeError(f"{what} must be a path, serialized ONNX bytes or an onnx.ModelProto, "
                        f"got {type(model).__name__}") from None


def _parse(data, what):
    """The ModelProto of ``data``; a file whose tensors point at external data is refused (the
    runtimes would read other files named by an untrusted model)."""
    try:
        model = onnx.load_from_string(data)
    except Exception as e:  # protobuf's DecodeError
        raise ValueError(f"{what} is not an ONNX model: {e}") from e
    tensors = list(model.graph.initializer) + [a.t for n in model.graph.node
                                               for a in n.attribute if a.HasField("t")]
    external = [t.name for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]
    if external:
        raise ValueError(f"{what} keeps tensors in external data ({external[:3]}); the check "
                         f"reads self-contained files only")
    return model


def _graph_inputs(model):
    inits = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in inits]


def _np_dtype(elem_type):
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    except Exception:  # noqa: BLE001  (UNDEFINED)
        return np.float32


def _feeds(model, inputs, what):
    """{graph input name: numpy array} for ``inputs`` (a dict by name, or a sequence in the
    file's input order), each checked against the file's shape and cast to its type."""
    graph_inputs = _graph_inputs(model)
    names = [vi.name for vi in graph_inputs]
    if isinstance(inputs, dict):
        unknown = [k for k in inputs if k not in names]
        if unknown:
            raise ValueError(f"inputs name {unknown}, which {what} does not take: its inputs are "
                             f"{names}")
        missing = [n for n in names if n not in inputs]
        if missing:
            raise ValueError(f"{what} also takes inputs {missing}: give every one of {names}")
        items = [(n, inputs[n]) for n in names]
    else:
        seq = list(inputs) if isinstance(inputs, (tuple, list)) else [inputs]
        if len(seq) != len(names):
            raise ValueError(f"{len(seq)} input(s) given, but {what} takes {len(names)}: "
                             f"{names}")
        items = list(zip(names, seq))
    feeds = {}
    for vi, (name, value) in zip(graph_inputs, items):
        arr = _to_numpy(value)
        dims = vi.type.tensor_type.shape.dim if vi.type.tensor_type.HasField("shape") else None
        if dims is not None:
            want = [d.dim_value if d.HasField("dim_value") else None for d in dims]
            if len(want) != arr.ndim or any(w is not None and w != s
                                            for w, s in zip(want, arr.shape)):
                shown = ["?" if w is None else w for w in want]
                raise ValueError(f"input '{name}' has shape {list(arr.shape)}, which {what} "
                                 f"does not take: it takes {shown}")
        dtype = np.dtype(_np_dtype(vi.type.tensor_type.elem_type))
        if arr.dtype.kind == "f" and dtype.kind in "iub":
            raise ValueError(f"input '{name}' holds {arr.dtype} values where the file takes "
                             f"{dtype}: give integers (token ids, masks)")
        feeds[name] = arr.astype(dtype, copy=False)
    return feeds


def _to_numpy(value):
    if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without torch
        return value.detach().cpu().numpy()
    return np.asarray(value)


# -- the runtimes -----------------------------------------------------------------------------
def _check_runtime(runtime):
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {RUNTIMES}, got {runtime!r}")
    module = "onnxruntime" if runtime == "onnxruntime" else "openvino"
    try:
        __import__(module)
    except ImportError:
        raise ImportError(f"the runtime '{runtime}' is not installed: pip install {module}") \
            from None


def _with_outputs(model, tensors):
    out = onnx.ModelProto()
    out.CopyFrom(model)
    present = {o.name for o in out.graph.output}
    for t in tensors:
        if t not in present:
            out.graph.output.append(onnx.ValueInfoProto(name=t))
            present.add(t)
    return out


def _run(model, feeds, tensors, runtime):
    """{tensor: numpy value} of ``tensors`` and the graph outputs, ``model`` run in ``runtime``
    (onnxruntime: with the session options of :mod:`mqbench.deploy._runtime`)."""
    try:
        return _run_in(model, feeds, tensors, runtime)
    except ImportError:
        raise
    except Exception as e:  # noqa: BLE001  (the runtimes' own error types)
        raise ValueError(f"{runtime} could not run the file: {e}") from e


def _run_in(model, feeds, tensors, runtime):
    if runtime == "onnxruntime":
        import onnxruntime
        from mqbench.deploy._runtime import onnxruntime_session
        # A graph output computed from initializers alone (a weight's DequantizeLinear) makes
        # onnxruntime's constant folding fail ("Attempt to replace the existing tensor"): those
        # come from a second session without graph optimizations, which computes them with the
        # same kernels.
        const = _constant_tensors(model)
        varying = [t for t in tensors if t not in const]
        fixed = [t for t in tensors if t in const]
        sess = onnxruntime_session(_with_outputs(model, varying).SerializeToString())
        names = [o.name for o in sess.get_outputs()]
        out = dict(zip(names, sess.run(names, feeds)))
        if fixed:
            plain = onnx.ModelProto()
            plain.CopyFrom(model)
            del plain.graph.output[:]
            sess = onnxruntime_session(_with_outputs(plain, fixed).SerializeToString(),
                                       level=onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL)
            needed = {i.name for i in sess.get_inputs()}
            out.update(zip(fixed, sess.run(fixed, {k: v for k, v in feeds.items()
                                                   if k in needed})))
        return out
    data = _with_outputs(model, tensors).SerializeToString()
    import openvino
    core = openvino.Core()
    compiled = core.compile_model(core.read_model(model=data, weights=b""), "CPU")
    result = compiled(feeds)
    return {out.get_any_name(): np.asarray(result[out]) for out in compiled.outputs}


# -- matching the reference's quantizers to the file's tensors --------------------------------
@dataclasses.dataclass
class _Target:
    quantizer: str       # the quantizer (module path, or a scope from the reference)
    layer: str           # what the quantized tensor is the output of
    kind: str            # "activation" or "weight"
    ref_in: str          # the reference's input tensor of the quantizer node
    ref_out: str         # the reference's output tensor
    tensor: str          # the deployed file's tensor
    integer: bool        # the file holds the integers (ONNX_QNN): dequantized with the qparams
    order: int           # the deployed node's position
    scale: str = ""      # the reference's scale / zero point tensors (the check of two files)
    zero_point: str = ""
    axis: int = None
    fp8: str = None      # the FP8 format of a float8 Q/DQ pair
    blocked: bool = False  # a blocked Q/DQ pair (group-wise): no per-value step here
    call: int = 0        # which call of its quantizer module (a module called twice)


def _scopes(node):
    """The module scopes the exporter recorded for ``node``: the dynamo exporter's name_scopes
    (without the op's own entry), else the TorchScript exporter's node name split at '/'."""
    for p in node.metadata_props:
        if p.key == "pkg.torch.onnx.name_scopes" and len(p.value) <= 65536:
            try:
                scopes = ast.literal_eval(p.value)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                break
            if isinstance(scopes, list) and all(isinstance(x, str) for x in scopes):
                return [x for x in scopes[:-1] if x]
            break
    parts = [s for s in node.name.split("/") if s]
    return parts[:-1]


def _constant_tensors(model):
    """The tensors computed from initializers and Constant nodes alone."""
    const = {t.name for t in model.graph.initializer}
    for n in model.graph.node:
        if all(i in const for i in n.input if i):
            const.update(n.output)
    return const


def _weight_owner(node, model, initializers):
    """The module path of a weight quantizer's module, from its weight's initializer name
    (``layer1.0.conv1.weight``) or the dynamo scopes."""
    name = node.input[0]
    if name in initializers and "." in name:
        return name.rsplit(".", 1)[0]
    # a weight the model rescales before its quantizer (a conv-bn not merged): the
    # initializer named "<module>.weight" in the constant subgraph before it (a bounded walk)
    producers = {o: n for n in model.graph.node for o in n.output}
    todo, seen = [name], {name}
    while todo and len(seen) < 64:
        t = todo.pop(0)
        if t in initializers and t.endswith(".weight"):
            return t[:-len(".weight")]
        for i in getattr(producers.get(t), "input", ()):
            if i and i not in seen:
                seen.add(i)
                todo.append(i)
    scopes = [c for c in _scopes(node) if not c.startswith("weight_fake_quant")]
    return scopes[-1] if scopes else name


@dataclasses.dataclass
class _RefQuantizer:
    """A fake quantizer of the reference export: one of mqbench's nodes, or a standard
    QuantizeLinear [-> Clip] -> DequantizeLinear chain (the formats: FP8, blocked)."""
    node: object          # the node whose scopes name it
    input: str
    output: str
    scale: str
    zero_point: str
    axis: object = None   # per-channel axis, or None
    fp8: str = None       # "fp8_e4m3" / "fp8_e5m2" for float8 Q/DQ
    blocked: bool = False


_FP8_TYPES = {onnx.TensorProto.FLOAT8E4M3FN: "fp8_e4m3", onnx.TensorProto.FLOAT8E5M2: "fp8_e5m2"}


def _reference_fqs(reference):
    """The reference's fake quantizers, in graph order."""
    constants = _emulate.constant_values(reference)
    types = {t.name: t.data_type for t in reference.graph.initializer}
    for n in reference.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and n.output:
                    types[n.output[0]] = a.t.data_type
    readers = {}
    for n in reference.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    out = []
    for node in reference.graph.node:
        if node.op_type in ("QuantizeLinear", "DequantizeLinear") or \
                _emulate.is_fake_quant_node(node):
            if len(node.input) < 2 or not node.output:
                raise ValueError(f"the reference's node '{node.name}' ({node.op_type}) has "
                                 f"{len(node.input)} inputs and {len(node.output)} outputs")
        if _emulate.is_fake_quant_node(node):
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            axis = None
            if node.op_type == "FixedPerChannelAffine" and len(node.input) > 3:
                value = np.asarray(constants.get(node.input[3], 0)).reshape(-1)
                axis = int(value[0]) if value.size else 0
            elif node.op_type in ("FakeQuantizeLearnablePerchannelAffine",
                                  "FakeQuantizeDSQPerchannel"):
                axis = int(attrs.get("ch_axis", 0))
            scale = node.input[1] if len(node.input) > 1 else ""
            zp = node.input[2] if len(node.input) > 2 else ""
            out.append(_RefQuantizer(node, node.input[0], node.output[0], scale, zp, axis))
        elif node.op_type == "QuantizeLinear" and node.domain in ("", "ai.onnx"):
            nxt = readers.get(node.output[0], [])
            if len(nxt) == 1 and nxt[0].op_type == "Clip":
                nxt = readers.get(nxt[0].output[0], [])
            if len(nxt) != 1 or nxt[0].op_type != "DequantizeLinear" or len(nxt[0].input) < 2 \
                    or not nxt[0].output:
                continue
            dq = nxt[0]
            attrs = {a.name: onnx.helper.get_attribute_value(a) for a in dq.attribute}
            zp = dq.input[2] if len(dq.input) > 2 else ""
            q_attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
            fp8 = _FP8_TYPES.get(types.get(zp)) or _FP8_TYPES.get(q_attrs.get("output_dtype"))
            blocked = int(attrs.get("block_size", 0)) > 0
            scale_rank = np.asarray(constants[dq.input[1]]).ndim if dq.input[1] in constants \
                else 0
            axis = int(attrs.get("axis", 1)) if scale_rank == 1 and not blocked else None
            out.append(_RefQuantizer(node, node.input[0], dq.output[0], dq.input[1], zp, axis,
                                     fp8, blocked))
    return out


def _reference_quantizers(reference, module_names=None):
    """[(quantizer, call, kind, _RefQuantizer)] of the reference export's fake quantizers, in
    graph order. ``module_names``: the model's quantizer module names, to pick the scope that
    names one; ``call`` counts the earlier calls of the same quantizer."""
    initializers = {t.name for t in reference.graph.initializer}
    const = _constant_tensors(reference)
    seen = {}
    out = []
    for fq in _reference_fqs(reference):
        node = fq.node
        weight = fq.input in const
        scopes = _scopes(node)
        if weight:
            name = _weight_owner(node, reference, initializers) + ".weight_fake_quant"
        else:
            name = None
            if module_names is not None:
                # TorchScript: '/x_post_act_fake_quantizer/...'; a scale named '<module>.scale'
                candidates = list(reversed(scopes)) + [".".join(scopes)]
                if "." in fq.scale:
                    candidates.append(fq.scale.rsplit(".", 1)[0])
                name = next((c for c in candidates if c in module_names), None)
            if name is None:
                name = scopes[-1] if scopes else (node.name or fq.output)
        k = seen.get(name, 0)
        seen[name] = k + 1
        out.append((name, k, "weight" if weight else "activation", fq))
    return out


def _locate(deployed, reference, module_names=None, layer_of=None):
    """The _Targets: each quantizer of the reference with the deployed tensor holding its
    output (Note [Checking a deployed file layer by layer])."""
    producers = {}
    for i, n in enumerate(deployed.graph.node):
        for o in n.output:
            producers[o] = (i, n)
    ref_producers = {o: n for n in reference.graph.node for o in n.output}
    targets = []
    for name, call, kind, fq in _reference_quantizers(reference, module_names):
        t_in, t_out = fq.input, fq.output
        if kind == "weight":
            layer = name[:-len(".weight_fake_quant")]
        elif layer_of is not None:
            layer = layer_of(name, call)
        else:
            layer = _reference_layer(name, ref_producers.get(t_in), t_in)
        entry = None
        if t_out in producers:
            entry = (t_out, False)
        elif t_in + "_quantized" in producers:  # QLinear ops (ONNX_QNN)
            n = producers[t_in + "_quantized"][1]
            if n.op_type.startswith("QLinear") or n.op_type == "QuantizeLinear":
                entry = (t_in + "_quantized", True)
        if entry is None:
            continue
        tensor, integer = entry
        targets.append(_Target(name if call == 0 else f"{name}#{call}", layer, kind, t_in, t_out,
                               tensor, integer, producers[tensor][0], fq.scale, fq.zero_point,
                               fq.axis, fq.fp8, fq.blocked, call))
    targets.sort(key=lambda t: t.order)
    return targets


def _reference_layer(quantizer, producer, tensor):
    """The layer of an activation quantizer without the model: MQBench names a quantizer after
    the fx node of its input (``layer1_0_conv1_post_act_fake_quantizer``); else the producing
    node's innermost scope."""
    for suffix in ("_post_act_fake_quantizer", "_fake_quantizer"):
        if quantizer.endswith(suffix):
            return quantizer[:-len(suffix)]
    if producer is not None:
        scopes = _scopes(producer)
        if scopes:
            return scopes[-1]
        return producer.name or tensor
    return tensor


# -- comparing ----------------------------------------------------------------------------
def _compare(ref, got, step, steps, rtol):
    """(max_abs, max_rel, max_steps, off_by_one, beyond) of ``got`` against ``ref``; ``step``
    broadcasts to them (None: no grid, ``rtol`` of the largest reference value)."""
    ref = np.asarray(ref, dtype=np.float64)
    got = np.asarray(got, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        diff = np.abs(ref - got)
    same = (ref == got) | (np.isnan(ref) & np.isnan(got))  # equal infinities, NaN for NaN
    diff = np.where(same, 0.0, np.where(np.isfinite(diff), diff, np.inf))
    peak = float(np.max(np.abs(np.where(np.isfinite(ref), ref, 0.0)))) if ref.size else 0.0
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = max_abs / peak if peak > 0 else max_abs
    if step is None:
        beyond = int((diff > rtol * max(peak, 1e-30)).sum())
        return max_abs, max_rel, None, 0, beyond
    step = np.broadcast_to(np.asarray(step, dtype=np.float64), diff.shape)
    with np.errstate(divide="ignore", invalid="ignore"):
        n = np.where(step > 0, diff / step, np.where(diff > 0, np.inf, 0.0))
        # float32 cannot hold a value finer than its spacing: at 16 bits a step of a large
        # value is a few float32 ulps, so the slack grows with the value's own spacing
        spacing = np.nan_to_num(np.spacing(np.abs(ref).astype(np.float32)).astype(np.float64),
                                nan=0.0, posinf=0.0)
        slack = _STEP_SLACK + np.where(step > 0, 2 * spacing / step, 0.0)
    max_steps = float(n.max()) if n.size else 0.0
    off_by_one = int(((n > slack) & (n <= 1 + slack)).sum())
    beyond = int((n > steps + slack).sum())
    return max_abs, max_rel, max_steps, off_by_one, beyond


def _row(target, ref, got, step, steps, rtol):
    if ref.size != got.size:
        raise ValueError(f"the file's tensor '{target.tensor}' has {got.size} values where the "
                         f"model's {target.kind} of '{target.layer}' has {ref.size}: the file "
                         f"does not come from this model (or from these inputs' shapes)")
    got = got.reshape(ref.shape)
    return LayerRow(target.layer, target.quantizer, target.kind, target.tensor,
                    *_compare(ref, got, step, steps, rtol), numel=int(ref.size))


def _check_tolerances(steps, rtol):
    rtol = DEFAULT_RTOL if rtol is None else rtol
    if not isinstance(rtol, (int, float)) or isinstance(rtol, bool) or not rtol > 0 \
            or not math.isfinite(rtol):
        raise ValueError(f"rtol must be a positive number, got {rtol!r}")
    if not isinstance(steps, (int, float)) or isinstance(steps, bool) or not steps >= 0 \
            or not math.isfinite(steps):
        raise ValueError(f"steps must be a number >= 0, got {steps!r}")
    return float(steps), float(rtol)


def _runnable(model, runtime):
    """The file as the runtime takes it: mqbench's own nodes (and OpenVINO's FakeQuantize, for
    onnxruntime) emulated with standard ops; the count emulated."""
    custom = any(_emulate.is_fake_quant_node(n) for n in model.graph.node) or (
        runtime == "onnxruntime" and any(n.domain == _emulate.OPENVINO_DOMAIN
                                         for n in model.graph.node))
    return _emulate.emulate(model) if custom else (model, 0)


def _file_name(path):
    if isinstance(path, (str, os.PathLike)):
        return os.fspath(path)
    return "the deployed model"


# -- the check of two files (no torch) ----------------------------------------------------------
def check_files(deployed, reference, inputs, runtime="onnxruntime", rtol=None, *, steps=1.0):
    """The check without torch: the deployed file against ``reference``, the fake-quant model's
    export with mqbench's nodes (``convert_deploy``'s ``<name>.onnx`` of a backend that keeps
    that file, or ``mqbench.onnx.export_onnx``'s file of the model as deployed), run through the
    standard-op emulation in onnxruntime. ``inputs``: a dict by input name or a sequence in the
    file's input order (numpy arrays). Returns a :class:`DeployCheckReport`."""
    steps, rtol = _check_tolerances(steps, rtol)
    _check_runtime(runtime)
    dep = _parse(_model_bytes(deployed, "the deployed model"), "the deployed model")
    ref = _parse(_model_bytes(reference, "the reference"), "the reference")
    if not _emulate.fake_quant_nodes(ref):
        raise ValueError("the reference has none of mqbench's fake-quantize nodes: give the "
                         "fake-quant model's export (convert_deploy's <name>.onnx of a float "
                         "backend, or mqbench.onnx.export_onnx), not a deployed file")
    feeds = _feeds(dep, inputs, "the deployed file")
    targets = _locate(dep, ref)
    if not targets:
        raise ValueError(_NO_MAP)
    runnable, _ = _runnable(dep, runtime)
    got = _run(runnable, feeds, [t.tensor for t in targets], runtime)
    # The reference in lockstep: the readers of each activation quantizer's output take the
    # file's value instead, through a new graph input.
    ref_model, _ = _emulate.emulate(ref)
    fed = {t.ref_out: t.ref_out + "::from_deployed" for t in targets if t.kind == "activation"}
    for node in ref_model.graph.node:
        for k, name in enumerate(node.input):
            if name in fed:
                node.input[k] = fed[name]
    ref_model.graph.input.extend(onnx.helper.make_tensor_value_info(v, onnx.TensorProto.FLOAT,
                                                                    None) for v in fed.values())
    ref_inputs = {vi.name for vi in _graph_inputs(ref)}
    ref_feeds = _feeds(ref, {k: v for k, v in feeds.items() if k in ref_inputs}, "the reference")
    ref_feeds_plain = dict(ref_feeds)
    qparams = sorted({q for t in targets for q in (t.scale, t.zero_point) if q})
    values = {t.ref_out: got[t.tensor].astype(np.float64) for t in targets}
    if any(t.integer for t in targets):
        # the integers of a QLinear file read with the reference's qparams, which do not depend
        # on the fed values: a first run gives them
        raw = dict(ref_feeds, **{fed[r]: values[r].astype(np.float32) for r in fed})
        qp = _run(ref_model, raw, qparams, "onnxruntime")
        for t in targets:
            if t.integer:
                s, z = _broadcast_qparams(qp, t, values[t.ref_out].ndim)
                values[t.ref_out] = (values[t.ref_out] - np.round(z)) * s
    ref_feeds.update({fed[r]: values[r].astype(np.float32) for r in fed})
    ref_vals = _run(ref_model, ref_feeds, [t.ref_out for t in targets] + qparams, "onnxruntime")
    dequantized = values
    rows = []
    for t in targets:
        ref_value = ref_vals[t.ref_out]
        rows.append(_row(t, ref_value, dequantized[t.ref_out], _file_step(ref_vals, t, ref_value),
                         steps, rtol))
    dep_outs = [o.name for o in dep.graph.output]
    ref_outs = [o.name for o in ref_model.graph.output][:len(ref.graph.output)]
    notes = []
    if len(dep_outs) == len(ref_outs):
        for d, r in zip(dep_outs, ref_outs):
            t = _Target("", f"output '{d}'", "output", r, r, d, False, len(dep.graph.node))
            rows.append(_row(t, ref_vals[r], got[d], None, steps, rtol))
    else:
        notes.append(f"outputs not compared: the file has {len(dep_outs)}, the reference "
                     f"{len(ref_outs)}")
    plain_ref, _ = _emulate.emulate(ref)
    ref_end = _run(plain_ref, ref_feeds_plain, [], "onnxruntime")
    note, worst = _end_to_end(runnable, feeds, runtime,
                              [ref_end[o.name] for o in plain_ref.graph.output])
    if note:
        notes.append(note)
    report = DeployCheckReport(rows, _file_name(deployed), runtime, steps, rtol, notes)
    report.end_to_end = worst
    return report


def _broadcast_qparams(values, target, ndim):
    """(scale, zero point) of ``target`` from the reference's values, shaped to broadcast over
    a tensor of rank ``ndim`` (a missing zero point is 0)."""
    s = np.asarray(values[target.scale], dtype=np.float64)
    z = np.asarray(values[target.zero_point], dtype=np.float64) if target.zero_point \
        else np.zeros_like(s)
    return _channel_view(s, target.axis, ndim), _channel_view(z, target.axis, ndim)


def _file_step(values, target, ref_value):
    """The step of each value of a quantizer of the reference file (None for a blocked one)."""
    if target.blocked or not target.scale:
        return None
    s, _ = _broadcast_qparams(values, target, np.ndim(ref_value))
    return _fp8_step(ref_value, s, target.fp8) if target.fp8 else s


def _fp8_step(values, scale, fmt):
    """The spacing of the FP8 grid at each value (scaled): 2^(e - mantissa bits) * scale, the
    exponent e of |value| / scale floored at the format's smallest normal one."""
    mantissa, min_exp = (3, -6) if "e4m3" in fmt else (2, -14)
    mag = np.abs(np.asarray(values, dtype=np.float64)) / scale
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.floor(np.log2(np.where((mag > 0) & np.isfinite(mag), mag, 1.0)))
    e = np.maximum(np.nan_to_num(e, nan=min_exp), min_exp)
    return np.ldexp(1.0, (e - mantissa).astype(np.int64)) * scale


def _end_to_end(runnable, feeds, runtime, reference_outputs):
    """(note, largest relative difference) of the file run as deployed (no tensor exposed, so
    the runtime fuses its Q/DQ groups into integer kernels) against the reference's outputs end
    to end. Reported, not judged: end to end, one tie broken the other way grows through the
    layers after it (Note [Checking a deployed file layer by layer])."""
    got = _run(runnable, feeds, [], runtime)
    names = [o.name for o in runnable.graph.output]
    if len(names) != len(reference_outputs):
        return None, None
    worst = 0.0
    for name, ref in zip(names, reference_outputs):
        ref = np.asarray(ref, dtype=np.float64)
        value = np.asarray(got[name], dtype=np.float64)
        if value.size != ref.size:
            return None, None
        peak = float(np.max(np.abs(ref))) if ref.size else 0.0
        diff = float(np.max(np.abs(value.reshape(ref.shape) - ref))) if ref.size else 0.0
        worst = max(worst, diff / peak if peak > 0 else diff)
    return (f"end to end, the file as deployed (its runtime's fused kernels; the rows above run "
            f"it with their tensors exposed, unfused) against the reference: largest relative "
            f"difference of the outputs {worst:.3e}"), worst


_NO_MAP = ("no tensor of the deployed file holds a quantizer's output of the model: the file does "
           "not come from this model, or it is a float file whose quantization is its vendor's "
           "(the ranges file of Tensorrt, SNPE, PPL, NNIE, Vitis, Tengine, STPU). Check the "
           "deploy's QDQ model (Tensorrt: deploy_to_qlinear=True writes "
           "onnx_quantized_model.onnx) or the fake-quant export <name>.onnx")


# -- the check against the torch model ----------------------------------------------------------
def check_deploy(model, onnx_path, inputs, runtime="onnxruntime", rtol=None, *, steps=1.0,
                 reference=None):
    """Runs the deployed file and the fake-quant model on ``inputs`` and compares every
    quantized tensor, layer by layer in lockstep (Note [Checking a deployed file layer by
    layer]).

    Args:
        model: the prepared model (the ``GraphModule`` given to ``convert_deploy``); not
            modified.
        onnx_path: the deployed file (a path, bytes or a ModelProto): a QDQ / Academic /
            Tensorrt_NLP file, Tensorrt's ``onnx_quantized_model.onnx``, an ONNX_QNN file, an
            OPENVINO ``_deploy_model.onnx``, or a file with mqbench's own nodes (emulated).
        inputs: a tensor, a tuple of tensors in forward()'s order, or a dict by input name.
        runtime: ``"onnxruntime"`` or ``"openvino"`` (OPENVINO files; in onnxruntime their
            FakeQuantize nodes are emulated with standard ops).
        rtol: the tolerance of the graph outputs, relative to their largest value (default 1e-3).
        steps: the tolerance of quantized tensors, in steps of their quantizer (default 1: a
            value one step off is a rounding tie).
        reference: the fake-quant export the file was translated from, if at hand (bytes or a
            path); otherwise the model is exported again in memory to match the tensors.

    Returns a :class:`DeployCheckReport`; ``report.first_divergent`` is the module path of the
    first layer beyond tolerance, or None. Nothing is written."""
    import torch
    from mqbench._deploy_export import (dict_parameter, export_copy, export_model_bytes,
                                        flatten, keyword_arguments)
    from mqbench.fake_quantize.quantize_base import QuantizeBase
    from mqbench.fusion_method import convert_merge_bn

    steps, rtol = _check_tolerances(steps, rtol)
    _check_runtime(runtime)
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"check_deploy needs the prepared model, got {type(model).__name__}")
    dep = _parse(_model_bytes(onnx_path, "onnx_path"), "the deployed file")
    copied = export_copy(model)
    file_inputs = _numpy_inputs(inputs)
    if isinstance(file_inputs, dict) and \
            set(file_inputs) != {vi.name for vi in _graph_inputs(dep)} and \
            dict_parameter(copied, inputs) is None:
        # keyword arguments, and a file whose inputs the exporter named itself ("input.1"):
        # the file's inputs are forward()'s parameters in order
        file_inputs = list(keyword_arguments(copied, file_inputs).values())
    feeds = _feeds(dep, file_inputs, "the deployed file")
    has_bn = any(n.op_type == "BatchNormalization" for n in dep.graph.node)
    if not has_bn and isinstance(copied, torch.fx.GraphModule):
        convert_merge_bn(copied)
    quantizers = {n: m for n, m in copied.named_modules() if isinstance(m, QuantizeBase)}
    if not quantizers:
        raise ValueError("the model has no fake quantizers: give the prepared model the file "
                         "was deployed from")
    args, kwargs = _torch_call(copied, inputs, dict_parameter)
    if reference is None:
        dynamo = any(p.key.startswith("pkg.torch.onnx") for n in dep.graph.node
                     for p in n.metadata_props)
        input_names = [vi.name for vi in _graph_inputs(dep)]
        reference = export_model_bytes(copied, args, kwargs, input_names, dynamo)
    ref = _parse(_model_bytes(reference, "reference"), "the reference")
    layer_of = _fx_layers(copied)
    targets = _locate(dep, ref, module_names=quantizers, layer_of=layer_of)
    if not targets:
        raise ValueError(_NO_MAP)
    runnable, _ = _runnable(dep, runtime)
    got = _run(runnable, feeds, [t.tensor for t in targets], runtime)
    rows = {}
    hooks = []
    by_module = {}  # {quantizer module: {call: target}}
    for t in targets:
        if t.kind == "activation":
            by_module.setdefault(t.quantizer.split("#")[0], {})[t.call] = t
    calls = {}

    def hook(module, inp, output, name):
        k = calls.get(name, 0)
        calls[name] = k + 1
        t = by_module[name].get(k)
        if t is None:  # a call the file holds no tensor for: the model's own value goes on
            return None
        value = got[t.tensor]
        step = _torch_step(module, output)
        if t.integer:
            value = _dequantize_torch(module, value, output.dim())
        ref_np = output.detach().float().cpu().numpy()
        rows[id(t)] = _row(t, ref_np, np.asarray(value, dtype=np.float64), step, steps, rtol)
        return torch.as_tensor(np.asarray(value).reshape(output.shape),
                               dtype=output.dtype, device=output.device)

    for name in by_module:
        try:
            module = copied.get_submodule(name)
        except AttributeError:  # a quantizer named by a scope, not a module of the model
            continue
        hooks.append(module.register_forward_hook(
            lambda m, i, o, name=name: hook(m, i, o, name)))
    try:
        with torch.no_grad():
            out = copied(*args, **kwargs)
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad():
        for t in targets:
            if t.kind != "weight" or t.integer:
                continue
            owner_name = t.quantizer.split("#")[0][:-len(".weight_fake_quant")]
            try:
                owner = copied.get_submodule(owner_name)
            except AttributeError:
                continue
            fq = getattr(owner, "weight_fake_quant", None)
            w = getattr(owner, "weight", None)
            if fq is None or w is None or getattr(owner, "bn", None) is not None:
                continue  # a weight the module rescales first (an unmerged conv-bn)
            q = fq(w)
            rows[id(t)] = _row(t, q.float().cpu().numpy(), got[t.tensor].astype(np.float64),
                               _torch_step(fq, q), steps, rtol)
    ordered = [rows[id(t)] for t in targets if id(t) in rows]
    notes = []
    unreached = [t.quantizer for t in targets if t.kind == "activation" and id(t) not in rows]
    if unreached:
        notes.append(f"not compared (their quantizer did not run on these inputs): {unreached}")
    outs = [v for _, v in flatten(out)] if not isinstance(out, torch.Tensor) else [out]
    dep_outs = [o.name for o in dep.graph.output]
    if len(outs) == len(dep_outs):
        for name, value in zip(dep_outs, outs):
            t = _Target("", f"output '{name}'", "output", "", "", name, False, len(dep.graph.node))
            ordered.append(_row(t, value.detach().float().cpu().numpy(), got[name], None,
                                steps, rtol))
    else:
        notes.append(f"outputs not compared: the file has {len(dep_outs)}, the model returns "
                     f"{len(outs)} tensors")
    with torch.no_grad():  # end to end: the model on its own values, the file as deployed
        plain = copied(*args, **kwargs)
    plain = [v for _, v in flatten(plain)] if not isinstance(plain, torch.Tensor) else [plain]
    note, worst = _end_to_end(runnable, feeds, runtime,
                              [v.detach().float().cpu().numpy() for v in plain])
    if note:
        notes.append(note)
    report = DeployCheckReport(ordered, _file_name(onnx_path), runtime, steps, rtol, notes)
    report.end_to_end = worst
    return report


def _numpy_inputs(inputs):
    if isinstance(inputs, dict):
        return {k: _to_numpy(v) for k, v in inputs.items()}
    if isinstance(inputs, (tuple, list)):
        return [_to_numpy(v) for v in inputs]
    return [_to_numpy(inputs)]


def _torch_call(model, inputs, dict_parameter):
    """(args, kwargs) for the model's forward from ``inputs`` (as convert_deploy reads its
    ``dummy_input``)."""
    import torch

    def as_tensor(v):
        return v if isinstance(v, torch.Tensor) else torch.from_numpy(np.asarray(v))
    if isinstance(inputs, dict):
        tensors = {k: as_tensor(v) for k, v in inputs.items()}
        if dict_parameter(model, tensors) is not None:
            return (tensors,), {}
        return (), tensors
    seq = inputs if isinstance(inputs, (tuple, list)) else [inputs]
    return tuple(as_tensor(v) for v in seq), {}


def _fx_layers(model):
    """layer_of(quantizer, call) for a GraphModule: the module path (or input, or node name)
    of the fx node a quantizer's call reads."""
    import torch
    graph = getattr(model, "graph", None)
    calls = {}
    if isinstance(graph, torch.fx.Graph):
        for node in graph.nodes:
            if node.op == "call_module" and node.args and isinstance(node.args[0], torch.fx.Node):
                src = node.args[0]
                layer = src.target if src.op in ("call_module", "placeholder") else src.name
                calls.setdefault(node.target, []).append(str(layer))

    def layer_of(name, call):
        found = calls.get(name, [])
        if call < len(found):
            return found[call]
        return _reference_layer(name, None, name)
    return layer_of


def _torch_step(module, output):
    """The quantization step of each value of ``output`` (numpy, broadcastable), or None for a
    quantizer without a uniform grid: the scale for integer grids, the FP8 spacing at each
    value for FP8."""
    scale = getattr(module, "scale", None)
    if scale is None or not hasattr(scale, "detach") or \
            not bool(getattr(module, "fake_quant_enabled", [1])[0]) or \
            getattr(module, "group_size", None) is not None:  # group-wise: no per-value step
        return None
    s = _channel_view(scale.detach().float().cpu().numpy().astype(np.float64),
                      getattr(module, "ch_axis", -1), output.dim())
    fmt = getattr(module, "format", None)
    if isinstance(fmt, str) and fmt.startswith("fp8"):
        return _fp8_step(output.detach().float().cpu().numpy(), s, fmt)
    if isinstance(fmt, str) and fmt not in ("int",):  # block formats: no per-value grid here
        return None
    return s


def _channel_view(s, ch_axis, ndim):
    """``s`` (one value, or one per channel along ``ch_axis``) shaped to broadcast over a
    tensor of rank ``ndim``."""
    if s.size == 1:
        return s.reshape(())
    axis = 0 if ch_axis is None else (ch_axis % ndim if ndim else 0)
    shape = [1] * ndim
    shape[axis] = -1
    return s.reshape(shape)


def _dequantize_torch(module, value, ndim):
    s = _channel_view(module.scale.detach().float().cpu().numpy().astype(np.float64),
                      getattr(module, "ch_axis", -1), ndim)
    z = _channel_view(module.zero_point.detach().float().cpu().numpy().astype(np.float64),
                      getattr(module, "ch_axis", -1), ndim)
    return (np.asarray(value, dtype=np.float64) - np.round(z)) * s


# -- the command line -----------------------------------------------------------------------
def _load_inputs(paths):
    """The --inputs files: one .npy per graph input, in order, or one .npz keyed by name."""
    if len(paths) == 1 and paths[0].endswith(".npz"):
        with np.load(paths[0], allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    return [np.load(p, allow_pickle=False) for p in paths]


def main(argv=None):
    """``mqbench-deploy check MODEL.onnx --reference FQ.onnx --inputs X.npy [...]``: exit 0
    when every tensor agrees, 1 when the file departs (the first layer is named) or the check
    fails, 2 on bad usage."""
    parser = argparse.ArgumentParser(
        prog="mqbench-deploy check",
        description="Compares a deployed ONNX file, layer by layer, with the fake-quant model's "
                    "export it came from, and names the first layer where it departs.")
    parser.add_argument("model", help="the deployed file")
    parser.add_argument("--reference", required=True,
                        help="the fake-quant model's export (mqbench's nodes)")
    parser.add_argument("--inputs", required=True, nargs="+",
                        help="one .npy per input in the file's order, or one .npz by input name")
    parser.add_argument("--runtime", default="onnxruntime", choices=RUNTIMES)
    parser.add_argument("--rtol", type=float, default=None)
    parser.add_argument("--steps", type=float, default=1.0)
    parser.add_argument("--html", default=None, help="also write the report to this file")
    args = parser.parse_args(argv)
    try:
        dep = _parse(_model_bytes(args.model, "MODEL"), "MODEL")
        report = check_files(dep, args.reference, _load_inputs(args.inputs), args.runtime,
                             args.rtol, steps=args.steps)
        report.file = args.model
        print(report)
        if args.html:
            report.to_html(args.html)
    except (ValueError, OSError, ImportError, TypeError) as e:
        print(f"mqbench-deploy check: {e}", file=sys.stderr)
        return 1
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
