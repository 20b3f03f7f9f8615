// The one TORCH_LIBRARY of the project: it creates the `mqbench` op namespace
// (torch.ops.mqbench.* in Python). Each op declares its schema with TORCH_LIBRARY_FRAGMENT in
// its own file under src/ops/, beside its CPU implementation; autograd lives in
// src/ops/autograd/ and the kernels in src/ops/cpu/.

#include <torch/library.h>

TORCH_LIBRARY(mqbench, m) {}
