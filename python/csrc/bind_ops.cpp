// pybind11 glue for what the ops expose besides the ops themselves: the CPU instruction set
// the kernels dispatched to, and the quantile observer's bin limit. The ops are not bound here:
// they are torch.ops.mqbench.* (src/ops/library.cpp registers them with the dispatcher).
#include <pybind11/pybind11.h>

#include "mqbench/config.h"

namespace mqbench {
namespace python {

void bind_ops(pybind11::module_& m) {
  m.def("cpu_capability", &mqbench::cpu_capability,
        "The CPU instruction set the fake-quantize kernels use: 'avx2' or 'default'. "
        "Set MQBENCH_CPU_CAPABILITY=default before import to force the baseline kernels.");
  m.attr("MAX_QUANTILE_BINS") = mqbench::kMaxQuantileBins;
}

}  // namespace python
}  // namespace mqbench
