"""Running an LLM algorithm on a model with fused experts (``per_expert``): the experts seen one
Linear per expert through ``_experts.ExpertView``, the routers left float, the starved experts
rounded to nearest (docs/design/llm.md, "Experts one by one")."""
import functools
import inspect
import warnings

from mqbench.llm import _calibration, _experts, _layers, _weights
from mqbench.utils.utils import to_device


def check_expert_args(calibrate_all_experts, min_expert_tokens, algorithm):
    if not isinstance(calibrate_all_experts, bool):
        raise ValueError(f"{algorithm}: calibrate_all_experts must be True or False, got "
                         f"{calibrate_all_experts!r}")
    if isinstance(min_expert_tokens, bool) or not isinstance(min_expert_tokens, int) or \
            min_expert_tokens < 0:
        raise ValueError(f"{algorithm}: min_expert_tokens must be an integer >= 0, got "
                         f"{min_expert_tokens!r}")


def warn_starved(starved, algorithm):
    if starved:
        first = sorted(starved)[:3]
        warnings.warn(f"{algorithm}: {len(starved)} experts got fewer calibration tokens than "
                      f"min_expert_tokens and are rounded to nearest instead (first: "
                      f"{', '.join(f'{n} ({starved[n]} tokens)' for n in first)}); "
                      "calibrate_all_experts=True gives every expert every token")


def per_expert(fn):
    """Runs the algorithm ``fn(model, calib_data, ...)`` (which takes ``layers``, ``ignore``,
    ``calibrate_all_experts`` and ``min_expert_tokens``) on a model with fused experts through
    an ``ExpertView``: each expert's Linears quantized like any other, the gates beside them
    left float, an expert with fewer than ``min_expert_tokens`` routed tokens rounded to nearest
    with a warning naming it. Its qparams are keyed by the experts' Linear names
    (``...mlp.experts.3.gate_proj``), the names their checkpoints use."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        algorithm = fn.__name__.replace("run_", "")
        all_tokens = a.get("calibrate_all_experts", False)
        min_tokens = a.get("min_expert_tokens", _experts.MIN_EXPERT_TOKENS)
        check_expert_args(all_tokens, min_tokens, algorithm)
        view = _experts.ExpertView(a["model"], all_tokens)
        if not view:
            return fn(**a)
        ignore = (a["ignore"],) if isinstance(a["ignore"], str) else tuple(a["ignore"])
        with view:
            ignore = ignore + tuple(view.routers)
            a["ignore"] = ignore
            starved = {}
            calib = a.get("calib_data")
            if calib is not None:
                calib = list(calib)
                a["calib_data"] = calib
                model = a["model"]
                device = _calibration.input_device(model)

                def run():
                    for sample in calib:
                        _calibration.run_model(model, sample if device is None else
                                               to_device(sample, device))
                starved = view.starved(run, min_tokens)
            names = [n for n, _ in _layers.find_linears(a["model"], a["layers"], ignore)]
            low = [n for n in names if n.rpartition(".")[0] in starved]
            a["layers"] = [n for n in names if n not in set(low)]
            out = fn(**a)
            if low:
                warn_starved(starved, algorithm)
                scheme = a.get("w_qscheme")
                if scheme is not None:
                    wq = _weights.resolve_w_qscheme(scheme, algorithm)
                    mods = dict(a["model"].named_modules())
                    out.update(_weights.round_layers([(n, mods[n]) for n in low], wq))
        return out
    return wrapper
