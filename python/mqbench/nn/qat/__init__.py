"""QAT modules (``mqbench.nn.qat``): layers whose weight goes through ``weight_fake_quant``.
``Conv1d``/``Conv2d``/``Conv3d`` and ``Linear`` are torch's ``nn.qat`` modules, owned here."""
from mqbench.nn.qat.modules import (Conv1d, Conv2d, Conv3d, ConvTranspose2d,  # noqa: F401
                                    Embedding, Linear)
