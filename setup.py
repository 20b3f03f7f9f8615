"""Builds mqbench._C, libmqbench and libmqbench_deploy with the project's CMake build, for pip.

    pip install --no-build-isolation .        # a wheel into the current environment
    pip install --no-build-isolation -e .     # development: the package stays in python/

--no-build-isolation is required: the C++ parts compile against the torch wheel already installed
in the environment (its headers, libraries and C++ ABI), and an isolated build environment would
hold no torch, or a second one. The wheel requires that torch's minor release
(docs/design/build-and-ci.md). CMake, a C++20 compiler and the Debian packages of
scripts/setup.sh must be present; the CMake build dir is ./build (BUILD_DIR overrides), shared with
scripts/build.sh, so pip and the scripts never compile twice.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = os.path.dirname(os.path.abspath(__file__))
TORCH_RANGE = ((2, 5), (2, 14))  # as cmake/TorchWheel.cmake


def installed_torch():
    """(major, minor) of the environment's torch; exits with what to do when it is unusable."""
    try:
        import torch
    except ImportError:
        sys.exit("mqbench: torch is not importable in this build environment. Install torch "
                 f"{TORCH_RANGE[0][0]}.{TORCH_RANGE[0][1]}-{TORCH_RANGE[1][0]}.{TORCH_RANGE[1][1]} "
                 "first (pip install torch==2.14.1), then build with "
                 "`pip install --no-build-isolation .`")
    version = tuple(int(v) for v in torch.__version__.split("+")[0].split(".")[:2])
    if not TORCH_RANGE[0] <= version <= TORCH_RANGE[1]:
        sys.exit(f"mqbench: torch {torch.__version__} is outside the supported range "
                 f"{TORCH_RANGE[0][0]}.{TORCH_RANGE[0][1]}-{TORCH_RANGE[1][0]}.{TORCH_RANGE[1][1]}; "
                 "install one of those (pip install torch==2.14.1)")
    return version


def build_dir_for(python):
    """./build, unless it was configured for another interpreter: then build-<name of its env>."""
    build_dir = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
    cache = os.path.join(build_dir, "CMakeCache.txt")
    if os.path.isfile(cache) and "BUILD_DIR" not in os.environ:
        with open(cache) as f:
            line = next((l for l in f if l.startswith("Python_EXECUTABLE:")), "")
        configured = line.split("=", 1)[-1].strip()
        if configured and os.path.realpath(configured) != os.path.realpath(python):
            env = os.path.basename(os.path.dirname(os.path.dirname(os.path.abspath(python))))
            build_dir = os.path.join(ROOT, f"build-{env}")
    return build_dir


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        installed_torch()
        build_dir = build_dir_for(sys.executable)
        if not os.path.isfile(os.path.join(build_dir, "build.ninja")):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja",
                                   "-DCMAKE_BUILD_TYPE=Release",
                                   f"-DPython_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "mqbench_python",
                               "--parallel", str(os.cpu_count() or 2)])
        # CMake writes _C into python/mqbench/; copy it, and the libraries it finds through its
        # $ORIGIN rpath (their SONAME files), to where setuptools expects the extension.
        built = glob.glob(os.path.join(ROOT, "python", "mqbench", "_C*.so"))[0]
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.abspath(built) != os.path.abspath(target):
            shutil.copy2(built, target)
        if self.inplace:  # editable: _C finds the libraries in the build dir (its build rpath)
            return
        for lib in ("libmqbench.so.[0-9]", "libmqbench_deploy.so.[0-9]"):
            for path in glob.glob(os.path.join(build_dir, lib)):
                dest = os.path.join(os.path.dirname(target), os.path.basename(path))
                if os.path.abspath(path) != os.path.abspath(dest):
                    shutil.copy2(path, dest, follow_symlinks=True)


major, minor = installed_torch()
setup(
    # setuptools' own staging folders go inside the CMake build dir (./build is CMake's).
    options={"build": {"build_base": os.path.join(build_dir_for(sys.executable), "setuptools")}},
    ext_modules=[CMakeExtension("mqbench._C")],
    cmdclass={"build_ext": CMakeBuild},
    # The binary parts are built for this torch minor release only.
    install_requires=[f"torch=={major}.{minor}.*"],
)
