"""Manual check (not a test): MQBenchQuantizer under torchao's prepare_pt2e / prepare_qat_pt2e
against prepare_by_platform(capture="export") for all 14 backends: activation quantizer names
(quantizer.placement), weight quantizer layers, and the counts in the pt2e-prepared graph.

    PYTHONPATH=python .venv/bin/python bench/bench_pt2e_placement.py vision resnet18:qat \
        resnet18:ptq mobilenet_v2:ptq
    PYTHONPATH=python HF_HUB_OFFLINE=1 .venv/bin/python bench/bench_pt2e_placement.py minilm

SKIP (comma-separated backends) skips those backends' QAT runs. Run from the repository
root (it imports tests/python/capture/test_pt2e.py's helpers and bench/minilm.py)."""
import sys, os, copy, time, logging
sys.path[:0] = ["tests/python", "tests/python/capture", "tests/python/quantizer", "bench"]
logging.disable(logging.CRITICAL)
import torch, torchvision
from test_pt2e import (BACKENDS, extra_for, reference_placement, pt2e_quantizers,
                       MQBenchQuantizer, prepare_pt2e, prepare_qat_pt2e)
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
which = sys.argv[1]
results = []
def check(name, model, args, kwargs, backend, qat):
    ref = prepare_by_platform(copy.deepcopy(model), BackendType[backend],
        {"capture": "export", "example_inputs": kwargs if kwargs else args,
         "extra_qconfig_dict": extra_for(backend)}, is_qat=qat)
    ra, rp = reference_placement(ref)
    if qat: rp = [p for p in rp if not p.endswith("bias_fake_quant")]
    q = MQBenchQuantizer(BackendType[backend], extra_for(backend))
    t = time.time()
    gm = torch.export.export(copy.deepcopy(model), args, kwargs).module()
    p = (prepare_qat_pt2e if qat else prepare_pt2e)(gm, q)
    dt = time.time() - t
    a, w = pt2e_quantizers(p)
    ok = (q.placement[:len(ra)] == ra and sorted(q.placement[len(ra):]) == rp and
          len(a) == len(ra) and len(w) == len(rp))
    results.append(ok)
    print(f"{name:14s} {backend:13s} {'QAT' if qat else 'PTQ'} acts {len(a):3d}/{len(ra):3d} "
          f"params {len(w):3d}/{len(rp):3d} {'same' if ok else 'DIFFER'} prepare {dt:.1f}s",
          flush=True)
if which == "vision":
    skip = set(os.environ.get("SKIP", "").split(","))
    for name, qat in [(a.split(":")[0], a.split(":")[1] == "qat") for a in sys.argv[2:]]:
        torch.manual_seed(0)
        m = getattr(torchvision.models, name)()
        m = m.train() if qat else m.eval()
        for b in BACKENDS:
            if qat and b in skip:
                continue
            check(name, m, (torch.randn(2, 3, 32, 32),), None, b, qat)
else:
    import minilm
    model, tok = minilm.load()
    calib = minilm.encode(tok, minilm.SENTENCES["calibration"][:4])
    for b in BACKENDS:
        check("MiniLM", model.eval(), (), dict(calib), b, False)
print("all same:", all(results), len(results))
