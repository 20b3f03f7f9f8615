"""An example backend defined outside the library: "MyNPU", a hypothetical accelerator with
4-bit symmetric per-channel weights and 8-bit asymmetric activations whose range is clipped at
the 99.99th percentile of |x|. docs/add_a_backend.md walks through it.

    PYTHONPATH=python .venv/bin/python examples/custom_backend/my_npu.py

Importing this module registers the backend (once); running it calibrates and quantizes a small
conv net for MyNPU and prints the error against float.
"""
import torch

import mqbench  # noqa: F401
from mqbench.fake_quantize import LearnableFakeQuantize
from mqbench.observer import EMAQuantileObserver
from mqbench.prepare_by_platform import BackendType, get_qconfig_by_platform, register_backend
from mqbench.scheme import QuantizeScheme


class MyNPUActObserver(EMAQuantileObserver):
    """Step 1, the observer: MyNPU's calibration clips activations at the 99.99th percentile of
    |x| with a faster-moving average than MQBench's default."""

    def __init__(self, *args, threshold=0.9999, ema_ratio=0.8, **kwargs):
        super().__init__(*args, threshold=threshold, ema_ratio=ema_ratio, **kwargs)


def register():
    """Steps 2-4: the schemes, the quantizer rules (MQBench's default ones) and the deploy
    translator (none yet) in one spec. Idempotent."""
    if "MyNPU" in BackendType.__members__:
        return BackendType.MyNPU
    return register_backend(
        "MyNPU",
        qtype="affine",
        w_qscheme=QuantizeScheme(symmetry=True, per_channel=True, bit=4, symmetric_range=True),
        a_qscheme=QuantizeScheme(symmetry=False, per_channel=False, bit=8),
        default_weight_quantize=LearnableFakeQuantize,
        default_act_quantize=LearnableFakeQuantize,
        default_weight_observer="MinMaxObserver",
        default_act_observer=MyNPUActObserver,
        model_quantizer="ModelQuantizer",
    )


MyNPU = register()


def main():
    torch.manual_seed(0)
    qconfig = get_qconfig_by_platform(MyNPU, {})
    conv = torch.nn.Conv2d(3, 16, 3)
    w_fq, a_fq = qconfig.weight(), qconfig.activation()
    x = torch.randn(8, 3, 16, 16)
    with torch.no_grad():
        for _ in range(4):  # calibration: observers on
            a_fq(torch.relu(conv(x)))
        w_fq(conv.weight)
        for fq in (w_fq, a_fq):
            fq.disable_observer()
        y_float = torch.relu(conv(x))
        y_q = a_fq(torch.relu(torch.nn.functional.conv2d(x, w_fq(conv.weight), conv.bias)))
    err = (y_q - y_float).abs().mean() / y_float.abs().mean()
    print(f"MyNPU: weights {w_fq.quant_min}..{w_fq.quant_max} per channel, activations "
          f"{a_fq.quant_min}..{a_fq.quant_max}; relative mean error {err:.4f}")


if __name__ == "__main__":
    main()
