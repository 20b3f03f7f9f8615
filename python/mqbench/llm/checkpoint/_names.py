"""Tensor names on disk and in the model: transformers 5 renames some checkpoint keys when it
loads a model (Mixtral's ``block_sparse_moe`` is the model's ``mlp``) and renames them back when
it saves; the engines read the names on disk. Fused experts are not renamed here: they are
written and read one Linear per expert (``_experts.ExpertView``), under the per-expert names
the checkpoints use."""


def _renamings(model, legacy):
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import PrefixChange, WeightRenaming
    except ImportError:  # a transformers without conversion mappings renames nothing
        return []
    convs = get_model_conversion_mapping(model, add_legacy=legacy)
    return [c for c in convs if isinstance(c, WeightRenaming) and not isinstance(c, PrefixChange)]


class KeyNames(object):
    """``to_disk(key)`` / ``to_model(key)`` for the model class of ``model`` (an instance; a
    meta-device skeleton will do)."""

    def __init__(self, model):
        self._load = _renamings(model, legacy=True)
        self._save = [c.reverse_transform() for c in _renamings(model, legacy=False)[::-1]]

    def to_disk(self, key):
        from transformers.core_model_loading import apply_renamings
        return apply_renamings(key, self._save) if self._save else key

    def to_model(self, key):
        from transformers.core_model_loading import apply_renamings
        return apply_renamings(key, self._load) if self._load else key
