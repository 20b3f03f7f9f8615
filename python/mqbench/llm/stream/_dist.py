"""``quantize_checkpoint`` over several processes (``torchrun --nproc-per-node N -m mqbench.llm
...``): torch.distributed with gloo on the CPU, NCCL on GPUs (docs/design/llm.md, "Many
processes").

Each rank takes every N-th calibration item (``shard``) and runs the blocks on them; GPTQ sums
the Hessians over the ranks (each rank's ``H * n``, then divided by all the rows); the layers of
a step are dealt out to the ranks, each quantizes its own at the same time as the others, and
each weight and its grid is then broadcast, so every rank holds the same block before its
outputs are computed. AWQ and SmoothQuant reduce their statistics instead (the per-channel
means or maxima of the inputs, and each candidate's error weighed by the ranks' token counts),
and every rank then picks the same scales. SignRound sums each step's gradients and objective
over the ranks, so every rank takes the same steps. Rank 0 alone writes the output
folder. Every collective has the process group's timeout: a rank that dies ends the job on every
rank with an error, never a hang.
"""
import datetime
import os

import torch

from mqbench.llm.stream._source import WHO

# seconds a collective waits for the other ranks (a block's GPTQ on the slowest rank included)
DEFAULT_TIMEOUT = 1800


class Comm(object):
    """This process's rank in the group, and the collectives ``quantize_checkpoint`` needs."""

    def __init__(self, device):
        import torch.distributed as dist
        self.dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.device = device  # where the collectives' tensors live (NCCL: this rank's GPU)
        self._next = 0  # layers quantized so far: the owner of the next is _next % world

    @classmethod
    def from_env(cls, timeout=DEFAULT_TIMEOUT):
        """The group torchrun describes in the environment (WORLD_SIZE > 1), initialized here
        if the caller has not; None for one process."""
        import torch.distributed as dist
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        if not dist.is_available():
            raise ValueError(f"{WHO}: WORLD_SIZE is {os.environ['WORLD_SIZE']} but this torch "
                             "has no torch.distributed; run one process")
        cuda = torch.cuda.is_available()
        if not dist.is_initialized():
            dist.init_process_group("nccl" if cuda else "gloo",
                                    timeout=datetime.timedelta(seconds=timeout))
        device = torch.device("cpu")
        if dist.get_backend() == "nccl":
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
        return cls(device)

    def shard(self, ids):
        """This rank's calibration rows: every ``world``-th from ``rank``."""
        if ids.shape[0] < self.world:
            raise ValueError(f"{WHO}: {ids.shape[0]} calibration rows for {self.world} ranks; "
                             "give each rank at least one")
        return ids[self.rank::self.world]

    def reduce_hessian(self, H, n):
        """H = 2/n X^T X of this rank's n rows -> H of all the ranks' rows, in H's own buffer
        where it is on the collectives' device (H is the caller's to give: no [in, in] copy)."""
        total = H.mul_(float(n)) if H.device == self.device else (H * float(n)).to(self.device)
        rows = torch.tensor([float(n)], dtype=torch.float64, device=self.device)
        self.dist.all_reduce(total)
        self.dist.all_reduce(rows)
        rows = float(rows.item())
        if rows > 0:
            total.div_(rows)
        return total.to(H.device)

    def share(self, tokens):
        """This rank's share of a token budget (rounded up)."""
        return -(-tokens // self.world)

    def sum(self, t):
        """``t`` summed over the ranks (a new tensor, on ``t``'s device)."""
        buf = t.detach().to(self.device, copy=True)
        self.dist.all_reduce(buf)
        return buf.to(t.device)

    def max(self, t):
        """The elementwise maximum of ``t`` over the ranks (a new tensor, on ``t``'s device)."""
        buf = t.detach().to(self.device, copy=True)
        self.dist.all_reduce(buf, op=self.dist.ReduceOp.MAX)
        return buf.to(t.device)

    def mean_of_means(self, values, n):
        """The mean over every rank's items of a statistic each rank holds as ``values``, the
        means over its own ``n`` items (a float64 tensor)."""
        total = float(self.sum(torch.tensor([float(n)], dtype=torch.float64)).item())
        summed = self.sum(values.double() * float(n))
        return summed / total if total > 0 else summed

    def quantize_layers(self, tasks, quantize):
        """``quantize(name, layer, H)`` (GPTQ of one layer: writes its weight, returns its
        qparams) of each task on one rank, the layers dealt out in turn, all ranks at once; then
        each weight and its qparams broadcast from its rank. Returns the qparams in task
        order."""
        owners = [(self._next + i) % self.world for i in range(len(tasks))]
        self._next += len(tasks)
        mine = {i: quantize(*task) for i, task in enumerate(tasks) if owners[i] == self.rank}
        out = []
        for i, (name, mod, _) in enumerate(tasks):
            qp = self.broadcast_object(mine.get(i), owners[i])
            weight = mod.weight.detach()
            buf = weight.to(self.device)
            self.dist.broadcast(buf, owners[i])
            if owners[i] != self.rank:
                with torch.no_grad():
                    weight.copy_(buf.to(weight.device))
            out.append(qp)
        return out

    def gather_object(self, obj):
        """[every rank's ``obj``] in rank order, on every rank."""
        out = [None] * self.world
        self.dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj, src=0):
        box = [obj]
        self.dist.broadcast_object_list(box, src=src, device=self.device
                                        if self.device.type == "cuda" else None)
        return box[0]

    def barrier(self):
        self.dist.barrier()
