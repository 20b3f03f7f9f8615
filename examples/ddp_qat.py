"""Multi-process quantization-aware training with torch.distributed: one model, N ranks.

Every rank runs the same program on its own shard of the 8x8 digits training set
(examples/digits.py):

1. float pretraining under DistributedDataParallel (or --float-checkpoint: load it);
2. prepare_by_platform (Academic: LSQ weights and activations at --bits, default w4a4,
   per tensor, min/max calibration; Tensorrt: its default 8-bit LSQ, per-channel weights);
3. calibration on the rank's own shard, --calib-batches batches on every rank: each observer
   averages its scale and zero point across ranks at every calibration forward
   (mqbench.utils.sync_tensor, an all_reduce), so every rank must run the same number of them;
4. the prepared GraphModule wrapped in torch.nn.parallel.DistributedDataParallel and trained
   --steps steps (Adam): gradients of weights and of the LSQ scales and zero points (all
   Parameters) are all-reduced by DDP, buffers are broadcast from rank 0 at every forward;
5. BatchNorm running statistics averaged across ranks (each rank's last forward updated them
   with its own batch after DDP's broadcast), then every state_dict tensor of every rank is
   compared bit for bit (sha256 of its bytes, all_gather_object);
6. rank 0 deploys (convert_deploy of the unwrapped GraphModule), runs the deployed model in
   onnxruntime and compares it with the fake-quant model; the other ranks wait at a barrier.

Rank 0 prints a summary; the exit status is 1 when the ranks differ or the deployed model
disagrees with the fake-quant one (accuracy more than 0.5 points apart).

Usage:
    torchrun --nproc_per_node=2 examples/ddp_qat.py [--backend Academic|Tensorrt] [--steps N]
                                                    [--output-dir out/ddp]
    python3 examples/ddp_qat.py ...          (one process: a world of 1, same code path)
    torchrun --nproc_per_node=2 examples/ddp_qat.py --device cuda   (nccl, one GPU per rank)

docs/ddp.md explains what is synchronised, and how.
"""
import argparse
import datetime
import gc
import hashlib
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # digits.py, deploy_demo.py

from digits import DigitsNet, load_data  # noqa: E402
from deploy_demo import AGREEMENT, accuracy_of, deployed_logits  # noqa: E402
from mqbench.convert_deploy import convert_deploy  # noqa: E402
from mqbench.prepare_by_platform import BackendType, prepare_by_platform  # noqa: E402
from mqbench.utils.logger import set_log_level  # noqa: E402
from mqbench.utils.state import enable_calibration, enable_quantization  # noqa: E402

SUMMARY_FILE = "ddp_qat_summary.json"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", default="Academic", choices=["Academic", "Tensorrt"],
                   help="Academic: LSQ at --bits, per tensor; Tensorrt: its 8-bit LSQ default")
    p.add_argument("--bits", default="w4a4", help="Academic bit widths, wXaY (default w4a4)")
    p.add_argument("--fake-quantize", default="LearnableFakeQuantize",
                   choices=["LearnableFakeQuantize", "FixedFakeQuantize"],
                   help="weights' and activations' fake quantizer (default LSQ; FixedFakeQuantize "
                        "keeps scale and an int32 zero point in buffers)")
    p.add_argument("--steps", type=int, default=60, help="QAT steps (each rank one batch a step)")
    p.add_argument("--batch-size", type=int, default=32, help="images per rank and step")
    p.add_argument("--lr", type=float, default=None,
                   help="QAT learning rate (Adam; default 1e-3 Academic, 1e-4 Tensorrt)")
    p.add_argument("--float-epochs", type=int, default=4, help="float pretraining epochs")
    p.add_argument("--float-checkpoint", default=None,
                   help="load the float DigitsNet state_dict from this file instead of training")
    p.add_argument("--calib-batches", type=int, default=4, help="calibration batches per rank")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--dist-backend", default=None,
                   help="process group backend (default gloo on cpu, nccl on cuda)")
    p.add_argument("--find-unused-parameters", action="store_true",
                   help="pass find_unused_parameters=True to DDP (not needed for this model)")
    p.add_argument("--save-states", action="store_true",
                   help="save every rank's state_dict after calibration and after QAT "
                        "(rank{r}_calibrated.pt, rank{r}_qat.pt in --output-dir)")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a collective may wait for the other ranks")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output-dir", default=os.path.join("out", "ddp"))
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error("--steps must be at least 1")
    if args.lr is None:
        args.lr = 1e-3 if args.backend == "Academic" else 1e-4
    try:
        qconfig(args)
    except ValueError as e:
        p.error(str(e))
    return args


def qconfig(args):
    """prepare_by_platform's extra config: Academic at --bits, per tensor, min/max observers;
    Tensorrt's defaults. Both with --fake-quantize for weights and activations."""
    fq = {"w_fakequantize": args.fake_quantize, "a_fakequantize": args.fake_quantize}
    if args.backend != "Academic":
        return {"extra_qconfig_dict": fq}
    try:
        w_bit, a_bit = (int(v) for v in args.bits.lower().lstrip("w").split("a"))
    except ValueError:
        raise ValueError(f"--bits must look like w4a4 (weight and activation bits), "
                         f"got {args.bits!r}") from None
    return {"extra_qconfig_dict": {
        "w_qscheme": {"bit": w_bit, "symmetry": True, "per_channel": False, "pot_scale": False},
        "a_qscheme": {"bit": a_bit, "symmetry": False, "per_channel": False, "pot_scale": False},
        **fq, "w_observer": "MinMaxObserver", "a_observer": "MinMaxObserver"}}


# -- process group --------------------------------------------------------------------------
def init_distributed(args, rank=None, world_size=None, init_method=None):
    """Joins (or, alone, creates) the process group. Under torchrun, RANK / WORLD_SIZE /
    LOCAL_RANK come from the environment (env:// rendezvous); a caller (the tests) may pass them
    with an init_method instead. One plain process gets a world of 1 on an in-memory store, so
    the DDP code path is the same. Returns (rank, world size, device)."""
    if rank is None:
        rank = int(os.environ.get("RANK", 0))
        world_size = int(os.environ.get("WORLD_SIZE", 1))
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("--device cuda: no CUDA device is visible; use --device cpu")
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)  # nccl collectives and all_gather_object use it
    else:
        device = torch.device("cpu")
    backend = args.dist_backend or ("nccl" if device.type == "cuda" else "gloo")
    timeout = datetime.timedelta(seconds=args.timeout)
    if init_method is not None or "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, init_method=init_method or "env://", rank=rank,
                                world_size=world_size, timeout=timeout)
    else:  # one plain process
        if world_size != 1:
            raise RuntimeError(f"WORLD_SIZE={world_size} without MASTER_ADDR: launch with torchrun")
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                timeout=timeout)
    return rank, world_size, device


def shard(x, y, rank, world_size, batch_size, seed):
    """(sampler, loader) over this rank's shard. DistributedSampler(drop_last=True) gives every
    rank floor(N / world) images and the loader drops the last partial batch, so every rank has
    the same number of batches: DDP and the observers' all_reduce need the same number of
    forwards on every rank (a rank with one batch more would wait forever)."""
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed, drop_last=True)
    return sampler, DataLoader(data, batch_size=batch_size, sampler=sampler, drop_last=True)


def batches(sampler, loader, steps, device):
    """`steps` batches, epoch after epoch (set_epoch reshuffles the shards)."""
    done, epoch = 0, 0
    while True:
        sampler.set_epoch(epoch)
        epoch += 1
        for xb, yb in loader:
            yield xb.to(device), yb.to(device)
            done += 1
            if done == steps:
                return


def train(model, sampler, loader, steps, lr, device):
    """`steps` Adam steps of `model` (DDP-wrapped: gradients are all-reduced in backward)."""
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    loss = None
    for xb, yb in batches(sampler, loader, steps, device):
        loss = F.cross_entropy(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    return loss.item()


def average_bn_stats(model, world_size):
    """All-reduces (mean) the running_mean / running_var of every BatchNorm. DDP broadcasts
    buffers from rank 0 at the start of each forward, so after the last training step each
    rank holds rank 0's statistics plus one update from its own batch: they differ. Their mean
    covers every rank's last batch (SyncBatchNorm would do it at every step instead)."""
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.track_running_stats:
            for t in (m.running_mean, m.running_var):
                t.div_(world_size)
                dist.all_reduce(t)


def digest(t):
    """sha256 of a tensor's dtype, shape and bytes (bit for bit)."""
    t = t.detach().cpu().contiguous()
    h = hashlib.sha256(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.view(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def differing_tensors(model, world_size):
    """Names of the state_dict tensors (parameters and buffers) not identical on every rank;
    every rank gets the same list."""
    mine = {k: digest(v) for k, v in model.state_dict().items()}
    everyone = [None] * world_size
    dist.all_gather_object(everyone, mine)
    keys = set().union(*everyone)
    return sorted(k for k in keys if len({d.get(k) for d in everyone}) != 1), len(keys)


def calibrate(model, loader, n_batches, device):
    """Observers on, fake quantization off, n_batches of this rank's shard, then quantize. Every
    observer forward all-reduces its qparams (sync_tensor): same n_batches on every rank."""
    if n_batches > len(loader):
        raise ValueError(f"--calib-batches {n_batches} is more than the {len(loader)} batches of "
                         "a rank's shard: lower it or --batch-size")
    model.eval()
    enable_calibration(model)
    with torch.no_grad():
        for i, (xb, _) in enumerate(loader):
            if i == n_batches:
                break
            model(xb.to(device))
    enable_quantization(model)


def accuracy(model, data, device):
    x, y = data
    model.eval()
    with torch.no_grad():
        return accuracy_of(model(x.to(device)).cpu(), y)


def float_model(args, train_set, rank, world_size, device):
    """The float DigitsNet: loaded from --float-checkpoint, or trained under DDP on the shards
    (then its BN statistics averaged, so every rank prepares the same model)."""
    torch.manual_seed(args.seed)
    net = DigitsNet().to(device)
    if args.float_checkpoint:
        net.load_state_dict(torch.load(args.float_checkpoint, map_location=device))
        return net
    sampler, loader = shard(*train_set, rank, world_size, 64, args.seed)
    ddp = DistributedDataParallel(net, device_ids=[device] if device.type == "cuda" else None)
    train(ddp, sampler, loader, args.float_epochs * len(loader), 3e-3, device)
    average_bn_stats(net, world_size)
    return net


def deploy(qmodel, backend, test_set, args):
    """Rank 0: convert_deploy from a CPU copy, run in onnxruntime, compare with the fake-quant
    model on the test set. Returns a dict of figures."""
    import copy
    x_test, y_test = test_set
    cpu_model = copy.deepcopy(qmodel).cpu().eval()
    name = f"digits_ddp_{args.backend.lower()}"
    written = convert_deploy(cpu_model, backend, {"x": list(x_test.shape)},
                             output_path=args.output_dir, model_name=name,
                             deploy_to_qlinear=backend == BackendType.Tensorrt)
    logits, ran = deployed_logits(backend, name, args.output_dir, x_test)
    with torch.no_grad():
        fq = cpu_model(x_test)
    return {"deployed": accuracy_of(logits, y_test), "fake_quant_cpu": accuracy_of(fq, y_test),
            "max_abs_diff": (logits - fq).abs().max().item(),
            "argmax_agree": (logits.argmax(1) == fq.argmax(1)).float().mean().item() * 100,
            "ran": ran, "files": written}


def run(args, rank, world_size, device):
    say = print if rank == 0 else (lambda *a, **k: None)
    os.makedirs(args.output_dir, exist_ok=True)
    start = time.time()
    train_set, test_set = load_data()
    backend = BackendType[args.backend]

    net = float_model(args, train_set, rank, world_size, device)
    float_acc = accuracy(net, test_set, device)

    qmodel = prepare_by_platform(net, backend, qconfig(args)).to(device)
    sampler, loader = shard(*train_set, rank, world_size, args.batch_size, args.seed + 1)
    calibrate(qmodel, loader, args.calib_batches, device)
    calibrated_acc = accuracy(qmodel, test_set, device)
    if args.save_states:
        torch.save(qmodel.state_dict(), os.path.join(args.output_dir, f"rank{rank}_calibrated.pt"))
    calibrated_diff, _ = differing_tensors(qmodel, world_size)

    # Wrap after calibration: per-channel LSQ scales change shape at their first observation,
    # and DDP fixes its gradient buckets (and broadcasts rank 0's parameters and buffers) here.
    # Buffers (observer ranges and switches, BN statistics) are broadcast from rank 0 here and at
    # every training forward: DDP's default (broadcast_buffers, called forward_sync_buffers in
    # newer torch; left at its default so no deprecation warning is printed either way).
    ddp = DistributedDataParallel(qmodel, device_ids=[device] if device.type == "cuda" else None,
                                  find_unused_parameters=args.find_unused_parameters)
    t0 = time.time()
    loss = train(ddp, sampler, loader, args.steps, args.lr, device)
    qat_s = time.time() - t0
    before_bn_sync, _ = differing_tensors(qmodel, world_size)
    average_bn_stats(qmodel, world_size)
    differing, n_tensors = differing_tensors(qmodel, world_size)
    qat_acc = accuracy(qmodel, test_set, device)
    if args.save_states:
        torch.save(qmodel.state_dict(), os.path.join(args.output_dir, f"rank{rank}_qat.pt"))

    status = torch.zeros(1, dtype=torch.int64, device=device if device.type == "cuda" else "cpu")
    result = None
    if rank == 0:
        try:
            result = deploy(qmodel, backend, test_set, args)
            ok = abs(result["deployed"] - result["fake_quant_cpu"]) <= AGREEMENT
        except Exception as e:  # reported, then every rank exits 1
            print(f"rank 0: deploy failed: {type(e).__name__}: {e}", file=sys.stderr)
            ok = False
        status[0] = 0 if ok and not differing else 1
    dist.barrier()  # the other ranks wait for rank 0's deploy
    dist.broadcast(status, src=0)

    summary = {
        "world_size": world_size, "backend": args.backend,
        "bits": args.bits if args.backend == "Academic" else "w8a8 (per-channel weights)",
        "fake_quantize": args.fake_quantize, "device": str(device),
        "dist_backend": dist.get_backend(), "steps": args.steps, "batch_per_rank": args.batch_size,
        "float": float_acc, "calibrated": calibrated_acc,
        "qat": qat_acc, "final_loss": loss, "qat_seconds": qat_s,
        "state_tensors": n_tensors, "differing_after_calibration": calibrated_diff,
        "differing_before_bn_average": before_bn_sync, "differing": differing,
        "identical": not differing, "deploy": result, "ok": int(status.item()) == 0,
        "seconds": time.time() - start}
    if rank == 0:
        with open(os.path.join(args.output_dir, SUMMARY_FILE), "w") as f:
            json.dump(summary, f, indent=1)
        dep = "failed" if result is None else f"{result['deployed']:.1f}%"
        say(f"\nDDP QAT on 8x8 digits: world size {world_size} ({summary['dist_backend']}, "
            f"{device.type}), {args.backend} {summary['bits']} {args.fake_quantize}, "
            f"{args.steps} steps of {world_size}x{args.batch_size} images")
        say(f"accuracy (360 test images): float {float_acc:.1f}% | calibrated "
            f"{calibrated_acc:.1f}% | QAT {qat_acc:.1f}% | deployed {dep}")
        say(f"after calibration: {len(calibrated_diff)} of {n_tensors} state tensors differ across "
            "ranks (observers' local min/max; scales and zero points are averaged)")
        say(f"after QAT, before averaging BN statistics: {len(before_bn_sync)} differ "
            f"({', '.join(before_bn_sync) or 'none'})")
        if result is not None:
            say(f"deployed ({result['ran']}) vs fake-quant: argmax agree "
                f"{result['argmax_agree']:.1f}%, max |logit diff| {result['max_abs_diff']:.3g}")
        say(f"ranks identical: {'yes' if not differing else 'no'} ({n_tensors} state tensors, "
            f"sha256){'' if not differing else ': ' + ', '.join(differing)}")
        say(f"QAT {qat_s:.1f} s, total {time.time() - start:.1f} s; summary in "
            f"{os.path.join(args.output_dir, SUMMARY_FILE)}")
        if not summary["ok"]:
            say("FAILED: " + ("ranks differ" if differing else "deployed and fake-quant accuracy "
                              f"differ by more than {AGREEMENT} points"))
    return 0 if summary["ok"] else 1


def main(argv=None, rank=None, world_size=None, init_method=None):
    """Entry point; the tests call it with rank, world_size and a file:// init_method."""
    args = parse_args(argv)
    set_log_level("WARNING")
    rank, world_size, device = init_distributed(args, rank, world_size, init_method)
    try:
        code = run(args, rank, world_size, device)
        dist.barrier()  # every rank is done before any rank tears its connections down
        return code
    finally:
        gc.collect()  # DDP's reducer holds the process group: free it before destroying it
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
