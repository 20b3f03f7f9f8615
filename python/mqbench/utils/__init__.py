"""MQBench's ``mqbench.utils``: ``utils.py`` re-exported, plus ``hook`` and ``logger``."""
from mqbench.utils.utils import *  # noqa: F401,F403
from mqbench.utils.utils import (USE_DDP, USE_LINK, is_per_channel, is_symmetric_quant,  # noqa: F401
                                 is_tracing_state, no_jit_trace, pot_quantization, sync_tensor)
