"""MQBench's ``mqbench.utils``: ``utils.py`` re-exported (as MQBench's ``from .utils import *``),
plus the submodules ``fusion``, ``hook``, ``logger``, ``registry`` and ``state``."""
from mqbench.utils.utils import *  # noqa: F401,F403
from mqbench.utils.utils import (USE_DDP, USE_LINK, _fix_succ_recursivly,  # noqa: F401
                                 deepcopy_graphmodule, deepcopy_mixedmodule,
                                 get_flattened_qconfig_dict, getitem2node, is_per_channel,
                                 is_symmetric_quant, is_tracing_state, no_jit_trace,
                                 pot_quantization, sync_tensor, topology_order)
