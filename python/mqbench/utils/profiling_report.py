"""How :func:`mqbench.utils.profiling.profiling` shows its records: the table it logs and the
HTML report it writes to ``report_dir`` (``index.html``, an SQNR bar chart and histograms of the
lowest-SQNR layers, drawn with matplotlib on its own Agg canvas).

The two share one formatting of a record (:func:`_row_cells`), so the page and the log say the
same numbers. The profiler itself (the copies, the taps, the metrics) is in ``profiling.py``.
"""
import contextlib
import html
import io
import math
import os
import tempfile

import torch

from mqbench.utils.utils import to_device

# At most this many activation values per layer go into a histogram of the report.
_HIST_SAMPLE = 200_000


# -- table ----------------------------------------------------------------------------------
_HEADERS = ("op", "name", "nodes", "cosine", "sqnr_db", "mse")


def _nodes_text(nodes):
    return "[" + ", ".join(str(getattr(n, "name", n)) for n in nodes) + "]"


def _fmt_sqnr(v):
    return "inf" if v == math.inf else ("-inf" if v == -math.inf else f"{v:.2f}")


def _row_cells(r):
    """The printed (and HTML) cells of one record: the same strings in both places."""
    return (r.op, r.name, _nodes_text(r.nodes), f"{r.cosine:.6f}", _fmt_sqnr(r.sqnr_db),
            f"{r.mse:.4e}")


def _format_table(records):
    rows = [_row_cells(r) for r in records]
    widths = [max([len(h)] + [len(row[i]) for row in rows]) for i, h in enumerate(_HEADERS)]
    numeric = (False, False, False, True, True, True)
    rule = "+" + "+".join("-" * (w + 2) for w in widths) + "+"

    def line(cells):
        return "| " + " | ".join(c.rjust(w) if num else c.ljust(w)
                                 for c, w, num in zip(cells, widths, numeric)) + " |"

    out = [rule, line(_HEADERS), rule] + [line(row) for row in rows] + [rule]
    return "\n".join(out)


# -- the report directory ------------------------------------------------------------------
def check_report_dir(report_dir):
    if report_dir is None:
        return None
    try:
        path = os.fspath(report_dir)
    except TypeError:
        raise TypeError(f"report_dir must be a path (str or os.PathLike), got "
                        f"{type(report_dir).__name__}") from None
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if not path:
        raise ValueError("report_dir is empty: pass a directory path, or None for no report")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"report_dir {path!r} exists and is not a directory: pass a directory "
                         f"(it is created when missing)")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ImportError("the HTML report (report_dir) needs matplotlib: pip install "
                          "matplotlib, or pass report_dir=None") from None
    return path


# -- the HTML report ------------------------------------------------------------------------
# Note [Report files]: every file name is fixed here (index.html, sqnr.png, worstN_weight.png,
# worstN_act.png), never derived from a layer name, so nothing is written outside report_dir.
# Each file is written to a fresh temporary file in report_dir (O_EXCL) and renamed over the
# final name with os.replace, which replaces a symlink planted there rather than following it.
# PNGs are referenced by relative path, so the folder can be moved or zipped as a whole.
def _write_file(report_dir, filename, data):
    fd, tmp = tempfile.mkstemp(prefix=f".{filename}.", suffix=".tmp", dir=report_dir)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, os.path.join(report_dir, filename))
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _new_figure(width, height):
    """A matplotlib Figure on its own Agg canvas: pyplot and the user's backend are untouched."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    fig = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(fig)
    return fig


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


_BAR, _BAR_WORST = "#4C72B0", "#C44E52"


def _sqnr_chart(records, worst_names):
    n = len(records)
    fig = _new_figure(9, max(2.5, 0.28 * n + 1.2))
    ax = fig.add_subplot(1, 1, 1)
    for i, r in enumerate(records):
        color = _BAR_WORST if r.name in worst_names else _BAR
        if math.isfinite(r.sqnr_db):
            ax.barh(i, r.sqnr_db, color=color)
        else:  # no bar: nothing quantized here (+inf), or an all-zero float output (-inf)
            note = " no error (nothing quantized here)" if r.sqnr_db > 0 else \
                " float output all zero"
            ax.text(0, i, note, va="center", ha="left", fontsize=8, color="#555555")
    ax.set_yticks(range(n))
    ax.set_yticklabels([r.name for r in records], fontsize=8, parse_math=False)
    ax.invert_yaxis()
    ax.set_xlabel("SQNR (dB), higher is better")
    ax.set_title("Per-layer SQNR (red: the lowest)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    return _png(fig)


def _qparams(fq):
    """(scale, zero_point, quant_min, quant_max, ch_axis) of a fake quantizer, or None."""
    scale, zp = getattr(fq, "scale", None), getattr(fq, "zero_point", None)
    qmin, qmax = getattr(fq, "quant_min", None), getattr(fq, "quant_max", None)
    if not isinstance(scale, torch.Tensor) or qmin is None or qmax is None:
        return None
    zp = zp if isinstance(zp, torch.Tensor) else torch.zeros_like(scale)
    return (scale.detach().double().cpu().flatten(), zp.detach().double().cpu().flatten(),
            int(qmin), int(qmax), int(getattr(fq, "ch_axis", -1)))


def _clip_view(values, fq):
    """(values to plot, lo, hi, x label). Per tensor: real values and the clip range
    [(qmin - zp) * s, (qmax - zp) * s]. Per channel: x / s_c + zp_c (quantization steps), so
    one range [qmin, qmax] holds for every channel."""
    values = values.detach().double().cpu()
    qp = _qparams(fq) if fq is not None else None
    if qp is None:
        return values.flatten(), None, None, "value"
    s, zp, qmin, qmax, ch_axis = qp
    if s.numel() == 1:
        s, zp = float(s[0]), float(zp[0])
        return values.flatten(), (qmin - zp) * s, (qmax - zp) * s, "value"
    axis = ch_axis if ch_axis >= 0 else values.dim() + ch_axis
    shape = [1] * values.dim()
    shape[axis] = -1
    grid = values / s.view(shape) + zp.view(shape)
    return grid.flatten(), float(qmin), float(qmax), "x / scale + zero_point (per channel)"


def _histogram(values, fq, title):
    import numpy as np
    plot, lo, hi, xlabel = _clip_view(values, fq)
    data = plot.numpy()
    fig = _new_figure(6, 3.2)
    ax = fig.add_subplot(1, 1, 1)
    ax.hist(data, bins=100, color=_BAR, alpha=0.85)
    ax.set_yscale("log")
    text = title
    if lo is not None:
        for x in (lo, hi):
            ax.axvline(x, color=_BAR_WORST, linestyle="--", linewidth=1.2)
        clipped = float(np.mean((data < lo) | (data > hi))) * 100 if data.size else 0.0
        text += f"\nclip range [{lo:.4g}, {hi:.4g}], {clipped:.2f}% outside"
    ax.set_title(text, fontsize=9, parse_math=False)  # "$" in names
    ax.set_xlabel(xlabel)
    ax.set_ylabel("count (log)")
    fig.tight_layout()
    return _png(fig)


def _collect_tensors(fp_model, cali_data, device, wanted):
    """Runs the float copy once over ``cali_data`` with pre-hooks on the fake quantizers in
    ``wanted`` ({key: module}); returns {key: values seen at that quantizer's input} (weights:
    the first call; activations: a strided sample of at most _HIST_SAMPLE values)."""
    n_batches = max(1, len(cali_data)) if hasattr(cali_data, "__len__") else 1
    per_batch = max(1, _HIST_SAMPLE // n_batches)
    seen = {key: [] for key in wanted}
    handles = []

    def make_hook(key, weight):
        def hook(module, inputs):
            x = inputs[0].detach() if inputs and isinstance(inputs[0], torch.Tensor) else None
            if x is None or (weight and seen[key]):
                return
            if weight:
                seen[key].append(x.cpu().clone())
            elif sum(t.numel() for t in seen[key]) < _HIST_SAMPLE:
                flat = x.flatten()
                step = max(1, math.ceil(flat.numel() / per_batch))
                seen[key].append(flat[::step].cpu().clone())
        return hook

    for key, (module, weight) in wanted.items():
        handles.append(module.register_forward_pre_hook(make_hook(key, weight)))
    try:
        with torch.no_grad():
            for batch in cali_data:
                fp_model(to_device(batch, device))
    finally:
        for h in handles:
            h.remove()
    out = {}
    for key, parts in seen.items():
        if parts:
            out[key] = parts[0] if wanted[key][1] else torch.cat(parts)
    return out


def _render_html(result, worst, images):
    """The report page. ``worst``: the highlighted records; ``images``: {record name: [(file,
    caption)]} for the worst layers. Every name and caption is escaped."""
    esc = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    worst_names = {r.name for r in worst}
    mode = ("each op quantized alone" if result.profiling_type == "standalone"
            else "each op quantized together with every op before it")
    p = ['<!DOCTYPE html>', '<html lang="en">', '<head>', '<meta charset="utf-8">',
         '<title>MQBench profiling report</title>',
         '<style>body{font-family:sans-serif;margin:2em;max-width:70em}'
         'table{border-collapse:collapse;font-size:0.9em}'
         'th,td{border:1px solid #ccc;padding:2px 8px}td.num{text-align:right;'
         'font-family:monospace}tr.worst{background:#fbe3e4}img{max-width:100%}'
         'code{background:#f4f4f4}</style>', '</head>', '<body>',
         '<h1>Quantization profiling report</h1>',
         f'<p>Profiling type: <b>{esc(result.profiling_type)}</b> ({mode}); '
         f'{len(result)} profiled ops. Errors compare the output of each op (after its '
         f'activation fake quantizer) with the float model\'s output at the same place.</p>',
         '<h2>Summary</h2>', '<pre>' + esc(result.summary) + '</pre>']
    if len(result):
        p += ['<h2>Per-layer SQNR</h2>',
              '<img src="sqnr.png" alt="per-layer SQNR bar chart; the lowest in red">']
    p += ['<h2>Per-layer errors</h2>', '<table id="layers">',
          '<tr>' + ''.join(f'<th>{esc(h)}</th>' for h in _HEADERS) + '</tr>']
    for r in result:
        cells = _row_cells(r)
        cls = ' class="worst"' if r.name in worst_names else ''
        p.append(f'<tr{cls}>' + ''.join(f'<td>{esc(c)}</td>' for c in cells[:3]) +
                 ''.join(f'<td class="num">{esc(c)}</td>' for c in cells[3:]) + '</tr>')
    p.append('</table>')
    if worst:
        p.append('<h2>Lowest-SQNR layers</h2>')
        for i, r in enumerate(worst, 1):
            p.append(f'<h3>{i}. {esc(r.name)} ({esc(r.op)})</h3>')
            p.append(f'<p>nodes {esc(_nodes_text(r.nodes))}; cosine {esc(f"{r.cosine:.6f}")}, '
                     f'SQNR {esc(_fmt_sqnr(r.sqnr_db))} dB, MSE {esc(f"{r.mse:.4e}")}</p>')
            shown = images.get(r.name, [])
            if not shown:
                p.append('<p>No fake quantizer with a clip range on this op.</p>')
            for file, caption in shown:
                p.append(f'<figure><img src="{esc(file)}" alt="{esc(caption)}">'
                         f'<figcaption>{esc(caption)}</figcaption></figure>')
    p += ['<h2>How to read this report</h2>', '<ul>',
          '<li><b>SQNR</b> (dB) = 10 log10(signal energy / error energy) over all batches: '
          'every 6 dB is about one bit. Below ~10 dB the op is badly quantized.</li>',
          '<li><b>cosine</b> is MQBench\'s metric, averaged over batches; 1 is perfect.</li>',
          '<li>In the histograms the dashed lines are the clip range of the quantizer: values '
          'outside are clipped, a range much wider than the values wastes levels.</li>',
          '<li>A function op without a following quantizer (node <code>*_dummy</code>) has '
          'nothing to quantize in standalone mode: its error is 0.</li>', '</ul>',
          '</body>', '</html>']
    return "\n".join(p) + "\n"


def write_report(report_dir, result, plans, fp_model, cali_data, device, num_worst):
    os.makedirs(report_dir, exist_ok=True)
    worst = [r for r in result.worst(num_worst) if r.sqnr_db != math.inf] if num_worst else []
    if result:
        _write_file(report_dir, "sqnr.png", _sqnr_chart(result, {r.name for r in worst}))
    by_name = {plan.name: plan for plan in plans}
    # The float copy's quantizers of the worst layers (all off) see the float values; the
    # quantized copy's twins hold the same qparams.
    wanted, fq_of = {}, {}
    for r in worst:
        for kind, (q_fq, f_fq) in by_name[r.name].quantizers.items():
            fq_of[(r.name, kind)] = q_fq
            wanted[(r.name, kind)] = (f_fq, kind == "weight")
    values = _collect_tensors(fp_model, cali_data, device, wanted) if wanted else {}
    images = {}
    for i, r in enumerate(worst, 1):
        for kind in ("weight", "act"):
            key = (r.name, kind)
            if key not in values:
                continue
            what = "weight" if kind == "weight" else "activation (op output, float model)"
            file = f"worst{i}_{kind}.png"
            _write_file(report_dir, file, _histogram(values[key], fq_of[key], f"{r.name}: {what}"))
            images.setdefault(r.name, []).append((file, f"{r.name}: {what} histogram"))
    page = _render_html(result, worst, images)
    _write_file(report_dir, "index.html", page.encode("utf-8"))
    return os.path.join(report_dir, "index.html")
