"""Weight-only INT4 for a decoder LLM, from GPTQ to a deployed ONNX model (docs/llm.md):

1. a small Llama (transformers 5, random weights with LLM-like outlier channels; no download)
   and a few calibration sequences;
2. RTN, GPTQ and SignRound at INT4, one scale per 32 input channels: the logits' relative
   error to float;
3. the GPTQ model prepared for BackendType.QDQ (torch.export capture), its weight fake
   quantizers set to GPTQ's grid (load_weight_qparams), the activation quantizers off
   (weight-only: enable_calibration_quantization(model, "weight_fake_quant")); and the other
   order, GPTQ on a model prepared first, which must give the same logits bit for bit;
4. convert_deploy writes blocked INT4 Q/DQ (opset 21); onnxruntime runs the deployed file and
   its logits are compared with the fake-quant model's.

The embedding table and lm_head stay float (extra_quantizer_dict's exclude_module_name), as
weight-only LLM deployments usually keep them.

Usage:  python3 examples/llm_gptq.py [--quick] [--output-dir DIR] [--device cuda]
With --device the model runs there; the calibration sequences stay on the CPU, as a
tokenizer gives them, and the algorithms move them to the model (docs/llm.md, "Devices").
Exits non-zero if GPTQ or SignRound is not better than RTN, if a prepared model loses the
algorithm's grid (GPTQ's or SignRound's), if
GPTQ on the prepared model gives other logits, or if onnxruntime's logits differ from the
fake-quant model's by more than 1e-4 of their range.
"""
import argparse
import copy
import os
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime
import torch
import transformers

from mqbench.convert_deploy import convert_deploy
from mqbench.llm import gptq, load_weight_qparams, rtn, signround
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.logger import set_log_level
from mqbench.utils.state import enable_calibration_quantization
from mqbench.utils.utils import to_device

W4 = {"bit": 4, "per_channel": True, "group_size": 32}


def small_llama(layers):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=4, max_position_embeddings=64,
                                   use_cache=False)
    model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # a few hidden channels carry large values, as in trained LLMs
        model.model.embed_tokens.weight[:, [3, 17, 90]] *= 30.0
    return model


def sequences(n, length, seed):
    g = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(0, 256, (1, length), generator=g)} for _ in range(n)]


def logits(model, batches, device="cpu"):
    """The logits of ``batches`` (on the CPU), run on ``device``, back on the CPU."""
    with torch.no_grad():
        out = [model(**to_device(b, device)) for b in batches]
    return torch.cat([(o if isinstance(o, torch.Tensor) else o["logits"]).float().cpu()
                      for o in out])


def rel_error(y, ref):
    return ((y - ref).norm() / ref.norm()).item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="two layers (the test suite's run)")
    p.add_argument("--output-dir", default="")
    p.add_argument("--device", default="cpu", help="where the model runs (cpu, cuda)")
    a = p.parse_args()
    set_log_level("ERROR")
    dev = a.device
    model = small_llama(2 if a.quick else 4).to(dev)
    calib, evaluation = sequences(8, 32, 1), sequences(4, 32, 2)  # on the CPU
    ref = logits(model, evaluation, dev)

    rtn_model = copy.deepcopy(model)
    rtn(rtn_model, W4)
    gptq_model = copy.deepcopy(model)
    grid = gptq(gptq_model, calib, W4)
    signround_model = copy.deepcopy(model)
    signround_grid = signround(signround_model, calib, W4)
    errors = {"RTN": rel_error(logits(rtn_model, evaluation, dev), ref),
              "GPTQ": rel_error(logits(gptq_model, evaluation, dev), ref),
              "SignRound": rel_error(logits(signround_model, evaluation, dev), ref)}

    config = {"example_inputs": to_device(calib[0], dev),
              "extra_qconfig_dict": {"w_qscheme": W4},
              "extra_quantizer_dict": {"exclude_module_name": ["lm_head", "embed_tokens"]}}
    prepared = prepare_by_platform(gptq_model, BackendType.QDQ, config)
    enable_calibration_quantization(prepared, "weight_fake_quant")  # weight-only
    load_weight_qparams(prepared, grid)  # GPTQ's grid; those observers off
    fake_quant = logits(prepared, evaluation, dev)
    errors["GPTQ, prepared"] = rel_error(fake_quant, ref)
    prepared_sr = prepare_by_platform(signround_model, BackendType.QDQ, config)
    enable_calibration_quantization(prepared_sr, "weight_fake_quant")
    load_weight_qparams(prepared_sr, signround_grid)
    errors["SignRound, prepared"] = rel_error(logits(prepared_sr, evaluation, dev), ref)

    # The other order, MQBench's own for its PTQ: prepare first, then GPTQ on the prepared
    # model. Its passes see the float model inside; its weight quantizers get GPTQ's grid.
    prepared_first = prepare_by_platform(copy.deepcopy(model), BackendType.QDQ, config)
    enable_calibration_quantization(prepared_first, "weight_fake_quant")
    gptq(prepared_first, calib, W4)
    first = logits(prepared_first, evaluation, dev)
    errors["prepared, then GPTQ"] = rel_error(first, ref)

    with tempfile.TemporaryDirectory(prefix="mqbench_llm_") as scratch:
        out_dir = a.output_dir or scratch
        convert_deploy(prepared, BackendType.QDQ, dummy_input=to_device(evaluation[0], dev),
                       output_path=out_dir, model_name="llama_w4g32", dynamo=True)
        path = os.path.join(out_dir, "llama_w4g32.onnx")
        proto = onnx.load(path)
        onnx.checker.check_model(proto, full_check=True)
        blocked = sum(1 for n in proto.graph.node if n.op_type == "QuantizeLinear"
                      and any(att.name == "block_size" for att in n.attribute))
        quantizers = sum(1 for n in proto.graph.node if n.op_type == "QuantizeLinear")
        sess = onnxruntime.InferenceSession(path, providers=["CPUExecutionProvider"])
        deployed = torch.cat([torch.from_numpy(sess.run(None, {
            "input_ids": b["input_ids"].numpy()})[0]) for b in evaluation])
    errors["deployed (onnxruntime)"] = rel_error(deployed, ref)
    gap = (deployed - fake_quant).abs().max().item() / fake_quant.abs().max().item()

    print(f"INT4, groups of {W4['group_size']}, {len(grid)} Linear layers; logits' relative "
          f"error to float on {len(evaluation)} sequences:")
    for name, err in errors.items():
        print(f"  {name:<24}{err:.4f}")
    print(f"deployed: {blocked} blocked QuantizeLinear of {quantizers} (weight-only); "
          f"onnxruntime vs fake-quant: {gap:.2e} of the logits' range")
    for algo in ("GPTQ", "SignRound"):
        if not errors[algo] < errors["RTN"]:
            sys.exit(f"{algo} is not better than RTN")
        if abs(errors[f"{algo}, prepared"] - errors[algo]) > 1e-4:
            sys.exit(f"the prepared model does not compute {algo}'s weights")
    if not torch.equal(first, fake_quant):
        sys.exit("GPTQ on the prepared model differs from GPTQ before prepare_by_platform")
    if blocked != len(grid) or quantizers != blocked:
        sys.exit(f"expected {len(grid)} blocked weight quantizers and no other")
    if gap > 1e-4:
        sys.exit("onnxruntime and the fake-quant model disagree")
    return 0


if __name__ == "__main__":
    main()
