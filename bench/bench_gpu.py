"""GPU benchmark of the fake-quantize ops, the observer searches and the QAT training step.

    PYTHONPATH=python python bench/bench_gpu.py [--all-variants] [--sections bw,obs,qat]
        [--device cuda] [--amp bf16] [--channels-last] [--compile] [--models resnet18,...]
    PYTHONPATH=python .venv/bin/python bench/bench_gpu.py --device cpu --smoke   # a quick check

Everything is measured in this one run on one device, and every ratio is between two figures
of this run. On CUDA a figure is the median of N `torch.cuda.Event` pairs recorded after a
warm-up (no synchronisation between repetitions, one `torch.cuda.synchronize` before reading
them); on the CPU, of N `time.perf_counter` intervals. Sections:

  bw   bandwidth, 64M elements (--smoke: 64K): copy_ into a preallocated tensor (the baseline,
       read+write bytes / time); torch's fixed fake-quant ops and ours, per tensor and per
       channel ([64, 256, 64, 64] axis 1, weight-like [4096, 16384] axis 0), as % of the copy's
       bandwidth; LSQ forward+backward (torch's `_fake_quantize_learnable_*` against ours) as
       the ratio torch / ours; in float32, float16 and bfloat16.
  obs  observers on 4M floats (--smoke: 64K): MQBench's MSE search (a Python loop over the
       candidates, a host sync per candidate) against `observer_mse_range`, per tensor and per
       channel, the same for EMAMSEObserver; `observer_min_max` against `torch.aminmax`;
       `observer_quantile_range` against histc + a Python loop over the bins. The MSE rows also
       check that our op picks the loop's range (or one whose loss ties it).
  qat  a training step (forward, backward, SGD) of resnet18, resnet50 and mobilenet_v2, batch 64
       at 224x224 (--smoke: batch 2 at 64x64): float; torch.ao `prepare_qat_fx`; ours
       Tensorrt; ours Academic 4-bit LSQ; quantized models calibrated, observers off.

Failures (an op without a kernel for a dtype, torch.ao refusing a mode) land in the table cell
as a numbered note and the run goes on. Figures: docs/benchmarks.md.
"""
import argparse
import copy
import math
import platform
import statistics
import time
import warnings

import torch

import mqbench
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization

from bench_observers import quantile_observe_plain  # bench/ is the script's directory

ops = torch.ops.mqbench
QMIN, QMAX = -128, 127
MODELS = ("resnet18", "resnet50", "mobilenet_v2")
TIMM_NAMES = {"resnet18": "resnet18", "resnet50": "resnet50", "mobilenet_v2": "mobilenetv2_100"}
ACADEMIC_W4A4 = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 4, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 4, "symmetry": False, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver"}}


# ---- timing ---------------------------------------------------------------------------------

class Timer:
    """Medians in ms: CUDA event pairs on CUDA, perf_counter elsewhere."""

    def __init__(self, device, repeats, warmup):
        self.cuda = device.type == "cuda"
        self.repeats, self.warmup = repeats, warmup

    def start(self, fn):
        """Runs fn once; returns a callable giving its time in ms (CUDA: read after a sync)."""
        if self.cuda:
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            fn()
            end.record()
            return lambda: begin.elapsed_time(end)
        t0 = time.perf_counter()
        fn()
        ms = (time.perf_counter() - t0) * 1e3
        return lambda: ms

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def median(self, fn, repeats=None, warmup=None):
        for _ in range(self.warmup if warmup is None else warmup):
            fn()
        self.sync()
        pending = [self.start(fn) for _ in range(repeats or self.repeats)]
        self.sync()
        return statistics.median(p() for p in pending)


# ---- table printing with errors as numbered notes --------------------------------------------

class Table:
    """Rows of cells; an exception in a cell prints as [n] and its message below the table."""

    def __init__(self, columns):
        self.columns, self.rows, self.notes = columns, [], []

    def error(self, exc):
        msg = " ".join(f"{type(exc).__name__}: {exc}".split())
        if len(msg) > 300:
            msg = msg[:300] + " ..."
        self.notes.append(msg)
        return f"[{len(self.notes)}] {type(exc).__name__}"

    def add(self, *cells):
        self.rows.append([c if isinstance(c, str) else self.error(c) for c in cells])

    def print(self, title):
        widths = [max(len(str(r[i])) for r in [self.columns] + self.rows)
                  for i in range(len(self.columns))]
        line = lambda r: " | ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)
                                    for i, (c, w) in enumerate(zip(r, widths)))
        print(f"\n{title}")
        print(line(self.columns))
        print("-" * len(line(self.columns)))
        for r in self.rows:
            print(line(r))
        for i, n in enumerate(self.notes, 1):
            print(f"  [{i}] {n}")


def attempt(fn):
    """fn() or the exception it raised (the benchmark goes on)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any failure is reported in its cell
        # Drop the traceback: its frames would keep the failed column's model and tensors
        # (device memory) alive for the rest of the run.
        e.__traceback__, e.__context__, e.__cause__ = None, None, None
        return e


def ms_cell(v):
    """A time in ms; "-" where there is nothing to time (None), the exception where it failed."""
    return "-" if v is None else v if isinstance(v, Exception) else f"{v:.3f}"


def pct_cell(ref_ms, v, factor=1.0):
    return "" if v is None or isinstance(v, Exception) or isinstance(ref_ms, Exception) else \
        f"{factor * ref_ms / v * 100:.0f}%"


def row_adder(table, res, timer, copy_ms):
    """add(label, key, torch_fn, ours_fn, factor=1.0): times both (``torch_fn`` None: no torch
    counterpart), keeps ``res[key] = (torch ms, ours ms)`` and adds the table's row."""
    def add(label, key, torch_fn, ours_fn, factor=1.0):
        t = None if torch_fn is None else attempt(lambda: timer.median(torch_fn))
        o = attempt(lambda: timer.median(ours_fn))
        res[key] = (t, o)
        table.add(label, ms_cell(t), pct_cell(copy_ms, t, factor), ms_cell(o),
                  pct_cell(copy_ms, o, factor), ratio_cell(t, o))
    return add


def ratio_cell(a, b):
    return "" if a is None or b is None or isinstance(a, Exception) or \
        isinstance(b, Exception) else f"{a / b:.2f}x"


# ---- section 1: bandwidth ---------------------------------------------------------------------

def section_bw(args, dev, timer, results):
    if args.smoke:
        act_shape, w_shape = (4, 16, 32, 32), (256, 256)
    else:
        act_shape, w_shape = (64, 256, 64, 64), (4096, 16384)
    g = torch.Generator(device=dev).manual_seed(0)  # data made on the device: 64M randn is slow on a CPU
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(act_shape, generator=g, device=dev, dtype=dtype)
        w = torch.randn(w_shape, generator=g, device=dev, dtype=dtype)
        y = torch.empty_like(x)
        numel, esize = x.numel(), x.element_size()
        copy_ms = timer.median(lambda: y.copy_(x))
        gbs = 2 * numel * esize / (copy_ms * 1e-3) / 1e9
        s_t = torch.tensor([0.02], device=dev)
        z_t = torch.tensor([0], dtype=torch.int32, device=dev)
        zf_t = torch.tensor([0.0], device=dev)

        def channel_qparams(t, axis):
            c = t.shape[axis]
            sc = torch.rand(c, generator=g, device=dev) * 0.02 + 0.01
            return sc, torch.zeros(c, dtype=torch.int32, device=dev), torch.zeros(c, device=dev)

        def lsq_step(fn, t, s, z):
            dy = torch.randn(t.shape, generator=g, device=dev, dtype=dtype)

            def step():
                xr = t.detach().requires_grad_()
                fn(xr, s.detach().requires_grad_(), z.detach().requires_grad_()).backward(dy)
            return step

        table = Table(["op", "torch ms", "% copy", "ours ms", "% copy", "torch / ours"])
        res = {}
        row = row_adder(table, res, timer, copy_ms)

        row("fake_quant per tensor", "pt",
            lambda: torch.fake_quantize_per_tensor_affine(x, s_t, z_t, QMIN, QMAX),
            lambda: ops.fake_quantize_per_tensor_affine(x, s_t, z_t, QMIN, QMAX))
        shapes = [(x, 1, f"{list(act_shape)} axis 1", "pc_act"), (w, 0, f"{list(w_shape)} axis 0", "pc_w")]
        for t, axis, desc, key in shapes:
            sc, zc, _ = channel_qparams(t, axis)
            row(f"fake_quant per channel {desc}", key,
                lambda: torch.fake_quantize_per_channel_affine(t, sc, zc, axis, QMIN, QMAX),
                lambda: ops.fake_quantize_per_channel_affine(t, sc, zc, axis, QMIN, QMAX))
        # LSQ: the ideal traffic is 5 passes (forward reads x, writes y; backward reads x and dy,
        # writes dx), 2.5 copies: "% copy" of these rows is against that floor.
        gf = 1.0 / math.sqrt(numel * QMAX)
        row("LSQ fwd+bwd per tensor", "lsq_pt",
            lsq_step(lambda a, b, c: torch._fake_quantize_learnable_per_tensor_affine(
                a, b, c, QMIN, QMAX, gf), x, s_t, zf_t),
            lsq_step(lambda a, b, c: ops.fake_quantize_learnable_per_tensor_affine(
                a, b, c, QMIN, QMAX, gf), x, s_t, zf_t), factor=2.5)
        for t, axis, desc, key in shapes:
            sc, _, zcf = channel_qparams(t, axis)
            gfc = 1.0 / math.sqrt(t.numel() / t.shape[axis] * QMAX)
            row(f"LSQ fwd+bwd per channel {desc}", "lsq_" + key,
                lsq_step(lambda a, b, c: torch._fake_quantize_learnable_per_channel_affine(
                    a, b, c, axis, QMIN, QMAX, gfc), t, sc, zcf),
                lsq_step(lambda a, b, c: ops.fake_quantize_learnable_per_channel_affine(
                    a, b, c, axis, QMIN, QMAX, gfc), t, sc, zcf), factor=2.5)
        results[("bw", dtype)] = res
        if dtype == torch.float32:
            results[("bw_copy",)] = copy_ms
        name = str(dtype).replace("torch.", "")
        table.print(f"Bandwidth, {name}, {numel} elements: copy_ {copy_ms:.3f} ms = {gbs:.1f} GB/s "
                    f"(read+write); LSQ rows' % copy: against 2.5 copies (5 passes over the tensor)")
        del x, w, y
        if dev.type == "cuda":
            torch.cuda.empty_cache()


# ---- section 2: observers ---------------------------------------------------------------------

EPS = torch.finfo(torch.float32).eps


def sym_qparams(mn, mx):
    """The observer formula (docs/observers.md), symmetric int8: s = max(max(-mn, mx) / 127.5, eps)."""
    mn, mx = torch.clamp(mn, max=0), torch.clamp(mx, min=0)
    s = torch.clamp(torch.maximum(-mn, mx) / ((QMAX - QMIN) / 2), min=EPS)
    return s, torch.zeros_like(s, dtype=torch.int32)


def mse_loop_per_tensor(x, iters, p=2.0):
    """MQBench's search as described in docs/observers.md: candidates shrink the batch range by
    1% steps; each runs torch's per-tensor fake quant with qparams read back by `.item()`, an Lp
    loss, and a host-side comparison. Returns (best_min, best_max, best_score)."""
    x_min, x_max = torch.aminmax(x)
    best_score, best = 1e10, (x_min, x_max)
    for i in range(iters):
        new_min, new_max = x_min * (1.0 - i * 0.01), x_max * (1.0 - i * 0.01)
        s, z = sym_qparams(new_min, new_max)
        xq = torch.fake_quantize_per_tensor_affine(x, s.item(), int(z.item()), QMIN, QMAX)
        score = (xq - x).abs().pow(p).mean()
        if score < best_score:
            best_score, best = score, (new_min, new_max)
    return best[0], best[1], float(best_score)


def mse_loop_per_channel(x, axis, iters, p=2.0):
    """The per-channel search with the channels batched: per candidate one torch per-channel
    fake-quant pass, a per-channel Lp loss, the better channels kept by boolean indexing (a host
    sync per candidate). Returns (best_min, best_max, best_score) per channel."""
    dims = [d for d in range(x.dim()) if d != axis]
    x_min = torch.amin(x, dim=dims)
    x_max = torch.amax(x, dim=dims)
    best_score = torch.full_like(x_min, 1e10)
    best_min, best_max = x_min.clone(), x_max.clone()
    for i in range(iters):
        new_min, new_max = x_min * (1.0 - i * 0.01), x_max * (1.0 - i * 0.01)
        s, z = sym_qparams(new_min, new_max)
        xq = torch.fake_quantize_per_channel_affine(x, s, z, axis, QMIN, QMAX)
        score = (xq - x).abs().pow(p).mean(dim=dims)
        better = score < best_score
        best_score[better] = score[better]
        best_min[better] = new_min[better]
        best_max[better] = new_max[better]
    return best_min, best_max, best_score


def mse_loop_each_channel(x, axis, iters):
    """docs/observers.md's per-channel description taken literally: the per-tensor loop run on
    every channel in turn (candidates x channels host syncs)."""
    xc = x.transpose(0, axis)
    out = [mse_loop_per_tensor(xc[c], iters) for c in range(xc.shape[0])]
    return torch.stack([o[0] for o in out]), torch.stack([o[1] for o in out])


def ema_update(state, cur_min, cur_max, ratio=0.9):
    """EMAMSEObserver's combination rule: first batch as is, then v = v * r + batch * (1 - r)."""
    if state:
        cur_min = state[0] * ratio + cur_min * (1 - ratio)
        cur_max = state[1] * ratio + cur_max * (1 - ratio)
    state[:] = [cur_min, cur_max]


def quantile_loop(x, threshold=0.99999, bins=2048):
    """EMAQuantileObserver's batch range as MQBench computes it: torch.histc over |x|, then a
    Python loop over the bins of the (device) histogram (bench_observers.py's baseline)."""
    return quantile_observe_plain(x, threshold, bins)


def mse_equivalence(x, axis, iters, ours):
    """Does our op pick the loop's range? 'same' when bit-equal; else 'tie' when our range's
    loss equals the loop's best loss within 1e-5 relative (a different summation order can
    break a tie the other way); else 'DIFFERENT'."""
    if axis == -1:
        lmin, lmax, lscore = mse_loop_per_tensor(x, iters)
        if torch.equal(lmin.reshape(-1), ours[0].reshape(-1)) and \
                torch.equal(lmax.reshape(-1), ours[1].reshape(-1)):
            return "same range"
        s, z = sym_qparams(ours[0].reshape(()), ours[1].reshape(()))
        xq = torch.fake_quantize_per_tensor_affine(x, s.item(), int(z.item()), QMIN, QMAX)
        oscore = float((xq - x).pow(2).mean())
        return "tie (loss within 1e-5)" if abs(oscore - lscore) <= 1e-5 * abs(lscore) else \
            f"DIFFERENT: loss {oscore:.6g} vs loop {lscore:.6g}"
    lmin, lmax, lscore = mse_loop_per_channel(x, axis, iters)
    same = (lmin == ours[0]) & (lmax == ours[1])
    if bool(same.all()):
        return f"same range, {same.numel()}/{same.numel()} ch"
    dims = [d for d in range(x.dim()) if d != axis]
    s, z = sym_qparams(ours[0], ours[1])
    oscore = (torch.fake_quantize_per_channel_affine(x, s, z, axis, QMIN, QMAX) - x).pow(2).mean(dim=dims)
    tie = (oscore - lscore).abs() <= 1e-5 * lscore.abs()
    n_same, n_tie = int(same.sum()), int((tie & ~same).sum())
    bad = same.numel() - n_same - n_tie
    return f"same {n_same}, tie {n_tie}" + (f", DIFFERENT {bad}" if bad else "") + f" of {same.numel()} ch"


def section_obs(args, dev, timer, results):
    from mqbench.observer import EMAMSEObserver
    shape = (4, 16, 32, 32) if args.smoke else (16, 64, 64, 64)
    x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(dev)
    eps = torch.tensor([EPS], device=dev)
    it_t, it_c = 95, 80  # MQBench's (and MSEObserver's) candidate counts
    few = max(2, timer.repeats // 4)  # the Python loops are slow: fewer repetitions
    table = Table(["observer step", "baseline", "baseline ms", "ours ms", "baseline / ours",
                   "our range vs the loop's"])
    res = {}

    def row(label, base_label, key, base_fn, ours_fn, check="", base_repeats=None):
        b = attempt(lambda: timer.median(base_fn, repeats=base_repeats or few, warmup=1))
        o = attempt(lambda: timer.median(ours_fn))
        res[key] = (b, o)
        table.add(label, base_label, ms_cell(b), ms_cell(o), ratio_cell(b, o), check)

    def mse_op(axis, iters):
        return lambda: ops.observer_mse_range(x, axis, QMIN, QMAX, True, 0, eps, 2.0, iters)

    for axis, iters, key, desc in ((-1, it_t, "mse_t", "per tensor"), (1, it_c, "mse_c", f"per channel ({shape[1]} ch)")):
        ours = attempt(mse_op(axis, iters))
        check = ours if isinstance(ours, Exception) else attempt(lambda: mse_equivalence(x, axis, iters, ours))
        if axis == -1:
            base_fn, base_label = (lambda: mse_loop_per_tensor(x, iters)), f"loop, {iters} cand., .item()"
        else:
            base_fn, base_label = (lambda: mse_loop_per_channel(x, axis, iters)), f"loop, {iters} cand., ch batched"
        row(f"MSE search {desc}", base_label, key, base_fn, mse_op(axis, iters), check)
    row(f"MSE search per channel ({shape[1]} ch)", f"loop, {it_c} cand. x {shape[1]} ch", "mse_c_each",
        lambda: mse_loop_each_channel(x, 1, it_c), mse_op(1, it_c), "(as above)", base_repeats=2)

    for axis, iters, key, desc in ((-1, it_t, "emamse_t", "per tensor"), (1, it_c, "emamse_c", "per channel")):
        state = []
        loop = mse_loop_per_tensor if axis == -1 else (lambda t, n: mse_loop_per_channel(t, 1, n))
        obs = EMAMSEObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric if axis == -1
                             else torch.per_channel_symmetric, quant_min=QMIN, quant_max=QMAX,
                             ch_axis=axis).to(dev)
        row(f"EMAMSEObserver {desc}", "loop + EMA (torch ops)", key,
            lambda: ema_update(state, *loop(x, iters)[:2]), lambda: obs(x), "(same search)")

    row("min/max per tensor", "torch.aminmax", "minmax_t", lambda: torch.aminmax(x),
        lambda: ops.observer_min_max(x, -1), base_repeats=timer.repeats)
    row("min/max per channel", "permute+flatten+aminmax", "minmax_c",
        lambda: torch.aminmax(x.transpose(0, 1).flatten(1), dim=1),
        lambda: ops.observer_min_max(x, 1), base_repeats=timer.repeats)

    def quantile_check():
        a, b = quantile_loop(x), ops.observer_quantile_range(x, 0.99999, 2048)
        bin_w = float(torch.max(-x.min(), x.max())) / 2048
        d = max(abs(float(a[0]) - float(b[0])), abs(float(a[1]) - float(b[1])))
        return "same range" if d == 0 else f"differs by {d / bin_w:.2g} bin"
    row("quantile range (EMAQuantile)", "histc + loop over 2048 bins", "quantile",
        lambda: quantile_loop(x), lambda: ops.observer_quantile_range(x, 0.99999, 2048),
        attempt(quantile_check))
    results["obs"] = res
    table.print(f"Observers on {x.numel()} float32 elements {list(shape)} (per channel: axis 1), "
                f"symmetric int8; baseline repetitions {few}")


# ---- section 3: the QAT step ------------------------------------------------------------------

def model_factory(zoo):
    """name -> a float model constructor, from torchvision when importable, else timm."""
    if zoo in ("auto", "torchvision"):
        try:
            import torchvision
            return "torchvision", lambda name: getattr(torchvision.models, name)()
        except ImportError:
            if zoo == "torchvision":
                raise
    import timm

    def create(name):
        # timm's ResNets zero-initialise the last BatchNorm weight of every block; BN folding
        # (ours, torch.ao's, MQBench's) divides the conv output by weight / std and gives NaN.
        # torchvision's default (zero_init_residual=False) is what this benchmark times.
        extra = {"zero_init_last": False} if name.startswith("resnet") else {}
        return timm.create_model(TIMM_NAMES[name], pretrained=False, **extra)
    return "timm", create


def train_step(model, x, y, amp_dtype):
    """One SGD step (momentum 0.9, cross-entropy), the forward under autocast when amp_dtype is
    given. lr 1e-3: any lr costs the same, and on random data a larger one can blow the
    BN-folded models' gradients up within the timed steps (NaN scales) at small sizes."""
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = torch.nn.CrossEntropyLoss()

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast(x.device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
    return step


def prepare_torch_ao(float_model, x, backend):
    from torch.ao.quantization import disable_observer, get_default_qat_qconfig_mapping
    from torch.ao.quantization.quantize_fx import prepare_qat_fx
    m = prepare_qat_fx(copy.deepcopy(float_model), get_default_qat_qconfig_mapping(backend),
                       example_inputs=(torch.randn(1, *x.shape[1:]),)).to(x.device)
    with torch.no_grad():
        m(x)  # calibration: observers see one batch
    m.apply(disable_observer)
    return m


def prepare_ours(float_model, x, backend, config=None):
    m = prepare_by_platform(copy.deepcopy(float_model), backend, config).to(x.device)
    enable_calibration(m)
    with torch.no_grad():
        m(x)
    enable_quantization(m)
    return m


def section_qat(args, dev, timer, results, amp_dtype):
    zoo, build = model_factory(args.zoo)
    # smoke: 64x64, not 32x32: resnet50's last BatchNorm would see 2 values per channel, and
    # the folded models' gradients overflow within two steps
    batch, size = (2, 64) if args.smoke else (args.batch, args.size)
    fmt = torch.channels_last if args.channels_last else torch.contiguous_format
    mode = (f"{'bf16 autocast' if amp_dtype is not None else 'fp32'}"
            f"{', channels_last' if args.channels_last else ''}"
            f"{f', torch.compile {args.compile_backend} (every column)' if args.compile else ''}")
    table = Table(["model", "float ms", "torch.ao ms", "x float", "Tensorrt ms", "x float",
                   "Academic w4a4 LSQ ms", "x float"])
    firsts = []
    for name in args.models:
        torch.manual_seed(0)
        x = torch.randn(batch, 3, size, size, device=dev).contiguous(memory_format=fmt)
        y = torch.randint(0, 1000, (batch,), device=dev)
        float_cpu = attempt(lambda: build(name).train())
        if isinstance(float_cpu, Exception):
            table.add(name, float_cpu, *[""] * 6)
            continue

        def torch_ao():
            errors = []
            for backend in ("x86", "fbgemm", "qnnpack"):  # the first that runs a step here
                try:
                    m = prepare_torch_ao(float_cpu, x, backend)
                    train_step(m, x, y, amp_dtype)()
                    return m
                except Exception as e:  # noqa: BLE001
                    errors.append(f"{backend}: {type(e).__name__}: {e}")
            raise RuntimeError("prepare_qat_fx failed with every qconfig mapping; " + " | ".join(errors))

        makers = {"float": lambda: copy.deepcopy(float_cpu).to(dev),
                  "torch.ao": torch_ao,
                  "Tensorrt": lambda: prepare_ours(float_cpu, x, BackendType.Tensorrt),
                  "Academic": lambda: prepare_ours(float_cpu, x, BackendType.Academic, ACADEMIC_W4A4)}
        steps, cells = {}, {}
        for col, make in makers.items():
            def setup():
                m = make().to(memory_format=fmt)
                if args.compile:
                    m = torch.compile(m, backend=args.compile_backend)
                step = train_step(m, x, y, amp_dtype)
                t0 = time.perf_counter()
                step()  # compiles under --compile
                timer.sync()
                firsts.append(f"{name} {col} {time.perf_counter() - t0:.1f} s")
                return step
            s = attempt(setup)
            if isinstance(s, Exception):
                cells[col] = s
            else:
                steps[col] = s
        # Warm-up, then interleaved rounds (float, torch.ao, Tensorrt, Academic, float, ...):
        # a drift of the card's clocks hits the four alike.
        for col in list(steps):
            e = attempt(lambda: [steps[col]() for _ in range(timer.warmup)])
            if isinstance(e, Exception):
                cells[col] = e
                del steps[col]
        timer.sync()
        pending = {col: [] for col in steps}
        for _ in range(args.steps):
            for col in list(steps):
                p = attempt(lambda: timer.start(steps[col]))
                if isinstance(p, Exception):
                    cells[col] = p
                    del steps[col]
                else:
                    pending[col].append(p)
        timer.sync()
        for col in steps:
            cells[col] = statistics.median(p() for p in pending[col])
        results[("qat", amp_dtype, name)] = cells
        f = cells.get("float")
        row = [name, ms_cell(f)]
        for col in ("torch.ao", "Tensorrt", "Academic"):
            row += [ms_cell(cells[col]), ratio_cell(cells[col], f)]
        table.add(*row)
        del steps, pending, float_cpu
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    table.print(f"QAT step ({zoo} models), batch {batch} at {size}x{size}, SGD, {mode}; medians of "
                f"{args.steps} interleaved steps after {timer.warmup} warm-up; torch.ao and ours "
                f"calibrated on one batch, observers off")
    if args.compile:
        print("  first step (compiles): " + "; ".join(firsts))


# ---- targets ----------------------------------------------------------------------------------

def print_targets(results, dev):
    """The issue's targets against this run's float32 / fp32 figures."""
    lines = []

    def check(label, value, ok, shown):
        if value is None or isinstance(value, Exception):
            lines.append(f"  {label}: n/a")
        else:
            lines.append(f"  {label}: {shown} -> {'met' if ok else 'NOT met'}")

    bw = results.get(("bw", torch.float32))
    if bw:
        for key, label, target in (("pt", "per-tensor fake-quant >= 92% of copy", 0.92),
                                   ("pc_act", "per-channel (activation) >= 85% of copy", 0.85),
                                   ("pc_w", "per-channel (weight) >= 85% of copy", 0.85)):
            t, o = bw[key]
            frac = None if isinstance(o, Exception) else results[("bw_copy",)] / o
            check(label, frac, frac is not None and frac >= target,
                  "" if frac is None else f"{frac * 100:.0f}%")
        for key, label in (("lsq_pt", "LSQ fwd+bwd per tensor >= 2.5x torch"),
                           ("lsq_pc_act", "LSQ fwd+bwd per channel (activation) >= 2.5x torch"),
                           ("lsq_pc_w", "LSQ fwd+bwd per channel (weight) >= 2.5x torch")):
            t, o = bw[key]
            r = None if isinstance(t, Exception) or isinstance(o, Exception) else t / o
            check(label, r, r is not None and r >= 2.5, "" if r is None else f"{r:.2f}x")
    fmt = results.get("fmt")
    if fmt:
        for key, label in (("fp8", "FP8 per tensor >= 80% of copy"),
                           ("group", "INT4 per group >= 80% of copy"),
                           ("mxfp8", "MXFP8 >= 80% of copy"), ("mxfp4", "MXFP4 >= 80% of copy"),
                           ("nvfp4", "NVFP4 >= 80% of copy")):
            o = fmt[key][1]
            frac = None if isinstance(o, Exception) else results[("fmt_copy",)] / o
            check(label, frac, frac is not None and frac >= 0.8,
                  "" if frac is None else f"{frac * 100:.0f}%")
    obs = results.get("obs")
    if obs:
        for key, label in (("mse_t", "MSE search per tensor >= 50x the loop"),
                           ("mse_c", "MSE search per channel >= 50x the (batched) loop"),
                           ("emamse_t", "EMAMSE per tensor >= 50x the loop"),
                           ("emamse_c", "EMAMSE per channel >= 50x the (batched) loop")):
            b, o = obs[key]
            r = None if isinstance(b, Exception) or isinstance(o, Exception) else b / o
            check(label, r, r is not None and r >= 50, "" if r is None else f"{r:.1f}x")
    for (kind, *rest), cells in results.items():
        if kind != "qat" or rest[0] is not None:
            continue
        name = rest[1]
        limit = 1.5 if name == "mobilenet_v2" else 1.3
        for col in ("Tensorrt", "Academic"):
            f, c = cells.get("float"), cells.get(col)
            r = None if not isinstance(f, float) or not isinstance(c, float) else c / f
            check(f"QAT step {name} {col} <= {limit}x float (fp32)", r, r is not None and r <= limit,
                  "" if r is None else f"{r:.2f}x")
    if lines:
        print("\nThe GPU targets against this run" +
              ("" if dev.type == "cuda" else " (set for a GPU: a CPU run says nothing about them)") + ":")
        print("\n".join(lines))


# ---- section 4: formats and the LLM activation ops -----------------------------------------------

def section_fmt(args, dev, timer, results):
    """The formats' fake quantization (FP8, group-wise INT4, MXFP8, MXFP4, NVFP4) and the LLM
    activation ops (per-token, Hadamard) on float32 [rows, 4096], against copy_ and, where torch
    has one, a torch composite of the same formula. The formats' target: 80% of copy_."""
    rows, cols = (16, 4096) if args.smoke else (16384, 4096)  # 64K / 64M elements
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(rows, cols, generator=g, device=dev)
    y = torch.empty_like(x)
    copy_ms = timer.median(lambda: y.copy_(x))
    amax = x.abs().amax().reshape(1)
    s_fp8 = (amax / 448).reshape(1)
    group = 128
    w_groups = x.abs().reshape(rows, cols // group, group).amax(-1).clamp(min=1e-8)
    s_grp = (w_groups / 7).contiguous()
    z_grp = torch.zeros_like(s_grp, dtype=torch.int32)
    had = None
    if cols & (cols - 1) == 0:  # the dense Hadamard of the torch composite (Sylvester)
        had = torch.ones(1, 1, device=dev)
        while had.shape[0] < cols:
            had = torch.cat([torch.cat([had, had], 1), torch.cat([had, -had], 1)], 0)
    inv_sqrt = 1.0 / math.sqrt(cols)

    def fp8_torch():
        q = torch.clamp(x / s_fp8, -448, 448).to(torch.float8_e4m3fn)
        return q.to(torch.float32) * s_fp8

    def group_torch():
        v = x.reshape(rows, cols // group, group)
        q = torch.clamp(torch.round(v * (1.0 / s_grp).unsqueeze(-1)), -8, 7)
        return (q * s_grp.unsqueeze(-1)).reshape(rows, cols)

    def per_token_torch():
        mn = torch.clamp(x.amin(1, keepdim=True), max=0)
        mx = torch.clamp(x.amax(1, keepdim=True), min=0)
        sc = torch.clamp((mx - mn) / 255, min=EPS)
        zp = torch.clamp(-128 - torch.round(mn / sc), -128, 127)
        return (torch.clamp(torch.round(x * (1.0 / sc)) + zp, -128, 127) - zp) * sc

    table = Table(["op", "torch ms", "% copy", "ours ms", "% copy", "torch / ours"])
    res = {}
    add_row = row_adder(table, res, timer, copy_ms)
    add_row("FP8 E4M3 per tensor", "fp8", fp8_torch,
            lambda: ops.fake_quantize_fp8(x, s_fp8, None, "fp8_e4m3"))
    add_row(f"INT4 per group of {group}", "group", group_torch,
            lambda: ops.fake_quantize_per_group_affine(x, s_grp, z_grp, 1, group, -8, 7))
    add_row("MXFP8 E4M3 (blocks of 32)", "mxfp8", None,
            lambda: ops.fake_quantize_mx(x, "mxfp8_e4m3", 32, -1))
    add_row("MXFP4 (blocks of 32)", "mxfp4", None, lambda: ops.fake_quantize_mx(x, "mxfp4", 32, -1))
    add_row("NVFP4 (blocks of 16)", "nvfp4", None,
            lambda: ops.fake_quantize_nvfp4(x, amax, 16, -1))
    add_row("per-token INT8 asymmetric", "per_token", per_token_torch,
            lambda: ops.fake_quantize_per_token(x, -128, 127, False, "int"))
    add_row(f"Hadamard n={cols} (torch: matmul with the matrix)", "hadamard",
            None if had is None else (lambda: torch.matmul(x, had) * inv_sqrt),
            lambda: ops.hadamard_transform(x, None, inv_sqrt))
    results["fmt"] = res
    results[("fmt_copy",)] = copy_ms
    table.print(f"Formats and LLM activation ops, float32 [{rows}, {cols}]: copy_ {copy_ms:.3f} "
                f"ms; torch '-': no torch op or composite of the same formula here")
    if dev.type == "cuda":
        del x, y, had
        torch.cuda.empty_cache()


# ---- main -------------------------------------------------------------------------------------

def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny sizes and few repetitions, to check the script on any device")
    parser.add_argument("--sections", default="bw,obs,fmt,qat",
                        help="comma-separated: bw,obs,fmt,qat")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated: " + ",".join(MODELS))
    parser.add_argument("--zoo", default="auto", choices=("auto", "torchvision", "timm"),
                        help="where the models come from (auto: torchvision if importable, else timm)")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--steps", type=int, default=None, help="timed QAT steps per column (10)")
    parser.add_argument("--repeats", type=int, default=None, help="repetitions per op figure (20)")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up calls (3)")
    parser.add_argument("--amp", choices=("none", "bf16"), default="none",
                        help="bf16: torch.autocast(dtype=torch.bfloat16) around the forward")
    parser.add_argument("--all-variants", action="store_true",
                        help="the QAT table in fp32, then with bf16 autocast")
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile every model of the QAT table (calibrated, observers off)")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend (inductor; aot_eager to check the path quickly)")
    args = parser.parse_args()
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = set(sections) - {"bw", "obs", "fmt", "qat"}
    if unknown:
        parser.error(f"--sections: unknown {sorted(unknown)}; choose from bw, obs, fmt, qat")
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if set(args.models) - set(MODELS):
        parser.error(f"--models: unknown {sorted(set(args.models) - set(MODELS))}; choose from {MODELS}")
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: torch sees no CUDA device here; use --device cpu "
                         "(with --smoke for a quick check of the script)")
    if dev.type == "cuda" and dev.index is not None:
        torch.cuda.set_device(dev)
    args.steps = args.steps or (2 if args.smoke else 10)
    timer = Timer(dev, args.repeats or (3 if args.smoke else 20),
                  args.warmup if args.warmup is not None else (1 if args.smoke else 3))
    set_log_level("WARNING")
    warnings.filterwarnings("ignore", message=r"torch\.ao\.quantization is deprecated")
    warnings.filterwarnings("ignore", message=r"Please use quant_min and quant_max")
    warnings.filterwarnings("ignore", category=FutureWarning)

    if dev.type == "cuda":
        card = f"{torch.cuda.get_device_name(dev)} (CUDA {torch.version.cuda}, cudnn.allow_tf32=" \
               f"{torch.backends.cudnn.allow_tf32}, matmul.allow_tf32={torch.backends.cuda.matmul.allow_tf32})"
    else:
        card = f"CPU {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, " \
               f"{mqbench._C.cpu_capability()} kernels"
    print(f"bench_gpu: {card}; torch {torch.__version__}; mqbench {mqbench.__version__}"
          f"{'; SMOKE sizes' if args.smoke else ''}")

    results = {}
    if "bw" in sections:
        section_bw(args, dev, timer, results)
    if "obs" in sections:
        section_obs(args, dev, timer, results)
    if "fmt" in sections:
        section_fmt(args, dev, timer, results)
    if "qat" in sections:
        variants = [None, torch.bfloat16] if args.all_variants else \
            [torch.bfloat16 if args.amp == "bf16" else None]
        for amp_dtype in variants:
            section_qat(args, dev, timer, results, amp_dtype)
    print_targets(results, dev)


if __name__ == "__main__":
    main()
