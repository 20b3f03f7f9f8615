"""Worker of test_ddp_qat.py: one rank of examples/ddp_qat.py, started by torch.multiprocessing
with a file:// rendezvous (the example's own entry point, called with rank and world size)."""
import os
import sys

import torch

EXAMPLES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "examples"))


def run(rank, world_size, init_file, argv):
    torch.set_num_threads(1)
    if EXAMPLES not in sys.path:
        sys.path.insert(0, EXAMPLES)
    import ddp_qat
    code = ddp_qat.main(argv, rank=rank, world_size=world_size, init_method=f"file://{init_file}")
    if code:
        raise SystemExit(code)  # mp.spawn reports the rank and its exit code
