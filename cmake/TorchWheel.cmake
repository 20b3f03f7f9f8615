# Imported targets for the LibTorch inside an installed torch wheel
# (docs/design/build-and-ci.md).
#
#   mqbench_torch        ATen / c10 / torch (CPU): include dirs, libtorch, libtorch_cpu, libc10,
#                        the wheel's _GLIBCXX_USE_CXX11_ABI
#   mqbench_torch_cuda   libtorch_cuda + libc10_cuda (only when the wheel is a CUDA build)
#
# Input: MQBENCH_TORCH_ROOT, the torch package folder (site-packages/torch). When it is empty, the
# interpreter Python_EXECUTABLE (or the first python3 on PATH) is asked where torch is. The
# variables MQBENCH_TORCH_VERSION, MQBENCH_TORCH_CXX11_ABI and MQBENCH_TORCH_CUDA_VERSION
# (empty for a CPU build) are set, and cached, for the caller.
#
# Why not torch's own TorchConfig.cmake: for a CUDA wheel it configures only when a full CUDA
# toolkit with cuBLAS, cuDNN, nvrtc... development files is installed, which a pip-installed torch
# neither needs nor brings; torch.utils.cpp_extension builds extensions the same way as here.

set(MQBENCH_TORCH_MIN_VERSION 2.5)
set(MQBENCH_TORCH_MAX_VERSION 2.14)  # newest minor release built and tested

if(NOT MQBENCH_TORCH_ROOT)
  if(NOT Python_EXECUTABLE)
    find_program(Python_EXECUTABLE NAMES python3 python)
  endif()
  execute_process(
    COMMAND "${Python_EXECUTABLE}" -c
      "import os, torch; print(os.path.dirname(torch.__file__))"
    OUTPUT_VARIABLE _root OUTPUT_STRIP_TRAILING_WHITESPACE
    ERROR_VARIABLE _err RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR
      "mqbench: '${Python_EXECUTABLE}' cannot import torch (${_err}). Install a torch wheel "
      "${MQBENCH_TORCH_MIN_VERSION}-${MQBENCH_TORCH_MAX_VERSION} into that interpreter "
      "(pip install torch==2.14.1), or pass -DPython_EXECUTABLE=<python with torch> or "
      "-DMQBENCH_TORCH_ROOT=<site-packages/torch>.")
  endif()
  set(MQBENCH_TORCH_ROOT "${_root}" CACHE PATH "The torch package folder (site-packages/torch)")
endif()

# Version, ABI and CUDA version from the wheel's own files (no interpreter needed, so installed
# consumers of find_package(mqbench) read the same facts).
set(_vfile "${MQBENCH_TORCH_ROOT}/version.py")
if(NOT EXISTS "${_vfile}" OR NOT EXISTS "${MQBENCH_TORCH_ROOT}/include/ATen/ATen.h")
  message(FATAL_ERROR "mqbench: '${MQBENCH_TORCH_ROOT}' is not a torch wheel with C++ headers "
                      "(no version.py or include/ATen/ATen.h)")
endif()
file(STRINGS "${_vfile}" _vline REGEX "^__version__")
string(REGEX MATCH "[0-9]+\\.[0-9]+(\\.[0-9]+)?" MQBENCH_TORCH_VERSION "${_vline}")
file(STRINGS "${_vfile}" _cline REGEX "^cuda")
string(REGEX MATCH "[0-9]+\\.[0-9]+" MQBENCH_TORCH_CUDA_VERSION "${_cline}")
string(REGEX MATCH "[0-9]+\\.[0-9]+" _minor "${MQBENCH_TORCH_VERSION}")
if(_minor VERSION_LESS MQBENCH_TORCH_MIN_VERSION OR
   _minor VERSION_GREATER MQBENCH_TORCH_MAX_VERSION)
  message(FATAL_ERROR
    "mqbench: torch ${MQBENCH_TORCH_VERSION} at ${MQBENCH_TORCH_ROOT} is outside the supported "
    "range ${MQBENCH_TORCH_MIN_VERSION}-${MQBENCH_TORCH_MAX_VERSION}; install one of those "
    "(pip install torch==2.14.1)")
endif()

# The C++ ABI the wheel was built with: TorchConfig.cmake of pre-2.7 PyPI wheels sets
# TORCH_CXX_FLAGS to -D_GLIBCXX_USE_CXX11_ABI=0; newer ones use the new ABI and say nothing.
if(NOT DEFINED MQBENCH_TORCH_CXX11_ABI)
  set(_abi 1)
  set(_abi_probe "${MQBENCH_TORCH_ROOT}/share/cmake/Torch/TorchConfig.cmake")
  if(EXISTS "${_abi_probe}")
    file(STRINGS "${_abi_probe}" _abi_line REGEX "_GLIBCXX_USE_CXX11_ABI=0")
    if(_abi_line)
      set(_abi 0)
    endif()
  endif()
  set(MQBENCH_TORCH_CXX11_ABI ${_abi} CACHE STRING "_GLIBCXX_USE_CXX11_ABI of the torch wheel")
endif()

set(_lib "${MQBENCH_TORCH_ROOT}/lib")
if(NOT TARGET mqbench_torch)
  add_library(mqbench_torch INTERFACE IMPORTED)
  set_target_properties(mqbench_torch PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES
      "${MQBENCH_TORCH_ROOT}/include;${MQBENCH_TORCH_ROOT}/include/torch/csrc/api/include"
    INTERFACE_COMPILE_DEFINITIONS "_GLIBCXX_USE_CXX11_ABI=${MQBENCH_TORCH_CXX11_ABI}"
    # torch >= 2.10's headers require C++20; earlier ones accept it.
    INTERFACE_COMPILE_FEATURES cxx_std_20
    INTERFACE_LINK_LIBRARIES "${_lib}/libtorch.so;${_lib}/libtorch_cpu.so;${_lib}/libc10.so")
endif()
if(MQBENCH_TORCH_CUDA_VERSION AND NOT TARGET mqbench_torch_cuda)
  add_library(mqbench_torch_cuda INTERFACE IMPORTED)
  set_target_properties(mqbench_torch_cuda PROPERTIES
    INTERFACE_LINK_LIBRARIES "mqbench_torch;${_lib}/libtorch_cuda.so;${_lib}/libc10_cuda.so")
endif()
