"""Multi-process QAT (examples/ddp_qat.py) on 2 CPU processes with gloo: calibration with
qparams averaged across ranks, LSQ training under DistributedDataParallel, every rank ending
with the same state bit for bit, and rank 0's deployed model agreeing with rank 1's fake-quant
model. docs/ddp.md describes what is synchronised."""
import json
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import ddp_qat_worker
import observer_reference as ref
import ort
from mqbench.fake_quantize.lsq import LearnableFakeQuantize
from mqbench.prepare_by_platform import BackendType, prepare_by_platform

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
WORLD = 2

if not (dist.is_available() and dist.is_gloo_available()):
    print("test_ddp_qat: torch.distributed with gloo is not available in this torch build")
    pytestmark = pytest.mark.skip(reason="torch.distributed with gloo is not available")

sys.path.insert(0, ddp_qat_worker.EXAMPLES)
import ddp_qat  # noqa: E402  (examples/ddp_qat.py)
from digits import DigitsNet, load_data  # noqa: E402  (examples/digits.py)


def same_bits(a, b):
    """True when two tensors have the same dtype, shape and bytes."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().view(-1).view(torch.uint8),
                       b.contiguous().view(-1).view(torch.uint8))


@pytest.fixture(scope="module")
def float_checkpoint(tmp_path_factory):
    """A float DigitsNet trained briefly in this process (the workers load it)."""
    torch.manual_seed(0)
    net = DigitsNet()
    (x, y), _ = load_data()
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    for _ in range(2):
        for idx in torch.randperm(len(y), generator=torch.Generator().manual_seed(1)).split(64):
            loss = torch.nn.functional.cross_entropy(net(x[idx]), y[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
    path = tmp_path_factory.mktemp("float") / "digits_float.pt"
    torch.save(net.state_dict(), path)
    return str(path)


@pytest.fixture(scope="module")
def spawned(float_checkpoint, tmp_path_factory):
    """Runs examples/ddp_qat.py (Academic w4a4 LSQ, 8 steps) as 2 gloo ranks; returns the
    output directory, the parsed arguments and rank 0's summary."""
    out = tmp_path_factory.mktemp("ddp")
    argv = ["--backend", "Academic", "--bits", "w4a4", "--steps", "8",
            "--float-checkpoint", float_checkpoint, "--save-states", "--output-dir", str(out),
            "--timeout", "120"]
    mp.spawn(ddp_qat_worker.run, args=(WORLD, str(out / "init"), argv), nprocs=WORLD, join=True)
    with open(out / ddp_qat.SUMMARY_FILE) as f:
        summary = json.load(f)
    return out, ddp_qat.parse_args(argv), summary


def states(out, stage):
    return [torch.load(out / f"rank{r}_{stage}.pt") for r in range(WORLD)]


def prepared(args):
    return prepare_by_platform(DigitsNet(), BackendType[args.backend], ddp_qat.qconfig(args))


def lsq_quantizers(model):
    return [(n, m) for n, m in model.named_modules() if isinstance(m, LearnableFakeQuantize)]


def test_every_rank_ends_with_the_same_state_bit_for_bit(spawned):
    out, _, summary = spawned
    qat = states(out, "qat")
    assert qat[0].keys() == qat[1].keys()
    differ = [k for k in qat[0] if not same_bits(qat[0][k], qat[1][k])]
    assert differ == []
    assert summary["identical"] and summary["ok"] and summary["differing"] == []
    # DDP broadcasts buffers before each forward, so only the last step's BatchNorm update
    # diverged, and the example averaged exactly those statistics.
    bn_stats = sorted(k for k in qat[0] if k.endswith(("running_mean", "running_var")))
    assert len(bn_stats) == 6
    assert summary["differing_before_bn_average"] == bn_stats


def test_calibration_averages_qparams_of_each_rank_own_shard(spawned):
    out, args, _ = spawned
    cal = states(out, "calibrated")
    quantizers = lsq_quantizers(prepared(args))
    assert len(quantizers) == 8  # 4 weights, 4 activations
    local_ranges_differ = 0
    for name, fq in quantizers:
        obs = f"{name}.activation_post_process."
        ranges = [(c[obs + "min_val"], c[obs + "max_val"]) for c in cal]
        local_ranges_differ += not all(same_bits(a, b) for a, b in zip(*ranges))
        local = [ref.affine_qparams(mn, mx, fq.quant_min, fq.quant_max, fq.is_symmetric_quant)
                 for mn, mx in ranges]
        want_scale = sum(s / WORLD for s, _ in local)
        want_zp = round(sum(int(z) for _, z in local) / WORLD)
        for c in cal:
            # sync_tensor: scale / world on each rank, then all_reduce (a sum): exact in float32
            assert c[name + ".scale"].item() == want_scale.item(), name
            assert c[name + ".zero_point"].item() == want_zp, name
    # the shards differ, so some activation observers saw different ranges on the two ranks
    assert local_ranges_differ >= 2


def test_training_moved_weights_and_lsq_scales(spawned):
    out, args, _ = spawned
    cal, qat = states(out, "calibrated")[0], states(out, "qat")[0]
    scales = [n + ".scale" for n, _ in lsq_quantizers(prepared(args))]
    weights = [k for k in cal
               if k.endswith(".weight") and k.split(".")[0].startswith(("conv", "fc"))]
    assert len(weights) == 4 and len(scales) == 8
    unchanged = [k for k in weights + scales if torch.equal(cal[k], qat[k])]
    assert unchanged == []


def test_rank0_deployed_model_matches_rank1_fake_quant_model(spawned):
    ort.require()
    out, args, summary = spawned
    model = prepared(args)
    model.load_state_dict(states(out, "qat")[1])
    model.eval()
    _, (x, y) = load_data()
    with torch.no_grad():
        fq = model(x)
    onnx_file = out / f"digits_ddp_{args.backend.lower()}.onnx"
    deployed = ort.run(onnx_file.read_bytes(), {"x": x})
    deployed = next(iter(deployed.values()))
    assert deployed.shape == fq.shape
    close = ((deployed - fq).abs() <= 1e-3 * max(1.0, fq.abs().max().item())).all(1)
    assert close.float().mean().item() >= 0.95
    assert (deployed.argmax(1) == fq.argmax(1)).float().mean().item() >= 0.99
    # the accuracy the example printed is this model's
    acc = (fq.argmax(1) == y).float().mean().item() * 100
    assert abs(acc - summary["qat"]) < 1e-6
    assert abs(summary["deploy"]["deployed"] - acc) <= 0.5


def test_torchrun_launches_the_example(tmp_path):
    """The documented command: torchrun with 2 processes, Tensorrt (per-channel LSQ weights,
    conv-bn fused), float pretraining under DDP. Rank 1's state loads into a fresh prepared
    model (per-channel scales resized by the load hook) that agrees with rank 0's deployment."""
    env = dict(os.environ, PYTHONPATH="python", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--standalone",
           "examples/ddp_qat.py", "--backend", "Tensorrt", "--steps", "3", "--float-epochs", "1",
           "--timeout", "120", "--save-states", "--output-dir", str(tmp_path)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "world size 2 (gloo, cpu)" in done.stdout
    assert "ranks identical: yes" in done.stdout
    summary = json.loads((tmp_path / ddp_qat.SUMMARY_FILE).read_text())
    assert summary["world_size"] == 2 and summary["steps"] == 3 and summary["ok"]
    ort.require()
    args = ddp_qat.parse_args(["--backend", "Tensorrt"])
    model = prepared(args)
    model.load_state_dict(torch.load(tmp_path / "rank1_qat.pt"))
    model.eval()
    assert model.conv2.weight_fake_quant.scale.shape == (32,)
    _, (x, _) = load_data()
    with torch.no_grad():
        fq = model(x)
    deployed = ort.run((tmp_path / "onnx_quantized_model.onnx").read_bytes(), {"x": x})
    deployed = next(iter(deployed.values()))
    assert (deployed.argmax(1) == fq.argmax(1)).float().mean().item() >= 0.99
