#pragma once
// The 2-d loop over a TensorIterator that every CPU kernel uses: body(ptrs, strides, n) on each
// 1-d run, split over threads by the iterator.
//
// Why not iter.for_each with a 1-d lambda: torch adapts that with loop_2d_from_1d, whose
// SmallVector copy of the data pointers GCC 12 flags with -Wmaybe-uninitialized once inlined
// into the kernel (a false positive inside torch's headers that no -isystem silences, since the
// diagnostic is emitted after inlining). Writing the 2-d loop here keeps the build quiet without
// switching the warning off for our own code.

#include <ATen/TensorIterator.h>

#include <cstdint>
#include <cstring>

namespace mqbench {
namespace cpu {

template <int kNumOperands, typename Body>
inline void for_each_run(at::TensorIteratorBase& iter, const Body& body,
                         int64_t grain_size = at::internal::GRAIN_SIZE) {
  TORCH_INTERNAL_ASSERT(iter.ntensors() == kNumOperands, "for_each_run<", kNumOperands,
                        "> on an iterator of ", iter.ntensors(), " operands");
  iter.for_each(
      [&](char** data, const int64_t* strides, int64_t size0, int64_t size1) {
        char* ptrs[kNumOperands];
        std::memcpy(ptrs, data, sizeof(ptrs));
        const int64_t* outer = strides + kNumOperands;
        for (int64_t j = 0; j < size1; ++j) {
          body(ptrs, strides, size0);
          for (int k = 0; k < kNumOperands; ++k) ptrs[k] += outer[k];
        }
      },
      grain_size);
}

}  // namespace cpu
}  // namespace mqbench
