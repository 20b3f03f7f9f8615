#pragma once
// Library-wide limits and the CPU capability query (the instruction set the kernels run with).

#include <cstdint>

namespace mqbench {

/// The most histogram bins EMAQuantileObserver takes: 2^24 (128 MiB of counts; MQBench's default
/// is 2048). More is refused rather than allocated.
constexpr int64_t kMaxQuantileBins = int64_t(1) << 24;

/// The CPU instruction set the fake-quantize kernels run with: "avx2" or "default".
/// Detected once per process; the environment variable MQBENCH_CPU_CAPABILITY=default forces
/// the baseline kernels.
const char* cpu_capability();

}  // namespace mqbench
