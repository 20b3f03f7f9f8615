#pragma once
// Large CPU outputs from reused buffers (Note [Reused output buffers] in output_buffers.cpp).

#include <ATen/core/Tensor.h>

#include <cstddef>

namespace mqbench {
namespace ops {
namespace detail {

/// An uninitialised CPU tensor with x's sizes, strides and options, for an x that is
/// non-overlapping and dense and at least kMinCachedBytes large (above 32 MiB: see Note [Reused
/// output buffers] for why not smaller): its memory is a buffer that an
/// earlier such output of the same byte size released, or a fresh one advised to use huge pages.
/// Returns an undefined tensor when x does not qualify or the cache is off.
at::Tensor cached_empty_like(const at::Tensor& x);

/// Frees every buffer the cache holds; returns how many bytes that was (also
/// mqbench::release_cached_outputs, mqbench/config.h).
size_t release_cached_outputs();

/// The cache's limit in bytes (MQBENCH_OUTPUT_CACHE_MB, read once; 0 turns the cache off) and
/// what it holds now.
size_t output_cache_limit();
size_t output_cache_held();

constexpr size_t kMinCachedBytes = (size_t(32) << 20) + 1;

}  // namespace detail
}  // namespace ops
}  // namespace mqbench
