#pragma once

namespace mqbench {

/// The CPU instruction set the fake-quantize kernels run with: "avx2" or "default".
/// Detected once per process; the environment variable MQBENCH_CPU_CAPABILITY=default forces
/// the baseline kernels.
const char* cpu_capability();

}  // namespace mqbench
