"""``torchrun --nproc-per-node 2 -m mqbench.llm`` on gloo (docs/llm.md, "Many processes"): the
ranks split the calibration items, GPTQ's Hessians are summed over them and each layer is
quantized by one rank; the output equals one process's within float summation order, and a rank
that dies ends the job on every rank."""
import json
import os
import subprocess
import sys

import pytest
import torch

from mqbench.llm import load_quantized, quantize_checkpoint
from hf_loader import tiny_llama

transformers = pytest.importorskip("transformers")
pytest.importorskip("compressed_tensors")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(
    __file__)))))
W4G32 = ["--bits", "4", "--group-size", "32"]


def _src(path, layers=3):
    tiny_llama(layers=layers).save_pretrained(path)
    return str(path)


def _torchrun(args, tmp_path, entry=("-m", "mqbench.llm"), timeout=600):
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
           "--master-port", "0", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0",
           *entry, *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout,
                          cwd=str(tmp_path))


_HESSIAN = r"""
import sys, torch
from mqbench.llm.gptq import _Hessian
from mqbench.llm.stream._dist import Comm
comm = Comm.from_env()
x = torch.randn(3000, 96, generator=torch.Generator().manual_seed(4))
h = _Hessian(96, torch.device("cpu"))
for part in comm.shard(x).split(100):  # this rank's rows, in batches
    h.add(part)
got = comm.reduce_hessian(h.finish(), h.n)
full = _Hessian(96, torch.device("cpu"))
for part in x.split(100):
    full.add(part)
torch.testing.assert_close(got, full.finish(), rtol=1e-5, atol=1e-6)
print("rank", comm.rank, "hessian ok", flush=True)
comm.barrier()  # neither rank leaves while the other still talks to it
torch.distributed.destroy_process_group()
"""


def test_the_hessian_summed_over_two_ranks_is_one_process_hessian(tmp_path):
    (tmp_path / "hessian.py").write_text(_HESSIAN)
    r = _torchrun([], tmp_path, entry=(str(tmp_path / "hessian.py"),))
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.count("hessian ok") == 2


def _logits(path, ids):
    model, _ = load_quantized(path)
    with torch.no_grad():
        return model(input_ids=ids).logits


def _two_ranks_and_one(tmp_path, algorithm, layers):
    """The float logits and those of ``algorithm``'s checkpoint written by two gloo ranks and
    by one process, on held-out ids; the two ranks' manifest."""
    src = _src(tmp_path / "src", layers=layers)
    ids = torch.randint(0, 128, (8, 32), generator=torch.Generator().manual_seed(1))
    torch.save(ids, tmp_path / "calib.pt")
    r = _torchrun([src, str(tmp_path / "two"), "--algorithm", algorithm, *W4G32, "--calib",
                   str(tmp_path / "calib.pt")], tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    quantize_checkpoint(src, tmp_path / "one", algorithm,
                        {"bit": 4, "per_channel": True, "group_size": 32}, calib_data=ids)
    held_out = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(5))
    ref = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    with torch.no_grad():
        float_logits = ref(input_ids=held_out).logits
    one, two = _logits(tmp_path / "one", held_out), _logits(tmp_path / "two", held_out)
    return float_logits, one, two, json.load(open(tmp_path / "two" / "mqbench_quantize.json"))


def test_two_gloo_ranks_equal_one_process(tmp_path):
    """Tolerance: GPTQ's column loop spreads each rounding over the columns after it, so the
    other summation order of the Hessians (each rank's rows, then the ranks: within 1e-5, the
    test above) flips near-tie roundings and then the rest of their rows (here about 15% of
    layer 0's q_proj weights, more in later blocks, whose inputs moved too). The models are then
    as far apart as a few such flips make them: each as close to the float model as the other
    within 25%, and closer to each other than either is to the float model."""
    float_logits, one, two, manifest = _two_ranks_and_one(tmp_path, "gptq", 3)
    err_one = float((one - float_logits).pow(2).mean())
    err_two = float((two - float_logits).pow(2).mean())
    assert abs(err_two - err_one) <= 0.25 * err_one, (err_one, err_two)
    assert float((one - two).pow(2).mean()) < min(err_one, err_two)
    assert manifest["complete"] and sorted(manifest["blocks"]) == ["0", "1", "2"]


def test_rtn_on_two_ranks_is_bit_equal(tmp_path):
    src = _src(tmp_path / "src", layers=2)
    r = _torchrun([src, str(tmp_path / "two"), "--algorithm", "rtn", *W4G32], tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    quantize_checkpoint(src, tmp_path / "one", "rtn",
                        {"bit": 4, "per_channel": True, "group_size": 32})
    names = sorted(n for n in os.listdir(tmp_path / "one") if n != "mqbench_quantize.json")
    assert names == sorted(n for n in os.listdir(tmp_path / "two")
                           if n != "mqbench_quantize.json")
    for n in names:
        assert open(tmp_path / "one" / n, "rb").read() == open(tmp_path / "two" / n, "rb").read()


_DYING = r"""
import os, sys
from mqbench.llm import __main__ as cli
from mqbench.llm.stream import quantize
real = quantize._Run.quantize

def quantize_or_die(self, b):
    if b == 1 and os.environ["RANK"] == "1":
        os._exit(3)  # a rank lost mid-run (killed, out of memory)
    return real(self, b)

quantize._Run.quantize = quantize_or_die
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_dead_rank_ends_the_job_on_every_rank(tmp_path):
    src = _src(tmp_path / "src")
    ids = torch.randint(0, 128, (8, 32), generator=torch.Generator().manual_seed(1))
    torch.save(ids, tmp_path / "calib.pt")
    (tmp_path / "dying.py").write_text(_DYING)
    r = _torchrun([src, str(tmp_path / "out"), "--algorithm", "gptq", *W4G32, "--calib",
                   str(tmp_path / "calib.pt")], tmp_path, entry=(str(tmp_path / "dying.py"),),
                  timeout=300)
    assert r.returncode != 0
    assert not os.path.exists(tmp_path / "out" / "config.json")
    # what rank 0 wrote before the loss is kept for a resumed run
    assert os.path.exists(tmp_path / "out" / "mqbench_quantize.json")


def test_a_search_that_runs_in_one_process_is_refused_on_two(tmp_path):
    src = _src(tmp_path / "src", layers=2)
    ids = torch.randint(0, 128, (8, 32), generator=torch.Generator().manual_seed(1))
    torch.save(ids, tmp_path / "calib.pt")
    r = _torchrun([src, str(tmp_path / "out2"), "--algorithm", "awq", *W4G32, "--calib",
                   str(tmp_path / "calib.pt"), "--set", "objective=block"], tmp_path)
    assert r.returncode != 0
    assert "objective='block' runs in one process" in r.stderr


def _files(path):
    return {n: open(os.path.join(path, n), "rb").read() for n in sorted(os.listdir(path))
            if n != "mqbench_quantize.json"}


def test_smoothquant_on_two_ranks_is_bit_equal(tmp_path):
    """A fixed alpha needs the inputs' channel maxima only, and a maximum over the ranks is the
    maximum over all the rows: the very scales, so the very files."""
    src = _src(tmp_path / "src", layers=2)
    ids = torch.randint(0, 128, (8, 32), generator=torch.Generator().manual_seed(1))
    torch.save(ids, tmp_path / "calib.pt")
    r = _torchrun([src, str(tmp_path / "two"), "--algorithm", "smoothquant", "--bits", "8",
                   "--group-size", "0", "--calib", str(tmp_path / "calib.pt"), "--set",
                   "alpha=0.5"], tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    quantize_checkpoint(src, tmp_path / "one", "smoothquant", {"bit": 8, "per_channel": True},
                        calib_data=ids, alpha=0.5)
    assert _files(tmp_path / "one") == _files(tmp_path / "two")


_SEARCHES = r"""
import torch
from mqbench.llm import _weights
from mqbench.llm.awq import _clip_errors, _search_scale, awq_weight_mean
from mqbench.llm.smoothquant import _layer_losses
from mqbench.llm.stream._dist import Comm
comm = Comm.from_env()
g = torch.Generator().manual_seed(3)
x = torch.randn(300, 16, generator=g) @ torch.randn(16, 64, generator=g)  # correlated tokens
x[:, 5] *= 20  # an outlier channel
ws = [0.1 * torch.randn(48, 64, generator=g) for _ in range(3)]
mine = x[comm.rank::comm.world]
wq = _weights.resolve_w_qscheme({"bit": 4, "per_channel": True, "group_size": 32}, "test")
x_mean = x.abs().mean(0)
torch.testing.assert_close(comm.mean_of_means(mine.abs().mean(0), mine.shape[0]).float(),
                           x_mean, rtol=1e-6, atol=0)
w_mean = awq_weight_mean(ws, wq)
one = _search_scale(x, ws, x_mean, w_mean, 20, wq)[1]
two = comm.mean_of_means(_search_scale(mine, ws, x_mean, w_mean, 20, wq)[1], mine.shape[0])
torch.testing.assert_close(two, one, rtol=1e-5, atol=0)
one = _clip_errors(x, ws[0], wq, 20, 0.5)[1]
two = comm.mean_of_means(_clip_errors(mine, ws[0], wq, 20, 0.5)[1], mine.shape[0]).float()
torch.testing.assert_close(two, one, rtol=1e-5, atol=1e-12)
act_max = x.abs().amax(0)
assert torch.equal(comm.max(mine.abs().amax(0)), act_max)
one = _layer_losses(x, ws, act_max, 8)[0]
two = comm.mean_of_means(_layer_losses(mine, ws, act_max, 8)[0], mine.shape[0])
torch.testing.assert_close(two, one, rtol=1e-5, atol=0)
print("rank", comm.rank, "searches ok", flush=True)
comm.barrier()  # neither rank leaves while the other still talks to it
torch.distributed.destroy_process_group()
"""


def test_search_errors_reduced_over_two_ranks_are_one_process_errors(tmp_path):
    """What AWQ and SmoothQuant reduce over the ranks: the inputs' channel means (AWQ) and
    maxima (SmoothQuant: exact), and each candidate's error of the scale search, the clip search
    and the alpha search, each rank's a mean over its own tokens: summed weighed by the ranks'
    token counts they are one process's errors up to summation order."""
    (tmp_path / "searches.py").write_text(_SEARCHES)
    r = _torchrun([], tmp_path, entry=(str(tmp_path / "searches.py"),))
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.count("searches ok") == 2


def test_awq_on_two_ranks_writes_a_model_as_good_as_one_process(tmp_path):
    """End to end under torchrun. The candidate scales come from the inputs' channel means, whose
    last bit depends on the summation order; a weight of a candidate that then rounds the other
    way moves its error by up to 1% on this model, where the candidates' errors are often
    within 1% of each other, so the two runs may pick neighbouring candidates: the two models
    are then as close to the float model as each other within 25%."""
    float_logits, one, two, manifest = _two_ranks_and_one(tmp_path, "awq", 2)
    err_one = float((one - float_logits).pow(2).mean())
    err_two = float((two - float_logits).pow(2).mean())
    assert abs(err_two - err_one) <= 0.25 * err_one, (err_one, err_two)
    assert manifest["complete"] and manifest["settings"]["ranks"] == 2


_SIGNROUND = r"""
import torch
from torch import nn
from mqbench.llm import _weights
from mqbench.llm.signround import learn_block, options
from mqbench.llm.stream._dist import Comm
comm = Comm.from_env()
g = torch.Generator().manual_seed(3)
block = nn.Sequential(nn.Linear(64, 48))
with torch.no_grad():
    block[0].weight.copy_(0.1 * torch.randn(48, 64, generator=g))
w0 = block[0].weight.detach().clone()
hidden = [torch.randn(1, 16, 64, generator=g) for _ in range(8)]
wq = _weights.resolve_w_qscheme({"bit": 4, "per_channel": True, "group_size": 32}, "test")


def learn(items, batch, comm=None):
    with torch.no_grad():
        block[0].weight.copy_(w0)
    opts, use_cpp = options(15, None, batch, 0, "auto")
    calls = [(h, "arg", ((), {})) for h in items]
    _, losses, _ = learn_block("b", block, [("b.0", block[0])], calls, list(items),
                               [None] * len(items), wq, opts, use_cpp, comm=comm)
    return block[0].weight.detach().clone(), losses


# every item in every step: the steps of one process over the 8 items and of two ranks over
# 4 each (a batch of comm.share(8)) see the same objective, summed in another order
one, one_losses = learn(hidden, 8)
two, two_losses = learn(hidden[comm.rank::comm.world], comm.share(8), comm)
both = comm.gather_object(two)
assert all(torch.equal(w, both[0]) for w in both), "the ranks' roundings differ"
torch.testing.assert_close(torch.tensor(two_losses), torch.tensor(one_losses), rtol=1e-5, atol=0)
assert two_losses[1] < two_losses[0], two_losses  # it learned something
differ = (two != one).float().mean().item()
assert differ <= 0.01, differ  # a sign of a gradient near 0 may flip with the order
print("rank", comm.rank, "signround ok", differ, flush=True)
comm.barrier()  # neither rank leaves while the other still talks to it
torch.distributed.destroy_process_group()
"""


def test_signround_steps_are_the_same_on_every_rank_and_one_process_steps(tmp_path):
    """Each step's gradients and objective summed over the ranks (Note [SignRound over several
    ranks]): every rank takes the same steps, and with every item in every step they are one
    process's steps (up to a sign flipped by the summation order)."""
    (tmp_path / "signround.py").write_text(_SIGNROUND)
    r = _torchrun([], tmp_path, entry=(str(tmp_path / "signround.py"),))
    assert r.returncode == 0, r.stderr[-4000:]
    assert r.stdout.count("signround ok") == 2


def test_signround_on_two_ranks_writes_a_model_as_good_as_one_process(tmp_path):
    """End to end: the ranks draw their own batches, so the steps are not one process's; the
    two models are as close to the float model as each other within 25%."""
    src = _src(tmp_path / "src", layers=2)
    ids = torch.randint(0, 128, (8, 32), generator=torch.Generator().manual_seed(1))
    torch.save(ids, tmp_path / "calib.pt")
    r = _torchrun([src, str(tmp_path / "two"), "--algorithm", "signround", *W4G32, "--calib",
                   str(tmp_path / "calib.pt"), "--set", "iters=30"], tmp_path)
    assert r.returncode == 0, r.stderr[-4000:]
    quantize_checkpoint(src, tmp_path / "one", "signround",
                        {"bit": 4, "per_channel": True, "group_size": 32}, calib_data=ids,
                        iters=30)
    held_out = torch.randint(0, 128, (4, 32), generator=torch.Generator().manual_seed(5))
    ref = transformers.AutoModelForCausalLM.from_pretrained(src).eval()
    with torch.no_grad():
        float_logits = ref(input_ids=held_out).logits
    err = {k: float((_logits(tmp_path / k, held_out) - float_logits).pow(2).mean())
           for k in ("one", "two")}
    assert abs(err["two"] - err["one"]) <= 0.25 * err["one"], err
    manifest = json.load(open(tmp_path / "two" / "mqbench_quantize.json"))
    assert manifest["settings"]["ranks"] == 2
    assert all(len(b["generator"]) == 2 for b in manifest["blocks"].values())


_STOPPING = r"""
import os, sys
from mqbench.llm import __main__ as cli
from mqbench.llm.stream import quantize
real = quantize._Run.quantize

def quantize_or_stop(self, b):
    if b == 1 and os.environ.get("STOP_AT_1") == "1":
        raise KeyboardInterrupt  # Ctrl-C on every rank at block 1
    return real(self, b)

quantize._Run.quantize = quantize_or_stop
sys.exit(cli.main(sys.argv[1:]))
"""


def test_signround_on_two_ranks_resumes_to_the_same_files(tmp_path):
    """Each rank's generator is kept per block, so a stopped two-rank run resumed by the same
    command draws what an uninterrupted one draws: the same files."""
    src = _src(tmp_path / "src", layers=3)
    # 4 rows on rank 0, 3 on rank 1: the ranks' generators move apart
    ids = torch.randint(0, 128, (7, 32), generator=torch.Generator().manual_seed(1))
    torch.save(ids, tmp_path / "calib.pt")
    (tmp_path / "stopping.py").write_text(_STOPPING)
    args = ["--algorithm", "signround", *W4G32, "--calib", str(tmp_path / "calib.pt"), "--set",
            "iters=6", "--set", "batch_size=4"]
    entry = (str(tmp_path / "stopping.py"),)
    r = _torchrun([src, str(tmp_path / "whole"), *args], tmp_path, entry=entry)
    assert r.returncode == 0, r.stderr[-4000:]
    os.environ["STOP_AT_1"] = "1"
    try:
        r = _torchrun([src, str(tmp_path / "out"), *args], tmp_path, entry=entry)
    finally:
        del os.environ["STOP_AT_1"]
    assert r.returncode != 0
    manifest = json.load(open(tmp_path / "out" / "mqbench_quantize.json"))
    assert sorted(manifest["blocks"]) == ["0"] and not manifest["complete"]
    states = manifest["blocks"]["0"]["generator"]
    assert len(states) == 2 and states[0] != states[1]
    r = _torchrun([src, str(tmp_path / "out"), *args], tmp_path, entry=entry)
    assert r.returncode == 0, r.stderr[-4000:]
    assert _files(tmp_path / "out") == _files(tmp_path / "whole")
