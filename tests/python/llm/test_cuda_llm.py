"""mqbench.llm on the device of the ``device`` fixture (cuda_harness.py): GPTQ, AWQ and
SmoothQuant on a tiny Llama held on that device, against the same algorithms on the CPU. The
CPU case runs the same comparisons CPU against CPU; the CUDA case skips, with its reason, where
no GPU is present (tools/gpu_check.sh runs it on the GPU machine).

What may differ between devices: matrix products sum in another order, so a weight within an
ulp of a rounding tie can land on the other level (GPTQ then spreads a different error), and a
search whose candidates nearly tie can pick the neighbour. So the weights are compared by the
share that is equal, the searches by their losses, and the models by their output error."""
import copy

import pytest
import torch

from mqbench.llm import awq, gptq, smoothquant

W4G32 = {"bit": 4, "per_channel": True, "group_size": 32}


def _tiny_llama():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(cfg).eval()
    model.config.use_cache = False
    with torch.no_grad():
        model.model.embed_tokens.weight[:, [3, 17]] *= 30.0
    return model


def _calib(device):
    g = torch.Generator().manual_seed(1)
    return [{"input_ids": torch.randint(0, 128, (1, 32), generator=g).to(device)}
            for _ in range(4)]


def _logits(model, calib):
    with torch.no_grad():
        return torch.cat([model(**c).logits.float().cpu() for c in calib])


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def _on(device, algo):
    """(model after ``algo`` on ``device``, its result, its logits' error to float)."""
    model = copy.deepcopy(_tiny_llama()).to(device)
    calib = _calib(device)
    ref = _logits(model, calib)
    if algo == "gptq":
        out = gptq(model, calib, W4G32, act_order=True)
    elif algo == "awq":
        out = awq(model, calib, W4G32)
    else:
        out = smoothquant(model, calib, alpha=0.5)
    return model, out, _rel(_logits(model, calib), ref)


@pytest.mark.parametrize("algo", ["gptq", "awq", "smoothquant"])
def test_llm_algorithms_on_the_device_match_the_cpu(device, algo):
    got, res, err = _on(device, algo)
    want, ref, ref_err = _on("cpu", algo)
    assert {p.device.type for p in got.parameters()} == {torch.device(device).type}
    assert list(res) == list(ref)
    if algo == "smoothquant":  # float function unchanged, scales from maxima: equal to rounding
        assert err < 1e-4 and ref_err < 1e-4, (err, ref_err)
        for name in ref:
            assert torch.allclose(res[name]["scale"].cpu(), ref[name]["scale"], rtol=1e-4), name
        return
    if algo == "awq":  # the searches' losses agree; the model moves as on the CPU
        for name in ref:
            assert torch.allclose(res[name]["losses"].cpu(), ref[name]["losses"], rtol=1e-3,
                                  atol=1e-9), name
        assert abs(err - ref_err) < 1e-4 + 1e-3 * ref_err, (err, ref_err)
        return
    # GPTQ: almost every weight on the same level; the same output error within a few percent
    same = total = 0
    for (name, p), q in zip(got.named_parameters(), want.parameters()):
        same += (p.detach().cpu() == q.detach()).sum().item()
        total += p.numel()
    assert same / total > 0.99, same / total
    for name in ref:
        assert torch.allclose(res[name]["scale"].cpu(), ref[name]["scale"], rtol=1e-4), name
    assert abs(err - ref_err) < 0.05 * ref_err, (err, ref_err)


def test_calibration_data_on_the_cpu_for_a_model_on_the_device(device):
    """A tokenizer's CPU tensors for a model on the device: moved where the model takes its
    inputs, with the result of data given on the device."""
    models = [copy.deepcopy(_tiny_llama()).to(device) for _ in range(2)]
    gptq(models[0], _calib("cpu"), W4G32)
    gptq(models[1], _calib(device), W4G32)
    for p, q in zip(models[0].parameters(), models[1].parameters()):
        assert torch.equal(p, q)
