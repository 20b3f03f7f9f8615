"""Builds the wheel with pip, installs it into a fresh venv and uses it outside the source tree.

    python tests/wheel/check_wheel.py WORK_DIR

1. `pip wheel --no-build-isolation --no-deps .` with this interpreter (the CMake build is the
   one scripts/build.sh made: nothing recompiles);
2. a fresh venv in WORK_DIR/venv, without this tree on its path. It sees this environment's
   torch through a .pth file instead of a second 5.5 GB install, and takes the wheel with
   --no-deps --no-index (the wheel's torch requirement is checked against that torch below);
3. from WORK_DIR, in the fresh venv: import mqbench from site-packages, run an op, prepare,
   calibrate and deploy a small model, and check the deployed files with onnx.
"""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import venv

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

USE = r'''
import json, os, re, sys, tempfile
import mqbench, onnx, torch
from importlib.metadata import requires
site = os.path.dirname(os.path.dirname(mqbench.__file__))
assert site.startswith(sys.prefix), (mqbench.__file__, sys.prefix)
# torch itself (the extras' packages, e.g. torchao for pt2e, are optional and named otherwise)
req = [r for r in requires("mqbench") if re.match(r"torch\s*[=<>!~;]|torch$", r)]
minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
assert req == [f"torch=={minor}.*"], (req, torch.__version__)
y = torch.ops.mqbench.fake_quantize_per_tensor_affine(
    torch.tensor([0.26, -1.0, 9.0]), torch.tensor([0.5]), torch.tensor([0]), -8, 7)
assert y.tolist() == [0.5, -1.0, 3.5], y
from mqbench.prepare_by_platform import BackendType, prepare_by_platform
from mqbench.utils.state import enable_calibration, enable_quantization
from mqbench.convert_deploy import convert_deploy
net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
q = prepare_by_platform(net, BackendType.Tensorrt)
enable_calibration(q); q(torch.randn(2, 3, 8, 8)); enable_quantization(q)
out = tempfile.mkdtemp()
files = convert_deploy(q.eval(), BackendType.Tensorrt, {"x": [1, 3, 8, 8]}, output_path=out,
                       model_name="net")
onnx.checker.check_model(onnx.load(os.path.join(out, "net_deploy_model.onnx")))
ranges = json.load(open(os.path.join(out, "net_clip_ranges.json")))
assert ranges["tensorrt"]["blob_range"], ranges
print("wheel: mqbench", mqbench.__version__, "from", mqbench.__file__, "with torch", torch.__version__)
print("wheel: deployed", sorted(os.path.basename(f) for f in files))
'''


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def main(work):
    shutil.rmtree(work, ignore_errors=True)
    dist = os.path.join(work, "dist")
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
         "--disable-pip-version-check", "-w", dist, ROOT])
    wheel = glob.glob(os.path.join(dist, "mqbench-*.whl"))
    assert len(wheel) == 1, wheel
    env_dir = os.path.join(work, "venv")
    venv.create(env_dir, with_pip=True)
    py = os.path.join(env_dir, "bin", "python")
    fresh_site = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                check=True, capture_output=True, text=True).stdout.strip()
    # This environment's site-packages (torch, onnx) after the fresh one's own.
    with open(os.path.join(fresh_site, "build_env.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\n")
    run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
         "--disable-pip-version-check", wheel[0]])
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([py, "-c", USE], cwd=work, env=env)
    print("wheel: built, installed into a fresh venv and used outside the source tree")


if __name__ == "__main__":
    main(os.path.abspath(sys.argv[1]))
