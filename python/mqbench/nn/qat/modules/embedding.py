"""``Embedding`` QAT module (MQBench 1.10's mapping of nn.Embedding): the table goes through
``weight_fake_quant``, per channel along dimension 1 when the qconfig is per channel."""
import torch.nn as nn
import torch.nn.functional as F

from mqbench.nn.qat.modules.deconv import deconv_weight_quantizer

__all__ = ["Embedding"]


class Embedding(nn.Embedding):
    _FLOAT_MODULE = nn.Embedding

    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, max_norm=None,
                 norm_type=2.0, scale_grad_by_freq=False, sparse=False, _weight=None,
                 qconfig=None, device=None, dtype=None):
        super().__init__(num_embeddings, embedding_dim, padding_idx, max_norm, norm_type,
                         scale_grad_by_freq, sparse, _weight, device=device, dtype=dtype)
        assert qconfig, "qconfig must be provided for QAT module"
        self.qconfig = qconfig
        self.weight_fake_quant = deconv_weight_quantizer(qconfig)  # ch_axis 1 if per channel

    def forward(self, input):
        return F.embedding(input, self.weight_fake_quant(self.weight), self.padding_idx,
                           self.max_norm, self.norm_type, self.scale_grad_by_freq, self.sparse)

    @classmethod
    def from_float(cls, mod):
        assert type(mod) == cls._FLOAT_MODULE, \
            f"{cls.__name__}.from_float expects nn.Embedding, got {type(mod).__name__}"
        assert hasattr(mod, "qconfig") and mod.qconfig, "the float module needs a qconfig"
        qat = cls(mod.num_embeddings, mod.embedding_dim, mod.padding_idx, mod.max_norm,
                  mod.norm_type, mod.scale_grad_by_freq, mod.sparse, qconfig=mod.qconfig)
        qat.weight = mod.weight  # shared with the float model, as torch's from_float does
        return qat
