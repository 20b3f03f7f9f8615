"""Every backend as a torchao pt2e ``Quantizer`` (``MQBenchQuantizer``), and the road from a
pt2e-prepared model to ``convert_deploy`` (``convert_pt2e_for_deploy``). docs/pt2e.md.

::

    from torchao.quantization.pt2e.quantize_pt2e import prepare_qat_pt2e
    from mqbench.pt2e import MQBenchQuantizer
    gm = torch.export.export(model, (x,)).module()
    prepared = prepare_qat_pt2e(gm, MQBenchQuantizer(BackendType.Tensorrt))
    # prepared has MQBench's fake quantizers (LearnableFakeQuantize, ...) where
    # prepare_by_platform(model, BackendType.Tensorrt) puts them

The modules: ``planning`` decides the placement on the lifted graph (the same rules as
``prepare_by_platform``), ``quantizer`` is the ``Quantizer`` that annotates it (torchao is
imported there), ``deploy_fold`` folds torchao's QAT conv + BN before ``convert_deploy``.
"""
from mqbench.pt2e.deploy_fold import convert_pt2e_for_deploy, is_pt2e_fake_quantizer
from mqbench.pt2e.planning import plan_pt2e
from mqbench.pt2e.quantizer import MQBenchQuantizer

__all__ = ["MQBenchQuantizer", "convert_pt2e_for_deploy", "is_pt2e_fake_quantizer", "plan_pt2e"]
