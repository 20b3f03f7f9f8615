"""mqbench.llm: GPTQ, AWQ, SmoothQuant and RTN (docs/llm.md), against round-to-nearest and the
float model, and the C++ ops against the torch references."""
import math
import warnings

import pytest
import torch
from torch import nn

from mqbench.llm import awq, gptq, rtn, smoothquant
from mqbench.llm import _common
from mqbench.llm.awq import awq_search_scale_reference, awq_weight_mean
from mqbench.llm.gptq import gptq_quantize_weight_reference, hessian_update_reference
from mqbench.scheme import QuantizeScheme

HAS_CPP = hasattr(torch.ops.mqbench, "gptq_quantize_weight")
needs_cpp = pytest.mark.skipif(not HAS_CPP, reason="mqbench built without the LLM ops")
W4G32 = {"bit": 4, "per_channel": True, "group_size": 32}


def _correlated_inputs(n, d, seed=0, outliers=()):
    """Tokens with correlated channels (a random mixing of a few latent factors) and optional
    outlier channels, like LLM hidden states."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d // 4, generator=g)
    x = z @ torch.randn(d // 4, d, generator=g) + 0.1 * torch.randn(n, d, generator=g)
    for c in outliers:
        x[:, c] *= 20.0
    return x


def _layer_error(w, q, x):
    return ((x @ w.t() - x @ q.t()).norm() / (x @ w.t()).norm()).item()


def _tiny_llama(seed=0, layers=2):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    # LLM-like activation outliers: a few hidden channels carry large values
    with torch.no_grad():
        model.model.embed_tokens.weight[:, [3, 17]] *= 30.0
    return model


def _llama_calib(n=4, seq=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 128, (1, seq), generator=g)} for _ in range(n)]


def _logits(model, calib):
    with torch.no_grad():
        return torch.cat([model(**c).logits for c in calib])
