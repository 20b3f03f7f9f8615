"""Sweep: does every torchvision classification model prepare, calibrate and quantize for every
backend?

    PYTHONPATH=python .venv/bin/python scripts/sweep_torchvision.py \
        [--models resnet18,vit_b_16] [--backends Tensorrt,Vitis] [--json out.json] \
        [--timeout-per-model 600] [--batch 2] [--image-size 224]

For each name in ``torchvision.models.list_models(module=torchvision.models)`` (the
classification models; ``--models`` filters), the model is built with ``weights=None`` in eval
mode, then for each backend (default: every ``BackendType``; ``--backends`` filters) it is
prepared with ``prepare_by_platform``, calibrated on one random batch (``enable_calibration``)
and run once with fake quantization on (``enable_quantization``). Each (model, backend) is
recorded as ``ok`` or as the stage that failed (``build``, ``prepare``, ``calibrate``,
``quantize``) with the exception's type and first line, plus the seconds each stage took.

``--timeout-per-model`` bounds the time spent on one model, building it and all its backends
(SIGALRM, so Unix and the main thread only; the alarm is raised between Python bytecodes, so a
single long C++ call finishes first). The backend running when it fires is recorded as
``timeout`` and the model's remaining backends as ``skipped``.

Prints a table (one row per model and backend, then a summary per backend) and, with
``--json``, writes the records and the run's settings.
"""
import argparse
import json
import logging
import platform
import signal
import sys
import time

import torch
import torchvision
from tqdm import tqdm

from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration, enable_quantization

# The Academic backends have no qconfig of their own: the tests' 8-bit LSQ settings.
ACADEMIC = {"extra_qconfig_dict": {
    "w_qscheme": {"bit": 8, "symmetry": True, "per_channel": True, "pot_scale": False},
    "a_qscheme": {"bit": 8, "symmetry": True, "per_channel": False, "pot_scale": False},
    "w_fakequantize": "LearnableFakeQuantize", "a_fakequantize": "LearnableFakeQuantize",
    "w_observer": "MinMaxObserver", "a_observer": "EMAMinMaxObserver"}}


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


def run_backend(model, backend, x):
    """Prepare, calibrate and quantize; returns (stage reached or 'ok', error, seconds)."""
    times = {}
    stage = "prepare"
    try:
        t = time.perf_counter()
        q = prepare_by_platform(model, backend, ACADEMIC if backend.name.startswith("Academic")
                                else {})
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
        return "ok", None, times
    except Exception as e:  # noqa: BLE001  (a sweep records every failure and goes on)
        return stage, first_line(e), times


def sweep(models, backends, batch, image_size, timeout):
    records = []
    signal.signal(signal.SIGALRM, _on_alarm)
    for name in tqdm(models, desc="models", file=sys.stderr):
        done = set()
        signal.setitimer(signal.ITIMER_REAL, timeout if timeout > 0 else 0)
        try:
            t = time.perf_counter()
            try:
                torch.manual_seed(0)
                model = torchvision.models.get_model(name, weights=None).eval()
                x = torch.randn(batch, 3, image_size, image_size)
            except Exception as e:  # noqa: BLE001
                build_s = time.perf_counter() - t
                for b in backends:
                    records.append({"model": name, "backend": b, "status": "build",
                                    "error": first_line(e), "build_s": build_s})
                    done.add(b)
                continue
            build_s = time.perf_counter() - t
            for b in backends:
                status, error, times = run_backend(model, BackendType[b], x)
                records.append({"model": name, "backend": b, "status": status, "error": error,
                                "build_s": build_s, **times})
                done.add(b)
        except ModelTimeout:
            for i, b in enumerate([b for b in backends if b not in done]):
                records.append({"model": name, "backend": b,
                                "status": "timeout" if i == 0 else "skipped",
                                "error": f"model exceeded --timeout-per-model {timeout:g} s"})
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        model = None  # free a big model before building the next
    return records


def print_table(records, backends, out=sys.stdout):
    def fmt(v):
        return f"{v:8.2f}" if isinstance(v, float) else f"{'-':>8}"

    w_model = max([len("model")] + [len(r["model"]) for r in records])
    w_backend = max([len("backend")] + [len(r["backend"]) for r in records])
    print(f"{'model':<{w_model}}  {'backend':<{w_backend}}  {'status':<9}  {'prepare':>8}  "
          f"{'calib':>8}  {'quant':>8}  error", file=out)
    for r in records:
        print(f"{r['model']:<{w_model}}  {r['backend']:<{w_backend}}  {r['status']:<9}  "
              f"{fmt(r.get('prepare_s'))}  {fmt(r.get('calibrate_s'))}  "
              f"{fmt(r.get('quantize_s'))}  {r['error'] or ''}", file=out)
    print("", file=out)
    print("summary (ok / run):", file=out)
    for b in backends:
        rs = [r for r in records if r["backend"] == b]
        ok = sum(r["status"] == "ok" for r in rs)
        print(f"  {b:<{w_backend}}  {ok} / {len(rs)}", file=out)


def main(argv=None):
    all_models = torchvision.models.list_models(module=torchvision.models)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", help="comma-separated model names (default: all "
                   f"{len(all_models)} classification models)")
    p.add_argument("--backends", help="comma-separated BackendType names (default: all)")
    p.add_argument("--json", metavar="OUT", help="write the records as JSON to OUT")
    p.add_argument("--timeout-per-model", type=float, default=600.0,
                   help="seconds per model over all its backends; 0 for none (default 600)")
    p.add_argument("--batch", type=int, default=2, help="calibration batch size (default 2)")
    p.add_argument("--image-size", type=int, default=224, help="input height and width")
    args = p.parse_args(argv)

    models = parse_list(args.models, all_models, "models")
    backends = parse_list(args.backends, list(BackendType.__members__), "backends")
    set_log_level("WARNING")
    logging.getLogger("py.warnings").setLevel(logging.ERROR)
    logging.captureWarnings(True)  # uncalibrated-quantizer warnings would drown the table

    t = time.perf_counter()
    records = sweep(models, backends, args.batch, args.image_size, args.timeout_per_model)
    total = time.perf_counter() - t
    print_table(records, backends)
    print(f"\n{len(records)} runs in {total:.1f} s (torch {torch.__version__}, torchvision "
          f"{torchvision.__version__}, Python {platform.python_version()})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "torchvision": torchvision.__version__,
                       "python": platform.python_version(), "batch": args.batch,
                       "image_size": args.image_size,
                       "timeout_per_model": args.timeout_per_model, "total_s": total,
                       "records": records}, f, indent=1)
    return 0 if all(r["status"] == "ok" for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
