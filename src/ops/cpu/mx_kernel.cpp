// CPU kernels of the block-scaled formats (MXFP8, MXFP6, MXFP4, NVFP4). Each block is read twice
// from cache (its amax, then its elements), written once. The loops over a block of a fixed size
// (16 or 32) are plain loops on bit patterns that the compiler vectorises in each capability's copy
// (-O3; the avx2 copy processes 8 lanes); other block sizes and the short last block of a row take
// the same code with a run-time length. Formulas: ops/common/mx_formula.h.

#include <ATen/Parallel.h>

#include <algorithm>

#include "ops/common/mx_formula.h"
#include "ops/cpu/mx_kernel.h"

namespace mqbench {
namespace cpu {
namespace MQBENCH_CPU_CAPABILITY {
namespace {

using ops::detail::abs_bits;
using ops::detail::bits_float;
using ops::detail::block_quantize;
using ops::detail::BlockScale;
using ops::detail::E2M1;
using ops::detail::E2M3;
using ops::detail::E3M2;
using ops::detail::E4M3;

// Blocks handed to one task of at::parallel_for (16k to 32k elements).
constexpr int64_t kGrainBlocks = 1024;

template <int64_t kLen>
inline uint32_t block_amax_bits(const float* x, int64_t len) {
  const int64_t n = kLen > 0 ? kLen : len;
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max(m, abs_bits(x[i]));
  return m;
}

template <typename F, int64_t kLen>
inline void block_apply(const float* x, float* out, int64_t len, const BlockScale& b) {
  const int64_t n = kLen > 0 ? kLen : len;
  for (int64_t i = 0; i < n; ++i) out[i] = block_quantize<F>(x[i], b);
}

// Calls block(x, out, len) for every block of the rows x cols matrix, in parallel.
template <typename Block>
void for_each_block(const float* x, float* out, int64_t rows, int64_t cols, int64_t block_len,
                    const Block& block) {
  // ceil(cols / block_len), without overflow for a block_len near INT64_MAX
  const int64_t per_row = cols == 0 ? 0 : (cols - 1) / block_len + 1;
  at::parallel_for(0, rows * per_row, kGrainBlocks, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t r = b / per_row;
      const int64_t c = (b - r * per_row) * block_len;
      const int64_t off = r * cols + c;
      block(x + off, out + off, std::min(block_len, cols - c));
    }
  });
}

template <typename F, int64_t kLen>
void mx_blocks(const float* x, float* out, int64_t rows, int64_t cols, int64_t block) {
  for_each_block(x, out, rows, cols, block, [](const float* xb, float* ob, int64_t len) {
    if (kLen > 0 && len == kLen) {
      const auto s = ops::detail::mx_block_scale<F>(block_amax_bits<kLen>(xb, len));
      block_apply<F, kLen>(xb, ob, len, s);
    } else {
      const auto s = ops::detail::mx_block_scale<F>(block_amax_bits<0>(xb, len));
      block_apply<F, 0>(xb, ob, len, s);
    }
  });
}

template <typename F>
void mx_dispatch_len(const float* x, float* out, int64_t rows, int64_t cols, int64_t block) {
  if (block == 32) {
    mx_blocks<F, 32>(x, out, rows, cols, block);
  } else if (block == 16) {
    mx_blocks<F, 16>(x, out, rows, cols, block);
  } else {
    mx_blocks<F, 0>(x, out, rows, cols, block);
  }
}

void mx_fwd(const float* x, float* out, int64_t rows, int64_t cols, int64_t block,
            MxElement elem) {
  switch (elem) {
    case MxElement::kE4M3: mx_dispatch_len<E4M3>(x, out, rows, cols, block); break;
    case MxElement::kE3M2: mx_dispatch_len<E3M2>(x, out, rows, cols, block); break;
    case MxElement::kE2M3: mx_dispatch_len<E2M3>(x, out, rows, cols, block); break;
    case MxElement::kE2M1: mx_dispatch_len<E2M1>(x, out, rows, cols, block); break;
  }
}

template <int64_t kLen>
void nvfp4_blocks(const float* x, float* out, int64_t rows, int64_t cols, int64_t block,
                  float g) {
  for_each_block(x, out, rows, cols, block, [g](const float* xb, float* ob, int64_t len) {
    if (kLen > 0 && len == kLen) {
      const auto s = ops::detail::nvfp4_block_scale(bits_float(block_amax_bits<kLen>(xb, len)), g);
      block_apply<E2M1, kLen>(xb, ob, len, s);
    } else {
      const auto s = ops::detail::nvfp4_block_scale(bits_float(block_amax_bits<0>(xb, len)), g);
      block_apply<E2M1, 0>(xb, ob, len, s);
    }
  });
}

void nvfp4_fwd(const float* x, float* out, int64_t rows, int64_t cols, int64_t block,
               float global_scale) {
  if (block == 16) {
    nvfp4_blocks<16>(x, out, rows, cols, block, global_scale);
  } else {
    nvfp4_blocks<0>(x, out, rows, cols, block, global_scale);
  }
}

}  // namespace

MQBENCH_REGISTER_STUB(mx_fwd_stub, mx_fwd);
MQBENCH_REGISTER_STUB(nvfp4_fwd_stub, nvfp4_fwd);

}  // namespace MQBENCH_CPU_CAPABILITY
}  // namespace cpu
}  // namespace mqbench
