"""Sweep: does every torchvision classification model prepare, calibrate and quantize for every
backend, and deploy to Tensorrt and QDQ with onnxruntime agreeing?

    PYTHONPATH=python .venv/bin/python scripts/sweep_torchvision.py \
        [--models resnet18,vit_b_16] [--backends Tensorrt,Vitis] [--deploy Tensorrt,QDQ] \
        [--json out.json] [--timeout-per-model 600] [--batch 2] [--image-size auto] \
        [--skip vit_h_14] [--max-gflops 60] [--budget 3600] [--order name]
    PYTHONPATH=python .venv/bin/python scripts/sweep_torchvision.py --report out.json [rerun.json]

For each name in ``torchvision.models.list_models(module=torchvision.models)`` (the
classification models; ``--models`` filters), the model is built with ``weights=None`` in eval
mode, then for each backend (default: every ``BackendType``; ``--backends`` filters) it is
prepared with ``prepare_by_platform``, put in eval mode, calibrated on one random batch
(``enable_calibration``) and run once with fake quantization on (``enable_quantization``).

For the ``--deploy`` backends (default Tensorrt and QDQ) the quantized model is then deployed
with ``convert_deploy`` (input ``[1, 3, H, W]``) into a temporary directory (deleted after each
model and backend: a VGG's ONNX files are about 500 MB) and checked in onnxruntime on the first
calibration sample:

* QDQ: ``<name>.onnx`` (QuantizeLinear/DequantizeLinear) against the fake-quantized PyTorch
  model; passes when the cosine similarity of the outputs is above 0.99, or, when it is not,
  when every activation quantizer agrees in lockstep (``qdq_lockstep``: each compared on
  identical inputs, within one quantization step and 99.9 % of the values identical, and the
  outputs then above 0.99): a random-weight net can amplify single rounding flips end to end.
* Tensorrt: ``<name>_deploy_model.onnx`` (the float model, fake quantization removed) against
  the PyTorch model with every quantizer off (``disable_all``); passes above 0.999, and
  ``<name>_clip_ranges.json`` must hold a positive range for every entry.

Each (model, backend) is recorded as ``ok`` or as the stage that failed (``build``, ``prepare``,
``calibrate``, ``quantize``, ``deploy``, ``onnxruntime``) with the exception's type and first
line, the seconds each stage took, and for deployed backends the cosine similarity and the
largest absolute error relative to the reference output's largest magnitude.

``--image-size auto`` (default) uses 224 for the models whose architecture fixes or needs it
(ViT, Swin, MaxViT: their weights' ``min_size`` is at least 224; AlexNet and VGG: their adaptive
average pooling to 6x6 / 7x7 exports to ONNX only when the input size is a multiple of the
output size), 299 for inception_v3 (its auxiliary head runs in train mode while the BatchNorm
statistics are set, and pools 5x5 at its 17x17 stage) and 96 for the others (every other
convnet's ``min_size`` is at most 75).

``--timeout-per-model`` bounds the time spent on one model, building it and all its backends
(SIGALRM, so Unix and the main thread only; the alarm is raised between Python bytecodes, so a
single long C++ call finishes first). The backend running when it fires is recorded as
``timeout`` and the model's remaining backends as ``skipped``. ``--skip`` and ``--max-gflops``
leave out models up front (status ``skipped``, with the reason: FLOPs scaled from the weights'
metadata to the sweep's image size, and parameters); ``--budget`` stops starting new models once
the sweep has run that many seconds (the rest are ``skipped``, naming the budget).
``--order cost`` runs the cheapest models first, so a budget cuts the most expensive ones.

On a shared machine set ``OMP_NUM_THREADS=1``: with torch's intra-op threads descheduled behind
other jobs each op waits at its thread barrier (a 32x32 efficientnet_b0 forward: 2.8 s with two
threads at ``nice 19`` under load 5, 0.08 s with one).

Prints a table (one row per model and backend, then a summary per backend) and, with
``--json``, writes the records and the run's settings. ``--report`` runs nothing: it prints the
table of saved JSONs (a later file's (model, backend) entries replacing an earlier one's, for a
re-run of some entries) and a markdown table, one row per model.
"""
import argparse
import json
import logging
import os
import platform
import shutil
import signal
import sys
import tempfile
import time

import torch
import torch.nn.functional as F
import torchvision
from tqdm import tqdm

from mqbench.convert_deploy import convert_deploy
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import disable_all, enable_calibration, enable_quantization

# The Academic backends have no qconfig of their own: the tests' 8-bit LSQ settings.
ACADEMIC = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 8, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 8, "symmetry": True, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver"}}

DEPLOYABLE = ("Tensorrt", "QDQ")
# Pass thresholds of the onnxruntime checks (cosine similarity of the outputs).
QDQ_MIN_COSINE = 0.99
TENSORRT_MIN_COSINE = 0.999
# Models whose architecture fixes the input size (or needs 224): their weights' min_size.
FIXED_SIZE = 224
SMALL_SIZE = 96


class ModelTimeout(BaseException):
    """The model's time budget (--timeout-per-model) ran out. A BaseException, so that no
    ``except Exception`` on the way (in torch or mqbench) swallows it."""


def _on_alarm(signum, frame):
    raise ModelTimeout("timeout")


def first_line(e):
    text = str(e).strip()
    line = text.splitlines()[0] if text else ""
    return f"{type(e).__name__}: {line}" if line else type(e).__name__


def parse_list(text, valid, what):
    if text is None:
        return list(valid)
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in valid]
    if unknown:
        raise SystemExit(f"unknown {what} {unknown}; valid: {list(valid)}")
    return names


def weights_meta(name):
    """The DEFAULT weights' metadata of a torchvision model (no download): ``_ops`` (GFLOPs at
    ``crop_size``), ``num_params``, ``min_size``, ``crop_size``."""
    w = torchvision.models.get_model_weights(name).DEFAULT
    crop = getattr(w.transforms, "keywords", {}).get("crop_size", 224)
    return {"gflops": w.meta.get("_ops"), "num_params": w.meta["num_params"],
            "min_size": w.meta.get("min_size", (1, 1)), "crop_size": crop}


def image_size_for(name, size="auto"):
    """``size`` as an int, or for ``auto``: 224 for the models needing it (min_size >= 224:
    ViT, Swin, MaxViT; AlexNet and VGG, whose adaptive average pooling to 6x6 / 7x7 exports to
    ONNX only from an input it divides), 299 for inception_v3 (its auxiliary head, run in train
    mode for the BatchNorm statistics, pools 5x5 at the 17x17 stage), else 96."""
    if size != "auto":
        return int(size)
    if name == "inception_v3":
        return 299
    if name == "alexnet" or name.startswith("vgg"):
        return FIXED_SIZE
    return FIXED_SIZE if max(weights_meta(name)["min_size"]) >= FIXED_SIZE else SMALL_SIZE


def gflops_at(name, image_size):
    """GFLOPs at ``image_size`` (the metadata's figure scaled by the pixel count)."""
    m = weights_meta(name)
    return m["gflops"] * (image_size / m["crop_size"]) ** 2


def size_reason(name, image_size):
    m = weights_meta(name)
    return (f"too large for the 2-core CI machine: {gflops_at(name, image_size):.1f} GFLOPs at "
            f"{image_size}x{image_size} / {m['num_params'] / 1e6:.0f} M params")


def with_bn_statistics(model, image_size, batch=4, steps=2):
    """Random-weight nets have near-zero activations deep down (a vanishing output would make
    the onnxruntime checks compare zeros); a few forward passes in train mode set BatchNorm's
    running statistics (cumulative average) so that activations keep a unit scale, as in a
    trained net. Returns ``model`` in eval mode."""
    bns = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    if bns:
        momenta = [m.momentum for m in bns]
        for m in bns:
            m.momentum = None
        g = torch.Generator().manual_seed(1)
        model.train()
        with torch.no_grad():
            for _ in range(steps):
                model(torch.randn(batch, 3, image_size, image_size, generator=g))
        for m, momentum in zip(bns, momenta):
            m.momentum = momentum
    return model.eval()


def without_zero_weights(model, std=0.02):
    """torchvision zero-initializes some weights (ViT's classification head and class token):
    the random-weight model's output would be identically zero, which no comparison can judge
    and which NNIE's quantizer refuses (its range would be 0). Such parameters (2 or more
    dimensions, all zero) get N(0, std) values, as a trained net would have. Returns the names."""
    names = []
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() >= 2 and not bool(p.any()):
                p.normal_(0, std)
                names.append(n)
    return names


def build_model(name, image_size, **kwargs):
    """``name`` with random weights (seed 0; no all-zero weight tensor) and BatchNorm
    statistics, in eval mode; ``kwargs`` go to the model's builder."""
    torch.manual_seed(0)
    model = torchvision.models.get_model(name, weights=None, **kwargs)
    without_zero_weights(model)
    return with_bn_statistics(model, image_size)


def cosine(a, b):
    return F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0).item()


def ort_session(model):
    """An onnxruntime CPU session on ``model`` (a path or serialized bytes) in AVX2 precise
    mode: by default onnxruntime fuses QDQ + MatMul into integer kernels (QGemm) whose AVX2
    u8s8 path (VPMADDUBSW, on CPUs without VNNI) saturates pairs of products at int16, so an
    int8 symmetric activation times an int8 weight can come out wrong by tens of steps (a
    ViT's MLP: cosine 0.957 against 1.0 with the precise mode or with graph optimizations at
    BASIC). The check is of the deployed model's semantics, not of that kernel."""
    import onnxruntime
    so = onnxruntime.SessionOptions()
    so.add_session_config_entry("session.x64quantprecision", "1")
    return onnxruntime.InferenceSession(model, so, providers=["CPUExecutionProvider"])


def ort_run(path, x):
    sess = ort_session(path)
    name = sess.get_inputs()[0].name
    return torch.from_numpy(sess.run(None, {name: x.numpy()})[0]).float()


def qdq_lockstep(q, x, qdq_path):
    """Compares every activation quantizer of ``q`` (fake quantization on) with the same tensor
    of the deployed QDQ model, each on identical inputs: the torch model runs with each
    quantizer's output replaced by onnxruntime's, so a one-level rounding flip (float
    convolutions summed in another order land on the other side of a .5) cannot grow through
    the following layers as it does end to end in a random-weight net.

    Returns (quantizers compared, values that differ, values, largest difference in
    quantization steps, cosine similarity of the outputs in lockstep)."""
    import onnx
    m = onnx.load(qdq_path)
    modules = dict(q.named_modules())
    tensors = {}  # activation quantizer module: its DequantizeLinear's output, which the
    for n in m.graph.node:  # TorchScript exporter names /<module>/<op>_output_0
        parts = n.output[0].split("/") if n.op_type == "DequantizeLinear" else []
        if len(parts) > 2 and parts[1].endswith("_post_act_fake_quantizer") \
                and parts[1] in modules:
            tensors[parts[1]] = n.output[0]
    outputs = {o.name for o in m.graph.output}
    for t in tensors.values():
        if t not in outputs:
            m.graph.output.append(onnx.helper.make_tensor_value_info(t, onnx.TensorProto.FLOAT,
                                                                     None))
    sess = ort_session(m.SerializeToString())
    del m
    names = [o.name for o in sess.get_outputs()]
    got = dict(zip(names, sess.run(names, {sess.get_inputs()[0].name: x.numpy()})))
    stats, hooks = {}, []
    for module, t in tensors.items():
        def hook(mod, inputs, output, module=module, t=t):
            theirs = torch.from_numpy(got[t]).float().reshape(output.shape)
            diff = (output - theirs).abs()
            stats[module] = (int((diff != 0).sum()), diff.numel(),
                             (diff.max() / mod.scale.detach().max()).item())
            return theirs
        hooks.append(q.get_submodule(module).register_forward_hook(hook))
    try:
        with torch.no_grad():
            ours = q(x)
    finally:
        for h in hooks:
            h.remove()
    theirs = torch.from_numpy(got[names[0]]).float()
    n_act = sum(1 for n in modules if n.endswith("_post_act_fake_quantizer"))
    if len(stats) < n_act:
        logging.getLogger("MQBENCH").warning(
            "lockstep: %d of %d activation quantizers found in %s", len(stats), n_act, qdq_path)
    return (len(stats), sum(v[0] for v in stats.values()), sum(v[1] for v in stats.values()),
            max((v[2] for v in stats.values()), default=0.0), cosine(ours, theirs))


def check_deploy(q, backend, x, name, workdir=None):
    """Deploys the calibrated, quantizing ``q`` (a ``GraphModule`` in eval mode) for ``backend``
    (Tensorrt or QDQ) into a temporary directory and checks it in onnxruntime on ``x`` (batch 1).

    Returns (status, error, times, metrics): status ``ok``, ``deploy`` or ``onnxruntime``;
    metrics ``cosine`` and ``rel_err`` (max |onnxruntime - torch| / max |torch|). Leaves ``q``
    with every quantizer off for Tensorrt. The directory is removed before returning."""
    times, metrics = {}, {}
    d = tempfile.mkdtemp(prefix=f"sweep_{name}_", dir=workdir)
    stage = "deploy"
    try:
        t = time.perf_counter()
        written = convert_deploy(q, backend, {"x": list(x.shape)}, output_path=d, model_name=name)
        times["deploy_s"] = time.perf_counter() - t
        stage = "onnxruntime"
        t = time.perf_counter()
        if backend.name == "QDQ":
            path, min_cos = os.path.join(d, f"{name}.onnx"), QDQ_MIN_COSINE
        else:
            path, min_cos = os.path.join(d, f"{name}_deploy_model.onnx"), TENSORRT_MIN_COSINE
            ranges_path = os.path.join(d, f"{name}_clip_ranges.json")
            if ranges_path not in written:
                raise FileNotFoundError(f"{os.path.basename(ranges_path)} not written: {written}")
            with open(ranges_path) as f:
                ranges = json.load(f)["tensorrt"]["blob_range"]
            bad = [k for k, v in ranges.items() if not v > 0]
            if not ranges or bad:
                raise ValueError(f"clip ranges: {len(ranges)} entries, not positive: {bad[:3]}")
            metrics["clip_ranges"] = len(ranges)
            disable_all(q)
        if path not in written:
            raise FileNotFoundError(f"{os.path.basename(path)} not written: {written}")
        with torch.no_grad():
            ref = q(x)
        got = ort_run(path, x)
        times["onnxruntime_s"] = time.perf_counter() - t
        if got.shape != ref.shape:
            raise ValueError(f"output shape {tuple(got.shape)} != torch {tuple(ref.shape)}")
        metrics["cosine"] = cosine(got, ref)
        metrics["ref_absmax"] = ref.abs().max().item()
        metrics["rel_err"] = ((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        if not metrics["cosine"] > min_cos and backend.name == "QDQ":
            # A random-weight net amplifies rounding flips end to end; the deploy is right when
            # every quantizer agrees on identical inputs (within one step, 99.9 % identical).
            n, differ, total, steps, cos = qdq_lockstep(q, x, path)
            metrics["lockstep"] = {"quantizers": n, "differ": differ, "values": total,
                                   "max_steps": steps, "cosine": cos}
            if n and steps <= 1.0001 and differ <= 1e-3 * total and cos > min_cos:
                return "ok", None, times, metrics
            return ("onnxruntime", f"cosine {metrics['cosine']:.6f} <= {min_cos}; lockstep over "
                    f"{n} quantizers: {differ} of {total} values differ, up to {steps:.3g} "
                    f"steps, output cosine {cos:.6f}", times, metrics)
        if not metrics["cosine"] > min_cos:
            return ("onnxruntime", f"cosine {metrics['cosine']:.6f} <= {min_cos} (max abs error "
                    f"{metrics['rel_err']:.3g} of the output scale "
                    f"{metrics['ref_absmax']:.3g})", times, metrics)
        return "ok", None, times, metrics
    except Exception as e:  # noqa: BLE001
        return stage, first_line(e), times, metrics
    finally:
        shutil.rmtree(d, ignore_errors=True)


def run_backend(model, backend, x, deploy=False, workdir=None, name="model"):
    """Prepare, calibrate, quantize and (``deploy``) deploy + check in onnxruntime.

    Returns (stage reached or 'ok', error, seconds per stage, deploy metrics)."""
    times = {}
    stage = "prepare"
    try:
        t = time.perf_counter()
        q = prepare_by_platform(model, backend, ACADEMIC if backend.name.startswith("Academic")
                                else {})
        q.eval()
        times["prepare_s"] = time.perf_counter() - t
        stage = "calibrate"
        t = time.perf_counter()
        with torch.no_grad():
            enable_calibration(q)
            q(x)
            times["calibrate_s"] = time.perf_counter() - t
            stage = "quantize"
            t = time.perf_counter()
            enable_quantization(q)
            q(x)
            times["quantize_s"] = time.perf_counter() - t
    except Exception as e:  # noqa: BLE001  (a sweep records every failure and goes on)
        return stage, first_line(e), times, {}
    if not deploy:
        return "ok", None, times, {}
    status, error, deploy_times, metrics = check_deploy(q, backend, x[:1], name, workdir)
    return status, error, {**times, **deploy_times}, metrics


def sweep(models, backends, batch, image_size, timeout, deploy=DEPLOYABLE, skip=None,
          budget=0, workdir=None):
    """Runs every model and backend; ``skip`` is {model: reason}. Returns the records."""
    records = []
    skip = skip or {}
    start = time.perf_counter()
    signal.signal(signal.SIGALRM, _on_alarm)
    for name in tqdm(models, desc="models", file=sys.stderr):
        size = image_size_for(name, image_size)
        reason = skip.get(name)
        if reason is None and budget > 0 and time.perf_counter() - start > budget:
            reason = f"sweep time budget (--budget {budget:g} s) spent before this model started"
        if reason is not None:
            records += [{"model": name, "backend": b, "status": "skipped", "error": reason,
                         "image_size": size} for b in backends]
            continue
        done = set()
        signal.setitimer(signal.ITIMER_REAL, timeout if timeout > 0 else 0)
        try:
            t = time.perf_counter()
            try:
                model = build_model(name, size)
                x = torch.randn(batch, 3, size, size)
            except Exception as e:  # noqa: BLE001
                build_s = time.perf_counter() - t
                for b in backends:
                    records.append({"model": name, "backend": b, "status": "build",
                                    "error": first_line(e), "build_s": build_s,
                                    "image_size": size})
                    done.add(b)
                continue
            build_s = time.perf_counter() - t
            for b in backends:
                status, error, times, metrics = run_backend(
                    model, BackendType[b], x, deploy=b in deploy, workdir=workdir, name=name)
                records.append({"model": name, "backend": b, "status": status, "error": error,
                                "image_size": size, "build_s": build_s, **times, **metrics})
                done.add(b)
        except ModelTimeout:
            for i, b in enumerate([b for b in backends if b not in done]):
                records.append({"model": name, "backend": b,
                                "status": "timeout" if i == 0 else "skipped",
                                "error": f"model exceeded --timeout-per-model {timeout:g} s",
                                "image_size": size})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        model = None  # free a big model before building the next
    return records


def print_table(records, backends, out=None):
    out = out or sys.stdout
    def fmt(v):
        return f"{v:8.2f}" if isinstance(v, float) else f"{'-':>8}"

    def note(r):
        ls = r.get("lockstep")
        return (f"(end to end below the threshold; lockstep: {ls['differ']} of {ls['values']} "
                f"values differ, <= {ls['max_steps']:.3g} steps)" if ls else "")

    def fcos(v):
        return f"{v:9.6f}" if isinstance(v, float) else f"{'-':>9}"

    w_model = max([len("model")] + [len(r["model"]) for r in records])
    w_backend = max([len("backend")] + [len(r["backend"]) for r in records])
    print(f"{'model':<{w_model}}  {'backend':<{w_backend}}  {'status':<11}  {'prepare':>8}  "
          f"{'calib':>8}  {'quant':>8}  {'deploy':>8}  {'ort':>8}  {'cosine':>9}  error",
          file=out)
    for r in records:
        print(f"{r['model']:<{w_model}}  {r['backend']:<{w_backend}}  {r['status']:<11}  "
              f"{fmt(r.get('prepare_s'))}  {fmt(r.get('calibrate_s'))}  "
              f"{fmt(r.get('quantize_s'))}  {fmt(r.get('deploy_s'))}  "
              f"{fmt(r.get('onnxruntime_s'))}  {fcos(r.get('cosine'))}  {r['error'] or note(r)}",
              file=out)
    print("", file=out)
    print("summary (ok / run; skipped and timed-out models not counted as run):", file=out)
    for b in backends:
        rs = [r for r in records if r["backend"] == b and r["status"] not in ("skipped",)]
        ok = sum(r["status"] == "ok" for r in rs)
        print(f"  {b:<{w_backend}}  {ok} / {len(rs)}", file=out)
    skipped = {}
    for r in records:
        if r["status"] in ("skipped", "timeout"):
            skipped.setdefault(r["model"], r["error"])
    if skipped:
        print("\nmodels skipped or timed out:", file=out)
        for m, why in skipped.items():
            print(f"  {m}: {why}", file=out)


def merge_records(runs):
    """Records of several sweep JSONs; a later run's (model, backend) replaces an earlier one's
    (a re-run of some entries). Keeps the first run's order."""
    merged = {}
    for i, run in enumerate(runs):
        for r in run["records"]:
            merged[r["model"], r["backend"]] = {**r, "run": i}
    return list(merged.values())


def markdown_table(records, backends, deploy=DEPLOYABLE):
    """One row per model: ``ok`` or the failures of prepare/calibrate/quantize over every
    backend, then one column per deploy backend (deploy and onnxruntime check). A cell from a
    later run of ``merge_records`` is marked ``re-run``."""
    def rerun(rs):
        return " (re-run)" if any(r.get("run", 0) > 0 for r in rs) else ""

    def cell(rs):
        bad = [r for r in rs if r["status"] != "ok"]
        if not bad:
            return "ok"
        if all(r["status"] in ("skipped", "timeout") for r in bad) and len(bad) == len(rs):
            return bad[0]["status"]
        return "; ".join(f"{r['backend']}: {r['status']}" + (f" ({r['error']})" if r["error"]
                                                             and r["status"] not in
                                                             ("skipped", "timeout") else "")
                         for r in bad)

    by_model = {}
    for r in records:
        by_model.setdefault(r["model"], []).append(r)
    lines = [f"| model | size | prepare, calibrate, quantize ({len(backends)} backends) | "
             + " | ".join(f"{b} deploy" for b in deploy) + " |",
             "|---|---|---|" + "---|" * len(deploy)]
    for model, rs in by_model.items():
        size = " / ".join(str(v) for v in dict.fromkeys(r.get("image_size", "") for r in rs))
        pre = []
        for r in rs:  # a deploy backend that failed at deploy or onnxruntime prepared fine
            if r["backend"] in deploy and r["status"] in ("deploy", "onnxruntime"):
                pre.append({**r, "status": "ok"})
            else:
                pre.append(r)
        cells = [cell(pre) + rerun([r for r in rs if r["backend"] not in deploy])]
        for b in deploy:
            r = next((r for r in rs if r["backend"] == b), None)
            if r is None:
                cells.append("-")
            elif r["status"] == "ok":
                ls = r.get("lockstep")
                cells.append(f"ok ({r['cosine']:.4f}" + (", lockstep" if ls else "") + ")")
            elif r["status"] in ("deploy", "onnxruntime"):
                error = r["error"] if len(r["error"]) <= 120 else r["error"][:117] + "..."
                cells.append(f"{r['status']}: {error}")
            else:
                cells.append(f"not reached ({r['status']})")
            if r is not None:
                cells[-1] += rerun([r])
        lines.append(f"| {model} | {size} | " + " | ".join(c.replace("|", "/") for c in cells)
                     + " |")
    return "\n".join(lines)


def main(argv=None):
    all_models = torchvision.models.list_models(module=torchvision.models)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", help="comma-separated model names (default: all "
                   f"{len(all_models)} classification models)")
    p.add_argument("--backends", help="comma-separated BackendType names (default: all)")
    p.add_argument("--deploy", default=",".join(DEPLOYABLE),
                   help="backends to deploy and check in onnxruntime, of "
                   f"{','.join(DEPLOYABLE)} (default: both; '' for none)")
    p.add_argument("--json", metavar="OUT", help="write the records as JSON to OUT")
    p.add_argument("--timeout-per-model", type=float, default=600.0,
                   help="seconds per model over all its backends; 0 for none (default 600)")
    p.add_argument("--batch", type=int, default=2, help="calibration batch size (default 2)")
    p.add_argument("--image-size", default="auto",
                   help="input height and width, or auto (224 for ViT/Swin/MaxViT, else 96)")
    p.add_argument("--skip", default="", help="comma-separated models to leave out (recorded "
                   "as skipped with their size)")
    p.add_argument("--max-gflops", type=float, default=0.0,
                   help="leave out models above this many GFLOPs at the sweep's image size "
                   "(0: none)")
    p.add_argument("--budget", type=float, default=0.0,
                   help="start no model after this many seconds (0: none)")
    p.add_argument("--order", choices=("name", "cost"), default="name",
                   help="model order: listed, or cheapest (GFLOPs x params) first")
    p.add_argument("--report", metavar="JSON", nargs="+",
                   help="run nothing: print the table, the summary and a markdown table of "
                   "these sweep JSONs (a later file's entries replace an earlier one's)")
    args = p.parse_args(argv)
    if args.report:
        runs = []
        for path in args.report:
            with open(path) as f:
                runs.append(json.load(f))
        records = merge_records(runs)
        backends = list(dict.fromkeys(r["backend"] for r in records))
        print_table(records, backends)
        print("\n" + markdown_table(records, backends, runs[0].get("deploy", DEPLOYABLE)))
        return 0

    models = parse_list(args.models, all_models, "models")
    backends = parse_list(args.backends, list(BackendType.__members__), "backends")
    deploy = parse_list(args.deploy, DEPLOYABLE, "deploy backends") if args.deploy else []
    if args.image_size != "auto" and not args.image_size.isdigit():
        raise SystemExit(f"--image-size must be an integer or auto, got {args.image_size!r}")
    skip = {}
    for name in parse_list(args.skip, all_models, "models") if args.skip else []:
        skip[name] = size_reason(name, image_size_for(name, args.image_size))
    if args.max_gflops > 0:
        for name in models:
            size = image_size_for(name, args.image_size)
            if gflops_at(name, size) > args.max_gflops:
                skip[name] = size_reason(name, size)
    if args.order == "cost":
        def cost(name):
            size = image_size_for(name, args.image_size)
            return gflops_at(name, size) + weights_meta(name)["num_params"] / 1e6 / 10
        models = sorted(models, key=cost)
    set_log_level("WARNING")
    logging.getLogger("py.warnings").setLevel(logging.ERROR)
    logging.captureWarnings(True)  # uncalibrated-quantizer warnings would drown the table

    t = time.perf_counter()
    records = sweep(models, backends, args.batch, args.image_size, args.timeout_per_model,
                    deploy=deploy, skip=skip, budget=args.budget)
    total = time.perf_counter() - t
    print_table(records, backends)
    print(f"\n{len(records)} runs in {total:.1f} s (torch {torch.__version__}, torchvision "
          f"{torchvision.__version__}, Python {platform.python_version()})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "torchvision": torchvision.__version__,
                       "python": platform.python_version(), "batch": args.batch,
                       "image_size": args.image_size, "deploy": deploy,
                       "timeout_per_model": args.timeout_per_model, "budget": args.budget,
                       "order": args.order, "argv": sys.argv[1:] if argv is None else argv,
                       "total_s": total, "records": records}, f, indent=1)
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
