"""Worker of test_ddp_sync.py: one DDP rank calibrating observers on its own data."""
import torch
import torch.distributed as dist


def calibrate(rank, world_size, init_file, out_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world_size)
    import mqbench  # noqa: F401  (imported after the process group, as MQBench required)
    from mqbench.observer import MinMaxObserver
    sym = MinMaxObserver(dtype=torch.qint8, qscheme=torch.per_tensor_symmetric, quant_min=-128,
                         quant_max=127)
    asym = MinMaxObserver(dtype=torch.quint8, qscheme=torch.per_tensor_affine, quant_min=0,
                          quant_max=255)
    x = torch.linspace(-1.0, 2.0, 100) * (rank + 1)
    sym(x)
    asym(x + rank)
    s, _ = sym.calculate_qparams()
    sa, za = asym.calculate_qparams()
    torch.save({"sym_scale": s, "asym_scale": sa, "asym_zp": za}, f"{out_file}.{rank}")
    dist.barrier()
    dist.destroy_process_group()
