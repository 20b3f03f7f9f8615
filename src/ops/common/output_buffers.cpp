// Note [Reused output buffers]
// glibc serves an allocation above its mmap threshold (at most 32 MiB) with a fresh mapping and
// unmaps it on free, so every call of an out-of-place op on a large tensor writes its output
// into memory the kernel has never touched: one page fault per 4 KiB, or, with the huge-page
// advice of Note [Huge pages for large outputs], 2 MiB pages taken from the buddy allocator's
// free lists. Measured on this project's (virtual) machines, 16M floats, 2 threads:
//   * 4 KiB pages: ~16,400 faults and 32-40 ms per call, steady;
//   * huge pages: 32 faults per call, 9-13 ms once the pages are warm, but 50-90 ms for the
//     first 2-15 calls of a process: the free lists hand out 2 MiB blocks the guest has never
//     touched (one process in six stayed slow for all of its 15 timed calls), so the op was
//     bimodal across processes (bench/bench_spread.py);
//   * writing into a buffer already touched (copy_ into a preallocated tensor): 7-9 ms.
// So large outputs come from a small cache: when such an output's storage is freed, its buffer
// is kept (up to the limit) and handed to the next output of the same byte size; QAT and
// calibration loops allocate the same sizes on every step. Only outputs above 32 MiB: with the
// cache for outputs from 16 MiB on, resnet18's batch-8 QAT step (largest output 25.7 MB) was
// 170-340 ms slower in 3 of 3 alternated process pairs, on a machine where the same pair with
// the cache unused differed by up to 440 ms. Not settled; until a quiet machine settles it, the
// cache stays above the outputs of the QAT benchmarks (docs/design/ops.md). Buffers are 2 MiB
// aligned and advised to use huge pages when first allocated. The cache holds at most
// MQBENCH_OUTPUT_CACHE_MB megabytes (default 512; 0 turns it off), the most recently freed
// buffers first, never a buffer larger than that, and release_cached_outputs() empties it
// (mqbench._C.release_cached_outputs()).

#include "ops/common/output_buffers.h"

#include "mqbench/config.h"

#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>

#include <cstdlib>
#include <iterator>
#include <list>
#include <mutex>
#include <new>
#include <string>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace mqbench {
namespace ops {
namespace detail {
namespace {

constexpr size_t kAlign = size_t(2) << 20;

size_t limit_from_env() {
  const char* v = std::getenv("MQBENCH_OUTPUT_CACHE_MB");
  if (v == nullptr || *v == '\0') return size_t(512) << 20;
  char* end = nullptr;
  const unsigned long long mb = std::strtoull(v, &end, 10);
  TORCH_CHECK(end != v && *end == '\0' && mb <= (1ull << 20),
              "MQBENCH_OUTPUT_CACHE_MB must be a whole number of megabytes (0 turns the output "
              "cache off), got '", v, "'");
  return static_cast<size_t>(mb) << 20;
}

class Cache {
 public:
  static Cache& get() {
    static Cache* cache = new Cache();  // never destroyed: deleters may run at exit
    return *cache;
  }
  size_t limit() const { return limit_; }
  size_t held() {
    std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }
  void* take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto it = free_.begin(); it != free_.end(); ++it) {  // at most limit / 32 MiB entries
      if (it->first != bytes) continue;
      void* p = it->second;
      free_.erase(it);
      held_ -= bytes;
      return p;
    }
    return nullptr;
  }
  // Keeps the buffer, most recent first; the least recently freed go when the limit is passed
  // (a workload whose sizes change keeps its current ones).
  void give(void* p, size_t bytes) {
    std::list<std::pair<size_t, void*>> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      free_.emplace_front(bytes, p);
      held_ += bytes;
      while (held_ > limit_) {
        held_ -= free_.back().first;
        evicted.splice(evicted.end(), free_, std::prev(free_.end()));
      }
    }
    for (const auto& b : evicted) std::free(b.second);
  }
  size_t release() {
    std::list<std::pair<size_t, void*>> buffers;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      buffers.swap(free_);
      bytes = held_;
      held_ = 0;
    }
    for (const auto& b : buffers) std::free(b.second);
    return bytes;
  }

 private:
  Cache() : limit_(limit_from_env()) {}
  const size_t limit_;
  std::mutex mutex_;
  std::list<std::pair<size_t, void*>> free_;  // (byte size, buffer), most recently freed first
  size_t held_ = 0;
};

struct Buffer {
  void* data;
  size_t bytes;
};

void give_back(void* ctx) {
  auto* b = static_cast<Buffer*>(ctx);
  Cache::get().give(b->data, b->bytes);
  delete b;
}

void* fresh(size_t bytes) {
  void* p = std::aligned_alloc(kAlign, bytes);  // bytes is a multiple of kAlign
  if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  madvise(p, bytes, MADV_HUGEPAGE);  // Note [Huge pages for large outputs]
#endif
  return p;
}

}  // namespace

at::Tensor cached_empty_like(const at::Tensor& x) {
  if (!x.is_cpu() || !x.is_non_overlapping_and_dense() || x.is_sparse()) return {};
  const size_t used = x.nbytes();
  const size_t bytes = (used + kAlign - 1) / kAlign * kAlign;
  Cache& cache = Cache::get();
  if (used < kMinCachedBytes || bytes > cache.limit()) return {};
  void* data = cache.take(bytes);
  if (data == nullptr) data = fresh(bytes);
  auto* ctx = new Buffer{data, bytes};
  c10::DataPtr ptr(data, ctx, &give_back, c10::Device(c10::kCPU));
  // The storage is the tensor's exact size (torch.save writes a whole storage: the buffer's tail
  // holds an earlier output's bytes), and resizable through torch's CPU allocator: a resize
  // moves the data to a new allocation and gives this buffer back.
  c10::Storage storage(c10::Storage::use_byte_size_t(), used, std::move(ptr),
                       c10::GetCPUAllocator(), true);
  auto out = at::empty({0}, x.options());
  out.set_(storage, 0, x.sizes(), x.strides());
  return out;
}

size_t release_cached_outputs() { return Cache::get().release(); }
size_t output_cache_limit() { return Cache::get().limit(); }
size_t output_cache_held() { return Cache::get().held(); }

}  // namespace detail
}  // namespace ops

size_t release_cached_outputs() { return ops::detail::release_cached_outputs(); }
size_t output_cache_bytes() { return ops::detail::output_cache_held(); }

}  // namespace mqbench
