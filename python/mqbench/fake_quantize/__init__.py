"""MQBench's fake quantizers (``mqbench.fake_quantize``): thin modules around the
``torch.ops.mqbench`` fake-quantize ops."""
from mqbench.fake_quantize.adaround_quantizer import AdaRoundFakeQuantize  # noqa: F401
from mqbench.fake_quantize.dorefa import DoReFaFakeQuantize  # noqa: F401
from mqbench.fake_quantize.dsq import DSQFakeQuantize  # noqa: F401
from mqbench.fake_quantize.fixed import FixedFakeQuantize  # noqa: F401
from mqbench.fake_quantize.fp8 import FP8FakeQuantize, LearnableFP8FakeQuantize  # noqa: F401
from mqbench.fake_quantize.group import GroupFakeQuantize, LearnableGroupFakeQuantize  # noqa: F401
from mqbench.fake_quantize.lsq import LearnableFakeQuantize  # noqa: F401
from mqbench.fake_quantize.mx import MXFakeQuantize, NVFP4FakeQuantize  # noqa: F401
from mqbench.fake_quantize.nnie import NNIEFakeQuantize  # noqa: F401
from mqbench.fake_quantize.pact import PACTFakeQuantize  # noqa: F401
from mqbench.fake_quantize.per_token import PerTokenFakeQuantize  # noqa: F401
from mqbench.fake_quantize.qdrop_quantizer import QDropFakeQuantize  # noqa: F401
from mqbench.fake_quantize.quantize_base import QuantizeBase  # noqa: F401
from mqbench.fake_quantize.tqt import TqtFakeQuantize  # noqa: F401
