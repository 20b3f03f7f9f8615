"""Under DDP, observers average scale and zero point across ranks (MQBench's sync_tensor), also
when the process group is created after `import mqbench` (compatibility.md #23)."""
import torch
import torch.multiprocessing as mp

import ddp_worker
import observer_reference as ref


def test_qparams_are_averaged_across_ranks(tmp_path):
    world = 2
    mp.spawn(ddp_worker.calibrate, args=(world, str(tmp_path / "init"), str(tmp_path / "out")),
             nprocs=world, join=True)
    results = [torch.load(str(tmp_path / f"out.{r}")) for r in range(world)]
    # every rank holds the same, averaged qparams
    for key in ("sym_scale", "asym_scale", "asym_zp"):
        assert torch.equal(results[0][key], results[1][key]), key
    local_sym = [ref.affine_qparams(-1.0 * (r + 1), 2.0 * (r + 1), -128, 127, True)[0]
                 for r in range(world)]
    assert results[0]["sym_scale"].item() == torch.stack(local_sym).mean().item()
    local_asym = [ref.affine_qparams(-1.0 * (r + 1) + r, 2.0 * (r + 1) + r, 0, 255, False)
                  for r in range(world)]
    assert results[0]["asym_scale"].item() == torch.stack([a[0] for a in local_asym]).mean().item()
    zp_mean = sum(int(a[1]) for a in local_asym) / world
    assert results[0]["asym_zp"].item() == round(zp_mean)
    assert results[0]["asym_zp"].dtype == torch.int32
