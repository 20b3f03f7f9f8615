"""Finding the layers the LLM algorithms quantize: ``nn.Linear`` and transformers' ``Conv1D``
(seen as the ``[out, in]`` Linear it is), their weights as 2-D views, and the common parent of a
set of layers."""
from torch import nn

from mqbench.utils.module_types import is_conv1d  # noqa: F401  (the algorithms' name)

def is_linear(mod):
    """An ``nn.Linear`` or a transformers ``Conv1D``: the layers the algorithms process."""
    return isinstance(mod, nn.Linear) or is_conv1d(mod)


def weight_2d(mod):
    """The layer's weight as [out, in] (Note [Conv1D weights]): the parameter itself for
    ``nn.Linear``, its transposed view for ``Conv1D``. A view: in-place edits (``copy_``,
    ``mul_``) under ``no_grad`` write the parameter in its own layout."""
    # Note [Conv1D weights]: every algorithm reads and writes weights as [out, in] through this
    # view, so a Conv1D is quantized per output channel / per group of input channels exactly as
    # the Linear computing the same function would be, and the result lands in Conv1D's layout.
    return mod.weight.t() if is_conv1d(mod) else mod.weight


def in_features(mod):
    return weight_2d(mod).shape[1]


def find_linears(model, layers=None, ignore=("lm_head",)):
    """[(qualified name, layer)] of ``model``'s ``nn.Linear`` and transformers ``Conv1D`` layers
    in module order. ``layers``: names to keep (all by default); ``ignore``: names (or their last
    component) left out, by default the output head ``lm_head`` as in every LLM toolkit (its
    rounding dominates the logits' error)."""
    found = []
    for name, mod in model.named_modules():
        if not is_linear(mod):
            continue
        if layers is not None and name not in layers:
            continue
        if name in ignore or name.rsplit(".", 1)[-1] in ignore:
            continue
        found.append((name, mod))
    if layers is not None:
        missing = sorted(set(layers) - {n for n, _ in found})
        if missing:
            raise ValueError("layers names modules that are not nn.Linear (or transformers "
                             f"Conv1D) of the model: {missing}")
    if not found:
        raise ValueError("the model has no nn.Linear (or transformers Conv1D) layer to process")
    offloaded = [name for name, mod in found if mod.weight.device.type == "meta"]
    if offloaded:
        raise ValueError(
            f"{len(offloaded)} of the layers to process have their weights on the meta device "
            f"(offloaded, e.g. by accelerate's device_map with 'cpu' or 'disk'), first "
            f"{offloaded[0]!r}: the algorithms read and write every weight in memory; load the "
            "model onto one device (model.to(device)) first")
    return found


def common_module(names):
    """The qualified name of the deepest module holding all the named modules ("" the model)."""
    common = []
    for level in zip(*(n.split(".")[:-1] for n in names)):
        if any(p != level[0] for p in level):
            break
        common.append(level[0])
    return ".".join(common)
