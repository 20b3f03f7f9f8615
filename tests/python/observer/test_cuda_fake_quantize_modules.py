"""Every fake quantizer and observer module calibrated and trained on the device as on the CPU,
and the Python side of "no host synchronisation" (QuantizeBase's switches, NNIE's data_max check).
The comparison rules and the GPU skip: cuda_harness.py."""
import copy

import pytest
import torch

from cuda_harness import CLOSE, EXACT, NNIE, REDUCED, ROUNDED, assert_agree, batch, no_host_sync
from mqbench import observer as obs
from mqbench.fake_quantize import (AdaRoundFakeQuantize, DoReFaFakeQuantize, DSQFakeQuantize,
                                   FixedFakeQuantize, LearnableFakeQuantize, NNIEFakeQuantize,
                                   PACTFakeQuantize, QDropFakeQuantize, TqtFakeQuantize)

ops = torch.ops.mqbench


def _sym(per_channel=False, **kw):
    return dict(dtype=torch.qint8, quant_min=-128, quant_max=127, ch_axis=0 if per_channel else -1,
                qscheme=torch.per_channel_symmetric if per_channel else torch.per_tensor_symmetric,
                **kw)


def _quant_type(qtype):
    def set_it(fq):
        fq.set_quant_type(qtype)
    return set_it


# (name, factory, setup after construction, comparison of the output)
QUANTIZERS = [
    (f"Fixed+{o.__name__}{'/per_channel' if pc else ''}",
     lambda o=o, pc=pc: FixedFakeQuantize(o, **_sym(pc)), None, EXACT)
    for o in (obs.MinMaxObserver, obs.EMAMinMaxObserver, obs.MovingAverageMinMaxObserver,
              obs.ClipStdObserver, obs.LSQObserver, obs.LSQPlusObserver, obs.MSEObserver,
              obs.EMAMSEObserver)
    for pc in (False, True)
] + [
    ("Fixed+EMAQuantileObserver", lambda: FixedFakeQuantize(obs.EMAQuantileObserver, **_sym()),
     None, EXACT),
    ("Fixed+MinMaxFloorObserver", lambda: FixedFakeQuantize(obs.MinMaxFloorObserver, **_sym()),
     lambda fq: fq.activation_post_process.set_quant_type("tensor"), EXACT),
    ("Fixed+PoTModeObserver", lambda: FixedFakeQuantize(obs.PoTModeObserver, **_sym()),
     lambda fq: fq.activation_post_process.set_quant_type("param"), EXACT),
    ("Learnable+LSQObserver", lambda: LearnableFakeQuantize(obs.LSQObserver, **_sym()), None,
     EXACT),
    ("Learnable+MinMaxObserver/per_channel",
     lambda: LearnableFakeQuantize(obs.MinMaxObserver, **_sym(True)), None, EXACT),
    ("Learnable+EMAMinMaxObserver/affine", lambda: LearnableFakeQuantize(
        obs.EMAMinMaxObserver, dtype=torch.quint8, qscheme=torch.per_tensor_affine, quant_min=0,
        quant_max=255), None, EXACT),
    ("PACT", lambda: PACTFakeQuantize(obs.EMAMinMaxObserver, alpha=4.0, **_sym()), None, EXACT),
    ("PACT/affine", lambda: PACTFakeQuantize(
        obs.EMAMinMaxObserver, alpha=4.0, dtype=torch.quint8, qscheme=torch.per_tensor_affine,
        quant_min=0, quant_max=255), None, EXACT),
    ("TQT", lambda: TqtFakeQuantize(obs.MinMaxFloorObserver, **_sym()), _quant_type("input"),
     EXACT),
    ("NNIE", lambda: NNIEFakeQuantize(obs.MinMaxObserver, **_sym()), None, NNIE),
    ("DSQ/per_channel", lambda: DSQFakeQuantize(obs.MinMaxObserver, **_sym(True)), None, ROUNDED),
    # tanh's last bit may move a normalised value across a rounding tie
    ("DoReFa", lambda: DoReFaFakeQuantize(obs.MinMaxObserver, **_sym()), None, ROUNDED),
    ("QDrop", lambda: QDropFakeQuantize(obs.EMAMinMaxObserver, **_sym()), None, EXACT),
    ("AdaRound/per_channel", lambda: AdaRoundFakeQuantize(obs.MinMaxObserver, **_sym(True)),
     "adaround", CLOSE(1e-6, 1e-14)),
]
# observers whose statistic is a mean or standard deviation: qparams within 1e-5
_STAT_OBSERVERS = ("ClipStd", "LSQObserver", "LSQPlus")


@pytest.mark.parametrize("entry", QUANTIZERS, ids=[e[0] for e in QUANTIZERS])
def test_quantizer_calibrates_and_trains_on_device_as_on_the_cpu(entry, device):
    """Calibration (observer on: host reads allowed) must work on the device and give the CPU's
    qparams; then, from the same qparams, the QAT forward and backward (observer off) equal the
    CPU's."""
    name, factory, setup, kind = entry
    torch.manual_seed(0)
    cpu = factory()
    if callable(setup):
        setup(cpu)
    dev = copy.deepcopy(cpu).to(device)
    weight = batch((6, 5, 3, 3), 7)
    calib = [weight] if setup == "adaround" else [batch((6, 5, 3, 3), s) * 2 for s in (8, 9)]
    for b in calib:
        cpu(b)
        dev(b.to(device))
    if setup == "adaround":
        cpu.init(weight)
        dev.init(weight.to(device))
    state_c, state_d = cpu.state_dict(), dev.state_dict()
    assert list(state_c) == list(state_d)
    for key, w in state_c.items():
        got = state_d[key]
        assert got.device.type == device, key
        stat = key.rsplit(".", 1)[-1] in ("scale", "min_val", "max_val")
        k = REDUCED() if stat and any(s in name for s in _STAT_OBSERVERS) else EXACT
        if key == "alpha" and setup == "adaround":
            k = CLOSE(1e-5, 1e-12)
        assert_agree(got, w, k, torch.float32, w, f"{name}: {key}")
    # From identical qparams: the QAT forward and backward.
    cpu.load_state_dict({k: v.cpu() for k, v in state_d.items()})
    cpu.disable_observer()
    dev.disable_observer()
    x, g = batch((6, 5, 3, 3), 10) * 2, batch((6, 5, 3, 3), 11)
    params_c = [p for p in cpu.parameters()]
    params_d = [p for p in dev.parameters()]
    xc, xd = x.clone().requires_grad_(), x.to(device).requires_grad_()
    out_c, out_d = cpu(xc), dev(xd)
    out_c.backward(g)
    out_d.backward(g.to(device))
    assert_agree(out_d, out_c, kind, torch.float32, x, f"{name}: output")
    # dx: the straight-through mask (exact), or a transcendental derivative (DSQ, DoReFa)
    dx_kind = {EXACT: EXACT, NNIE: EXACT, ROUNDED: CLOSE(1e-5, 1e-12)}.get(kind, kind)
    assert_agree(xd.grad, xc.grad, dx_kind, torch.float32, x, f"{name}: dx")
    for pc, pd in zip(params_c, params_d):
        if pc.grad is not None:
            assert_agree(pd.grad, pc.grad, REDUCED() if kind == EXACT else CLOSE(2e-6, 1e-13),
                         torch.float32, pc.grad, f"{name}: parameter gradient")


# ---- the Python side of "no host synchronisation" --------------------------------------------

def test_quantizer_switches_are_read_on_the_host_only_after_they_change():
    """QuantizeBase keeps the switches' values on the host and reads a switch buffer (a CUDA
    synchronisation) only when it changed since: a direct write, load_state_dict, .to() and
    unpickling are all seen; enable_* and disable_* cost no read."""
    import io
    fq = FixedFakeQuantize(obs.MinMaxObserver, **_sym())
    x = batch((64,), 12)
    fq(x)
    fq.disable_observer()
    with no_host_sync("cpu"):
        fq(x)
        fq.enable_fake_quant(False)
        assert torch.equal(fq(x), x)
        fq.enable_fake_quant(True)
        quantized = fq(x)
    assert not torch.equal(quantized, x)
    fq.fake_quant_enabled[0] = 0  # a direct write (advanced_ptq does this)
    assert torch.equal(fq(x), x)
    fq.fake_quant_enabled.fill_(1)
    assert torch.equal(fq(x), quantized)
    state = fq.state_dict()
    state["fake_quant_enabled"] = torch.tensor([0], dtype=torch.uint8)
    fq.load_state_dict(state)
    assert torch.equal(fq(x), x)
    fq.enable_fake_quant()
    moved = copy.deepcopy(fq).to(torch.float64)  # new buffer objects
    moved.fake_quant_enabled[0] = 0
    assert torch.equal(moved(x.double()), x.double()) and torch.equal(fq(x), quantized)
    buf = io.BytesIO()
    torch.save(fq, buf)  # the host-side cache holds weak references: not pickled
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    assert torch.equal(loaded(x), quantized)
    loaded.fake_quant_enabled[0] = 0
    assert torch.equal(loaded(x), x)


def test_nnie_quantizer_checks_data_max_without_a_host_read_per_step():
    """NNIEFakeQuantize refuses an uncalibrated data_max, but once checked it reads nothing on
    the host in a QAT step; a new observation or a loaded state is checked again."""
    fq = NNIEFakeQuantize(obs.MinMaxObserver, **_sym())
    fq.disable_observer()
    with pytest.raises(RuntimeError, match="calibrate"):
        fq(batch((10,), 13))
    fq.enable_observer()
    fq(torch.tensor([-3.0, 2.0]))
    fq.disable_observer()
    x = batch((100,), 14).requires_grad_()
    fq(x)
    with no_host_sync("cpu"):
        y = fq(x)
        y.sum().backward()
    assert torch.equal(y, ops.fake_quantize_nnie(x.detach(), torch.tensor(3.0)))
    fresh = NNIEFakeQuantize(obs.MinMaxObserver, **_sym())
    fresh.disable_observer()
    fq.load_state_dict(fresh.state_dict())  # back to data_max -inf, no observed range
    with pytest.raises(RuntimeError, match="data_max is -inf"):
        fq(x)
