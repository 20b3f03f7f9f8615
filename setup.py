"""Builds mqbench._C (and libmqbench) with the project's CMake build, for pip.

    /usr/bin/python3 -m pip install --no-build-isolation -e .

(add --break-system-packages for Debian's system interpreter, or run it in a venv made with
`/usr/bin/python3 -m venv --system-site-packages`). The CMake build dir is ./build, shared with
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


class CMakeExtension(Extension):
    def __init__(self, name):
        super().__init__(name, sources=[])


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        build_dir = os.environ.get("BUILD_DIR", os.path.join(ROOT, "build"))
        if not os.path.isfile(os.path.join(build_dir, "build.ninja")):
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja",
                                   "-DCMAKE_BUILD_TYPE=Release",
                                   f"-DMQBENCH_PYTHON_EXECUTABLE={sys.executable}"])
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "mqbench_python",
                               "--parallel", str(os.cpu_count() or 2)])
        # CMake writes _C into python/mqbench/; copy it (and libmqbench, which _C finds through
        # its $ORIGIN rpath) to where setuptools expects the extension.
        built = glob.glob(os.path.join(ROOT, "python", "mqbench", "_C*.so"))[0]
        target = self.get_ext_fullpath(ext.name)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if os.path.abspath(built) != os.path.abspath(target):
            shutil.copy2(built, target)
            for lib in glob.glob(os.path.join(build_dir, "libmqbench.so.[0-9]")):  # the SONAME file
                shutil.copy2(lib, os.path.dirname(target), follow_symlinks=True)


setup(ext_modules=[CMakeExtension("mqbench._C")], cmdclass={"build_ext": CMakeBuild})
