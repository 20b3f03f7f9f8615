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
    # Leave without the interpreter's teardown, where a collector thread of the process group
    # can still be joined (seen once in CI: "terminate called without an active exception");
    # mp.spawn reports a non-zero exit code with the rank.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
