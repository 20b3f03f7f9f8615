"""MQBench's other module path of the reconstruction driver (its PTQ example imports
``from mqbench.ptq_reconstruction import ptq_reconstruction``): the same objects as
:mod:`mqbench.advanced_ptq`."""
from mqbench.advanced_ptq import *  # noqa: F401,F403
from mqbench.advanced_ptq import __all__  # noqa: F401
