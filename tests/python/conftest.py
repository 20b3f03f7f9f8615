import os
import sys

# Tests import the in-tree package (python/) and the references beside them.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
sys.path.insert(0, HERE)

import mqbench  # noqa: E402,F401  (registers torch.ops.mqbench)
