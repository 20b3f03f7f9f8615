#pragma once
// Library-wide limits and the CPU capability query (the instruction set the kernels run with).

#include <cstddef>
#include <cstdint>

namespace mqbench {

/// The most histogram bins EMAQuantileObserver takes: 2^24 (128 MiB of counts; MQBench's default
/// is 2048). More is refused rather than allocated.
constexpr int64_t kMaxQuantileBins = int64_t(1) << 24;

/// The CPU instruction set the fake-quantize kernels run with: "avx2" or "default".
/// Detected once per process; the environment variable MQBENCH_CPU_CAPABILITY=default forces
/// the baseline kernels.
const char* cpu_capability();

/// The fake-quantize ops' CPU outputs above 32 MiB reuse the buffers of earlier outputs of
/// the same size (src/ops/common/output_buffers.cpp, Note [Reused output buffers]), held up to
/// MQBENCH_OUTPUT_CACHE_MB megabytes (default 512; 0: off). This frees what the cache holds and
/// returns its size in bytes; output_cache_bytes() is what it holds now.
size_t release_cached_outputs();
size_t output_cache_bytes();

}  // namespace mqbench
