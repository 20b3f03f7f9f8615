// pybind11 glue for what the ops expose besides the ops themselves: the CPU instruction set
// the kernels dispatched to, the quantile observer's bin limit and the output buffer cache. The
// ops are not bound here: they are torch.ops.mqbench.* (src/ops/library.cpp registers them with
// the dispatcher).
#include <pybind11/pybind11.h>

#include "mqbench/config.h"

namespace mqbench {
namespace python {

void bind_ops(pybind11::module_& m) {
  m.def("cpu_capability", &mqbench::cpu_capability,
        "The CPU instruction set the fake-quantize kernels use: 'avx2' or 'default'. "
        "Set MQBENCH_CPU_CAPABILITY=default before import to force the baseline kernels.");
  m.attr("MAX_QUANTILE_BINS") = mqbench::kMaxQuantileBins;
  m.def("release_cached_outputs", &mqbench::release_cached_outputs,
        "Frees the buffers the fake-quantize ops keep for their large CPU outputs (above "
        "32 MiB; at most MQBENCH_OUTPUT_CACHE_MB megabytes, default 512, 0: off) and returns "
        "their size in bytes.");
  m.def("output_cache_bytes", &mqbench::output_cache_bytes,
        "How many bytes of freed output buffers the fake-quantize ops hold for reuse.");
}

}  // namespace python
}  // namespace mqbench
