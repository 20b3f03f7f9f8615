"""QAT modules (``mqbench.nn.qat``): layers whose weight goes through ``weight_fake_quant``.
Conv2d and Linear are torch's (``torch.nn.qat``)."""
from torch.nn.qat import Conv2d, Linear  # noqa: F401

from mqbench.nn.qat.modules import ConvTranspose2d, Embedding  # noqa: F401
