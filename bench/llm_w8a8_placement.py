"""Why W8A8 through ``prepare_by_platform(Tensorrt_NLP)`` reads below the bench's simulation of the
same format on all-MiniLM-L6-v2 (docs/benchmarks.md, "What the tables say"): the embedding cosine to
float of
  - the simulation (bench/llm_peers.py ``_input_quantized``): weights only, activations only,
    both; each Linear's own input quantized;
  - the same simulation with the residual stream quantized too: the outputs of the embeddings
    and of the LayerNorms that feed Q/K/V or the intermediate dense, for every consumer, which
    is what a post-activation quantizer does;
  - the prepared model with its fake quantizers switched on by kind: none, weights, activations,
    both.

    PYTHONPATH=python .venv/bin/python bench/llm_w8a8_placement.py
"""
import copy

import torch

import llm_minilm
import llm_peers


def main():
    from mqbench.utils.logger import set_log_level
    set_log_level("ERROR")
    torch.set_num_threads(2)
    model, samples, cosine, _ = llm_minilm.setup(64)

    def same(x, *_):
        return x

    def simulated(quantize_input, weight_fn):
        return cosine(llm_peers._input_quantized(copy.deepcopy(model), samples, quantize_input,
                                                 weight_fn))

    print(f"simulation, weights only          {simulated(same, llm_peers.int8_per_channel):.5f}")
    print(f"simulation, activations only      {simulated(llm_peers.int8_per_tensor, same):.5f}")
    print(f"simulation, both                  "
          f"{simulated(llm_peers.int8_per_tensor, llm_peers.int8_per_channel):.5f}")

    # the residual stream: each tensor quantized at the scale of the Linear it feeds
    m = llm_peers._input_quantized(copy.deepcopy(model), samples, llm_peers.int8_per_tensor,
                                   same)
    amax = llm_peers.linear_input_amax(model, samples)
    layers = len(model.encoder.layer)
    feeds = {"embeddings": "encoder.layer.0.attention.self.query"}
    for i in range(layers):
        feeds[f"encoder.layer.{i}.attention.output.LayerNorm"] = \
            f"encoder.layer.{i}.intermediate.dense"
        if i + 1 < layers:
            feeds[f"encoder.layer.{i}.output.LayerNorm"] = \
                f"encoder.layer.{i + 1}.attention.self.query"
    modules = dict(m.named_modules())
    for src, linear in feeds.items():
        modules[src].register_forward_hook(
            lambda _m, _a, out, n=linear: llm_peers.int8_per_tensor(out, amax[n]))
    print(f"simulation, activations only, residual stream quantized too {cosine(m):.5f}")

    q = llm_peers.ours_w8a8_prepared(copy.deepcopy(model), samples, None)  # its log: stderr
    from mqbench.fake_quantize.quantize_base import QuantizeBase
    quantizers = {n: x for n, x in q.named_modules() if isinstance(x, QuantizeBase)}
    for label, keep in (("none", lambda n: False),
                        ("weights only", lambda n: "weight_fake_quant" in n),
                        ("activations only", lambda n: "weight_fake_quant" not in n),
                        ("both", lambda n: True)):
        for n, x in quantizers.items():
            x.fake_quant_enabled.fill_(1 if keep(n) else 0)
        print(f"prepare_by_platform, {label:<17} {cosine(q):.5f}")


if __name__ == "__main__":
    main()
